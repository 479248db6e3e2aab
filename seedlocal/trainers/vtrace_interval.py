"""What V-trace's trainers share besides the run's skeleton (``trainers/vtrace.py``, ``trainers/population.py``):
the learning rhythm, the batches as the learner takes them, and one logging interval's accumulated losses,
episodes and rates."""

from __future__ import annotations

import abc
import time
from collections import deque

import numpy as np

from seedlocal.algos.frames import UnrollStacks, stacking
from seedlocal.algos.vtrace import VTraceParams
from seedlocal.dtypes import torch_dtype
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.ranks import Solo
from seedlocal.prepare import Prepared
from seedlocal.trainers.run import Run, StepTrainer

# Learner statistics measured once per logging interval (see learner_step).
DIAGNOSTICS = ("update_ratio", "advantage_std", "value_error", "explained_variance")


def actors_wait(a: VTraceParams) -> bool:
    """The learning rhythm: whether actors wait while the learner works on a batch. The same on every device unless
    asked (``algo.sync off``): the presets were tuned in it (PPO clip against mu, echo x minibatches passes), and
    running ahead (~23 updates of policy lag, docs/tuning.md) starts many rows outside the clip range, where they
    give no gradient. A GPU that chose the other rhythm by itself would run another algorithm."""
    return a.sync != "off"


class Interval:
    """What one logging interval accumulates (device-side loss sums, episodes, learner time) and its scalars."""

    def __init__(self, steps: int, stats, workers: dict):
        self.restart(time.monotonic(), steps, stats, workers)
        self.begun = False

    def begin(self, t0: float, workers: dict) -> None:
        """Step rates from ``t0`` on, the first actions served, so the workers' start-up is no slow first point
        while the first unroll's acting counts (from its arrival, a first update the actors waited for read 0
        steps/s); the workers' time shares from now, the first batch's arrival."""
        self.t0, self.workers, self.begun = t0, workers, True

    def restart(self, now: float, steps: int, stats, workers: dict) -> None:
        self.t0, self.steps, self.workers = now, steps, workers
        self.wait_s = self.learn_s = 0.0
        self.acc: dict = {}
        self.n = self.rows_learned = 0
        self.diag = None  # the learner's diagnostics (DIAGNOSTICS), once measured
        self.ep_n, self.ep_ret, self.ep_len = 0, 0.0, 0
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
        values = {
            **{f"losses/{key}": float(v) / n for key, v in self.acc.items() if key != "policy_lag"},
            **{(k if k.startswith("update_ratio/") else f"losses/{k}"): v for k, v in (self.diag or {}).items()},
            "charts/episode_return": self.ep_ret / self.ep_n if self.ep_n else None,
            "charts/episode_length": self.ep_len / self.ep_n if self.ep_n else None,
            "charts/return_mean20": float(np.mean(recent)) if len(recent) == recent.maxlen else None,
        }
        if rates:
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


class VTraceLearning(StepTrainer):
    """A V-trace trainer's parts that one learner and a population of them share: the rhythm (``sync``), the
    weight lock, the learner's frame stacks, the last 20 episodes' returns and the logging interval."""

    def __init__(self, prepared: Prepared, device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        self.sync, self.lock = actors_wait(self.cfg.algo), WeightLock(device)
        self.frame_stack = stacking(self.spec, self.cfg.frame_stack)
        self.stacks = None  # the learner's frame stacks (start), where the env sends single frames
        self.recent: deque[float] = deque(maxlen=20)
        self.iv: Interval | None = None  # once the pipeline runs (start)

    def start(self, run: Run) -> None:
        self._loop = run.loop  # whose policy version each optimiser step moves on (``_bump_version``)
        if self.frame_stack > 1:
            frame = self.spec.obs[""]
            self.stacks = UnrollStacks(self.frame_stack, self.shape.num_envs, self.shape.envs_per_group,
                                       frame.shape[1:], torch_dtype(frame.dtype), self.device)
        self.iv = Interval(self.counters["steps"], run.loop.stats, run.pipe.pool.worker_stats())
        super().start(run)  # last: a started trainer (``settle``) has its interval

    def _waited(self, run: Run, t0: float) -> float:
        """Now, a batch having come after a wait since ``t0``: the first begins the interval's rates (``begin``)."""
        t1 = time.monotonic()
        if not self.iv.begun:
            self.iv.begin(run.loop.stats.first_batch_at or t1, run.pipe.pool.worker_stats())
        else:
            self.iv.wait_s += t1 - t0
        return t1

    def _take_batch(self, batcher, fetched, optimizer, params: VTraceParams, steps: int,
                    total: float) -> tuple[dict, float]:
        """A batch as the learner takes it (frames stacked), and the learning rate set for it: ``params``', with
        ``lr_decay`` decayed linearly to 0 at ``total`` steps (``steps`` done)."""
        batch = batcher.use(fetched)
        if self.stacks is not None:
            frames = self.stacks(batch["obs"][""], batch["ignored"], fetched.groups, fetched.epochs)
            batch = {**batch, "obs": {**batch["obs"], "": frames}}
        lr = params.learning_rate
        if params.lr_decay and total:
            lr *= max(0.0, 1.0 - steps / total)
        for g in optimizer.param_groups:
            g["lr"] = lr
        return batch, lr

    def _bump_version(self) -> None:
        """``learner_step``'s ``after_update``: the policy the actors act with is one update newer."""
        self._loop.version += 1

    def _learned(self, stats: dict, n_updates: int, version0: int, acted_version: float, echo: int) -> None:
        """An update's statistics into the interval: the policy lag is the updates between acting and learning,
        averaged over the batch's ``n_updates``."""
        stats["policy_lag"] = version0 + (n_updates - 1) / 2 - acted_version
        self.iv.add(stats, self.rows_per_batch * echo)

    def log(self, run: Run, now: float, last: bool = False) -> None:
        step_now, workers, iv = self._steps(run), run.pipe.pool.worker_stats(), self.iv
        rates = not last or now - iv.t0 >= self.cfg.log_every_s / 4  # no rates from a fraction of an interval
        values = {**iv.scalars(now, step_now, run.loop.stats, workers, self.recent, self.frames_per_step, rates),
                  "charts/episodes": self.counters["episodes"], **self._scalars(run, step_now)}
        iv.restart(now, step_now, run.loop.stats, workers)  # first: an interval is written once, whatever follows
        run.scalars(step_now, values, rates)
        if not last:
            run.monitor.progress(self._progress(step_now, values))

    def _scalars(self, run: Run, step_now: int) -> dict:
        """The trainer's scalars besides the interval's."""
        return {}

    @abc.abstractmethod
    def _progress(self, step_now: int, values: dict) -> str:
        """The progress line, from the scalars just written."""

    def has_last_log(self) -> bool:
        # Episodes that end after the last update (the ones that reach --stop-at-return among them) belong on the
        # curve too.
        return super().has_last_log() or (self.iv is not None and (self.iv.n > 0 or self.iv.ep_n > 0))
