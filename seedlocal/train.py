"""``seedlocal train vtrace``: IMPALA on the SEED-style pipeline.

One process holds the model. Its inference thread serves the env workers
with the learner's own parameters (a ``WeightLock`` orders only the
optimiser's write against its reads); its main thread turns finished unrolls
into V-trace updates. Unrolls go from
shared memory to the device in one copy per field and go back to the free
pool at once, so actors never wait on the learner's arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from seedlocal import checkpoint
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.errors import ConfigError
from seedlocal.config import (BridgeConfig, EnvConfig, PipelineConfig, RunOptions, check_network_fits, fail,
                              num_groups, resolve_device, resume_line, validate_bridge, validate_env,
                              validate_pipeline, validate_run_options)
from seedlocal.arithmetic import apply_precision, resolve_precision
from seedlocal.networks import ActorCritic, obs_identity
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.monitor import RunMonitor, closing_line, nothing_stepped
from seedlocal.pipeline.batches import Batcher, Prefetcher
from seedlocal.pipeline.bridge_server import BridgeMeter
from seedlocal.pipeline.inference import InferenceThread, StallWatch

# Learner statistics measured once per logging interval (see learner_step).
DIAGNOSTICS = ("update_ratio", "advantage_std", "value_error", "explained_variance")


@dataclass
class VTraceRun(RunOptions):
    env: EnvConfig = field(default_factory=EnvConfig)
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=8, unroll_length=16, min_batch_envs=4))
    algo: VTraceParams = field(default_factory=VTraceParams)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)


PRESETS: dict[str, VTraceRun] = {
    "cartpole": VTraceRun(),
    # Sized for a workstation's data rate, not a cluster's (docs/tuning.md):
    # small batches and many updates, a mean loss with Adam, orthogonal init,
    # on envpool's v5 preprocessing (84x84 gray, 4-frame stack).
    "atari": VTraceRun(
        env=EnvConfig(id="Pong-v5"),
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, unroll_length=64),
        algo=VTraceParams(batch_size=16, echo=4, minibatches=4, clip=0.1, normalize_advantages=True,
                          learning_rate=2.5e-4, optimizer="adam", optimizer_eps=1e-5, lam=0.95,
                          entropy_cost=0.01, reward_clip=1.0, max_grad_norm=0.5, encoder="nature",
                          separate_critic=False, init="orthogonal"),
        total_steps=2_500_000,
    ),
}


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
    a = cfg.algo
    return {"algo": "vtrace", "env_id": spec.env_id, "num_actions": spec.num_actions,
            **obs_identity(spec),
            "encoder": a.encoder, "hidden": list(a.hidden), "lstm_size": a.lstm_size,
            "separate_critic": a.separate_critic}


def build_model(cfg: VTraceRun, spec) -> ActorCritic:
    a = cfg.algo
    return ActorCritic(spec, encoder=a.encoder, hidden=tuple(a.hidden), lstm_size=a.lstm_size,
                       separate_critic=a.separate_critic, init=a.init)


def validate(cfg: VTraceRun):
    validate_run_options(cfg)
    validate_pipeline(cfg.pipeline, remote_envs=cfg.bridge.remote_envs if cfg.bridge.listen else 0)
    validate_bridge(cfg.bridge, cfg.pipeline)
    spec = validate_env(cfg.env)
    a, p = cfg.algo, cfg.pipeline
    if spec.num_actions is None:
        fail("env.id", cfg.env.id, "V-trace here needs a Discrete action space")
    group = p.envs_per_worker // 2
    if a.batch_size < 1 or a.batch_size % group:
        fail("algo.batch_size", a.batch_size, f"must be a positive multiple of the envs per group ({group}, half "
             f"of pipeline.envs_per_worker={p.envs_per_worker}): change one or the other")
    k = a.batch_size // group
    groups = num_groups(cfg.pipeline, cfg.bridge)
    if p.num_buffers and p.num_buffers < max(groups, k):
        fail("pipeline.num_buffers", p.num_buffers,
             f"needs one unroll per group ({groups}) and at least a batch ({k})")
    if a.precision not in ("auto", "fp32", "tf32", "bf16"):
        fail("algo.precision", a.precision, "expected auto, fp32, tf32 or bf16")
    if a.echo < 1:
        fail("algo.echo", a.echo, "must be >= 1 (updates each batch of unrolls takes part in)")
    if a.minibatches < 1:
        fail("algo.minibatches", a.minibatches, "must be >= 1 (updates per pass over a batch)")
    if a.lstm_size and a.minibatches > a.batch_size:
        fail("algo.minibatches", a.minibatches,
             f"with an LSTM a minibatch holds whole unrolls: at most algo.batch_size ({a.batch_size})")
    if a.minibatches > a.batch_size * p.unroll_length:
        fail("algo.minibatches", a.minibatches, f"more than the {a.batch_size * p.unroll_length} rows of a batch")
    if a.sync not in ("auto", "on", "off"):
        fail("algo.sync", a.sync, "expected on or off")
    if not 0 <= a.clip < 1:
        fail("algo.clip", a.clip, "must be in [0, 1) (0 = IMPALA's policy gradient)")
    for name in ("learning_rate", "optimizer_eps", "rho_bar", "c_bar"):
        if getattr(a, name) <= 0:
            fail(f"algo.{name}", getattr(a, name), "must be positive")
    if not 0 <= a.discount <= 1:
        fail("algo.discount", a.discount, "must be in [0, 1]")
    if not 0 <= a.lam <= 1:
        fail("algo.lam", a.lam, "must be in [0, 1]")
    for name in ("entropy_cost", "baseline_cost", "reward_clip", "max_grad_norm", "lstm_size"):
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
        check_network_fits(lambda: build_model(cfg, spec), 5, "algo.hidden, algo.lstm_size",
                           "its weights, gradients, Adam state and the actors' copy")
    except ValueError as e:
        named = str(e).startswith(("encoder=", "separate_critic", "hidden="))
        raise ConfigError(f"algo.{e}" if named else str(e)) from None
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


def _run_dir(cfg: VTraceRun) -> tuple[Path, dict | None]:
    if cfg.resume:
        state = checkpoint.load(cfg.resume)
        return checkpoint.run_dir_of(state["path"]), state
    name = cfg.run_name or f"{cfg.env.id.replace('/', '_').replace(':', '.')}__vtrace__{cfg.env.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
    return checkpoint.new_run_dir(cfg.log_dir, name), None


def train(cfg: VTraceRun) -> dict:
    """Train until a budget ends; returns a summary (also on Ctrl-C, re-raised after saving)."""
    spec = validate(cfg)
    device = resolve_device(cfg.pipeline.device)
    torch.manual_seed(cfg.env.seed)
    run_dir, resumed = _run_dir(cfg)
    ident = identity(cfg, spec)
    model = build_model(cfg, spec).to(device)
    optimizer = make_optimizer(model.parameters(), cfg.algo)
    counters = {"steps": 0, "updates": 0, "episodes": 0}
    # Minibatch order: one seeded CPU generator on every device (learner_step).
    shuffle = torch.Generator().manual_seed(cfg.env.seed)
    if resumed is not None:
        print(resume_line(resumed.get("config"), cfg, resumed["path"]), flush=True)
        checkpoint.check_compatible(resumed, ident, needs=("model", "optimizer", "counters"))
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        counters.update(resumed["counters"])
        if "shuffle" in resumed:  # checkpoints before it continue from the seed
            shuffle.set_state(resumed["shuffle"])
    precision = resolve_precision(cfg.algo.precision, model.kind, device)
    apply_precision(precision, device)
    sync = actors_wait(cfg.algo)
    checkpoint.make_run_dir(run_dir)
    monitor = RunMonitor(run_dir, purge_step=counters["steps"] + 1 if resumed else None, progress=cfg.progress)
    monitor.text("config", "```\n" + json.dumps(dataclasses.asdict(cfg), indent=2) + "\n```", counters["steps"])
    print(f"seedlocal: training V-trace on {spec.env_id} ({model.kind} torso{f' + LSTM {cfg.algo.lstm_size}' if cfg.algo.lstm_size else ''}, {precision} on {device}, "
          f"{'actors wait for each update, algo.sync on' if sync else 'acting overlaps learning, algo.sync off'}); "
          f"TensorBoard: tensorboard --logdir {cfg.log_dir} (run {run_dir})", flush=True)

    lock = WeightLock(device)
    policy = ModelPolicy(model, spec, lock, precision=precision, cuda_graphs=cfg.pipeline.cuda_graphs)
    group = cfg.pipeline.envs_per_worker // 2
    k = cfg.algo.batch_size // group
    pipe_cfg = dataclasses.replace(cfg.pipeline)
    if not pipe_cfg.num_buffers:
        # One unroll per group, and at least a batch: while the learner works
        # on a batch, actors fill the next one (or, with algo.sync, wait),
        # no more, so the policy lag stays about one batch of updates.
        pipe_cfg.num_buffers = max(num_groups(pipe_cfg, cfg.bridge), k)
    frames_per_step = spec.frames_per_step
    recent: deque[float] = deque(maxlen=20)
    summary = {"status": "done", "run_dir": str(run_dir), "steps_to_target": None}
    state = {"saved": time.monotonic()}

    def save() -> None:
        checkpoint.save(run_dir, {
            "identity": ident, "config": dataclasses.asdict(cfg), "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "counters": dict(counters), "shuffle": shuffle.get_state(),
        }, counters["steps"], counters["steps"] * frames_per_step, keep=cfg.keep_checkpoints)
        state["saved"] = time.monotonic()

    from seedlocal.pipeline.pipeline import Pipeline

    steps0 = counters["steps"]
    rows_per_batch = cfg.algo.batch_size * cfg.pipeline.unroll_length
    torch.set_num_threads(cfg.pipeline.learner_threads or os.cpu_count() or 1)
    with monitor, Pipeline(cfg.env, pipe_cfg, lambda s, d: policy, consume=True, spec=spec, bridge=cfg.bridge) as pipe:
        loop, store = pipe.loop, pipe.store
        obs_keys = pipe.layout.obs_keys()
        runner = InferenceThread(loop)
        runner.start()
        # Actors wait for the learner (sync) by getting their unrolls back only after its update.
        # A synchronous learner holds one batch at a time: one set is enough.
        prefetch = Prefetcher(loop, Batcher(store, obs_keys, k, device, sets=1 if sync else 2),
                              release_early=not sync)
        if not sync:
            prefetch.start()
        t_start = time.monotonic()
        meter = BridgeMeter(pipe.pool.control) if pipe.pool.num_remote_groups else None
        watch = StallWatch(loop)
        t_said = 0.0
        iv = _Interval(steps0, loop.stats, pipe.pool.worker_stats())
        lr = cfg.algo.learning_rate

        def bump_version() -> None:
            loop.version += 1

        def log(now: float, last: bool = False) -> None:
            """Scalars and the progress line for the interval since the last
            call; ``last``: the run's final, partial interval (scalars only,
            and no rates from a fraction of an interval)."""
            step_now, workers = steps0 + loop.stats.env_steps, pipe.pool.worker_stats()
            rates = not last or now - iv.t0 >= cfg.log_every_s / 4
            values = iv.scalars(now, step_now, loop.stats, workers, recent, frames_per_step, rates)
            values.update({"charts/episodes": counters["episodes"], "charts/learning_rate": lr})
            if meter is not None and rates:
                values.update(meter.scalars())
            iv.restart(now, step_now, loop.stats, workers)  # first: an interval is written once, whatever follows
            monitor.scalars(step_now, values)
            if not last:
                ret = f"{np.mean(recent):7.1f}" if recent else "      -"
                monitor.progress(
                    f"steps {step_now:>10,d}  frames/s {values['charts/frames_per_s']:>9,.0f}  "
                    f"return(20) {ret}  updates {counters['updates']:,d}  "
                    f"loss {values['losses/total_loss']:.3f}  entropy {values['losses/entropy']:.2f}")

        failure = None
        try:
            while True:
                counters["steps"] = steps0 + loop.stats.env_steps
                elapsed = time.monotonic() - t_start
                if cfg.total_steps and counters["steps"] >= cfg.total_steps:
                    summary["stopped_by"] = "steps"
                    break
                if cfg.seconds and elapsed >= cfg.seconds:
                    summary["stopped_by"] = "seconds"
                    break
                if cfg.stop_at_return and len(recent) == recent.maxlen and np.mean(recent) >= cfg.stop_at_return:
                    summary["stopped_by"] = "target"
                    break
                # -- wait for a batch of unrolls (gathered a batch ahead unless actors wait for the learner)
                t0 = time.monotonic()
                watch.start()
                while (fetched := prefetch.next(timeout=0.5)) is None:
                    runner.check()
                    if meter is not None and time.monotonic() - t0 > 10 and time.monotonic() - t_said > 10:
                        t_said = time.monotonic()
                        line = meter.waiting_line(pipe.pool.num_remote_groups)
                        if line:
                            print(line, flush=True)
                    watch.poll()  # says so if the envs stopped stepping
                    if cfg.seconds and time.monotonic() - t_start >= cfg.seconds:
                        break  # the budget ends while waiting (e.g. a hung env)
                if fetched is None:
                    summary["stopped_by"] = "seconds"
                    break
                t1 = time.monotonic()
                if not iv.begun:
                    iv.begin(t1, steps0 + loop.stats.env_steps, pipe.pool.worker_stats())
                else:
                    iv.wait_s += t1 - t0
                batch = prefetch.batcher.use(fetched)
                # -- one update
                lr = cfg.algo.learning_rate
                if cfg.algo.lr_decay and cfg.total_steps:
                    lr *= max(0.0, 1.0 - counters["steps"] / cfg.total_steps)
                for g in optimizer.param_groups:
                    g["lr"] = lr
                acted_version = float(batch["policy_version"].mean())
                version0 = loop.version
                stats = learner_step(model, optimizer, batch, cfg.algo, step_lock=lock, diagnose=iv.diag is None,
                                     precision=precision, after_update=bump_version, shuffle=shuffle)
                if iv.diag is None:  # once per logging interval: it copies the weights
                    iv.diag = {key: stats.pop(key) for key in list(stats) if key.startswith(DIAGNOSTICS)}
                n_updates = stats.pop("updates")
                counters["updates"] += n_updates
                # Updates between acting and learning, averaged over this batch's updates.
                stats["policy_lag"] = version0 + (n_updates - 1) / 2 - acted_version
                iv.add(stats, rows_per_batch * cfg.algo.echo)
                prefetch.done(fetched)
                iv.learn_s += time.monotonic() - t1
                # -- episodes, logging, checkpoints
                eps = loop.stats.episodes.take()
                counters["episodes"] += eps.count
                recent.extend(r for r, _ in eps.recent[-recent.maxlen:])
                iv.add_episodes(eps)
                if (cfg.stop_at_return and summary["steps_to_target"] is None and len(recent) == recent.maxlen
                        and np.mean(recent) >= cfg.stop_at_return):
                    summary["steps_to_target"] = steps0 + loop.stats.env_steps
                now = time.monotonic()
                if now - iv.t0 >= cfg.log_every_s:
                    watch.poll()  # names a worker stuck while the others keep the run going
                    log(now)
                if now - state["saved"] >= cfg.checkpoint_every_min * 60:
                    save()
        except BaseException as e:
            summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt | SystemExit) else "error"
            failure = e
            raise
        finally:
            prefetch.stop()
            runner.stop()
            counters["steps"] = steps0 + loop.stats.env_steps
            eps = loop.stats.episodes.take()
            counters["episodes"] += eps.count
            recent.extend(r for r, _ in eps.recent[-recent.maxlen:])
            iv.add_episodes(eps)
            checkpoint.finish_run(
                run_dir, summary, failure,
                last_log=(lambda: log(time.monotonic(), last=True)) if iv.n else None,  # the curve's last point
                save=save if counters["steps"] or resumed is not None else None,
                results=lambda: {
                    "algo": "vtrace", "env": spec.env_id, "steps": counters["steps"],
                    "frames": counters["steps"] * frames_per_step, "updates": counters["updates"],
                    "episodes": counters["episodes"],
                    "mean_return_last20": float(np.mean(recent)) if recent else None,
                    "frames_to_target": (summary["steps_to_target"] * frames_per_step
                                         if summary["steps_to_target"] is not None else None),
                    "seconds": round(time.monotonic() - t_start, 2), "checkpoint": checkpoint.newest(run_dir),
                })
    ret = summary["mean_return_last20"]
    idle = (f" (the budget ended before a first batch of algo.batch_size x pipeline.unroll_length = "
            f"{rows_per_batch:,d} steps was learned from)") if summary["steps"] and not summary["updates"] else ""
    print(closing_line(summary, f"{summary['steps']:,d} steps, {summary['updates']:,d} updates{idle}, mean return "
                                f"(last 20) {'-' if ret is None else f'{ret:.1f}'}",
                       None if summary["steps"] else nothing_stepped(cfg)), flush=True)
    return summary
