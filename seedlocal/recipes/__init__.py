"""Each family's recipe: its options (the run configuration tyro parses), its presets, and the rules that
preparation (``seedlocal/prepare.py``) applies to them: plain functions of the values preparation hands them
(the env's kind, the machine, which options the user gave), describing no env and starting nothing.

    sizing(cfg, kind, machine, given) -> changes   the machine's sizes where the user gave none (DESIGN.md,
                                                    decision 9), derived from the sizes that hold
    derive(cfg, given) -> changes                   what follows from the options whatever the machine
    per_rank(cfg, ranks, shape_of) -> cfg          one of G data-parallel learners' share (V-trace: its batch)
    needs(cfg) -> ShapeNeeds                        what the family asks of the pipeline's shape
    check(cfg, spec, shape)                         the family's own refusals, one line naming the field

A change is ``{dotted option name: value}``. ``KINDS`` is the one table of env kinds the presets go by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from seedlocal.shape import ShapeNeeds

Given = Callable[[str], bool]
"""whether an option (dotted name, or a group such as ``pipeline``) was given by the user"""


@dataclass(frozen=True)
class Kind:
    """A kind of task, named as the presets made for it are."""

    name: str
    what: str
    """how the first line says it ("a preset made for ...")"""
    frames: bool
    """image frames, which a GPU machine sizes up (more envs, larger batches)"""
    episode_frames: int
    """neuroevolution's evaluation episode cap by default (0: none): the deep-GA paper's 20,000 frames for
    image frames; for small grids 10,000, four of Freeway's 2,500-frame episodes (a member that keeps
    Breakout's ball in play never ends its episode)"""


KINDS = {k.name: k for k in (
    Kind("atari", "image frames", True, 20_000),
    Kind("football", "Google Research Football's minimap frames", True, 20_000),
    Kind("minatar", "small image grids", False, 10_000),
    Kind("mujoco", "a Box action space", False, 0),
    Kind("cartpole", "small vectors", False, 0),
)}


def kind_of(spec) -> Kind:
    """The kind of task an env (its ``EnvSpec``) is: 'football' (envpool's gfootball/ ids), 'atari' for other
    frames of 36 x 36 and up, 'minatar' for smaller image grids with Discrete actions, 'mujoco' for Box actions,
    'cartpole' for the rest."""
    from seedlocal.networks import is_grid, is_image  # torch: not at import, where an actor host reaches here

    single = spec.obs.get("")
    if single is not None and is_image(single):
        return KINDS["football" if spec.env_id.startswith("gfootball/") else "atari"]
    if spec.num_actions is None:
        return KINDS["mujoco"]
    return KINDS["minatar" if single is not None and is_grid(single) else "cartpole"]


def no_needs(cfg) -> ShapeNeeds:
    return ShapeNeeds()


def no_changes(cfg, given) -> dict:  # a derive
    return {}


@dataclass(frozen=True)
class Recipe:
    """One family's options, presets and rules (module docstring)."""

    name: str
    """the ``seedlocal train`` command"""
    run: type
    """its run configuration (a ``RunConfig`` dataclass)"""
    presets: dict
    check: Callable[..., None]
    sizing: Callable[..., dict]
    per_rank: Callable[..., object]
    needs: Callable[..., ShapeNeeds] = no_needs
    derive: Callable[..., dict] = no_changes
