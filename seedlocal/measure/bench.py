"""Pipeline efficiency, measured in one run on one machine: raw envpool three ways (``raw.RawEnvpool``; the best
is the limit every ratio divides by), then the pipeline with a random policy and with training's network, each
alternating with the raw references for ``--rounds`` rounds so that drift on a shared machine affects both sides
of each ratio alike; with ``--learning`` the V-trace learner too. ``--raw-ceiling`` checks the limit against
envpool's own best settings (``raw.ceiling``). The modes and the last line's JSON keys: the README's "Benchmark:
pipeline efficiency".
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seedlocal.algos.frames import stacking
from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.config.checks import check_writable, usable_cores
from seedlocal.errors import ConfigError, fail, fail_if
from seedlocal.measure.raw import RawEnvpool, ceiling
from seedlocal.networks import is_image
from seedlocal.prepare import env_spec, prepare_pipeline, prepare_run, preset_for


@dataclass
class BenchConfig:
    env: str = "CartPole-v1"
    """environment id (envpool or Gymnasium)"""
    num_workers: int = 0
    """env worker processes; 0 = 1 (with --learning: the env's training preset)"""
    envs_per_worker: int = 0
    """environments per worker (two groups of half); 0 = 512 for envs with vector observations and 32 for
    images (with --learning: the env's training preset)"""
    seconds: float = 5.0
    """measured seconds per configuration (after a warm-up)"""
    warmup: float = 1.5
    """seconds run before measuring each configuration (and until its first batch: workers may still be starting)"""
    device: str = "auto"
    """where the policy runs: auto, cpu, cuda, cuda:N"""
    cuda_graphs: bool = False
    """replay the model's inference forward (and the learner run's) from CUDA graphs"""
    env_threads: int = 0
    """envpool threads in total, the same for raw and pipeline; 0 = one per core"""
    transport_only: bool = False
    """skip environments entirely: measure the slot transport ceiling"""
    frame_stack: int = 0
    """envpool's frames per Atari observation, for raw envpool and the pipeline alike: 0 = as training sends
    them (Atari: 1, single frames, stacked beside the network); 4 = envpool's own stack of 4"""
    min_batch_envs: int = 0
    """see pipeline.min_batch_envs (0 = half of all envs)"""
    batch_timeout_ms: float = 2.0
    """see pipeline.batch_timeout_ms"""
    skip_model: bool = False
    """measure the random policy only"""
    rounds: int = 3
    """raw and pipeline alternate this many times; ratios are the median of per-round ratios,
    so drift on a shared machine hits both sides alike"""
    learning: bool = False
    """also run the V-trace learner on the pipeline: learning_steps_per_s and ratio_learning"""
    bridge: bool = False
    """compare the local pipeline with the same envs behind the gRPC bridge (one actor host on loopback)"""
    bridge_delay_ms: float = 0.0
    """with --bridge: emulated network round trip added by the actor host (where tc netem is unavailable)"""
    autotune: bool = False
    """try a bounded set of worker/env/batch settings (~2 minutes) and write the best to --pipeline-out"""
    pipeline_out: str = "pipeline.json"
    """where --autotune writes the chosen settings (load them with seedlocal train --pipeline-config FILE)"""
    raw_ceiling: bool = False
    """raw envpool only: envpool's own best settings (async, batch_size ~ threads, num_envs 2-3 x batch,
    pinned or not) at 1, 2, 4 ... --env-threads threads, against the three kinds every ratio divides by"""
    ceiling_threads: tuple[int, ...] = ()
    """with --raw-ceiling: the thread counts to measure (e.g. 16 alone: the trainers' threads, a fifth of the
    time); empty = 1, 2, 4 ... --env-threads"""


def training_preset(env_id: str):
    """The V-trace preset ``seedlocal train vtrace --env.id ENV`` starts from (``prepare.preset_for``: the one
    made for the env's kind, fitted to its frames: Atari's single frames, 0 where they do not fit)."""
    from seedlocal.families import recipe

    return preset_for(recipe("vtrace"), env_id)


def pipeline_run(cfg: BenchConfig, pipe_cfg: PipelineConfig, backend: str, model: bool,
                 raw: RawEnvpool | None) -> dict:
    """Start a pipeline, then alternate ``cfg.rounds`` times: raw, pipeline."""
    from seedlocal.arithmetic import apply_precision, resolve_precision
    from seedlocal.policies import RandomPolicy
    from seedlocal.policies.actor_critic import ModelPolicy
    from seedlocal.pipeline.pipeline import Pipeline
    from seedlocal.recipes.vtrace import build_model

    def make_policy(spec, device):
        if not model:
            return RandomPolicy(spec, device)
        preset = training_preset(spec.env_id)  # the network (and arithmetic) training uses by default
        net = build_model(preset, spec).to(device)
        precision = resolve_precision(preset.algo.precision, net.kind, device)
        apply_precision(precision, device)
        return ModelPolicy(net, spec, precision=precision, cuda_graphs=pipe_cfg.cuda_graphs,
                           stack=stacking(spec, getattr(preset, "frame_stack", 0)))

    env = EnvConfig(id=cfg.env, backend=backend, frame_stack=cfg.frame_stack)
    spec, shape = prepare_pipeline(env, pipe_cfg, prefix="bench", env_field="bench.env")
    with Pipeline(env, pipe_cfg, make_policy, spec, shape) as pipe:
        pipe.loop.run(cfg.warmup)
        while not pipe.loop.stats.batches:  # workers still starting on a loaded machine: the warm-up waits for them
            pipe.loop.step()
        pipe.loop.stats.collect_s.clear()
        raws, pipes, ratios, totals, threads = _alternate(cfg, pipe, raw)
        lat = np.array(pipe.loop.stats.collect_s) * 1e3
        min_batch = pipe.shape.min_batch_envs
        batches = max(1, totals["batches"])
        thread_s = totals["dt"] * max(1, threads)
        return {
            "steps_per_s": float(np.median(pipes)),
            "raw": {k: float(np.median([r[k] for r in raws])) for k in RawEnvpool.KINDS} if raws else None,
            "ratio": float(np.median(ratios)) if ratios else None,
            "ratios": ratios,
            "batches_per_s": totals["batches"] / totals["dt"],
            "mean_batch": totals["envs"] / batches,
            # The mean batch over the one the loop waits for (min_batch_envs; default half of all envs, since the
            # other half is stepping by design): below 1 the timeout cut batches short; above 1 more groups were
            # ready than it waits for.
            "min_batch": min_batch,
            "batch_fill": totals["envs"] / batches / min_batch,
            "collect_ms_p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "collect_ms_p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "forward_ms_per_batch": totals["fwd"] / batches * 1e3,
            # Shares of all group-thread time: waiting for actions, inside the env.
            "worker_wait_share": totals["wait"] / thread_s,
            "worker_env_share": totals["env"] / thread_s,
            "device": str(pipe.device),
        }


def _alternate(cfg: BenchConfig, pipe, raw: RawEnvpool | None) -> tuple[list, list, list, dict, int]:
    """``cfg.rounds`` rounds of raw envpool (if ``raw``), then the running pipeline ``pipe``, for ``cfg.seconds``
    each: the raw rates, the pipeline's steps/s and their per-round ratios, the pipeline's totals over all rounds,
    and the workers' group threads."""
    loop, s = pipe.loop, pipe.loop.stats
    raws, pipes, ratios = [], [], []
    totals = {"dt": 0.0, "steps": 0, "batches": 0, "envs": 0, "fwd": 0.0, "wait": 0.0, "env": 0.0}
    for _ in range(cfg.rounds):
        if raw is not None:
            raws.append(raw.measure(min(0.5, cfg.warmup), cfg.seconds))
        loop.run(0.3)  # the workers slept during the raw run: wake them first
        w0 = pipe.pool.worker_stats()
        steps0, batches0, envs0, fwd0 = s.env_steps, s.batches, s.batch_envs, s.forward_s
        t0 = time.perf_counter()
        loop.run(cfg.seconds)
        dt = time.perf_counter() - t0
        w1 = pipe.pool.worker_stats()
        pipes.append((s.env_steps - steps0) / dt)
        if raws:
            ratios.append(pipes[-1] / max(raws[-1].values()))
        for k, v in (("dt", dt), ("steps", s.env_steps - steps0), ("batches", s.batches - batches0),
                     ("envs", s.batch_envs - envs0), ("fwd", s.forward_s - fwd0),
                     ("wait", w1["wait_s"] - w0["wait_s"]), ("env", w1["env_s"] - w0["env_s"])):
            totals[k] += v
    return raws, pipes, ratios, totals, w1["threads"]


def learning_run(cfg: BenchConfig, pipe_cfg: PipelineConfig) -> dict:
    """The V-trace learner on the pipeline for warmup + seconds, through ``train()`` itself; steps/s is read from
    the run's own TensorBoard points after the warm-up (so worker start-up is not counted)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from seedlocal.families import recipe
    from seedlocal.trainers.vtrace import train

    env = EnvConfig(id=cfg.env, frame_stack=cfg.frame_stack)
    spec, shape = prepare_pipeline(env, pipe_cfg, prefix="bench", env_field="bench.env")
    preset = training_preset(cfg.env)
    batch, why = learning_batch(preset.algo, shape, preset.network.lstm_size)
    with tempfile.TemporaryDirectory(prefix="seedlocal-bench-") as tmp:
        run_cfg = dataclasses.replace(
            preset, env=env, frame_stack=stacking(spec, getattr(preset, "frame_stack", 0)), pipeline=pipe_cfg,
            algo=dataclasses.replace(preset.algo, batch_size=batch),
            total_steps=0, seconds=cfg.warmup + 1.0 + cfg.seconds, log_dir=tmp, run_name="bench",
            log_every_s=0.5, progress=False, checkpoint_every_min=1e6)
        t0 = time.time()
        summary = train(prepare_run(run_cfg, recipe("vtrace")))
        ea = EventAccumulator(str(Path(tmp) / "bench"), size_guidance={"scalars": 0})
        ea.Reload()
        points = ea.Scalars("charts/steps_per_s") if "charts/steps_per_s" in ea.Tags()["scalars"] else []
        if len(points) < 2:  # too short to leave out the warm-up: the whole run's rate
            rate, since = summary["steps"] / max(1e-9, summary["seconds"]), 0.0
        else:
            # Steps between the first logging point after the warm-up and the last one, over the time between them.
            window = [e for e in points if e.wall_time >= points[0].wall_time + cfg.warmup]
            first, last = (window[0], window[-1]) if len(window) >= 2 else (points[0], points[-1])
            rate, since = (last.step - first.step) / max(1e-9, last.wall_time - first.wall_time), first.wall_time

        def mean_over(tag: str) -> float | None:
            vals = [e.value for e in ea.Scalars(tag) if e.wall_time >= since] \
                if tag in ea.Tags()["scalars"] else []
            return float(np.mean(vals)) if vals else None

        return {"learning_steps_per_s": rate,
                "learner_wait_share": mean_over("perf/learner_wait_share"),
                "worker_wait_share": mean_over("perf/worker_wait_share"),
                "updates_per_s": summary["updates"] / max(1e-9, time.time() - t0),
                "batch_size": run_cfg.algo.batch_size, "batch_size_why": why, "unroll_length": pipe_cfg.unroll_length}


def learning_batch(algo, shape, lstm_size: int = 0) -> tuple[int, str]:
    """The learner's batch (envs per update) for the envs this bench was given (their ``shape``), and why: the
    preset's own where it is whole groups (half a worker's envs each), else the nearest number of
    whole groups, at least one and at most all of them (an LSTM's minibatches need as many unrolls)."""
    group, groups = shape.envs_per_group, shape.num_groups
    if algo.batch_size % group == 0 and algo.batch_size // group <= groups:
        return algo.batch_size, f"the preset's {algo.batch_size}"
    k = min(groups, max(1, round(algo.batch_size / group), -(-algo.minibatches // group) if lstm_size else 1))
    return k * group, (f"the preset's {algo.batch_size}, as {k} whole group(s) of {group} envs "
                       f"(half of envs_per_worker {shape.envs_per_worker})")


def check(cfg: BenchConfig):
    """(env spec, pipeline config) of a bench run, or ConfigError naming the option."""
    fail_if(lambda v: not v > 0 or not math.isfinite(v), cfg, ("seconds",), "must be positive and finite", "bench.")
    fail_if(lambda v: not v >= 0 or not math.isfinite(v), cfg, ("warmup", "batch_timeout_ms", "bridge_delay_ms"),
            "must be >= 0 and finite", "bench.")
    if cfg.autotune:  # before minutes of trials, not after
        check_writable("bench.pipeline_out", cfg.pipeline_out, folder=False)
    fail_if(lambda v: v < 1, cfg, ("rounds",), "must be positive", "bench.")
    _refuse_with("raw_ceiling", cfg, "measures raw envpool alone", ("transport_only", "learning", "bridge", "autotune"))
    if cfg.ceiling_threads and not cfg.raw_ceiling:
        fail("bench.ceiling_threads", cfg.ceiling_threads, "only with --raw-ceiling")
    if bad := [t for t in cfg.ceiling_threads if t < 1]:
        fail("bench.ceiling_threads", cfg.ceiling_threads, f"every thread count must be positive ({bad[0]} is not)")
    # Without --bridge, --transport-only returns before every other row.
    _refuse_with("transport_only", cfg, "measures the pipeline without envs or model", ("learning", "autotune"))
    fail_if(lambda v: v < 0, cfg, ("frame_stack",), "must be >= 0", "bench.")
    if cfg.bridge_delay_ms and not cfg.bridge:
        fail("bench.bridge_delay_ms", cfg.bridge_delay_ms, "only with --bridge")
    fail_if(lambda v: v < 0, cfg, ("num_workers", "envs_per_worker"), "must be 0 (automatic) or positive", "bench.")
    preset = training_preset(cfg.env)
    training = preset.env.frame_stack
    if cfg.frame_stack and cfg.frame_stack != training and (cfg.learning or cfg.bridge or cfg.autotune):
        fail("bench.frame_stack", cfg.frame_stack, "the raw, transport and policy rows only (the learner, the "
             f"bridge and --autotune run the env as training does: {training})")
    cfg.frame_stack = cfg.frame_stack or training  # every row, the raw envpool ones too, runs this env
    env = EnvConfig(id=cfg.env, frame_stack=cfg.frame_stack)
    spec = env_spec(env, "bench.env")
    if cfg.learning:  # the sizes not given are the training preset's
        p = preset.pipeline
        workers, envs, unroll = p.num_workers, p.envs_per_worker, p.unroll_length
    else:  # one worker of 512 envs, or 32 of images
        single = spec.obs.get("")
        workers, envs, unroll = 1, 32 if single is not None and is_image(single) else 512, 32
    pipe_cfg = PipelineConfig(num_workers=cfg.num_workers or workers, envs_per_worker=cfg.envs_per_worker or envs,
                              env_threads=cfg.env_threads, device=cfg.device, cuda_graphs=cfg.cuda_graphs,
                              min_batch_envs=cfg.min_batch_envs, batch_timeout_ms=cfg.batch_timeout_ms,
                              unroll_length=unroll)
    prepare_pipeline(env, pipe_cfg, prefix="bench", env_field="bench.env")
    return spec, pipe_cfg


def _refuse_with(mode: str, cfg: BenchConfig, what: str, others: tuple[str, ...]) -> None:
    """ConfigError where ``mode`` is on together with any of ``others``, which it has no row for."""
    given = [f"--{n.replace('_', '-')}" for n in others if getattr(cfg, n)]
    if getattr(cfg, mode) and given:
        raise ConfigError(f"bench.{mode} {what}: drop {', '.join(given)}")


def run(cfg: BenchConfig, spec, pipe_cfg: PipelineConfig) -> dict:
    """Raw envpool against the pipeline (or the transport alone): the table and the JSON line."""
    workers, envs = pipe_cfg.num_workers, pipe_cfg.envs_per_worker
    threads = cfg.env_threads or usable_cores()
    rows: list[tuple[str, float, float | None, str]] = []
    result = {"env": cfg.env, "backend": spec.backend, "num_workers": workers, "envs_per_worker": envs,
              "env_threads": threads, "frames_per_step": spec.frames_per_step, "frame_stack": cfg.frame_stack,
              "obs_bytes_per_env": int(sum(np.prod(o.shape) * np.dtype(o.dtype).itemsize for o in spec.obs.values())),
              "cpu_count": os.cpu_count(), "cuda_graphs": cfg.cuda_graphs}

    if cfg.transport_only:
        p = pipeline_run(cfg, pipe_cfg, "null", model=False, raw=None)
        result.update({"backend": "null", "transport_steps_per_s": p["steps_per_s"],
                       "transport_batches_per_s": p["batches_per_s"],
                       **{k: p[k] for k in ("collect_ms_p50", "collect_ms_p99", "batch_fill", "device")}})
        rows.append(("transport only (null env)", p["steps_per_s"], None, _detail(p)))
    else:
        raw = RawEnvpool(spec, workers * envs, threads) if spec.backend == "envpool" else None
        with raw if raw is not None else contextlib.nullcontext():
            _measure_all(cfg, pipe_cfg, spec, raw, rows, result)

    print(f"\n{cfg.env}: {workers} worker(s) x {envs} envs, {threads} env threads, "
          f"frames/step {spec.frames_per_step}, {cfg.seconds:g}s each")
    print(f"{'configuration':42s} {'steps/s':>12s} {'ratio':>7s}  details "
          f"(ratio: median of per-round ratios to the best raw configuration)")
    for name, v, ratio, d in rows:
        r = f"{ratio:7.3f}" if ratio is not None else "      -"
        print(f"{name:42s} {v:12,.0f} {r}  {d}")
    return result


def _measure_all(cfg: BenchConfig, pipe_cfg: PipelineConfig, spec, raw: RawEnvpool | None, rows: list,
                 result: dict) -> None:
    """Raw envpool, the pipeline with a random policy and with the training network, and (``--learning``) the
    learner: into ``rows`` and ``result``."""
    p = pipeline_run(cfg, pipe_cfg, "auto", model=False, raw=raw)
    if p["raw"] is not None:
        best = max(p["raw"].values())
        for kind, label in (("sync", "sync step"), ("async_half", "async batch_size=n/2"),
                            ("two_groups", "two half pools, 2 threads")):
            rows.append((f"raw envpool, {label}", p["raw"][kind], p["raw"][kind] / best, ""))
        result.update({"raw_best_steps_per_s": best, "raw_best": max(p["raw"], key=p["raw"].get),
                       **{f"raw_{kind}_steps_per_s": v for kind, v in p["raw"].items()}})
    rows.append(("seedlocal, random policy", p["steps_per_s"], p["ratio"], _detail(p)))
    result.update({"random_policy_steps_per_s": p["steps_per_s"], "ratio_random": p["ratio"],
                   "random_detail": p, "device": p["device"]})
    result.update({"model_policy_steps_per_s": None, "ratio_model": None})  # unless the model runs
    if not cfg.skip_model:
        m = pipeline_run(cfg, pipe_cfg, "auto", model=True, raw=raw)
        rows.append(("seedlocal, training's network", m["steps_per_s"], m["ratio"], _detail(m)))
        result.update({"model_policy_steps_per_s": m["steps_per_s"], "ratio_model": m["ratio"], "model_detail": m})
    if cfg.learning:
        lr = learning_run(cfg, pipe_cfg)
        best = result.get("raw_best_steps_per_s")
        ratio = lr["learning_steps_per_s"] / best if best else None  # 0.0 from a run that made no step in time
        rows.append(("seedlocal, V-trace learner training", lr["learning_steps_per_s"], ratio,
                     f"learner waits {lr['learner_wait_share'] or 0:.0%}, workers wait "
                     f"{lr['worker_wait_share'] or 0:.0%}, {lr['updates_per_s']:.1f} updates/s of "
                     f"{lr['batch_size']} x {lr['unroll_length']} ({lr['batch_size_why']})"))
        result.update({"learning_steps_per_s": lr["learning_steps_per_s"], "ratio_learning": ratio,
                       "learning_detail": lr})


def _detail(p: dict) -> str:
    return (f"batch {p['mean_batch']:.0f} (waits for {p['min_batch']}), collect p50 {p['collect_ms_p50']:.2f} ms, "
            f"fwd {p['forward_ms_per_batch']:.2f} ms, workers wait {p['worker_wait_share']:.0%} / "
            f"in env {p['worker_env_share']:.0%}")


def thread_counts(most: int) -> list[int]:
    """1, 2, 4 ... and ``most`` itself: the thread counts ``--raw-ceiling`` measures."""
    return [2 ** i for i in range(most.bit_length()) if 2 ** i < most] + [most]


def run_ceiling(cfg: BenchConfig, spec, pipe_cfg: PipelineConfig) -> dict:
    """Raw envpool's best over envpool's own settings, per thread count, against the best of the bench's three
    kinds at the pipeline's env count (the limit every other ratio divides by): is that limit the machine's, or the
    bench's?"""
    if spec.backend != "envpool":
        raise ConfigError(f"bench.raw_ceiling: {cfg.env} is not an envpool env (backend {spec.backend})")
    n = pipe_cfg.num_workers * pipe_cfg.envs_per_worker
    most = cfg.env_threads or usable_cores()
    per_threads = []
    for t in sorted(set(cfg.ceiling_threads)) or thread_counts(most):
        rows = ceiling(spec, t, min(0.5, cfg.warmup), cfg.seconds)
        with RawEnvpool(spec, n, t) as raw:
            kinds = raw.measure(min(0.5, cfg.warmup), cfg.seconds)
        if t < 2:  # two_groups gives each half pool max(1, t // 2) threads: two, not t, below 2
            kinds.pop("two_groups")
        per_threads.append({"threads": t, "best": rows[0], "rows": rows, "bench_kinds": kinds,
                            "bench_best_over_ceiling": max(kinds.values()) / rows[0]["steps_per_s"]})
    first, top = per_threads[0], per_threads[-1]
    one = first["best"]["steps_per_s"]
    result = {"env": cfg.env, "frames_per_step": spec.frames_per_step, "cpu_count": os.cpu_count(), "envs": n,
              "per_threads": per_threads,
              "ceiling_steps_per_s": top["best"]["steps_per_s"],
              "bench_raw_best_steps_per_s": max(top["bench_kinds"].values()),
              "bench_best_over_ceiling": top["bench_best_over_ceiling"],
              # Scaling from the fewest threads measured to the most: 1.0 is linear (None: one count measured).
              "scaling_efficiency": top["best"]["steps_per_s"] / (one * top["threads"] / first["threads"])
              if len(per_threads) > 1 else None}
    print(f"\n{cfg.env}: raw envpool, envpool's own settings against the bench's kinds at {n} envs, "
          f"{cfg.seconds:g}s each")
    print(f"{'threads':>7s} {'best steps/s':>13s} {'num_envs':>8s} {'batch':>5s} {'pinned':>6s} "
          f"{'bench kinds best':>16s} {'bench/best':>10s}")
    for r in per_threads:
        b = r["best"]
        print(f"{r['threads']:7d} {b['steps_per_s']:13,.0f} {b['num_envs']:8d} {b['batch_size']:5d} "
              f"{'yes' if b['thread_affinity_offset'] >= 0 else 'no':>6s} {max(r['bench_kinds'].values()):16,.0f} "
              f"{r['bench_best_over_ceiling']:10.3f}")
    if result["scaling_efficiency"] is not None:
        print(f"scaling from {first['threads']} to {top['threads']} threads: {result['scaling_efficiency']:.2f} "
              f"of linear")
    return result
