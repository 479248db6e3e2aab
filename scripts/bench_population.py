"""Population evaluation, measured in one run: the forward and the whole trainer.

Forward (``--part forward``): P networks in P env slots, of which a fraction
still plays; one batched forward per step, timed for each strategy of
``PopulationForward`` (slot rows read in place) against the old way that
gathered every served member's parameter vector on every step.

End to end (``--part train``): GA and ES on the pipeline for a number of
generations (``--generations``) or a time budget (``--seconds``), evaluation
frames/s (rows served to members over the generations' time,
tails and idle slots included, the first generation, which also waits for
the workers to start, left out) against raw envpool stepping the same number of envs
with random actions and no model, measured before and after each run.

    python scripts/bench_population.py                       # CartPole-v1, P = 256 MLPs, both parts
    python scripts/bench_population.py --network nature --device cuda --part forward
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seedlocal.measure.raw import RawEnvpool
from seedlocal.config.schema import EnvConfig
from seedlocal.config.checks import resolve_device
from seedlocal.prepare import env_spec, prepare_run
from seedlocal.networks import PolicyNet
from seedlocal.families import recipe
from seedlocal.recipes.neuroevolution import ESRun, GARun
from seedlocal.trainers.neuroevolution import train
from seedlocal.policies.population_forward import PopulationForward


@dataclass
class Args:
    population: int = 256
    """P: networks evaluated per generation"""
    network: Literal["mlp", "minatar", "nature"] = "mlp"
    """mlp (CartPole-v1), minatar (MinAtar/Breakout-v1's 10 x 10 x 4 grids, the one-conv torso) or nature (Pong-v5)"""
    part: Literal["both", "forward", "train"] = "both"
    """what to measure"""
    active: tuple[float, ...] = (1.0, 0.5, 0.1)
    """forward: fractions of slots still playing (a generation's tail has few)"""
    repeats: int = 20
    """forward: timed passes per measurement (median reported)"""
    algos: tuple[str, ...] = ("ga", "es")
    """train: algorithms to run"""
    seconds: float = 20.0
    """train: seconds per algorithm (0 = no time budget: --generations ends it)"""
    generations: int = 0
    """train: generations per algorithm (0 = until --seconds); a work bound measures the same generations on any machine"""
    raw_seconds: float = 3.0
    """train: raw envpool's timing per kind of stepping, before and after each algorithm (warm-up a sixth of it)"""
    num_workers: int = 0
    """train: env workers (0 = the trainer's default)"""
    envs_per_worker: int = 0
    """train: envs per worker (0 = the trainer's default)"""
    device: str = "auto"
    """cpu, cuda, auto"""
    forward: str = "auto"
    """train: the trainers' --forward (population forward strategy)"""
    episodes_per_member: int = 1
    """train: the trainers' --episodes-per-member"""


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def forward_part(a: Args, device: torch.device) -> dict:
    ids = {"mlp": "CartPole-v1", "minatar": "MinAtar/Breakout-v1", "nature": "Pong-v5"}  # minatar: pip install .[minatar]
    spec = env_spec(EnvConfig(id=ids[a.network]))
    template = PolicyNet(spec).to(device)
    probe = PopulationForward(template, 1, device)
    flats = torch.randn(a.population, probe.size, device=device) * 0.05
    shape = spec.obs[""].shape
    obs = {"nature": lambda: torch.randint(0, 255, (a.population,) + shape, dtype=torch.uint8, device=device),
           "minatar": lambda: torch.rand((a.population,) + shape, device=device) < 0.1,
           "mlp": lambda: torch.randn((a.population,) + shape, device=device)}[a.network]()
    ways = {s: PopulationForward(template, a.population, device, strategy=s) for s in probe.candidates}
    for f in ways.values():
        f.load(torch.arange(a.population, device=device), flats, torch.arange(a.population, device=device))
    gather = ways["vmap"]
    flats = gather.to_slots(flats)  # the slot layout _one reads
    print(f"{a.network}: {probe.size:,d} parameters per network, P={a.population}, device {device}")
    rows = []
    for frac in a.active:
        k = max(1, round(frac * a.population))
        slots = np.sort(np.random.default_rng(0).permutation(a.population)[:k])
        x = {"": obs[torch.from_numpy(slots).to(device)]}
        idx = torch.from_numpy(slots).to(device)
        ms = {s: _time(lambda f=f, slots=slots, x=x: f(slots, x), a.repeats, device) * 1e3 for s, f in ways.items()}

        def per_step_gather(idx=idx, x=x):  # the previous implementation: every served vector copied every step
            with torch.inference_mode():
                return torch.func.vmap(gather._one)(flats[idx], x)

        ms["gather_vmap"] = _time(per_step_gather, a.repeats, device) * 1e3
        best = min((s for s in ways), key=ms.get)
        row = {"active": frac, **{f"{s}_ms": v for s, v in ms.items()}, "best": best,
               "gather_vmap_over_best": ms["gather_vmap"] / ms[best]}
        rows.append(row)
        print("  " + "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    out = {"part": "forward", "network": a.network, "population": a.population, "device": str(device), "rows": rows}
    print(json.dumps(out), flush=True)
    return out


def train_part(a: Args, device: torch.device) -> list[dict]:
    env = EnvConfig(id="CartPole-v1")
    spec = env_spec(env)
    outs = []
    for algo in a.algos:
        cls = {"ga": GARun, "es": ESRun}[algo]
        cfg = cls(env=env, generations=a.generations, seconds=a.seconds, progress=False, run_name="bench",
                  forward=a.forward, episodes_per_member=a.episodes_per_member)
        pipe = cfg.pipeline
        pipe = dataclasses.replace(pipe, num_workers=a.num_workers or pipe.num_workers,
                                   envs_per_worker=a.envs_per_worker or pipe.envs_per_worker, device=str(device))
        n = pipe.num_workers * pipe.envs_per_worker
        threads = pipe.env_threads or os.cpu_count() or 1
        with RawEnvpool(spec, n, threads) as raw:
            before = max(raw.measure(a.raw_seconds / 6, a.raw_seconds).values())
            with tempfile.TemporaryDirectory(prefix="seedlocal-bench-") as tmp:
                cfg = dataclasses.replace(cfg, pipeline=pipe, log_dir=tmp,
                                          algo=dataclasses.replace(cfg.algo, population_size=a.population))
                summary = train(prepare_run(cfg, recipe(cfg.name)))
                ea = EventAccumulator(os.path.join(tmp, "bench"), size_guidance={"scalars": 0})
                ea.Reload()
                tags = set(ea.Tags()["scalars"])

                def series(tag: str) -> list:  # empty when no generation finished within --seconds
                    return ea.Scalars(tag) if tag in tags else []

                frames = [e.value for e in series("perf/frames_per_generation")]
                secs = [e.value for e in series("perf/generation_s")]
                idle = series("perf/idle_share")
            after = max(raw.measure(a.raw_seconds / 6, a.raw_seconds).values())
        if not frames:
            print(f"{algo}: no generation finished within --seconds {a.seconds:g}: nothing to measure "
                  "(--generations N runs N whatever the time)", flush=True)
        # Generation 1 also waits for the env workers to start: left out when there are others.
        skip = 1 if len(frames) > 1 else 0
        rate = sum(frames[skip:]) / sum(secs[skip:]) if frames else None
        raw_best = float(np.median([before, after]))
        out = {"part": "train", "algo": algo, "env": env.id, "population": a.population, "envs": n,
               "episodes_per_member": a.episodes_per_member,
               "generations": summary["generations"], "eval_frames_per_s": rate,
               "raw_envpool_steps_per_s": raw_best, "raw_before": before, "raw_after": after,
               "ratio_raw": rate / raw_best if rate is not None else None,
               "best_member_return": summary["best_member_return"],
               "forward": summary["forward"],
               "idle_share": float(np.mean([e.value for e in idle[skip:]])) if idle else None,
               "device": str(device)}
        print(json.dumps(out), flush=True)
        outs.append(out)
    return outs


def main(a: Args) -> None:
    device = resolve_device(a.device)
    if a.part in ("both", "forward"):
        forward_part(a, device)
    if a.part in ("both", "train"):
        if a.network != "mlp":
            raise SystemExit("--part train runs CartPole-v1 MLPs; use --network mlp")
        train_part(a, device)


if __name__ == "__main__":
    main(tyro.cli(Args))
