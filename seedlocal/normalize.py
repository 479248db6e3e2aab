"""Running statistics for continuous control: observation normalisation inside a network, and reward scaling
beside a learner.

Both keep exact running moments, merged batch by batch with Chan et al.'s parallel update (no decay), in float64:
after millions of steps a float32 count or sum of squares would lose the digits that matter.

``RunningNorm`` is a module: its statistics are buffers, so they travel with the network's ``state_dict`` into
checkpoints and are the same tensors for whoever runs the network (the inference loop reads the learner's own
weights, and so its own statistics; updates go under the ``WeightLock``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def merge_moments(count: float, mean, var, batch_count: float, batch_mean, batch_var):
    """(count, mean, var) of two samples' union, from each one's (population) moments."""
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * (batch_count / total)
    m2 = var * count + batch_var * batch_count + delta * delta * (count * batch_count / total)
    return total, new_mean, m2 / total


class RunningNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps)``, clipped to ``[-clip, clip]``, over the last dimension of ``x`` [..., size],
    with the moments of every row passed to ``update``. Before the first update it is the identity."""

    def __init__(self, size: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, pool=None) -> None:
        """Fold the rows of ``x`` in; with ``pool`` (data-parallel ranks' ``pool_moments``) every rank's rows."""
        rows = x.reshape(-1, x.shape[-1]).to(torch.float64)
        rows, n = rows if pool is None else rows.cpu(), float(len(rows))
        if n:
            batch_mean, batch_var = rows.mean(0), rows.var(0, unbiased=False)
        else:  # a rank with no rows still joins the pool
            batch_mean, batch_var = rows.new_zeros(rows.shape[-1]), rows.new_zeros(rows.shape[-1])
        if pool is not None:
            n, batch_mean, batch_var = pool(n, batch_mean, batch_var)
            batch_mean, batch_var = batch_mean.to(self.mean.device), batch_var.to(self.mean.device)
        if not n:
            return
        # All on the statistics' device, the count included: reading it on the host (is this the first batch?)
        # made the learner wait for every update queued before it, on a GPU at every batch. The first batch
        # takes its own moments, chosen on the device. The batch's count is made there too (a fill, no copy):
        # torch divides a number by a tensor through a reciprocal, one rounding more than the host's n / total.
        n = self.count.new_full((), n)
        count, mean, var = merge_moments(self.count, self.mean, self.var, n, batch_mean, batch_var)
        first = self.count == 0
        self.mean.copy_(torch.where(first, batch_mean, mean))
        self.var.copy_(torch.where(first, batch_var, var))
        self.count.copy_(count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return normalise(x, self.mean, self.scale(), self.clip)

    def scale(self) -> torch.Tensor:
        """What ``forward`` multiplies by: ``1 / sqrt(var + eps)``."""
        return torch.rsqrt(self.var + self.eps)


def normalise(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, clip: float) -> torch.Tensor:
    """``RunningNorm``'s map given its mean and ``scale()``: also what a population's forward applies with each
    slot's own copy of them (rows [n, size], float32, so that no step converts or takes a root)."""
    return ((x - mean.to(x.dtype)) * scale.to(x.dtype)).clamp(-clip, clip)


def occurrence(ids: np.ndarray) -> np.ndarray:
    """For each entry of ``ids``, how many entries before it hold the same id (0 at an id's first)."""
    order = np.argsort(ids, kind="stable")  # stable: each id's entries stay in their order
    sorted_ids = ids[order]
    out = np.empty(len(ids), np.int64)
    out[order] = np.arange(len(ids)) - np.searchsorted(sorted_ids, sorted_ids)  # less the id's first place
    return out


class RewardScaler:
    """Rewards divided by the running standard deviation of each env's discounted return (as OpenAI Baselines'
    VecNormalize and CleanRL's PPO), clipped to ``[-clip, clip]``; only the learner's copy is scaled.

    ``update`` takes a batch's rewards, episode ends and counted rows [T, B] (host arrays, time order) with each
    column's env slot: each env's discounted return runs on across unrolls and batches, two unrolls of one env in
    a batch chained in the order they completed. Rows an auto-reset ignored enter neither the return nor the
    statistics."""

    def __init__(self, num_envs: int, discount: float, clip: float = 10.0, eps: float = 1e-8):
        self.discount, self.clip, self.eps = discount, clip, eps
        self.returns = np.zeros(num_envs, np.float64)
        self.count, self.mean, self.var = 0.0, 0.0, 1.0

    def update(self, rewards: np.ndarray, ends: np.ndarray, env_ids: np.ndarray, counted: np.ndarray,
               pool=None) -> None:
        """Fold a batch in (see the class); with ``pool`` (data-parallel ranks' ``pool_moments``) the
        statistics take every rank's returns, each env's running return staying with its rank."""
        # The k-th unroll of an env in this batch is chained after its (k-1)-th: one pass per k.
        nth = occurrence(env_ids)
        seen = []
        for k in range(int(nth.max(initial=-1)) + 1):
            cols = np.flatnonzero(nth == k)
            ids = env_ids[cols]
            ret = self.returns[ids]
            out = np.empty((rewards.shape[0], len(cols)), np.float64)
            for t in range(rewards.shape[0]):
                ret = ret * self.discount + rewards[t, cols]
                out[t] = ret
                ret = np.where(ends[t, cols], 0.0, ret)
            self.returns[ids] = ret
            seen.append(out[counted[:, cols]])
        seen = np.concatenate(seen) if seen else np.empty(0)
        n = float(seen.size)
        mean, var = (float(seen.mean()), float(seen.var())) if seen.size else (0.0, 0.0)
        if pool is not None:
            mean_t, var_t = (torch.tensor([x], dtype=torch.float64) for x in (mean, var))
            n, mean_t, var_t = pool(n, mean_t, var_t)
            mean, var = float(mean_t[0]), float(var_t[0])
        if n == 0:
            return
        moments = (n, mean, var) if self.count == 0 else merge_moments(self.count, self.mean, self.var, n, mean, var)
        self.count, self.mean, self.var = moments

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        return (rewards * (1.0 / math.sqrt(self.var + self.eps))).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        """The statistics only: a resumed run starts every env on a fresh episode, so no
        env's return continues, and the run may have another number of envs."""
        self.count, self.mean, self.var = float(state["count"]), float(state["mean"]), float(state["var"])
