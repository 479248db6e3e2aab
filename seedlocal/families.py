"""The table of algorithm families: what ``seedlocal train <name>`` runs, what ``seedlocal eval`` plays a
checkpoint with, and what the usage text and ``docs/families.md`` list.

A family is its recipe (``recipes/``: its options, presets and the rules preparation applies to them) and its
trainer (``trainers/``: ``train`` of a prepared run, ``from_checkpoint``), two modules of one name. The table
names it and a title, so that the command line imports only what it runs (a trainer pulls in torch). This is
the only place that chooses code by an algorithm's name (``tests/test_structure.py`` checks).

Adding a family (its math, recipe and trainer, and a line here): docs/architecture.md, "Adding a family".
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable

from seedlocal.config.overrides import unknown
from seedlocal.errors import CheckpointError, ConfigError

TABLE: dict[str, tuple[str, str]] = {
    "vtrace": ("vtrace", "IMPALA (V-trace) with central batched inference"),
    "r2d2": ("r2d2", "recurrent prioritized replay Q-learning (R2D2)"),
    "ga": ("neuroevolution", "deep GA: a population evaluated in batched forward passes"),
    "es": ("neuroevolution", "evolution strategies (antithetic, centred ranks, Adam)"),
    "ars": ("neuroevolution", "Augmented Random Search (Mania et al. 2018): steps along the best random directions; "
            "linear policies on normalised states in --preset mujoco"),
    "random-search": ("neuroevolution", "random search: the deep-GA paper's baseline"),
}
"""name -> (its modules' name, under seedlocal/recipes/ and seedlocal/trainers/ both; title)"""


@dataclass(frozen=True)
class Family:
    """One algorithm family as the commands see it: its recipe, the ``train`` of a prepared run, and, for eval,
    ``from_checkpoint(state, device, greedy, epsilon)``: the policy training's inference serves (``greedy``
    None: acting as the run acted)."""

    name: str
    recipe: object
    train: Callable[..., dict]
    from_checkpoint: Callable


def recipe(name: str):
    """The recipe of ``seedlocal train <name>`` (its module imported now; no trainer)."""
    module = import_module(f"seedlocal.recipes.{TABLE[name][0]}")
    return next(r for r in module.RECIPES if r.name == name)


def family(name: str) -> Family:
    """The family ``seedlocal train <name>`` runs (its recipe and trainer modules imported now); ConfigError, with
    the nearest, for a name that is none (``seedlocal.train``'s first argument)."""
    if name not in TABLE:
        raise ConfigError(unknown(str(name), list(TABLE)).replace("no such option", "no such family"))
    trainer = import_module(f"seedlocal.trainers.{TABLE[name][0]}")
    return Family(name, recipe(name), trainer.train, trainer.from_checkpoint)


def of_checkpoint(state: dict) -> Family:
    """The family that wrote a checkpoint, by the algorithm its identity names."""
    algo = state.get("identity", {}).get("algo")
    if algo not in TABLE:
        raise CheckpointError(f"{state.get('path')}: written by no algorithm seedlocal has ({algo!r}); "
                              f"expected one of {', '.join(TABLE)}")
    return family(algo)


def markdown() -> str:
    """docs/families.md: each family's command, title, presets and where its code lives."""
    rows = ["| command | what it trains | presets | run configuration | trainer |", "|---|---|---|---|---|"]
    for name, (module, title) in TABLE.items():
        r = recipe(name)
        presets = ", ".join(f"`{p}`" for p in r.presets)
        rows.append(f"| `seedlocal train {name}` | {title} | {presets} | `{r.run.__name__}` in "
                    f"`seedlocal/recipes/{module}.py` | `seedlocal/trainers/{module}.py` |")
    return ("# Algorithm families\n\nMade by `python -m seedlocal.families` from the family table "
            "(`seedlocal/families.py`); `tests/test_structure.py` keeps it in step.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(markdown(), end="")
