"""``seedlocal bench --autotune``: pick pipeline sizes for this machine.

It measures the best raw envpool configuration once, then a small, bounded set of (num_workers, envs_per_worker,
min_batch_envs) settings with a random policy, a few seconds each, and keeps the one with the most steps/s. The
total env count is held at the training preset's (what a run would use), so only how the envs are spread over
processes and batches changes:

- workers: 1, 2, one per core, two per core (fewer cores: fewer candidates);
- min_batch_envs: one group per worker (the default) or one group in all,
  which lets the loop serve each group as soon as it is ready.

The result is written as JSON holding ``PipelineConfig`` fields, which
``seedlocal train ... --pipeline-config FILE`` loads as the pipeline's defaults (options on the command line still win).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from seedlocal.config.checks import usable_cores
from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.errors import ConfigError
from seedlocal.measure.bench import pipeline_run, training_preset
from seedlocal.measure.raw import RawEnvpool
from seedlocal.prepare import prepare_pipeline


def candidates(env, total_envs: int, cpus: int) -> list[tuple[int, int, int]]:
    """(num_workers, envs_per_worker, min_batch_envs) settings of ``env`` (an ``EnvConfig``) worth measuring."""
    out = []
    for w in sorted({1, 2, cpus, 2 * cpus}):
        if total_envs % w:
            continue
        per_worker = total_envs // w
        try:
            _, shape = prepare_pipeline(env, PipelineConfig(num_workers=w, envs_per_worker=per_worker))
        except ConfigError:  # envs that make no two equal groups per worker
            continue
        out += [(w, per_worker, min_batch) for min_batch in sorted({shape.min_batch_envs, shape.envs_per_group})]
    return out


def autotune(cfg, spec) -> dict:
    preset = training_preset(spec.env_id)
    total = cfg.num_workers * cfg.envs_per_worker if cfg.num_workers and cfg.envs_per_worker else (
        preset.pipeline.num_workers * preset.pipeline.envs_per_worker)
    cpus = usable_cores()
    seconds = min(cfg.seconds, 3.0)
    t_start = time.monotonic()
    raw_best = None
    if spec.backend == "envpool":
        with RawEnvpool(spec, total, cfg.env_threads or cpus) as raw:
            raw_best = max(raw.measure(0.5, seconds).values())
    rows = []
    one = dataclasses.replace(cfg, seconds=seconds, warmup=min(cfg.warmup, 1.0), rounds=1)  # each candidate's run
    for w, per_worker, min_batch in candidates(EnvConfig(id=cfg.env, frame_stack=cfg.frame_stack), total, cpus):
        pipe_cfg = PipelineConfig(num_workers=w, envs_per_worker=per_worker, min_batch_envs=min_batch,
                                  env_threads=cfg.env_threads, device=cfg.device,
                                  batch_timeout_ms=cfg.batch_timeout_ms, unroll_length=preset.pipeline.unroll_length)
        p = pipeline_run(one, pipe_cfg, "auto", model=False, raw=None)
        ratio = p["steps_per_s"] / raw_best if raw_best else None
        rows.append({"num_workers": w, "envs_per_worker": per_worker, "min_batch_envs": min_batch,
                     "steps_per_s": p["steps_per_s"], "ratio_random": ratio})
        print(f"  workers {w:2d} x {per_worker:4d} envs, min batch {min_batch:4d}: "
              f"{p['steps_per_s']:12,.0f} steps/s" + (f"  ratio {ratio:.3f}" if ratio else ""), flush=True)
    best = max(rows, key=lambda r: r["steps_per_s"])
    chosen = {k: best[k] for k in ("num_workers", "envs_per_worker", "min_batch_envs")}
    out = Path(cfg.pipeline_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": cfg.env, "measured_s": round(time.monotonic() - t_start, 1),
                               "ratio_random": best["ratio_random"], "pipeline": chosen}, indent=2) + "\n")
    print(f"\nchosen for {cfg.env} on {cpus} cores ({total} envs): {chosen}; written to {out} "
          f"(use: seedlocal train ... --pipeline-config {out})")
    return {**chosen, "ratio_random": best["ratio_random"], "steps_per_s": best["steps_per_s"],
            "raw_best_steps_per_s": raw_best, "env": cfg.env, "file": str(out),
            "candidates": len(rows), "seconds": round(time.monotonic() - t_start, 1)}


