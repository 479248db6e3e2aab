"""What a user asked a training run for, before anything is derived from it: ``Request``.

The command line (``from_command_line``: tyro parses the options, once) and the Python API (``from_keywords``)
each build one; ``prepare`` (``seedlocal/prepare.py``) turns it into the run's one frozen configuration. What
the user gave wins over everything derived (a preset, the machine's sizes, a resumed run's saved config, a
pipeline file), so a request holds what was given, not only what the values came to.

tyro returns values, not which options were typed. Parsing the same options twice, over two defaults that
differ in every option, tells them apart: an option given has the user's value in both parses, one left out
has each default's.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
from types import MappingProxyType
from typing import Annotated, Mapping

from seedlocal.config.overrides import apply, checked, flatten, options_of
from seedlocal.config.resume import leaves

# Network options older command lines gave elsewhere (V-trace and R2D2 under --algo., neuroevolution at the
# top), each with its one spelling now; a bool's negation too.
RENAMED = {f"{old}{name}": f"--network.{name}" for old in ("--algo.", "--") for name in
           ("encoder", "hidden", "lstm-size", "lstm_size", "obs-norm", "obs_norm", "no-obs-norm", "no_obs_norm")}


@dataclasses.dataclass(frozen=True)
class Request:
    """A training run as asked for: nothing in it is derived. The fields after ``options`` are the command's own
    options, each described by its --help in ``COMMAND_OPTIONS``."""

    options: Mapping[str, object]
    """the run config's options that were given, by dotted name (``pipeline.num_workers``), with their values"""
    preset: str = ""
    machine_sizing: bool = True
    pipeline_config: str = ""

    def __post_init__(self):
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


def is_given(options: Mapping[str, object]):
    """Whether an option (dotted name) is among ``options``, itself or as part of a group (``pipeline``): a
    recipe's ``Given``."""
    return lambda name: name in options or any(k.startswith(name + ".") for k in options)


COMMAND_OPTIONS = {
    "preset": (str, "the preset to start from, by name; \"\" = the one made for --env.id's kind (image frames, "
                    "small grids, Box actions ...)"),
    "machine_sizing": (bool, "size the preset's workers, envs and batch for this machine's cores and GPU "
                             "(docs/tuning.md, \"Sized to the machine\"); --no-machine-sizing keeps the preset's"),
    "pipeline_config": (str, "a pipeline file from `seedlocal bench --autotune`: its sizes replace the preset's "
                             "(options given here still win)"),
}
"""``Request``'s own options beside the run config's: (type, --help)"""


def command_class(run_cls: type) -> type:
    """The ``seedlocal train`` command's options as one dataclass for tyro: the run config's own options at the
    top level (``--env.id``, not ``--run.env.id``), beside the command's choices (``Request``'s)."""
    import tyro

    return dataclasses.make_dataclass(
        f"Train{run_cls.__name__}",
        [("run", Annotated[run_cls, tyro.conf.arg(name="", prefix_name=False)],
          dataclasses.field(default_factory=run_cls)),
         *[(n, Annotated[k, tyro.conf.arg(help=h)], dataclasses.field(default=getattr(Request, n)))
           for n, (k, h) in COMMAND_OPTIONS.items()]])


def from_command_line(family: str, run_cls: type, args: list[str]) -> Request:
    """The request a ``seedlocal train <family>`` command line makes. tyro's own errors (an unknown option, a
    value of the wrong type) end the process with status 2; ``--help`` is left to the caller (``cli._help``)."""
    import tyro

    cls = command_class(run_cls)
    args = [a for a in spelled(args, run_cls) if a not in ("-h", "--help")]
    kinds = options_of(cls)  # the second default: every option another value of its type
    perturbed = apply(cls(), {name: _other(v, kinds[name]) for name, v in leaves(cls()).items()})
    one, two = (tyro.cli(cls, args=args, default=d, prog=f"seedlocal train {family}") for d in (cls(), perturbed))
    values, other = leaves(one), leaves(two)
    given = {name: v for name, v in values.items() if _same(other[name], v)}
    command = {name: given.pop(name) for name in list(given) if name in COMMAND_OPTIONS}
    return Request({name.removeprefix("run."): v for name, v in given.items()}, **command)


def from_keywords(run_cls: type, keywords: dict) -> Request:
    """The request ``seedlocal.train(family, **keywords)`` makes: the same options as keywords, a group as a
    dict (``config/overrides.py``), the command's choices by their names here."""
    command = {name: keywords.pop(name) for name in COMMAND_OPTIONS if name in keywords}
    command = {name: checked(name, v, COMMAND_OPTIONS[name][0]) for name, v in command.items() if v is not None}
    return Request(flatten(run_cls, keywords, also=tuple(COMMAND_OPTIONS)), **command)


def spelled(args: list[str], run_cls: type) -> list[str]:
    """``args`` as tyro reads them: an option's old spelling (``RENAMED``) given its one spelling, said in one
    line; an integer option's whole number in e-notation as digits (``whole_numbers``)."""
    out = []
    for a in args:
        name, eq, value = a.partition("=")
        if name in RENAMED:
            print(f"seedlocal: {name} is now {RENAMED[name]} (the old spelling will go)", file=sys.stderr, flush=True)
            a = RENAMED[name] + eq + value
        out.append(a)
    return whole_numbers(out, run_cls)


def whole_numbers(args: list[str], cls: type) -> list[str]:
    """``--total-steps 1e6`` read as ``--total-steps 1000000``: an integer option of ``cls`` given in e-notation
    (as CleanRL's and SB3's users write step counts) that is a whole number; any other value is tyro's to judge."""
    ints = {f"--{name}".replace("_", "-") for name, kind in options_of(cls).items() if kind is int}
    ints |= {f.replace("-", "_") for f in ints}
    out, after = [], ""
    for a in args:
        name, eq, value = a.partition("=")
        if a.startswith("--") and eq and name in ints:
            a = f"{name}={_whole(value)}"
        elif after in ints and not a.startswith("--"):
            a = _whole(a)
        out.append(a)
        after = a
    return out


def _same(a, b) -> bool:
    """Equal, NaN included (``--algo.learning-rate nan`` is given, and refused by the checks)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _whole(v: str) -> str:
    return str(int(float(v))) if re.fullmatch(r"[+-]?\d+(\.\d*)?[eE]\+?\d+", v) and float(v).is_integer() else v


def _other(v, kind):
    """Another value of ``kind`` than ``v``."""
    if kind is bool:
        return not v
    if kind is int:
        return v + 1
    if kind is float:
        return v + 1.5 if math.isfinite(v) else 0.0
    if kind is str:
        return v + "\x00"  # never typed on a command line
    if typing.get_origin(kind) is typing.Literal:
        return next(c for c in typing.get_args(kind) if c != v)
    if typing.get_origin(kind) is tuple:
        return (*v, "\x00" if typing.get_args(kind)[:1] == (str,) else 1)
    raise TypeError(f"no other value of {kind!r} to tell a given option from a default")  # a new option's type
