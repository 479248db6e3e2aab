"""Masked against unmasked V-trace on tests/mask_envs.py's Pick game: the
same game with its action mask (``Pick-v0``) and without (``PickNoMask-v0``,
where an illegal action ends the episode with -1), a few seeds each, run one
after another through the CLI with the preset's defaults. Writes one CSV of
every run's ``charts/return_mean20`` against agent steps, with the illegal
actions the envs logged so far, and a PNG of both curves (docs/masks.md).

    python scripts/mask_curve.py --out docs/figures --steps 40000 --seeds 1 2 3

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

import tyro

ROOT = Path(__file__).resolve().parents[1]
GAMES = {"masked": "mask_envs:Pick-v0", "unmasked": "mask_envs:PickNoMask-v0"}


@dataclass
class Args:
    out: Path = Path("docs/figures")
    """folder of the CSV and the PNG"""
    steps: int = 40_000
    """agent steps per run"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """env.seed of each run, per game"""


def run_one(game: str, seed: int, steps: int, logs: Path) -> tuple[Path, Path]:
    """One CLI run; its run folder and its illegal-action log."""
    illegal = logs / f"{game}_s{seed}.illegal"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
           "MASK_ENVS_ILLEGAL_LOG": str(illegal)}
    subprocess.run([sys.executable, "-m", "seedlocal", "train", "vtrace", "--env.id", GAMES[game],
                    "--env.seed", str(seed), "--total-steps", str(steps), "--log-dir", str(logs),
                    "--run-name", f"{game}_s{seed}", "--log-every-s", "1", "--no-progress"], env=env, check=True)
    return logs / f"{game}_s{seed}", illegal


def curve(run: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run))
    ea.Reload()
    return [(int(e.step), float(e.value)) for e in ea.Scalars("charts/return_mean20")]


def main(a: Args) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for game in GAMES:
            for seed in a.seeds:
                run, illegal = run_one(game, seed, a.steps, Path(tmp))
                n_illegal = len(illegal.read_text().splitlines()) if illegal.exists() else 0
                rows += [(f"{game}_s{seed}", steps, ret) for steps, ret in curve(run)]
                print(f"{game} seed {seed}: final return_mean20 {rows[-1][2]:.2f}, illegal actions {n_illegal}")
    path = a.out / "masks_pick_vtrace.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "steps", "return_mean20"])
        w.writerows(rows)
    print(f"wrote {path}")
    plot(rows, a.out / "masks_pick_vtrace.png")


def plot(rows: list[tuple[str, int, float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG")
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for run in dict.fromkeys(r[0] for r in rows):
        pts = [(s, v) for name, s, v in rows if name == run]
        ax.plot(*zip(*pts), color="C0" if run.startswith("masked") else "C3", alpha=0.8,
                label=run.split("_s")[0] if run.endswith("_s1") else None)
    ax.set_xlabel("agent steps")
    ax.set_ylabel("return, mean of last 20 episodes")
    ax.set_title("V-trace on Pick (8 actions, 20 steps; best 20)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(tyro.cli(Args))
