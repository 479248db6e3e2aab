"""``seedlocal train vtrace``: IMPALA on the SEED-style pipeline.

One process holds the model. Its inference thread serves the env workers
with the learner's own parameters (a ``WeightLock`` orders only the
optimiser's write against its reads); its main thread turns batches of
finished unrolls into V-trace updates (``algos/vtrace.py``). Unrolls go
from shared memory to the device in one copy per field (``Batcher``); by
default actors wait while the learner works on a batch (``actors_wait``).
The run's life around this is ``trainers/run.py``'s.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from seedlocal.algos.frames import UnrollStacks, net_spec, stack_problem, stacking
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.arithmetic import apply_precision, resolve_precision
from seedlocal.config.machine import Machine
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig, StepRunConfig
from seedlocal.config.checks import (check_network_fits, network_error, validate_bridge, validate_pipeline,
                                     validate_run_options)
from seedlocal.dtypes import torch_dtype
from seedlocal.envs.spaces import validate_env
from seedlocal.errors import ConfigError, fail
from seedlocal.monitor import nothing_stepped
from seedlocal.networks import ActorCritic, action_identity, checkpoint_network, encoder_identity, obs_identity
from seedlocal.normalize import RewardScaler
from seedlocal.pipeline.batches import Batcher, Prefetcher
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.shape import ShapeNeeds, pipeline_shape, widened
from seedlocal.trainers.run import (WAIT_S, Family, Run, Trainer, blank, checkpoint_env, env_kind, image_frames,
                                    rebuilding, run)

# Learner statistics measured once per logging interval (see learner_step).
DIAGNOSTICS = ("update_ratio", "advantage_std", "value_error", "explained_variance")


@dataclass
class VTraceRun(StepRunConfig):
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=8, unroll_length=16, min_batch_envs=4))
    algo: VTraceParams = field(default_factory=VTraceParams)

    def fit_to_groups(self, envs_per_group: int) -> VTraceRun:
        """V-trace batches whole groups: the batch rounded up to a multiple of the group size."""
        batch = self.algo.batch_size
        if envs_per_group <= 0 or batch % envs_per_group == 0:
            return self
        return dataclasses.replace(self, algo=dataclasses.replace(self.algo, batch_size=-(-batch // envs_per_group)
                                                                   * envs_per_group))

    def per_rank(self, ranks: int) -> VTraceRun:
        """A rank's batch: algo.batch_size / G unrolls where that is a whole number of its groups (its shape's:
        the run's divided, refused here where it cannot be), so that G ranks' update is the one-process recipe's
        (the same rows per update and per minibatch); else the whole batch on every rank (G x the unrolls per
        update)."""
        group = pipeline_shape(self.pipeline, self.bridge, ranks=ranks).envs_per_group
        if not self.pipeline.num_workers:  # every env remote: its groups' size is the bridge's
            return self
        batch = self.algo.batch_size
        # (An LSTM's minibatches hold whole unrolls: at most a rank's batch of them.)
        share = batch // ranks
        if ranks > 1 and batch % ranks == 0 and share % group == 0 and self.algo.minibatches <= share:
            return dataclasses.replace(self, algo=dataclasses.replace(self.algo, batch_size=share))
        return self

    def sized_for(self, machine: Machine) -> VTraceRun:
        """On a GPU, image frames (Atari, Football) get ``machine.gpu_envs`` envs in workers of 32, a batch of
        every local env (whole groups), minibatches of 16 unrolls, and a constant learning rate over twice the step
        budget: issue 33's H200 run (16 cores: 4 x 32 envs, batch 128, 8 minibatches, constant rate) reached
        +18.1 on Pong at 12.3M frames, past the preset's 10M, where its rate has decayed to 0. MinAtar's
        preset on a GPU lets the actors run ahead (algo.sync off). Everything else, and every CPU run, keeps the
        preset (docs/tuning.md, "Sized to the machine")."""
        if machine.accelerator and self.algo.sync != "off" and env_kind(self.env) == "minatar":
            # Issue 33's rule: actors run ahead on a GPU where that reaches the target in no more frames than
            # sync on (within 10%, mean of 3 seeds). MinAtar Breakout with this preset, 2-core CPU: >= 10 at
            # 0.62 / 0.95 / 0.59M steps against 1.07M / not by 1.9M / 1.30M (docs/tuning.md). Its sizes stay
            # (measured on no GPU). Atari keeps sync on: its clip 0.1 and 4 x 4 passes are unmeasured at a lag.
            return dataclasses.replace(self, algo=dataclasses.replace(self.algo, sync="off"))
        pipeline = widened(self.pipeline, machine.gpu_envs(), GPU_ENVS_PER_WORKER, self.bridge.remote_envs)
        if pipeline == self.pipeline or not image_frames(self.env):
            return self
        # Measured at 16 cores on Atari only (128 envs): other core counts, and Football, are unmeasured on a GPU.
        # The budget is unmeasured too: the H200 run had no step limit (total_steps 0) and was stopped by hand
        # after +19.4 at 16M frames; twice the Atari preset's 2.5M steps (20M frames) covers that, at the rate
        # it ran with (a decay over 5M steps would have halved it by 12.3M frames: never tried).
        batch = pipeline_shape(pipeline).num_local_envs
        algo = dataclasses.replace(self.algo, batch_size=batch, minibatches=max(1, batch // UNROLLS_PER_MINIBATCH),
                                   lr_decay=False)
        return dataclasses.replace(self, pipeline=pipeline, algo=algo, total_steps=2 * self.total_steps)


GPU_ENVS_PER_WORKER = 32  # a sized run's workers (issue 33's H200 run: 4 workers of 32)
UNROLLS_PER_MINIBATCH = 16  # the H200 run's 128 unrolls in 8 minibatches; the 2-core Atari preset's are 4


PRESETS: dict[str, VTraceRun] = {
    "cartpole": VTraceRun(),
    # Sized for a workstation's data rate, not a cluster's (docs/tuning.md):
    # small batches and many updates, a mean loss with Adam, orthogonal init,
    # on envpool's v5 preprocessing (84x84 gray), its 4-frame stack built
    # beside the network from single frames (algos/frames.py, docs/pipeline.md).
    "atari": VTraceRun(
        env=EnvConfig(id="Pong-v5", frame_stack=1), frame_stack=4,
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, unroll_length=64),
        algo=VTraceParams(batch_size=16, echo=4, minibatches=4, clip=0.1, normalize_advantages=True,
                          learning_rate=2.5e-4, optimizer="adam", optimizer_eps=1e-5, lam=0.95,
                          entropy_cost=0.01, reward_clip=1.0, max_grad_norm=0.5, separate_critic=False,
                          init="orthogonal"),
        network=NetworkConfig(encoder="nature"), total_steps=2_500_000,
    ),
    # Small pixel grids (MinAtar's 10 x 10 x C, docs/minatar.md): the one-conv torso and the Atari preset's
    # clipped surrogate on 1,024-step batches, but from more and shorter unrolls (64 envs x 32 steps), in 2
    # passes instead of 4, at a larger step size: the network is tiny, so the CPU learner's cost is per
    # minibatch, not per weight.
    "minatar": VTraceRun(
        env=EnvConfig(id="MinAtar/Breakout-v1"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=32),
        algo=VTraceParams(batch_size=32, echo=2, minibatches=4, clip=0.2, normalize_advantages=True,
                          learning_rate=1e-3, optimizer="adam", optimizer_eps=1e-5, lam=0.95, discount=0.99,
                          entropy_cost=0.01, max_grad_norm=0.5, separate_critic=False, init="orthogonal"),
        network=NetworkConfig(encoder="minatar"), total_steps=5_000_000,
    ),
    # SEED's Google Research Football (docs/football.md) on envpool's gfootball/ ids: one 72 x 96 x 4 minimap
    # (SMM) frame and the scoring reward; the Atari preset's rhythm and Nature CNN, with the longer horizon
    # and smaller entropy bonus of GRF's own PPO scripts (gamma 0.993, entropy 0.003), 19 actions.
    "football": VTraceRun(
        env=EnvConfig(id="gfootball/academy_empty_goal_close-v1"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, unroll_length=32),
        algo=VTraceParams(batch_size=16, echo=4, minibatches=4, clip=0.1, normalize_advantages=True,
                          learning_rate=3.4e-4, optimizer="adam", optimizer_eps=1e-5, lam=0.95, discount=0.993,
                          entropy_cost=0.003, reward_clip=1.0, max_grad_norm=0.5, separate_critic=False,
                          init="orthogonal"),
        network=NetworkConfig(encoder="nature"), total_steps=1_000_000,
    ),
    # Continuous control as SEED's MuJoCo PPO config and "What Matters in On-Policy RL" run it
    # (docs/mujoco.md): separate 2 x 64 tanh MLPs for policy and value, a Gaussian with a state-independent
    # std, observation normalisation, reward scaling, clip 0.2, 10 passes of 32 minibatches over each
    # 2,048-step batch, Adam 3e-4 decayed to 0.
    "mujoco": VTraceRun(
        env=EnvConfig(id="HalfCheetah-v5"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, unroll_length=128),
        algo=VTraceParams(batch_size=16, echo=10, minibatches=32, clip=0.2, normalize_advantages=True,
                          learning_rate=3e-4, optimizer="adam", optimizer_eps=1e-5, lam=0.95, discount=0.99,
                          entropy_cost=0.0, max_grad_norm=0.5, separate_critic=True, init="orthogonal",
                          reward_scale=True, init_std=0.5),
        network=NetworkConfig(obs_norm=True), total_steps=1_000_000,
    ),
}


def preset_for(spec) -> VTraceRun:
    """The preset made for an env's kind (``config.checks.task_kind``): Atari's for images, Football's for
    gfootball's minimaps, MinAtar's for small grids, MuJoCo's for Box actions, else CartPole's."""
    from seedlocal.config.checks import task_kind

    return PRESETS[task_kind(spec)]


def actors_wait(a: VTraceParams) -> bool:
    """The learning rhythm: whether actors wait while the learner works on a
    batch. The same on every device unless asked (``algo.sync off``): the
    presets were tuned in it (PPO clip against mu, echo x minibatches passes),
    and running ahead (~23 updates of policy lag, docs/tuning.md) starts many
    rows outside the clip range, where they give no gradient. A GPU that
    chose the other rhythm by itself would run another algorithm."""
    return a.sync != "off"


def identity(cfg: VTraceRun, spec) -> dict:
    """What a checkpoint must match to be resumed or evaluated with this config."""
    a, n, stack = cfg.algo, cfg.network, stacking(spec, cfg.frame_stack)
    # The frame stacks only where set: checkpoints from before them keep the identity they were saved with.
    stacks = {**({"env_frame_stack": spec.frame_stack} if spec.frame_stack else {}),
              **({"frame_stack": stack} if stack > 1 else {})}
    return {"algo": "vtrace", "env_id": spec.env_id, "num_actions": spec.num_actions,
            **obs_identity(spec), **action_identity(spec), **stacks,
            **encoder_identity(net_spec(spec, stack), n.encoder), "hidden": list(n.hidden), "lstm_size": n.lstm_size,
            "separate_critic": a.separate_critic, **({"obs_norm": True} if n.obs_norm else {}),
            "optimizer": a.optimizer}


def build_model(cfg: VTraceRun, spec) -> ActorCritic:
    a, n = cfg.algo, cfg.network
    return ActorCritic(net_spec(spec, stacking(spec, cfg.frame_stack)), encoder=n.encoder, hidden=tuple(n.hidden),
                       lstm_size=n.lstm_size, separate_critic=a.separate_critic, init=a.init, obs_norm=n.obs_norm,
                       init_std=a.init_std)


def shape_needs(cfg: VTraceRun) -> ShapeNeeds:
    """Batches of whole groups (k unrolls), and one unroll per group, at least a batch: while the learner works
    on a batch, actors fill the next one (or, with algo.sync, wait), no more, so the policy lag stays about one
    batch of updates."""
    return ShapeNeeds(batch_envs=cfg.algo.batch_size, buffers_per_group=1)


def validate(cfg: VTraceRun):
    validate_run_options(cfg)
    validate_pipeline(cfg.pipeline)
    pipeline_shape(cfg.pipeline, cfg.bridge, shape_needs(cfg))
    validate_bridge(cfg.bridge, cfg.pipeline)
    spec = validate_env(cfg.env)
    a, p = cfg.algo, cfg.pipeline
    if (problem := stack_problem(spec, cfg.frame_stack)) is not None:
        fail("frame_stack", cfg.frame_stack, problem)
    if not a.init_std > 0:
        fail("algo.init_std", a.init_std, "must be > 0")
    if a.precision not in ("auto", "fp32", "tf32", "bf16"):
        fail("algo.precision", a.precision, "expected auto, fp32, tf32 or bf16")
    if a.echo < 1:
        fail("algo.echo", a.echo, "must be >= 1 (updates each batch of unrolls takes part in)")
    if a.minibatches < 1:
        fail("algo.minibatches", a.minibatches, "must be >= 1 (updates per pass over a batch)")
    if cfg.network.lstm_size and a.minibatches > a.batch_size:
        fail("algo.minibatches", a.minibatches,
             f"with an LSTM a minibatch holds whole unrolls: at most algo.batch_size ({a.batch_size})")
    if a.minibatches > a.batch_size * p.unroll_length:
        fail("algo.minibatches", a.minibatches, f"more than the {a.batch_size * p.unroll_length} rows of a batch")
    if a.sync not in ("auto", "on", "off"):
        fail("algo.sync", a.sync, "expected on or off")
    if a.proximal not in ("behaviour", "batch"):
        fail("algo.proximal", a.proximal, "expected behaviour or batch")
    if a.proximal == "batch" and a.clip == 0:
        fail("algo.proximal", a.proximal, "keeps the clipped surrogate near the learner's policy: give algo.clip > 0")
    if not 0 <= a.clip < 1:
        fail("algo.clip", a.clip, "must be in [0, 1) (0 = IMPALA's policy gradient)")
    for name in ("learning_rate", "optimizer_eps", "rho_bar", "c_bar"):
        if getattr(a, name) <= 0:
            fail(f"algo.{name}", getattr(a, name), "must be positive")
    if not 0 <= a.discount <= 1:
        fail("algo.discount", a.discount, "must be in [0, 1]")
    if not 0 <= a.lam <= 1:
        fail("algo.lam", a.lam, "must be in [0, 1]")
    for name in ("entropy_cost", "baseline_cost", "reward_clip", "max_grad_norm"):
        if getattr(a, name) < 0:
            fail(f"algo.{name}", getattr(a, name), "must be >= 0")
    if cfg.total_steps < 0 or cfg.seconds < 0:
        fail("total_steps" if cfg.total_steps < 0 else "seconds",
             cfg.total_steps if cfg.total_steps < 0 else cfg.seconds, "must be >= 0")
    if cfg.total_steps == 0 and cfg.seconds == 0:
        fail("total_steps", 0, "with seconds=0 the run would never end; set one budget")
    if not 0 < a.rmsprop_alpha < 1:
        fail("algo.rmsprop_alpha", a.rmsprop_alpha, "must be in (0, 1)")
    try:
        check_network_fits(lambda: build_model(cfg, spec), 5, "network.hidden, network.lstm_size",
                           "its weights, gradients, Adam state and the actors' copy")
    except ValueError as e:
        raise ConfigError(network_error(e, algo=("separate_critic",))) from None
    return spec


class _Interval:
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


class VTraceTrainer(Trainer):
    algo = "vtrace"
    checkpoint_parts = ("model", "optimizer", "counters")
    needs = staticmethod(shape_needs)

    def __init__(self, cfg: VTraceRun, spec, device, ranks: Solo = Solo()):
        super().__init__(cfg, spec, device, ranks)
        a = cfg.algo
        self.model = build_model(cfg, spec).to(device)
        self.optimizer = make_optimizer(self.model.parameters(), a)
        self.counters = {"steps": 0, "updates": 0, "episodes": 0}
        # Minibatch order: one seeded CPU generator on every device (learner_step), each rank's and session's own.
        self.shuffle = torch.Generator().manual_seed(self.stream("shuffle"))
        self.precision = resolve_precision(a.precision, self.model.kind, device)
        apply_precision(self.precision, device)
        self.sync = actors_wait(a)
        self.lock = WeightLock(device)
        self.k = self.shape.unrolls_per_batch  # unrolls per batch
        self.rows_per_batch = a.batch_size * cfg.pipeline.unroll_length
        self.stack = stacking(spec, cfg.frame_stack)
        self.stacks = None  # the learner's frame stacks (start), where the env sends single frames
        self.recent: deque[float] = deque(maxlen=20)
        self.lr = a.learning_rate
        self.prefetch = self.iv = None  # once the pipeline runs (start)
        self.peer_steps = self.local_episodes = 0  # data-parallel ranks: the others' steps, this rank's episodes
        self.local_ep_sums = [0.0, 0.0]  # data-parallel ranks: this rank's episodes' returns and lengths, summed
        self.all_ranks: dict = {}  # data-parallel ranks: every rank's episodes at the last all-reduce (spent)
        self.logged_ranks: tuple = (0, 0.0, 0.0)  # ... and at the last log
        self.logged_mean20 = None  # the ranks' mean of means at the last log
        self.scaler = None
        if a.reward_scale:
            self.scaler = RewardScaler(self.shape.num_envs, a.discount)

    def identity(self) -> dict:
        return identity(self.cfg, self.spec)

    def restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if "shuffle" in saved and self.ranks.rank == 0:  # checkpoints before it continue from the seed
            self.shuffle.set_state(saved["shuffle"])  # rank 0's, saved: another rank draws its own (``stream``)
        elif self.ranks.rank:
            self.shuffle.manual_seed(self.stream("shuffle"))
        if self.scaler is not None and "reward_scaler" in saved:
            self.scaler.load_state_dict(saved["reward_scaler"])

    def state(self) -> dict:
        out = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
               "shuffle": self.shuffle.get_state()}
        if self.scaler is not None:
            out["reward_scaler"] = self.scaler.state_dict()
        return out

    def acting_state(self) -> dict:
        return {"model": self.model.state_dict()}

    def describe(self) -> str:
        lstm = f" + LSTM {self.cfg.network.lstm_size}" if self.cfg.network.lstm_size else ""
        rhythm = "actors wait for each update, algo.sync on" if self.sync else "acting overlaps learning, algo.sync off"
        if self.cfg.algo.proximal == "batch":
            rhythm += "; the clip against the learner's policy at each batch's start, algo.proximal batch"
        stacked = f", {self.stack} frames stacked beside the network" if self.stack > 1 else ""
        return (f"training V-trace on {self.spec.env_id} ({self.model.kind} torso{lstm}{stacked}, {self.precision} "
                f"on {self.device}, {rhythm})")

    def join_ranks(self, ranks) -> None:
        """Data-parallel: every rank starts from rank 0's parameters and observation statistics (a resumed
        run's are equal already; the optimiser's state is too, fresh or loaded from the same checkpoint)."""
        ranks.broadcast_(self.model)

    def _pooled(self):
        """The ranks to reduce over, or None for one process (which then makes no collective call)."""
        return self.ranks if self.ranks.world > 1 else None

    def policy(self):
        return ModelPolicy(self.model, self.spec, self.lock, precision=self.precision,
                           cuda_graphs=self.cfg.pipeline.cuda_graphs, stack=self.stack)

    def learner_threads(self) -> int:
        return self.cfg.pipeline.learner_threads or os.cpu_count() or 1

    def start(self, run: Run) -> None:
        # Actors wait for the learner (sync) by getting their unrolls back only after its update;
        # a synchronous learner holds one batch at a time: one set is enough.
        batcher = Batcher(run.pipe.store, run.pipe.layout.obs_keys(), self.k, self.device, sets=1 if self.sync else 2)
        self.prefetch = Prefetcher(run.loop, batcher, release_early=not self.sync)
        if self.stack > 1:
            frame = self.spec.obs[""]
            self.stacks = UnrollStacks(self.stack, self.shape.num_envs, self.shape.envs_per_group, frame.shape[1:],
                                       torch_dtype(frame.dtype), self.device)
        if not self.sync:
            self.prefetch.start()
        self.steps0, self.episodes0 = self.counters["steps"], self.counters["episodes"]
        self.iv = _Interval(self.steps0, run.loop.stats, run.pipe.pool.worker_stats())

    def _steps(self, run: Run) -> int:
        return self.steps0 + run.loop.stats.env_steps + self.peer_steps

    def _target_met(self) -> bool:
        return bool(self.cfg.stop_at_return) and len(self.recent) == self.recent.maxlen \
            and np.mean(self.recent) >= self.cfg.stop_at_return

    def spent(self, run: Run) -> str | None:
        if self.ranks.world > 1:
            return self._spent_together(run)
        self.counters["steps"] = self._steps(run)
        if self.cfg.total_steps and self.counters["steps"] >= self.cfg.total_steps:
            return "steps"
        if run.out_of_time():
            return "seconds"
        return "target" if self._target_met() else None

    def _spent_together(self, run: Run) -> str | None:
        """``spent`` for data-parallel ranks, decided by all of them in one all-reduce per update: the step
        budget counts every rank's steps, the time budget ends for all when it ends for one, and the target is
        the mean of the ranks' means of their last 20 episodes (once every rank has 20)."""
        full = len(self.recent) == self.recent.maxlen
        local = run.loop.stats.env_steps
        steps, episodes, returns, n_full, late, ret_sum, len_sum = self.ranks.sum(
            [local, self.local_episodes, float(np.mean(self.recent)) if full else 0.0, full, run.out_of_time(),
             *self.local_ep_sums])
        self.all_ranks = {"sums": (episodes, ret_sum, len_sum),
                          "mean20": returns / n_full if n_full == self.ranks.world else None}
        self.peer_steps = int(steps) - local
        # The all-reduced total, not _steps(run): that re-reads this rank's counter, which the inference thread
        # has moved on since, so ranks would judge the budget on different counts and one would stop alone.
        self.counters["steps"], self.counters["episodes"] = self.steps0 + int(steps), self.episodes0 + int(episodes)
        if self.cfg.total_steps and self.counters["steps"] >= self.cfg.total_steps:
            return "steps"
        if late:
            return "seconds"
        target = self.cfg.stop_at_return and n_full == self.ranks.world and returns / n_full >= self.cfg.stop_at_return
        if target and run.summary.get("steps_to_target") is None:
            run.summary["steps_to_target"], run.summary["return_at_target"] = self.counters["steps"], returns / n_full
        return "target" if target else None

    def advance(self, run: Run) -> str | None:
        """Wait for a batch of unrolls (gathered a batch ahead unless actors wait for the learner), learn from it."""
        cfg, iv = self.cfg, self.iv
        t0 = time.monotonic()
        run.watch.start()
        while (fetched := self.prefetch.next(timeout=WAIT_S)) is None:
            if run.waiting(t0):
                return "seconds"  # the budget ends while waiting (e.g. a hung env)
        t1 = time.monotonic()
        if not iv.begun:
            iv.begin(t1, self._steps(run), run.pipe.pool.worker_stats())
        else:
            iv.wait_s += t1 - t0
        batch = self.prefetch.batcher.use(fetched)
        if self.stacks is not None:
            frames = self.stacks(batch["obs"][""], batch["ignored"], fetched.groups, fetched.epochs)
            batch = {**batch, "obs": {**batch["obs"], "": frames}}
        self.lr = cfg.algo.learning_rate
        if cfg.algo.lr_decay and cfg.total_steps:
            self.lr *= max(0.0, 1.0 - self.counters["steps"] / cfg.total_steps)
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr
        acted_version, version0 = float(batch["policy_version"].mean()), run.loop.version
        batch = self._scale_rewards(batch, fetched)

        def bump_version() -> None:
            run.loop.version += 1

        stats = learner_step(self.model, self.optimizer, batch, cfg.algo, step_lock=self.lock,
                             diagnose=iv.diag is None, precision=self.precision, after_update=bump_version,
                             shuffle=self.shuffle, ranks=self._pooled())
        self._update_obs_norm(batch)
        if iv.diag is None:  # once per logging interval: it copies the weights
            iv.diag = {key: stats.pop(key) for key in list(stats) if key.startswith(DIAGNOSTICS)}
        n_updates = stats.pop("updates")
        self.counters["updates"] += n_updates
        # Updates between acting and learning, averaged over this batch's updates.
        stats["policy_lag"] = version0 + (n_updates - 1) / 2 - acted_version
        iv.add(stats, self.rows_per_batch * cfg.algo.echo)
        self.prefetch.done(fetched)
        iv.learn_s += time.monotonic() - t1
        self._take_episodes(run)
        if self.ranks.world == 1 and self._target_met() and run.summary.get("steps_to_target") is None:
            # The mean that met the target: episodes that end while the run stops may move the final one below it.
            run.summary["steps_to_target"] = self._steps(run)
            run.summary["return_at_target"] = float(np.mean(self.recent))
        return None

    def _update_obs_norm(self, batch: dict) -> None:
        """Fold this batch's observations into the statistics, after its updates (under the lock:
        inference reads them). Before them, the learner would recompute pi under other statistics
        than the actors acted with, and pi/mu would leave 1 on the first pass of a sync run."""
        if self.model.obs_norm is not None:
            T = self.cfg.pipeline.unroll_length
            with self.lock:
                pooled = self._pooled()
                self.model.update_obs_norm({k: v[:T] for k, v in batch["obs"].items()},
                                           pool=None if pooled is None else pooled.pool_moments)

    def _scale_rewards(self, batch: dict, fetched) -> dict:
        """The rewards' running scale, from this batch (on its host copy, in time order per env)."""
        T = self.cfg.pipeline.unroll_length
        if self.scaler is None:
            return batch
        host = self.prefetch.batcher.host[fetched.slot]
        E = self.shape.envs_per_group
        env_ids = (np.asarray(fetched.groups)[:, None] * E + np.arange(E)).ravel()
        pooled = self._pooled()
        self.scaler.update(host["reward"][:T], host["terminated"][:T] | host["truncated"][:T], env_ids,
                           ~host["ignored"][:T], pool=None if pooled is None else pooled.pool_moments)
        return {**batch, "reward": self.scaler(batch["reward"])}

    def _take_episodes(self, run: Run) -> None:
        eps = run.loop.stats.episodes.take()
        self.counters["episodes"] += eps.count
        self.local_episodes += eps.count
        self.local_ep_sums[0] += eps.return_sum
        self.local_ep_sums[1] += eps.length_sum
        self.recent.extend(r for r, _ in eps.recent[-self.recent.maxlen:])
        self.iv.add_episodes(eps)

    def log_due(self, run: Run, now: float) -> bool:
        return now - self.iv.t0 >= self.cfg.log_every_s

    def log(self, run: Run, now: float, last: bool = False) -> None:
        step_now, workers, iv = self._steps(run), run.pipe.pool.worker_stats(), self.iv
        rates = not last or now - iv.t0 >= self.cfg.log_every_s / 4  # no rates from a fraction of an interval
        values = iv.scalars(now, step_now, run.loop.stats, workers, self.recent, self.frames_per_step, rates)
        values.update({"charts/episodes": self.counters["episodes"], "charts/learning_rate": self.lr})
        if run.meter is not None and rates:
            values.update(run.meter.scalars())
        if self.ranks.world > 1:
            values.update(self._all_ranks_episodes())
        iv.restart(now, step_now, run.loop.stats, workers)  # first: an interval is written once, whatever follows
        run.monitor.scalars(step_now, values)
        if not last:
            ret = f"{np.mean(self.recent):7.1f}" if self.recent else "      -"
            run.monitor.progress(
                f"steps {step_now:>10,d}  frames/s {values['charts/frames_per_s']:>9,.0f}  return(20) {ret}  "
                f"updates {self.counters['updates']:,d}  loss {values['losses/total_loss']:.3f}  "
                f"entropy {values['losses/entropy']:.2f}")

    def _all_ranks_episodes(self) -> dict:
        """Data-parallel ranks: the episode scalars of every rank's episodes (as of the last all-reduce) since the
        last log, and the mean of the ranks' means of their last 20 (the target's); rank 0 writes them."""
        if not self.all_ranks:
            return {}
        (n, ret, length), (n0, ret0, length0) = self.all_ranks["sums"], self.logged_ranks
        self.logged_ranks, self.logged_mean20 = self.all_ranks["sums"], self.all_ranks["mean20"]
        return {"charts/episode_return": (ret - ret0) / (n - n0) if n > n0 else None,
                "charts/episode_length": (length - length0) / (n - n0) if n > n0 else None,
                "charts/return_mean20": self.all_ranks["mean20"]}

    def has_last_log(self) -> bool:
        # Episodes that end after the last update (the ones that reach --stop-at-return among them) belong on the
        # curve too; and with ranks, an all-reduce after the last log (spent() runs after log()) that moved the
        # ranks' mean of means, which is what stopped a run at its target.
        moved = bool(self.all_ranks) and (self.all_ranks["sums"] != self.logged_ranks
                                           or self.all_ranks["mean20"] != self.logged_mean20)
        return self.iv is not None and (self.iv.n > 0 or self.iv.ep_n > 0 or moved)

    def stop(self, run: Run) -> None:
        if self.prefetch is not None:
            self.prefetch.stop()

    def settle(self, run: Run) -> None:
        if self.iv is not None:
            self.counters["steps"] = self._steps(run)
            self._take_episodes(run)

    def results(self, run: Run) -> dict:
        c, to_target = self.counters, run.summary.get("steps_to_target")
        return {"algo": "vtrace", "env": self.spec.env_id, "steps": c["steps"], "frames": c["steps"] * self.frames_per_step,
                "updates": c["updates"], "episodes": c["episodes"], "steps_to_target": to_target,
                "mean_return_last20": float(np.mean(self.recent)) if self.recent else None,
                "return_at_target": run.summary.get("return_at_target"),
                "frames_to_target": to_target * self.frames_per_step if to_target is not None else None}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        ret = summary["mean_return_last20"]
        idle = (f" (the budget ended before a first batch of algo.batch_size x pipeline.unroll_length = "
                f"{self.rows_per_batch:,d} steps was learned from)") if summary["steps"] and not summary["updates"] else ""
        return (f"{summary['steps']:,d} steps, {summary['updates']:,d} updates{idle}, mean return (last 20) "
                f"{'-' if ret is None else f'{ret:.1f}'}", None if summary["steps"] else nothing_stepped(self.cfg))


def train(cfg: VTraceRun) -> dict:
    """Train until a budget ends; returns a summary (also on Ctrl-C, re-raised after saving)."""
    return run(VTraceTrainer, cfg, validate(cfg), from_checkpoint)


def from_checkpoint(state: dict, device: torch.device, greedy: bool | None = None, epsilon: float = 0.0) -> ModelPolicy:
    """A checkpoint's network acting as training's inference serves it: sampling (``greedy`` None, as trained,
    or False), or its distribution's mode (True). ``epsilon`` is R2D2's; V-trace acts without it. The network
    is sized by the checkpoint's identity, as it was saved."""
    ident = state.get("identity", {})
    spec = checkpoint_env(state)
    stack = int(ident.get("frame_stack", 1))
    with rebuilding(state):
        cfg = VTraceRun(network=checkpoint_network(ident, net_spec(spec, stack)), frame_stack=stack,
                        algo=VTraceParams(separate_critic=ident.get("separate_critic", False)))
        model = blank(lambda: build_model(cfg, spec))
        model.load_state_dict(state["model"])
    return ModelPolicy(model.to(device).eval(), spec, greedy=bool(greedy), stack=stack)


FAMILIES = (Family("vtrace", VTraceRun, PRESETS, train, from_checkpoint, data_parallel=True),)
