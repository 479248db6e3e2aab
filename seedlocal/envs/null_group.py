"""No environment at all: the transport's ceiling (``seedlocal bench``)."""

from __future__ import annotations

import numpy as np

from seedlocal.spec import EnvSpec


class NullGroup:
    """Returns the previous arrays at once: the transport's own cost (slots, notification, gather, write-back)."""

    def __init__(self, env_id: str, envs_per_group: int, num_threads: int, seed: int, spec: EnvSpec):
        self._obs = {k: np.zeros((envs_per_group,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self._reward = np.zeros(envs_per_group, np.float32)
        self._false = np.zeros(envs_per_group, bool)

    def reset(self) -> None:
        pass

    def send(self, actions) -> None:
        pass

    def recv(self):
        return self._obs, self._reward, self._false, self._false

    def close(self) -> None:
        pass
