"""Curves for two habits SB3 users bring (issue 44): a Box action space far
from [-1, 1] (``box``: tests/box_envs.py's WideTarget, the policy's [-1, 1]
rescaled onto its bounds against clipped to them) and images inside a Dict
observation (``dict``: tests/image_catch.py's CatchDict, a CNN for the image
field beside the MLP against the MLP for everything; ``pixels``: the same at
42 x 42 pixels). V-trace with the plain defaults (``--preset cartpole``), a
few seeds each, run one after another through the CLI. Writes one CSV of
every run's ``charts/return_mean20`` against agent steps and a PNG of the
curves (docs/mujoco.md, docs/dict_observations.md).

    python scripts/sb3_curves.py --figure box --out docs/figures --steps 30000 --seeds 1 2 3
    python scripts/sb3_curves.py --figure dict --out docs/figures --steps 60000 --seeds 1 2 3
    python scripts/sb3_curves.py --figure pixels --out docs/figures --steps 60000 --seeds 1 2

Needs tensorboard; the PNG needs matplotlib (the CSV is written without it).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Figure:
    env: str
    runs: dict[str, list[str]]  # a curve's name -> the options that make it
    name: str  # of the CSV and the PNG, in --out
    title: str


FIGURES = {
    "box": Figure("box_envs:WideTarget-v0",
                  {"rescale": ["--env.box-actions", "rescale"], "clip": ["--env.box-actions", "clip"]},
                  "box_bounds_widetarget", "V-trace on WideTarget ([0, 100] x [-20, 5]; best 20)"),
    "dict": Figure("image_catch:CatchDict-v0",
                   {"cnn": ["--network.encoder", "auto"], "mlp": ["--network.encoder", "mlp"]},
                   "dict_images_catchdict", "V-trace on CatchDict (7 x 7 image + paddle vector; best 5.14)"),
    "pixels": Figure("image_catch:CatchDictPixels-v0",
                     {"cnn": ["--network.encoder", "auto"], "mlp": ["--network.encoder", "mlp"]},
                     "dict_images_catchdictpixels", "V-trace on CatchDictPixels (42 x 42 image + vector; best 5.14)"),
}


@dataclass
class Args:
    figure: Literal["box", "dict", "pixels"] = "box"
    """which figure: box (WideTarget, rescale against clip), dict (CatchDict, CNN against MLP) or pixels
    (CatchDictPixels, the same at 42 x 42 pixels)"""
    out: Path = Path("docs/figures")
    """folder of the CSV and the PNG"""
    steps: int = 30_000
    """agent steps per run"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """env.seed of each run, per curve"""


def run_one(fig: Figure, curve: str, seed: int, steps: int, logs: Path) -> Path:
    """One CLI run; its run folder."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    name = f"{curve}_s{seed}"
    subprocess.run([sys.executable, "-m", "seedlocal", "train", "vtrace", "--preset", "cartpole", "--env.id", fig.env,
                    *fig.runs[curve], "--env.seed", str(seed), "--total-steps", str(steps), "--log-dir", str(logs),
                    "--run-name", name, "--log-every-s", "1", "--no-progress"], env=env, check=True)
    return logs / name


def returns(run: Path) -> list[tuple[int, float]]:
    """(steps, charts/return_mean20) of every logged point of a run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run))
    acc.Reload()
    return [(int(e.step), float(e.value)) for e in acc.Scalars("charts/return_mean20")]


def main(a: Args) -> None:
    fig = FIGURES[a.figure]
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for curve in fig.runs:
            for seed in a.seeds:
                points = returns(run_one(fig, curve, seed, a.steps, Path(tmp)))
                rows += [(curve, seed, steps, ret) for steps, ret in points]
                print(f"{curve} seed {seed}: last return_mean20 {points[-1][1]:.2f} at {points[-1][0]:,d} steps")
    path = a.out / f"{fig.name}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["curve", "seed", "steps", "return_mean20"])
        w.writerows(rows)
    print(f"wrote {path}")
    plot(fig, rows, a.out / f"{fig.name}.png")


def plot(fig: Figure, rows: list[tuple[str, int, int, float]], path: Path) -> None:
    try:
        from matplotlib import pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG")
        return
    plt.switch_backend("Agg")
    figure, ax = plt.subplots(figsize=(6, 3.6))
    for i, curve in enumerate(fig.runs):
        for seed in dict.fromkeys(r[1] for r in rows if r[0] == curve):
            pts = [(s, v) for c, sd, s, v in rows if c == curve and sd == seed]
            ax.plot(*zip(*pts), color=f"C{i}", alpha=0.8, label=curve if seed == rows[0][1] else None)
    ax.set(xlabel="agent steps", ylabel="return, mean of last 20 episodes", title=fig.title)
    ax.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(tyro.cli(Args))
