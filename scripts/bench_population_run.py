"""A population run's total frames/s against single-learner runs of the same preset, alternated in one script.

Each round trains, for ``--steps`` env steps each (all members together for a population):
  single: the preset as it is (MinAtar: 2 workers of 32 envs, batch 32);
  same-envs: one learner on the population's pipeline (workers of 16 envs, so that P members own whole groups);
  population: P members on that pipeline, each with its share of a batch of P groups (one group of 64 / P envs);
  population-preset: P members each a learner of the preset's batch shape (32 envs' unrolls of 32 steps), one
    group of 32 envs each (P / 2 workers of 64 envs).
Rounds alternate the order. Prints one JSON line per run and the ratios of the medians to single's.

    python scripts/bench_population_run.py --members 8 --steps 100000 --rounds 2
    python scripts/bench_population_run.py --runs single population-preset --steps 200000
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass

import numpy as np
import tyro

import seedlocal


@dataclass
class Args:
    env: str = "MinAtar/Breakout-v1"
    rounds: int = 2
    log_dir: str = "/tmp/bench_population_run"  # (the runs are kept, for their curves)
    members: int = 8
    """P (even: the population's pipeline has P / 2 workers, two groups each)"""
    steps: int = 100_000
    """env steps of each run (a population's: all members together)"""
    runs: tuple[str, ...] = ("single", "same-envs", "population")
    """which of single, same-envs, population, population-preset"""


def _runs(a: Args) -> dict[str, dict]:
    pipe = {"num_workers": a.members // 2, "envs_per_worker": 64 // (a.members // 2)}
    group = pipe["envs_per_worker"] // 2
    base = dict(env={"id": a.env}, preset="minatar", total_steps=a.steps, log_dir=a.log_dir, progress=False)
    return {"single": base, "same-envs": {**base, "pipeline": pipe},
            "population": {**base, "pipeline": pipe, "algo": {"batch_size": a.members * group},
                           "population": {"size": a.members}},
            "population-preset": {**base, "pipeline": {"num_workers": a.members // 2, "envs_per_worker": 64},
                                  "algo": {"batch_size": a.members * 32}, "population": {"size": a.members}}}


def _cpu() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        return f"{names[0]} x {len(names)}"
    except (OSError, IndexError):
        return platform.processor() or platform.machine()


def main(a: Args) -> None:
    rates: dict[str, list[float]] = {}
    for r in range(a.rounds):
        names = list(a.runs)
        for name in names if r % 2 == 0 else names[::-1]:
            s = seedlocal.train(**{"family": "vtrace", **_runs(a)[name]}).data
            rate = s["frames"] / s["seconds"]
            rates.setdefault(name, []).append(rate)
            print(json.dumps({"run": name, "round": r, "frames": s["frames"], "seconds": s["seconds"],
                              "frames_per_s": round(rate), "return20": s["mean_return_last20"]}), flush=True)
    med = {k: float(np.median(v)) for k, v in rates.items()}
    print(json.dumps({"cpu": _cpu(), "median_frames_per_s": med,
                      **{f"{k}/single": v / med["single"] for k, v in med.items() if k != "single"}}), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
