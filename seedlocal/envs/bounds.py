"""What a Box action goes through on its way to the simulator (``ActionBounds``)."""

from __future__ import annotations

import numpy as np

from seedlocal.errors import EnvContractError
from seedlocal.spec import EnvSpec

BOX_ACTIONS = ("rescale", "clip")  # EnvConfig.box_actions, EnvSpec.box_actions


def _bounds(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The env's (low, high) (float64, flat), and which components of a Box action the policy acts on in [-1, 1],
    mapped onto them: those with both bounds finite, under ``box_actions`` rescale. The others reach the env as
    the policy gave them, clipped to their bounds."""
    low, high = np.asarray(spec.action_low, np.float64), np.asarray(spec.action_high, np.float64)
    return low, high, np.isfinite(low) & np.isfinite(high) & (spec.box_actions == "rescale")


def policy_range(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the policy's own actions that the env's bounds stand for: [-1, 1] where they are
    rescaled, the env's bounds elsewhere (float32, flat)."""
    low, high, mapped = _bounds(spec)
    return np.where(mapped, -1.0, low).astype(np.float32), np.where(mapped, 1.0, high).astype(np.float32)


class ActionBounds:
    """What a Box action goes through on its way to the simulator (why: docs/mujoco.md, "Bounds far from [-1, 1]"):
    refused if it is NaN or infinite (a diverged network; the inference loop stops first, this is the last line),
    mapped from the policy's [-1, 1] onto the space's bounds where both are finite (``box_actions`` rescale),
    clipped to the bounds, rounded to the nearest value where the space's dtype is an integer or bool one, and given
    the space's own shape and dtype (the pipeline's actions are flat float32 vectors). The learner keeps the
    policy's own sample, before all of this. Every env backend steps through this one map."""

    def __init__(self, spec: EnvSpec):
        self.env_id, self.shape = spec.env_id, spec.box_shape
        low, high, mapped = _bounds(spec)
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        # a -> low + (a + 1) / 2 * (high - low), as scale * a + centre; halves first, so that bounds near
        # float32's limits do not overflow.
        low, high = np.where(mapped, low, -1.0), np.where(mapped, high, 1.0)  # unmapped: scale 1, centre 0
        self.scale = (high / 2 - low / 2).astype(np.float32)
        self.centre = (high / 2 + low / 2).astype(np.float32)
        self._affine = bool(((self.scale != 1) | (self.centre != 0)).any())  # [-1, 1] itself: clipped only
        self.dtype = np.dtype(spec.box_dtype)
        self._round = self.dtype.kind in "iub"
        self._out = self._cast = None

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """``actions``: [n, prod(shape)]; returns [n, *shape] in the space's dtype, within the bounds."""
        if not np.isfinite(actions).all():
            raise EnvContractError(f"{self.env_id}: the policy sent a NaN or infinite action; not stepping the env "
                                   "with it (a diverged network?)")
        n = len(actions)
        if self._out is None or len(self._out) != n:
            self._out = np.empty((n, self.low.size), np.float32)
        out = self._out
        if self._affine:
            np.multiply(np.reshape(actions, out.shape), self.scale, out=out)
            out += self.centre
            np.clip(out, self.low, self.high, out=out)
        else:
            np.clip(np.reshape(actions, out.shape), self.low, self.high, out=out)
        if self._round:
            np.rint(out, out=out)
        if self.dtype != out.dtype:  # into a kept buffer: no allocation per step (the groups copy what they keep)
            if self._cast is None or len(self._cast) != n:
                self._cast = np.empty(out.shape, self.dtype)
            np.copyto(self._cast, out, casting="unsafe")
            out = self._cast
        return out.reshape((n,) + self.shape)


def action_bounds(spec: EnvSpec) -> ActionBounds | None:
    return ActionBounds(spec) if spec.num_actions is None else None
