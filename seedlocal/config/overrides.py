"""Keyword overrides into the config dataclasses, for the Python API (``seedlocal.train``, ``seedlocal.evaluate``).

An option is named as the command line's, its sub-config a dict of its own options: ``--pipeline.num-workers 1
--network.hidden 64 64`` is ``pipeline={"num_workers": 1}, network={"hidden": (64, 64)}``; the dotted name
(``"pipeline.num_workers"``) is taken too. A name that is no option, or a value of the wrong type, is refused
in one line naming it (``ConfigError``), as the command line refuses its options.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import numbers
import os
import typing
from pathlib import Path

from seedlocal.config.schema import PipelineConfig
from seedlocal.errors import ConfigError


def options_of(cls: type, prefix: str = "") -> dict[str, object]:
    """Every option of the config dataclass ``cls`` by its dotted name (``pipeline.num_workers``), with its type."""
    out: dict[str, object] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, name = hints[f.name], prefix + f.name
        out.update(options_of(kind, name + ".") if dataclasses.is_dataclass(kind) else {name: kind})
    return out


def flatten(cls: type, overrides: dict, also: tuple[str, ...] = ()) -> dict[str, object]:
    """``overrides`` as {dotted name: value}, each name an option of ``cls`` and each value of its type
    (ConfigError otherwise). A sub-config is given as a dict of its options, or as an instance (all of its
    options then count as given). ``also``: names the caller takes itself, offered when a name is mistyped."""
    options = options_of(cls)
    groups = {name.rsplit(".", i)[0] for name in options for i in range(1, name.count(".") + 1)}
    out: dict[str, object] = {}

    def visit(prefix: str, given: dict) -> None:
        for key, value in given.items():
            name = prefix + str(key)
            if name in groups:
                if dataclasses.is_dataclass(value) and not isinstance(value, type):
                    value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
                if not isinstance(value, dict):
                    raise ConfigError(f"{name}={value!r}: a group of options; give them as a dict, "
                                      f"{name}={{'option': value, ...}}")
                visit(name + ".", value)
            elif name in options:
                out[name] = checked(name, value, options[name])
            else:
                raise ConfigError(unknown(name, [*options, *groups, *also]))

    visit("", overrides)
    return out


def unknown(name: str, valid: list[str]) -> str:
    """The one line refusing ``name``, with the nearest of ``valid``."""
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if not near:  # a misspelt group with the right option (pipelin.num_workers) still finds it
        leaf = name.rsplit(".", 1)[-1]
        near = [v for v in valid if v.rsplit(".", 1)[-1] == leaf][:1]
    hint = f"did you mean {near[0]}?" if near else "options: " + ", ".join(sorted(v for v in valid if "." not in v))
    return f"{name}: no such option; {hint}"


def checked(name: str, value, kind):
    """``value`` as option ``name`` of type ``kind`` holds it (an int for a float, a list for a tuple, a path for a
    str), or ConfigError naming it. A type not known here is left to the trainer's checks."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is bool:
        ok, value, want = isinstance(value, bool), value, "True or False"
    elif kind is int:
        ok, value, want = integral, int(value) if integral else value, "an int"
    elif kind is float:
        ok = integral or (isinstance(value, numbers.Real) and not isinstance(value, bool))
        value, want = float(value) if ok else value, "a number"
    elif kind is str:
        ok, want = isinstance(value, str | os.PathLike), "a str"
        value = os.fspath(value) if ok else value
    elif origin is typing.Literal:
        ok, want = value in args, "one of " + ", ".join(map(repr, args))
    elif origin is tuple and args and args[0] is str:
        ok = isinstance(value, tuple | list) and all(isinstance(v, str) for v in value)
        value, want = tuple(value) if ok else value, "a tuple of strs, e.g. ('learning_rate=1e-4..1e-2',)"
    elif origin is tuple:
        ok = isinstance(value, tuple | list) and all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                                                   for v in value)
        value, want = tuple(int(v) for v in value) if ok else value, "a tuple of ints, e.g. (64, 64)"
    else:
        ok, want = True, ""
    if not ok:
        raise ConfigError(f"{name}={value!r}: expected {want}")
    return value


def apply(cfg, values: dict[str, object]):
    """A copy of ``cfg`` with ``values`` (dotted names) set; ``cfg`` and its sub-configs are left as they are."""
    top = {name: value for name, value in values.items() if "." not in name}
    for head in {name.split(".", 1)[0] for name in values if "." in name}:
        sub = {name.split(".", 1)[1]: value for name, value in values.items() if name.startswith(head + ".")}
        top[head] = apply(getattr(cfg, head), sub)
    return dataclasses.replace(copy.deepcopy(cfg), **top)


def load_pipeline_file(path: str) -> dict:
    """The pipeline fields of an autotune file (or of a plain PipelineConfig JSON)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"pipeline_config={path!r}: no such file (write one with seedlocal bench --autotune)") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"pipeline_config={path!r}: not readable JSON ({e})") from None
    fields = data.get("pipeline", data) if isinstance(data, dict) else None
    kinds = options_of(PipelineConfig)
    if not isinstance(fields, dict) or not fields or set(fields) - set(kinds):
        bad = sorted(set(fields) - set(kinds)) if isinstance(fields, dict) else data
        raise ConfigError(f"pipeline_config={path!r}: expected PipelineConfig fields, got {bad!r}")
    try:  # each value of its field's type: a "8" for envs_per_worker would otherwise fail deep in validation
        return {name: checked(name, value, kinds[name]) for name, value in fields.items()}
    except ConfigError as e:
        raise ConfigError(f"pipeline_config={path!r}: {e}") from None
