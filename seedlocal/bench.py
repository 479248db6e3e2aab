"""Pipeline efficiency, measured in one run on one machine.

For one env configuration it measures, one after the other so they never
share the cores:

- raw envpool, one pool of all envs stepped synchronously with random actions
  and no model (the reference: same env count, same total threads);
- raw envpool in its async mode (``batch_size = num_envs / 2``) and as two
  fixed half pools on two threads: the two ways to double-buffer inside a
  worker, reported so the choice stays measured;
- the seedlocal pipeline with a random policy, and with the default network,
  each alternating with the raw reference for ``--rounds`` rounds so that
  drift on a shared machine affects both sides of each ratio alike.

With ``--transport-only`` the workers run no environment at all, which gives
the ceiling of the shared-memory transport and the batch-collection latency.

The last line printed is one JSON object (keys documented in the README).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from seedlocal.config import ConfigError, EnvConfig, PipelineConfig, resolve_device, validate_env, validate_pipeline


@dataclass
class BenchConfig:
    env: str = "CartPole-v1"
    """environment id (envpool or Gymnasium)"""
    num_workers: int = 1
    """env worker processes"""
    envs_per_worker: int = 512
    """environments per worker (two groups of half)"""
    seconds: float = 5.0
    """measured seconds per configuration (after a warm-up)"""
    warmup: float = 1.5
    """seconds run before measuring each configuration"""
    device: str = "auto"
    """where the policy runs: auto, cpu, cuda, cuda:N"""
    env_threads: int = 0
    """envpool threads in total, the same for raw and pipeline; 0 = one per core"""
    transport_only: bool = False
    """skip environments entirely: measure the slot transport ceiling"""
    min_batch_envs: int = 0
    """see pipeline.min_batch_envs (0 = half of all envs)"""
    batch_timeout_ms: float = 2.0
    """see pipeline.batch_timeout_ms"""
    skip_model: bool = False
    """measure the random policy only"""
    rounds: int = 3
    """raw and pipeline alternate this many times; ratios are the median of per-round ratios,
    so drift on a shared machine hits both sides alike"""


def _raw_actions(spec, n: int, rng: np.random.Generator, k: int = 64) -> list[np.ndarray]:
    if spec.num_actions is not None:
        return [rng.integers(0, spec.num_actions, n).astype(np.int32) for _ in range(k)]
    low, high = np.array(spec.action_low), np.array(spec.action_high)
    return [rng.uniform(low, high, (n,) + spec.action.shape).astype(np.float32) for _ in range(k)]


class RawSync:
    """One envpool of all envs stepped synchronously with random actions, no model."""

    def __init__(self, env_id: str, spec, n: int, threads: int):
        import envpool

        self.env = envpool.make(env_id, env_type="gymnasium", num_envs=n, num_threads=threads)
        self.env.reset()
        self.n = n
        self.acts = _raw_actions(spec, n, np.random.default_rng(0))

    def _one(self, i: int) -> int:
        self.env.step(self.acts[i % len(self.acts)])
        return self.n

    def measure(self, warmup: float, seconds: float) -> float:
        return _timed(self._one, warmup, seconds)


def raw_async_half(env_id: str, spec, n: int, threads: int, warmup: float, seconds: float) -> float:
    import envpool

    half = n // 2
    env = envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=half, num_threads=threads)
    env.async_reset()
    acts = _raw_actions(spec, half, np.random.default_rng(0))

    def one(i):
        *_, info = env.recv()
        env.send(acts[i % len(acts)], info["env_id"])
        return half

    return _timed(one, warmup, seconds)


def raw_two_groups(env_id: str, spec, n: int, threads: int, warmup: float, seconds: float) -> float:
    """Two pools of n/2 envs, each driven by its own thread (the worker's way)."""
    import envpool

    half = n // 2
    envs = [envpool.make(env_id, env_type="gymnasium", num_envs=half, num_threads=max(1, threads // 2))
            for _ in range(2)]
    acts = _raw_actions(spec, half, np.random.default_rng(0))
    counts, phase = [0, 0], {"measure": False, "stop": False}

    def drive(j):
        e = envs[j]
        e.async_reset()
        i = 0
        while not phase["stop"]:
            e.recv()
            e.send(acts[i % len(acts)])
            i += 1
            if phase["measure"]:
                counts[j] += half

    ts = [threading.Thread(target=drive, args=(j,), daemon=True) for j in range(2)]
    for t in ts:
        t.start()
    time.sleep(warmup)
    phase["measure"] = True
    t0 = time.perf_counter()
    time.sleep(seconds)
    total = sum(counts)
    dt = time.perf_counter() - t0
    phase["stop"] = True
    for t in ts:
        t.join()
    return total / dt


def _timed(step, warmup: float, seconds: float) -> float:
    i, end = 0, time.perf_counter() + warmup
    while time.perf_counter() < end:
        step(i)
        i += 1
    steps, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        steps += step(i)
        i += 1
    return steps / (time.perf_counter() - t0)


def pipeline_run(cfg: BenchConfig, backend: str, model: bool, raw: RawSync | None) -> dict:
    """Start a pipeline, then alternate ``cfg.rounds`` times: raw, pipeline."""
    from seedlocal.models import ActorCritic, ModelPolicy, RandomPolicy
    from seedlocal.pipeline.pipeline import Pipeline

    def make_policy(spec, device):
        if not model:
            return RandomPolicy(spec, device)
        return ModelPolicy(ActorCritic(spec).to(device), spec)

    env_cfg = EnvConfig(id=cfg.env, backend=backend)
    pipe_cfg = PipelineConfig(
        num_workers=cfg.num_workers, envs_per_worker=cfg.envs_per_worker, env_threads=cfg.env_threads,
        device=cfg.device, min_batch_envs=cfg.min_batch_envs, batch_timeout_ms=cfg.batch_timeout_ms,
    )
    raws, pipes, ratios = [], [], []
    with Pipeline(env_cfg, pipe_cfg, make_policy) as pipe:
        loop = pipe.loop
        loop.run(cfg.warmup)
        s = loop.stats
        totals = {"dt": 0.0, "steps": 0, "batches": 0, "envs": 0, "fwd": 0.0, "wait": 0.0, "env": 0.0}
        s.collect_s.clear()
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
                ratios.append(pipes[-1] / raws[-1])
            for k, v in (("dt", dt), ("steps", s.env_steps - steps0), ("batches", s.batches - batches0),
                         ("envs", s.batch_envs - envs0), ("fwd", s.forward_s - fwd0),
                         ("wait", w1["wait_s"] - w0["wait_s"]), ("env", w1["env_s"] - w0["env_s"])):
                totals[k] += v
        lat = np.array(s.collect_s) * 1e3
        total_envs = cfg.num_workers * cfg.envs_per_worker
        batches = max(1, totals["batches"])
        thread_s = totals["dt"] * 2 * cfg.num_workers
        return {
            "steps_per_s": float(np.median(pipes)),
            "raw_steps_per_s": float(np.median(raws)) if raws else None,
            "ratio": float(np.median(ratios)) if ratios else None,
            "ratios": ratios,
            "batches_per_s": totals["batches"] / totals["dt"],
            "mean_batch": totals["envs"] / batches,
            # Fill of the batch the loop waits for (min_batch_envs; default half
            # of all envs, since the other half is stepping by design).
            "batch_fill": totals["envs"] / batches / (cfg.min_batch_envs or total_envs // 2),
            "collect_ms_p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "collect_ms_p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "forward_ms_per_batch": totals["fwd"] / batches * 1e3,
            # Shares of all group-thread time: waiting for actions, inside the env.
            "worker_wait_share": totals["wait"] / thread_s,
            "worker_env_share": totals["env"] / thread_s,
            "device": str(pipe.device),
        }


def run(cfg: BenchConfig) -> dict:
    if cfg.seconds <= 0:
        raise ConfigError(f"bench.seconds={cfg.seconds!r}: must be positive")
    if cfg.rounds < 1:
        raise ConfigError(f"bench.rounds={cfg.rounds!r}: must be positive")
    pipe_cfg = PipelineConfig(num_workers=cfg.num_workers, envs_per_worker=cfg.envs_per_worker,
                              env_threads=cfg.env_threads, device=cfg.device)
    validate_pipeline(pipe_cfg, prefix="bench")
    spec = validate_env(EnvConfig(id=cfg.env), id_field="bench.env")
    resolve_device(cfg.device)
    n = cfg.num_workers * cfg.envs_per_worker
    threads = cfg.env_threads or os.cpu_count() or 1
    rows: list[tuple[str, float, float | None, str]] = []
    result = {"env": cfg.env, "backend": spec.backend, "num_workers": cfg.num_workers,
              "envs_per_worker": cfg.envs_per_worker, "env_threads": threads,
              "frames_per_step": spec.frames_per_step, "cpu_count": os.cpu_count()}

    if cfg.transport_only:
        p = pipeline_run(cfg, "null", model=False, raw=None)
        result.update({"transport_steps_per_s": p["steps_per_s"], "transport_batches_per_s": p["batches_per_s"],
                       "collect_ms_p50": p["collect_ms_p50"], "collect_ms_p99": p["collect_ms_p99"],
                       "batch_fill": p["batch_fill"], "device": p["device"]})
        rows.append(("transport only (null env)", p["steps_per_s"], None, _detail(p)))
    else:
        raw = None
        if spec.backend == "envpool":
            raw = RawSync(cfg.env, spec, n, threads)
            a = raw_async_half(cfg.env, spec, n, threads, cfg.warmup, cfg.seconds)
            t = raw_two_groups(cfg.env, spec, n, threads, cfg.warmup, cfg.seconds)
            ref = raw.measure(0.5, cfg.seconds)
            rows.append(("raw envpool, sync step", ref, None, ""))
            rows.append(("raw envpool, async batch_size=n/2", a, a / ref, ""))
            rows.append(("raw envpool, two half pools, 2 threads", t, t / ref, ""))
            result.update({"raw_async_half_steps_per_s": a, "raw_two_groups_steps_per_s": t})
        p = pipeline_run(cfg, "auto", model=False, raw=raw)
        rows.append(("seedlocal, random policy", p["steps_per_s"], p["ratio"], _detail(p)))
        result.update({"raw_steps_per_s": p["raw_steps_per_s"], "random_policy_steps_per_s": p["steps_per_s"],
                       "ratio_random": p["ratio"], "random_detail": p, "device": p["device"]})
        if not cfg.skip_model and spec.num_actions is not None:
            m = pipeline_run(cfg, "auto", model=True, raw=raw)
            rows.append(("seedlocal, default network", m["steps_per_s"], m["ratio"], _detail(m)))
            result.update({"model_policy_steps_per_s": m["steps_per_s"], "ratio_model": m["ratio"],
                           "model_raw_steps_per_s": m["raw_steps_per_s"], "model_detail": m})
        else:
            result.update({"model_policy_steps_per_s": None, "ratio_model": None})

    print(f"\n{cfg.env}: {cfg.num_workers} worker(s) x {cfg.envs_per_worker} envs, {threads} env threads, "
          f"frames/step {spec.frames_per_step}, {cfg.seconds:g}s each")
    print(f"{'configuration':42s} {'steps/s':>12s} {'ratio':>7s}  details (ratio: median of per-round ratios to raw sync)")
    for name, v, ratio, d in rows:
        r = f"{ratio:7.3f}" if ratio is not None else "      -"
        print(f"{name:42s} {v:12,.0f} {r}  {d}")
    print(json.dumps(result, default=float))
    return result


def _detail(p: dict) -> str:
    return (f"batch {p['mean_batch']:.0f} ({p['batch_fill']:.0%} full), collect p50 {p['collect_ms_p50']:.2f} ms, "
            f"fwd {p['forward_ms_per_batch']:.2f} ms, workers wait {p['worker_wait_share']:.0%} / "
            f"in env {p['worker_env_share']:.0%}")


def main(cfg: BenchConfig) -> None:
    torch.set_num_threads(1)
    run(cfg)
