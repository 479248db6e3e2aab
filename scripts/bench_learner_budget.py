"""The CPU budget of a V-trace preset: what one learner batch costs in core-seconds.

A CPU learner shares the cores with the env workers and the inference loop,
so a run's frames/s can be no higher than either of

    frames per batch / (learner seconds per batch, on its best thread count)
    cores * frames per batch / (learn + act + step core-seconds per batch)

the first even if acting cost nothing, the second however well the three
overlap. This script measures each term on its own,
in one run, with the preset's own settings and network:

- learn: one ``learner_step`` on a synthetic batch of the preset's shape
  (``echo`` passes of ``minibatches`` updates plus the no-grad target pass),
  timed on 1 thread and on every core (core-seconds = threads x seconds);
- act: the inference forward for one batch of a group's envs (one thread, as
  the inference loop runs), times the batches in a learner batch;
- step: raw envpool stepping with random actions on the same env count and
  threads, the best of ``seedlocal bench``'s three ways.

It prints one JSON line: the three terms and both ceilings; ``--echo`` and
``--minibatches`` measure another learning rhythm.

``--precisions`` times the learner step alone in each arithmetic instead, on
``--device`` (how ``--algo.precision auto`` is chosen for a GPU: the GPU
suite runs it), one JSON line with the seconds per batch of each.

    python scripts/bench_learner_budget.py                      # --preset atari on Pong-v5
    python scripts/bench_learner_budget.py --echo 1 --minibatches 16
    python scripts/bench_learner_budget.py --device cuda --precisions fp32 tf32 bf16
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seedlocal.algos.vtrace import learner_step, make_optimizer
from seedlocal.measure.raw import RawEnvpool
from seedlocal.config.schema import EnvConfig
from seedlocal.prepare import prepare_pipeline
from seedlocal.arithmetic import apply_precision, autocast, resolve_precision
from seedlocal.recipes.vtrace import PRESETS, build_model


@dataclass
class Args:
    preset: str = "atari"
    """V-trace preset whose settings are measured"""
    env: str = ""
    """env id (default: the preset's)"""
    echo: int = 0
    """override the preset's algo.echo (0 = keep)"""
    minibatches: int = 0
    """override the preset's algo.minibatches (0 = keep)"""
    repeats: int = 3
    """timed learner steps per thread count (median reported)"""
    device: str = "cpu"
    """where --precisions times the learner step"""
    precisions: list[str] = dataclasses.field(default_factory=list)
    """time only the learner step, once per arithmetic (fp32, tf32, bf16), on --device"""


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def synthetic_batch(spec, model, L: int, B: int) -> tuple[dict, dict]:
    """A learner batch of the preset's shape: random frames, sparse rewards, no episode ends."""
    g = torch.Generator().manual_seed(0)
    obs = {k: (torch.randint(0, 255, (L, B, *s.shape), dtype=torch.uint8, generator=g) if s.dtype == "uint8"
               else torch.randn((L, B, *s.shape), generator=g)) for k, s in spec.obs.items()}
    batch = {"obs": obs, "action": torch.randint(0, spec.num_actions, (L, B), generator=g),
             "reward": torch.randn(L, B, generator=g).sign() * (torch.rand(L, B, generator=g) < 0.02),
             "terminated": torch.zeros(L, B, dtype=torch.bool), "ignored": torch.zeros(L, B, dtype=torch.bool),
             "behaviour_logits": torch.zeros(L, B, spec.num_actions), "core_state": None}
    if model.lstm is not None:
        batch["core_state"] = torch.zeros(B, 2, model.lstm.hidden_size)
    return obs, batch


def _to(x, device: torch.device):
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x.to(device) if isinstance(x, torch.Tensor) else x


def time_precisions(a: Args, cfg, algo, spec) -> None:
    """The learner step's seconds per batch in each arithmetic, on one device,
    each from a fresh network and optimiser (the same seed): one JSON line."""
    device = torch.device(a.device)
    L, B = cfg.pipeline.unroll_length + 1, algo.batch_size
    frames = (L - 1) * B * spec.frames_per_step
    seconds, losses, resolved = {}, {}, {}
    for p in a.precisions:
        torch.manual_seed(0)
        model = build_model(cfg, spec).to(device)
        optimizer = make_optimizer(model.parameters(), algo)
        precision = resolve_precision(p, model.kind, device)
        apply_precision(precision, device)
        batch = _to(synthetic_batch(spec, model, L, B)[1], device)
        stats = learner_step(model, optimizer, batch, algo, precision=precision)  # warm-up (allocator, kernels)
        times = []
        for _ in range(a.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            stats = learner_step(model, optimizer, batch, algo, precision=precision)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        # Keyed by what was asked: on a CPU tf32 runs as fp32, and must not overwrite fp32's own figure.
        seconds[p] = _median(times)
        losses[p] = {k: round(float(v), 6) for k, v in stats.items() if "loss" in k}
        resolved[p] = precision
    fastest = min(seconds, key=seconds.get)
    print(json.dumps({"preset": a.preset, "env": spec.env_id, "device": str(device), "echo": algo.echo,
                      "minibatches": algo.minibatches, "frames_per_batch": frames, "learn_s": seconds,
                      "learner_alone_frames_per_s": {p: frames / s for p, s in seconds.items()},
                      "ran_as": resolved, "last_loss": losses, "fastest": fastest}), flush=True)


def time_learner(model, optimizer, batch: dict, algo, precision: str, repeats: int, thread_counts) -> dict:
    """The learner step's median seconds per batch on each thread count."""
    learn = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        learner_step(model, optimizer, batch, algo, precision=precision)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            learner_step(model, optimizer, batch, algo, precision=precision)
            times.append(time.perf_counter() - t0)
        learn[threads] = _median(times)
    return learn


def time_act(model, obs: dict, group: int, device: torch.device, precision: str) -> float:
    """The inference forward's median seconds for one group's envs, on one thread as the loop runs it."""
    torch.set_num_threads(1)  # the inference loop's default (pipeline.inference_threads)
    x = {k: v[0, :group] for k, v in obs.items()}
    core = None if model.lstm is None else torch.zeros(group, 2, model.lstm.hidden_size)
    with torch.inference_mode():
        times = []
        for i in range(33):
            t0 = time.perf_counter()
            with autocast(device, precision, cache=False):
                model.step(x, core)
            if i >= 3:  # the first calls warm oneDNN up
                times.append(time.perf_counter() - t0)
    return _median(times)


def main(a: Args) -> None:
    cfg = PRESETS[a.preset]
    if a.env:
        cfg = dataclasses.replace(cfg, env=EnvConfig(id=a.env))
    algo = dataclasses.replace(cfg.algo, echo=a.echo or cfg.algo.echo,
                               minibatches=a.minibatches or cfg.algo.minibatches)
    spec, shape = prepare_pipeline(cfg.env, cfg.pipeline)
    if a.precisions:
        return time_precisions(a, cfg, algo, spec)
    cores = os.cpu_count() or 1
    device = torch.device("cpu")
    model = build_model(cfg, spec)
    optimizer = make_optimizer(model.parameters(), algo)
    precision = resolve_precision(algo.precision, model.kind, device)
    L, B = cfg.pipeline.unroll_length + 1, algo.batch_size
    obs, batch = synthetic_batch(spec, model, L, B)

    learn = time_learner(model, optimizer, batch, algo, precision, a.repeats, sorted({1, cores}))
    group = shape.envs_per_group
    act_batch = time_act(model, obs, group, device, precision)

    n_envs = shape.num_local_envs
    with RawEnvpool(spec, n_envs, cfg.pipeline.env_threads or cores) as raw:
        raw_steps = max(raw.measure(0.5, 3.0).values())

    steps = (L - 1) * B  # agent steps per learner batch
    frames = steps * spec.frames_per_step
    terms = {"learn_core_s": learn[1], "learn_core_s_all_threads": learn[cores] * cores,
             "act_core_s": act_batch * steps / group, "step_core_s": steps / raw_steps * cores}
    total = terms["learn_core_s"] + terms["act_core_s"] + terms["step_core_s"]
    alone = frames / min(learn.values())
    budget = cores * frames / total
    out = {"preset": a.preset, "env": spec.env_id, "echo": algo.echo, "minibatches": algo.minibatches,
           "precision": precision, "cores": cores, "agent_steps_per_batch": steps, "frames_per_batch": frames,
           "learn_s_1_thread": learn[1], f"learn_s_{cores}_threads": learn[cores],
           "act_ms_per_inference_batch": act_batch * 1e3, "inference_batch": group,
           "raw_envpool_steps_per_s": raw_steps, **terms,
           "learner_alone_frames_per_s": alone, "core_budget_frames_per_s": budget,
           "ceiling_frames_per_s": min(alone, budget),
           "learn_share": terms["learn_core_s"] / total}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
