"""What V-trace's trainers share besides the run's skeleton: the learning rhythm and one logging interval's
accumulated losses, episodes and rates (``trainers/vtrace.py``, ``trainers/population.py``)."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from seedlocal.algos.vtrace import VTraceParams

# Learner statistics measured once per logging interval (see learner_step).
DIAGNOSTICS = ("update_ratio", "advantage_std", "value_error", "explained_variance")


def actors_wait(a: VTraceParams) -> bool:
    """The learning rhythm: whether actors wait while the learner works on a
    batch. The same on every device unless asked (``algo.sync off``): the
    presets were tuned in it (PPO clip against mu, echo x minibatches passes),
    and running ahead (~23 updates of policy lag, docs/tuning.md) starts many
    rows outside the clip range, where they give no gradient. A GPU that
    chose the other rhythm by itself would run another algorithm."""
    return a.sync != "off"


class Interval:
    """What one logging interval accumulates (device-side loss sums, episodes,
    learner time) and the scalars it ends with."""

    def __init__(self, steps: int, stats, workers: dict):
        self.restart(time.monotonic(), steps, stats, workers)
        self.begun = False

    def begin(self, now: float, steps: int, workers: dict) -> None:
        """Rates from here on: the first batch's arrival, so the workers' start-up is no slow first point."""
        self.t0, self.steps, self.workers = now, steps, workers
        self.begun = True

    def restart(self, now: float, steps: int, stats, workers: dict) -> None:
        self.t0, self.steps = now, steps
        self.wait_s = self.learn_s = 0.0
        self.acc: dict = {}
        self.n = self.rows_learned = 0
        self.diag = None
        self.ep_n, self.ep_ret, self.ep_len = 0, 0.0, 0
        self.workers = workers
        self.forward_s, self.batches, self.batch_envs = stats.forward_s, stats.batches, stats.batch_envs

    def add(self, update_stats: dict, rows: int) -> None:
        for key, v in update_stats.items():
            self.acc[key] = self.acc.get(key, 0.0) + v
        self.n += 1
        self.rows_learned += rows

    def add_episodes(self, eps) -> None:
        self.ep_n += eps.count
        self.ep_ret += eps.return_sum
        self.ep_len += eps.length_sum

    def scalars(self, now: float, steps: int, stats, workers: dict, recent: deque, frames_per_step: int,
                rates: bool = True) -> dict:
        """The interval's means; ``rates`` False leaves out per-second rates and time shares."""
        dt, n, nb = max(1e-9, now - self.t0), max(1, self.n), max(1, stats.batches - self.batches)
        thread_s = dt * max(1, workers["threads"])
        sps = (steps - self.steps) / dt
        # The one read of the device-side sums per logging interval.
        values = {f"losses/{key}": float(v) / n for key, v in self.acc.items() if key != "policy_lag"}
        values.update({(key if key.startswith("update_ratio/") else f"losses/{key}"): v
                       for key, v in (self.diag or {}).items()})
        values.update({
            "charts/episode_return": self.ep_ret / self.ep_n if self.ep_n else None,
            "charts/episode_length": self.ep_len / self.ep_n if self.ep_n else None,
            "charts/return_mean20": float(np.mean(recent)) if len(recent) == recent.maxlen else None,
        })
        if not rates:
            return values
        values.update({
            "charts/steps_per_s": sps,
            "charts/frames_per_s": sps * frames_per_step,
            "charts/replay_ratio": self.rows_learned / max(1, steps - self.steps),
            "perf/inference_batch_size": (stats.batch_envs - self.batch_envs) / nb,
            "perf/inference_forward_ms": (stats.forward_s - self.forward_s) / nb * 1e3,
            "perf/batch_collect_ms": float(np.median(stats.collect_s)) * 1e3 if stats.collect_s else None,
            "perf/worker_wait_share": (workers["wait_s"] - self.workers["wait_s"]) / thread_s,
            "perf/worker_env_share": (workers["env_s"] - self.workers["env_s"]) / thread_s,
            "perf/learner_wait_share": self.wait_s / max(1e-9, self.wait_s + self.learn_s),
            "perf/policy_lag": float(self.acc.get("policy_lag", 0.0)) / n,
            "perf/worker_restarts": stats.restarts,
        })
        return values
