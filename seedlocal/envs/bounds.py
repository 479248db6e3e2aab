"""What a Box action goes through on its way to the simulator (``ActionBounds``)."""

from __future__ import annotations

import numpy as np

from seedlocal.errors import EnvContractError
from seedlocal.spec import EnvSpec


class ActionBounds:
    """What a Box action goes through on its way to the simulator: refused
    if it is NaN or infinite (a diverged network; the inference loop stops
    first, this is the last line), clipped to the space's bounds, rounded
    to the nearest value where the space's dtype is an integer or bool one,
    and given the space's own shape and dtype (the pipeline's actions are
    flat float32 vectors). The learner keeps the unclipped sample: its
    probability is what the policy gave."""

    def __init__(self, spec: EnvSpec):
        self.env_id, self.shape = spec.env_id, spec.box_shape
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self.dtype = np.dtype(spec.box_dtype)
        self._round = self.dtype.kind in "iub"
        self._out = self._cast = None

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """``actions``: [n, prod(shape)]; returns [n, *shape] in the space's dtype, clipped."""
        if not np.isfinite(actions).all():
            raise EnvContractError(f"{self.env_id}: the policy sent a NaN or infinite action; not stepping the env "
                                   "with it (a diverged network?)")
        n = len(actions)
        if self._out is None or len(self._out) != n:
            self._out = np.empty((n, self.low.size), np.float32)
        np.clip(np.reshape(actions, self._out.shape), self.low, self.high, out=self._out)
        if self._round:
            np.rint(self._out, out=self._out)
        if self.dtype == self._out.dtype:
            return self._out.reshape((n,) + self.shape)
        if self._cast is None or len(self._cast) != n:
            self._cast = np.empty(self._out.shape, self.dtype)
        self._cast[...] = self._out
        return self._cast.reshape((n,) + self.shape)


def action_bounds(spec: EnvSpec) -> ActionBounds | None:
    return ActionBounds(spec) if spec.num_actions is None else None
