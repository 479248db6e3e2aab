"""``seedlocal train ga|es|random-search``: neuroevolution on the pipeline.

The learner thread asks the algorithm for a population, posts it to the
``PopulationPolicy`` (a work queue of member x episode jobs served by the
inference thread in batched forward passes), waits for every return, tells
the algorithm, logs and checkpoints, once per generation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from seedlocal import checkpoint
from seedlocal.algos import es, ga, random_search
from seedlocal.algos.neuroevo import NOISE_TABLE_SEED, ParamSpace
from seedlocal.errors import ConfigError
from seedlocal.config import (BridgeConfig, EnvConfig, PipelineConfig, check_network_fits, fail, num_groups,
                              resolve_device, resume_line, validate_bridge, validate_env, validate_pipeline,
                              validate_run_options)
from seedlocal.networks import PolicyNet, obs_identity
from seedlocal.monitor import RunMonitor, closing_line
from seedlocal.pipeline.bridge_server import BridgeMeter
from seedlocal.pipeline.inference import InferenceThread, StallWatch
from seedlocal.policies.population import PopulationPolicy


def _pipeline_default() -> PipelineConfig:
    # Slots are scratch here (no learner reads them): short unrolls, few buffers.
    return PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=8)


@dataclass
class NeuroevoRun:
    env: EnvConfig = field(default_factory=EnvConfig)
    pipeline: PipelineConfig = field(default_factory=_pipeline_default)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    generations: int = 100
    """generations to run (0 = until another budget ends)"""
    total_frames: int = 0
    """emulator frames to spend (0 = no frame budget)"""
    seconds: float = 0.0
    """wall-clock budget (0 = none)"""
    stop_at_return: float = 0.0
    """stop once the best member's mean return over its evaluation episodes reaches this (0 = never)"""
    episodes_per_member: int = 1
    """episodes averaged into each member's fitness"""
    best_episodes: int = 5
    """episodes that score the best member each generation (ES centre, random-search winner)"""
    encoder: str = "auto"
    """network torso: auto (Nature CNN for images, else MLP), mlp, nature, impala"""
    hidden: tuple[int, ...] = (64, 64)
    """MLP hidden sizes"""
    greedy: bool = True
    """act by argmax (the deep-GA convention) rather than sampling"""
    forward: str = "auto"
    """population forward: auto (times the others on the first batches and keeps the fastest);
    MLPs: bmm, mulsum, vmap; CNNs: vmap, loop"""
    run_name: str = ""
    """folder under log_dir (default: <env>__<algo>__<seed>__<date-time>)"""
    log_dir: str = "runs"
    """where runs are written"""
    keep_checkpoints: int = 3
    """newest checkpoints kept (one is written every generation; 0 = all)"""
    resume: str = ""
    """run directory or checkpoint to continue"""
    progress: bool = True
    """a line per generation on the terminal"""


@dataclass
class GARun(NeuroevoRun):
    algo: ga.GAParams = field(default_factory=ga.GAParams)


@dataclass
class ESRun(NeuroevoRun):
    algo: es.ESParams = field(default_factory=es.ESParams)


@dataclass
class RandomSearchRun(NeuroevoRun):
    algo: random_search.RSParams = field(default_factory=random_search.RSParams)


ALGOS = {"ga": GARun, "es": ESRun, "random-search": RandomSearchRun}


def _algo_name(cfg: NeuroevoRun) -> str:
    return {GARun: "ga", ESRun: "es", RandomSearchRun: "random-search"}[type(cfg)]


def validate(cfg: NeuroevoRun):
    validate_run_options(cfg)
    validate_pipeline(cfg.pipeline, remote_envs=cfg.bridge.remote_envs if cfg.bridge.listen else 0)
    if cfg.pipeline.cuda_graphs:
        fail("pipeline.cuda_graphs", True, "population evaluation does not use it (its batches change members every step)")
    validate_bridge(cfg.bridge, cfg.pipeline)
    spec = validate_env(cfg.env)
    {"ga": ga, "es": es, "random-search": random_search}[_algo_name(cfg)].validate(cfg.algo)
    for name in ("generations", "total_frames"):
        if getattr(cfg, name) < 0:
            fail(name, getattr(cfg, name), "must be >= 0")
    if cfg.seconds < 0:
        fail("seconds", cfg.seconds, "must be >= 0")
    if not (cfg.generations or cfg.total_frames or cfg.seconds):
        fail("generations", 0, "with no frame or time budget the run would never end")
    for name in ("episodes_per_member", "best_episodes"):
        if getattr(cfg, name) < 1:
            fail(name, getattr(cfg, name), "must be positive")
    try:
        # The population's vectors and one row per env slot, at least.
        copies = cfg.algo.population_size + cfg.pipeline.num_workers * cfg.pipeline.envs_per_worker + cfg.bridge.remote_envs
        net = check_network_fits(lambda: PolicyNet(spec, cfg.encoder, tuple(cfg.hidden)), copies,
                                 "hidden", f"{copies:,} copies (the population's vectors and one per env slot)")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    forwards = ("auto", "bmm", "mulsum", "vmap") if net.kind == "mlp" else ("auto", "vmap", "loop")
    if cfg.forward not in forwards:
        fail("forward", cfg.forward, f"expected one of {', '.join(forwards)} for a {net.kind} network")
    return spec


def identity(cfg: NeuroevoRun, spec) -> dict:
    return {"algo": _algo_name(cfg), "env_id": spec.env_id, "num_actions": spec.num_actions,
            **obs_identity(spec), "network": "policy",
            "encoder": cfg.encoder, "hidden": list(cfg.hidden),
            # Genomes name slices of this table: vectors rebuilt from another would differ.
            "noise": f"table seed {NOISE_TABLE_SEED:#x}"}


class _Evolver:
    """One algorithm behind one interface: ``generation(pool) -> stats``.

    ``pool`` is the ``PopulationPolicy``: jobs run asynchronously, so each
    generation overlaps what it can. ES scores its centre in the slots its
    population leaves free and starts the next population before it waits
    for that score; GA starts the next generation's children (they depend only
    on this generation's fitness) beside the elite candidates' re-evaluation,
    and random search its next population beside the winner's. A run that
    stops (or resumes) just re-evaluates the population in its state.
    """

    def __init__(self, cfg: NeuroevoRun, space: ParamSpace):
        self.cfg, self.space, self.name = cfg, space, _algo_name(cfg)
        self.best_params: torch.Tensor | None = None
        self.best_return = -math.inf
        seed = cfg.env.seed
        if self.name == "ga":
            self.state = ga.init(cfg.algo, seed)
        elif self.name == "es":
            self.state = es.init(space.init(seed), seed)
        else:
            self.state = random_search.init(seed)
        self._cache: dict[tuple, torch.Tensor] = {}
        self._next = None  # the next population's job, already playing (GA: without its elite)

    def state_dict(self) -> dict:
        return self.state if isinstance(self.state, dict) else dataclasses.asdict(self.state)

    def restore(self, d: dict) -> None:
        cls = {"ga": ga.GAState, "es": es.ESState, "random-search": random_search.RSState}[self.name]
        if self.name == "ga":
            d = {**d, "genomes": tuple(tuple(g) for g in d["genomes"]),
                 "elite": tuple(d["elite"]) if d["elite"] is not None else None}
        self.state = cls(**d)

    def _genome_vec(self, g: tuple) -> torch.Tensor:
        # Children are one mutation from a cached parent: rebuilding a genome
        # from all its seeds every generation would cost a noise slice per seed.
        if g not in self._cache:
            parent = self._cache.get(g[:-1])
            self._cache[g] = (ga.mutate(parent, g[-1], self.cfg.algo.sigma) if parent is not None
                              else ga.rebuild(g, self.space, self.cfg.algo.sigma))
        return self._cache[g]

    def _vecs(self, genomes) -> torch.Tensor:
        return self.space.stack([self._genome_vec(g) for g in genomes])

    def generation(self, pool, check=None) -> dict:
        cfg, n_eps = self.cfg, self.cfg.episodes_per_member

        def means(job) -> list[float]:
            return [float(np.mean(r)) for r in job.wait(check)]

        if self.name == "ga":
            if self._next is None:
                fitness = means(pool.submit(self._vecs(self.state.genomes), n_eps))
            else:  # children already playing; the elite joins at the front of the queue
                elite = pool.submit(self._vecs(self.state.genomes[:1]), n_eps, front=True)
                fitness = means(elite) + means(self._next)
            candidates = ga.tell(self.state, cfg.algo, fitness)
            scored = pool.submit(self._vecs(candidates), cfg.algo.elite_episodes, front=True)
            self._next = pool.submit(self._vecs(ga.children(self.state, cfg.algo, fitness)), n_eps)
            scores = scored.wait(check)
            self.state = ga.advance(self.state, cfg.algo, fitness, scores)
            best = float(np.mean(scores[candidates.index(self.state.elite)]))
            # Keep exactly the vectors of the next population: its children's
            # parents come from it.
            self._cache = {g: self._cache[g] for g in self.state.genomes}
            self._set_best(self._genome_vec(self.state.elite), best, always=True)
        elif self.name == "es":
            if self._next is None:
                seeds, params = es.ask(self.state, cfg.algo)
                self._next = (seeds, pool.submit(params, n_eps))
            seeds, job = self._next
            centre = self.state.theta.clone()  # the population's centre: the state it was asked from
            # The centre's episodes only fill slots the population leaves free
            # and nothing waits for them until the next population plays: with
            # as many slots as members, scoring it first would add a wave of
            # a few episodes to every generation.
            scored = pool.submit(centre[None], cfg.best_episodes, spare=True)
            fitness = means(job)
            state = es.tell(self.state, cfg.algo, seeds, fitness)
            following, params = es.ask(state, cfg.algo)
            self._next = (following, pool.submit(params, n_eps))
            best = float(np.mean(scored.wait(check)[0]))
            # Only now: a run stopped while waiting saves this generation's
            # state, matching its counters, and re-evaluates it on resume.
            self.state = state
            self._set_best(centre, best, always=True)
        else:
            if self._next is None:
                params = self.space.stack([self.space.init(s) for s in random_search.ask(self.state, cfg.algo)])
                self._next = (params, pool.submit(params, n_eps))
            params, job = self._next
            fitness = means(job)
            state = random_search.tell(self.state, fitness)
            top = params[int(np.argmax(fitness))]
            scored = pool.submit(top[None], cfg.best_episodes, front=True)
            following = self.space.stack([self.space.init(s) for s in random_search.ask(state, cfg.algo)])
            self._next = (following, pool.submit(following, n_eps))
            best = float(np.mean(scored.wait(check)[0]))
            self.state = state  # only now, as ES: a run stopped while waiting saves the state its counters match
            self._set_best(top, best, always=False)
        f = np.array(fitness)
        return {"best_fitness": float(f.max()), "mean_fitness": float(f.mean()),
                "median_fitness": float(np.median(f)), "best_member_return": best}

    def _set_best(self, vec: torch.Tensor, score: float, always: bool) -> None:
        # GA's elite and ES's centre are *the* current solution; random search
        # keeps the best network it has ever seen.
        if always or score > self.best_return:
            self.best_params, self.best_return = vec.clone(), score


LONG_GENERATION_S = 120.0  # a generation this long is told about, once


class _OutOfTime(Exception):
    """The time budget ended inside a generation."""


def train(cfg: NeuroevoRun) -> dict:
    spec = validate(cfg)
    device = resolve_device(cfg.pipeline.device)
    name = _algo_name(cfg)
    saved = checkpoint.load(cfg.resume) if cfg.resume else None
    ident = identity(cfg, spec)
    if saved is not None:
        print(resume_line(saved.get("config"), cfg, saved["path"]), flush=True)
        checkpoint.check_compatible(saved, ident, needs=("algo_state", "best_params", "best_return", "counters"))
        run_dir = checkpoint.run_dir_of(saved["path"])
    else:
        run_dir = checkpoint.new_run_dir(cfg.log_dir, cfg.run_name or
                                         f"{spec.env_id.replace('/', '_').replace(':', '.')}__{name}__{cfg.env.seed}__{time.strftime('%Y%m%d-%H%M%S')}")
    template = PolicyNet(spec, cfg.encoder, tuple(cfg.hidden))
    space = ParamSpace(template)
    evolver = _Evolver(cfg, space)
    counters = {"generation": 0, "frames": 0, "episodes": 0}
    gen_s, frames_run = 0.0, 0  # time inside generations (this session): the evaluation rate leaves start-up out
    if saved is not None:
        evolver.restore(saved["algo_state"])
        evolver.best_params, evolver.best_return = saved["best_params"], saved["best_return"]
        counters.update(saved["counters"])
    checkpoint.make_run_dir(run_dir)
    # Generation g is logged at step g: a resumed run writes from g + 1 on.
    monitor = RunMonitor(run_dir, purge_step=counters["generation"] + 1 if saved else None, progress=cfg.progress)
    monitor.text("config", "```\n" + json.dumps(dataclasses.asdict(cfg), indent=2) + "\n```", counters["generation"])
    print(f"seedlocal: {name} on {spec.env_id}, {space.size:,d} parameters per network; "
          f"TensorBoard: tensorboard --logdir {cfg.log_dir} (run {run_dir})", flush=True)

    group = cfg.pipeline.envs_per_worker // 2
    groups = num_groups(cfg.pipeline, cfg.bridge)
    policy = PopulationPolicy(template, group, groups, device, greedy=cfg.greedy, strategy=cfg.forward)
    fps = spec.frames_per_step
    summary = {"status": "done", "run_dir": str(run_dir), "generations_to_target": None,
               "steps_to_target": None, "frames_to_target": None}
    t_start = time.monotonic()

    def save() -> None:
        checkpoint.save(run_dir, {
            "identity": ident, "config": dataclasses.asdict(cfg), "algo_state": evolver.state_dict(),
            "best_params": evolver.best_params, "best_return": evolver.best_return, "counters": dict(counters),
        }, counters["generation"], counters["frames"], keep=cfg.keep_checkpoints)

    from seedlocal.pipeline.pipeline import Pipeline

    with monitor, Pipeline(cfg.env, cfg.pipeline, lambda s, d: policy, consume=False, spec=spec, bridge=cfg.bridge) as pipe:
        loop = pipe.loop
        policy.loop = loop
        runner = InferenceThread(loop)
        runner.start()
        meter = BridgeMeter(pipe.pool.control) if pipe.pool.num_remote_groups else None
        watch = StallWatch(loop)
        gen_t0 = [time.monotonic(), False]  # this generation's start; whether its slowness was told

        def check() -> None:
            # Runs every 0.5 s while a generation waits for episodes: the time
            # budget holds inside a generation too (long or endless episodes,
            # a hung env), abandoning it; the checkpoint keeps the last whole one.
            runner.check()
            watch.poll()  # names stuck envs
            now = time.monotonic()
            if cfg.seconds and now - t_start >= cfg.seconds:
                raise _OutOfTime
            if now - gen_t0[0] >= LONG_GENERATION_S and not gen_t0[1]:
                gen_t0[1] = True
                print(f"\nseedlocal: generation {counters['generation'] + 1} has waited {LONG_GENERATION_S:.0f} s "
                      "for its episodes to end (members are scored on whole episodes; if this env's episodes "
                      "never end, register it with a time limit, gymnasium.register(..., max_episode_steps=N), "
                      "or give --seconds)",
                      flush=True)

        failure = None
        try:
            while True:
                elapsed = time.monotonic() - t_start
                spent = next((budget for budget, over in (
                    ("generations", cfg.generations and counters["generation"] >= cfg.generations),
                    ("frames", cfg.total_frames and counters["frames"] >= cfg.total_frames),
                    ("seconds", cfg.seconds and elapsed >= cfg.seconds)) if over), None)
                if spent:
                    summary["stopped_by"] = spent
                    break
                t0, steps0, eps0 = time.monotonic(), loop.stats.env_steps, policy.episodes_scored
                w0, fwd0, served0 = pipe.pool.worker_stats(), policy.forward_s, policy.forward_envs
                watch.start()
                gen_t0[:] = [t0, False]
                try:
                    stats = evolver.generation(policy, check)
                except _OutOfTime:
                    summary["stopped_by"] = "seconds"
                    break
                dt = time.monotonic() - t0
                gen_s += dt
                # Frames of evaluation episodes only: each served row is one
                # step of a member's episode. Idle slots and auto-reset steps
                # are stepped too (a group steps all its envs), but are no
                # evaluation; their share is reported as perf/idle_share.
                served = policy.forward_envs - served0
                frames = served * fps
                stepped = loop.stats.env_steps - steps0
                w1 = pipe.pool.worker_stats()
                counters["generation"] += 1
                counters["frames"] += frames
                frames_run += frames
                counters["episodes"] += policy.episodes_scored - eps0
                loop.stats.episodes.take()
                values = {f"charts/{k}": v for k, v in stats.items()}
                values.update({
                    "charts/frames": counters["frames"], "charts/episodes": counters["episodes"],
                    "perf/frames_per_generation": frames, "perf/frames_per_s": frames / dt,
                    "perf/idle_share": 1.0 - served / stepped if stepped else 0.0,
                    "perf/generation_s": dt,
                    "perf/env_time_s": (w1["env_s"] - w0["env_s"]) / max(1, w1["threads"]),
                    "perf/inference_time_s": policy.forward_s - fwd0,
                })
                if meter is not None:
                    values.update(meter.scalars())
                monitor.scalars(counters["generation"], values)
                monitor.progress(
                    f"gen {counters['generation']:>4d}  best {stats['best_fitness']:8.1f}  "
                    f"mean {stats['mean_fitness']:8.1f}  best member {stats['best_member_return']:8.1f}  "
                    f"frames {counters['frames']:>12,d}  frames/s {frames / dt:>9,.0f}")
                save()
                if cfg.stop_at_return and stats["best_member_return"] >= cfg.stop_at_return:
                    summary["generations_to_target"] = counters["generation"]
                    summary["frames_to_target"] = counters["frames"]
                    summary["steps_to_target"] = counters["frames"] // fps
                    summary["stopped_by"] = "target"
                    break
        except BaseException as e:
            summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt | SystemExit) else "error"
            failure = e
            raise
        finally:
            runner.stop()
            best = evolver.best_return if math.isfinite(evolver.best_return) else None
            checkpoint.finish_run(
                run_dir, summary, failure,
                save=save if counters["generation"] or saved is not None else None,  # also mid-generation
                results=lambda: {
                    "algo": name, "env": spec.env_id, "generations": counters["generation"],
                    "steps": counters["frames"] // fps, "frames": counters["frames"],
                    "episodes": counters["episodes"], "best_member_return": best,
                    "seconds": round(time.monotonic() - t_start, 2),
                    "frames_per_s": round(frames_run / gen_s, 1) if gen_s else None,
                    "forward": policy.forward.strategy, "checkpoint": checkpoint.newest(run_dir)})
    best = f"{evolver.best_return:.1f}" if math.isfinite(evolver.best_return) else "-"
    print(closing_line(summary, f"{counters['generation']} generations, {counters['frames']:,d} frames, "
                                f"best member return {best}",
                       None if counters["generation"] else "stopped before the first generation ended"), flush=True)
    return summary
