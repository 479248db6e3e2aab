"""The group a spec's backend names (``make_group``), the null backend's (``NullGroup``), and the range env seeds
must stay in (``SEED_END``, ``wrap_seed``)."""

from __future__ import annotations

import numpy as np

from seedlocal.envs.envpool_group import EnvpoolGroup
from seedlocal.envs.gymnasium_group import GymnasiumGroup, quiet_gymnasium
from seedlocal.spec import EnvSpec


# envpool's seed is a C++ int and env i of a group is seeded seed + i, so every
# env's seed must stay below this; Gymnasium's take any size >= 0.
SEED_END = 2**31


def wrap_seed(seed: int, span: int) -> int:
    """``seed`` taken into [0, room), room a whole number of ``span``-wide blocks with one spare below
    SEED_END: a block of ``span`` envs seeded ``seed + j`` then always fits envpool's int32, however far
    restarts or reconnections have counted a run's blocks up."""
    return seed % ((SEED_END // span - 1) * span)


class NullGroup:
    """No environment at all (``seedlocal bench``): returns the previous arrays at once, so that a run measures
    the transport's own cost (slots, notification, gather, write-back)."""

    def __init__(self, spec: EnvSpec, envs_per_group: int, num_threads: int, seed: int, render: bool = False):
        self._obs = {k: np.zeros((envs_per_group,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self._reward = np.zeros(envs_per_group, np.float32)
        self._false = np.zeros(envs_per_group, bool)

    def send(self, actions=None) -> None:
        """Nothing to step (nor to reset or close)."""

    reset = close = send

    def recv(self):
        return self._obs, self._reward, self._false, self._false


def make_group(spec: EnvSpec, envs_per_group: int, num_threads: int, seed: int, render: bool = False):
    """``render``: the envs also draw frames for a person (``group.render()``: eval's videos)."""
    quiet_gymnasium()
    cls = {"envpool": EnvpoolGroup, "gymnasium": GymnasiumGroup, "null": NullGroup}[spec.backend]
    return cls(spec, envs_per_group, num_threads, seed, render)
