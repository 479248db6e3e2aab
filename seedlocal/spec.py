"""The words every floor of seedlocal shares: what a tensor is (``TensorSpec``), what an environment is to the
pipeline (``EnvSpec``), where an episode starts (``episode_starts``), and where an env's action mask travels
(``MASK_KEY``). Nothing here imports from seedlocal, so every floor may import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


# An env that says which Discrete actions are legal (Gymnasium's and PettingZoo's ``action_mask``: a key of its
# Dict observation, or of ``info``) has this field in ``EnvSpec.obs``: a bool per action, [num_actions], stored,
# replayed and shipped like any observation field; networks do not read it as input but set the outputs of
# illegal actions to ``networks.ILLEGAL`` (``networks.legal_only``).
MASK_KEY = "action_mask"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class EnvSpec:
    """What the pipeline must know of an environment to lay out storage."""

    env_id: str
    backend: str
    obs: dict[str, TensorSpec]
    # The pipeline's action per env: () for Discrete; for a Box, always a flat vector of its prod(shape)
    # components, as the networks emit them. Only the env sees its own shape (``box_shape``).
    action: TensorSpec
    num_actions: int | None  # discrete action count; None for a Box action space
    action_low: tuple[float, ...] | None
    action_high: tuple[float, ...] | None
    frames_per_step: int
    frame_stack: int = 0  # envpool's stack_num where set (0 = the env's default)
    # Discrete observation fields: key -> (n, start). Networks see them one-hot.
    obs_classes: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # A Discrete(n, start) action space: the pipeline's actions are 0..n-1; the env receives action + start.
    action_start: int = 0
    # A Box action space's own shape (``(2, 3)``, ``()``): what the env receives.
    box_shape: tuple[int, ...] | None = None
    # Its dtype: an integer or bool Box gets its actions rounded and cast to it.
    box_dtype: str = "float32"
    # How a Box action meets the space's bounds (``envs/bounds.py``): "rescale" maps the policy's [-1, 1]
    # onto each pair of finite bounds; "clip" (what seedlocal did before, and so what an older checkpoint
    # plays with) only clips. Infinite bounds are clipped under both.
    box_actions: str = "rescale"


def episode_starts(ignored, before=False):
    """``first`` flags of T consecutive rows (numpy or torch, [T, ...]) from their ``ignored`` flags: an
    observation starts an episode where the step before it was ignored (envpool's and Gymnasium's next-step
    auto-reset ignore the action after an episode's end and return the next episode's first observation); the
    inference loop reads the flag the same way. Row t > 0 by ``ignored[t - 1]``, row 0 by ``before`` (the
    ``ignored`` of the row before it; False: the caller's recurrent state already starts there)."""
    first = ignored.copy() if isinstance(ignored, np.ndarray) else ignored.clone()
    first[0] = before
    first[1:] = ignored[:-1]
    return first
