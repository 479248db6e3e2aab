"""The table of algorithm families: what ``seedlocal train <name>`` runs,
what ``seedlocal eval`` plays a checkpoint with, and what the usage text
and ``docs/families.md`` list.

A family (``trainers.run.Family``) is a run configuration, its presets,
its trainer and its ``from_checkpoint``; each trainer module holds its own
in ``FAMILIES``. The table names the module and a one-line title, so that
the command line imports only the trainer it runs (a trainer pulls in
torch) and prints its usage without any. This is the only place that
chooses code by an algorithm's name (``tests/test_structure.py`` checks).

Adding a family: its math in ``algos/``, its trainer with ``FAMILIES`` in
``trainers/``, and a line here (docs/architecture.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from seedlocal.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from seedlocal.trainers.run import Family

TABLE: dict[str, tuple[str, str]] = {
    "vtrace": ("seedlocal.trainers.vtrace", "IMPALA (V-trace) with central batched inference"),
    "r2d2": ("seedlocal.trainers.r2d2", "recurrent prioritized replay Q-learning (R2D2)"),
    "ga": ("seedlocal.trainers.neuroevolution", "deep GA: a population evaluated in batched forward passes"),
    "es": ("seedlocal.trainers.neuroevolution", "evolution strategies (antithetic, centred ranks, Adam)"),
    "ars": ("seedlocal.trainers.neuroevolution",
            "Augmented Random Search (Mania et al. 2018): steps along the best random directions; "
            "linear policies on normalised states in --preset mujoco"),
    "random-search": ("seedlocal.trainers.neuroevolution", "random search: the deep-GA paper's baseline"),
}


def family(name: str) -> Family:
    """The family ``seedlocal train <name>`` runs (its trainer module imported now)."""
    module, _ = TABLE[name]
    return next(f for f in import_module(module).FAMILIES if f.name == name)


def of_config(cfg) -> Family:
    """The family whose run configuration ``cfg`` is."""
    return next(f for f in map(family, TABLE) if type(cfg) is f.run)


def check_learners(cfg) -> Family:
    """The family of ``cfg``, a run of ``cfg.learners`` > 1 data-parallel ranks, once its ranks could start: the
    family has a data-parallel learner, and the run can be divided among them (``per_rank``: its shape, its
    batch); else refused in one line, before any rank starts (the command line and ``seedlocal.train``)."""
    fam = of_config(cfg)
    if not fam.data_parallel:
        raise ConfigError(f"learners={cfg.learners}: {fam.name} has no data-parallel learner; give --learners 1")
    cfg.per_rank(cfg.learners)
    return fam


def of_checkpoint(state: dict) -> Family:
    """The family that wrote a checkpoint, by the algorithm its identity names."""
    algo = state.get("identity", {}).get("algo")
    if algo not in TABLE:
        raise CheckpointError(f"{state.get('path')}: written by no algorithm seedlocal has ({algo!r}); "
                              f"expected one of {', '.join(TABLE)}")
    return family(algo)


def usage() -> str:
    """The ``train`` lines of the command line's usage text."""
    return "\n".join(f"  train {name:<14s} {title}" for name, (_, title) in TABLE.items())


def markdown() -> str:
    """docs/families.md: each family's command, title, presets and where its code lives."""
    rows = ["| command | what it trains | presets | run configuration | trainer |", "|---|---|---|---|---|"]
    for name, (module, title) in TABLE.items():
        f = family(name)
        presets = ", ".join(f"`{p}`" for p in f.presets)
        path = module.replace(".", "/") + ".py"
        rows.append(f"| `seedlocal train {name}` | {title} | {presets} | `{f.run.__name__}` | `{path}` |")
    return ("# Algorithm families\n\nMade by `python -m seedlocal.families` from the family table "
            "(`seedlocal/families.py`); `tests/test_structure.py` keeps it in step.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(markdown(), end="")
