"""Neuroevolution curves from seedlocal runs (ES, GA, ARS, random search):
one CSV per run and one PNG per env, return against training episodes and
against wall-clock minutes, every run overlaid.

    python scripts/neuro_curves.py runs/thresholds/es_Hopper-v5_s* runs/thresholds/ars_Hopper-v5_s* \\
        --out docs/figures --prefix thresholds_ --threshold 3120

Each argument is a run folder (``--log-dir``/``--run-name``) whose TensorBoard
events hold ``charts/best_member_return`` per generation (for ES the centre's
score, for ARS the current policy's, for GA the best member's). The CSV has
the columns of ``scripts/mujoco_thresholds.py``: generation, seconds (from the
end of the first generation minus its length, so env start-up is excluded),
episodes (all played), training_episodes (generation x population, what
ARS's Table 1 counts), frames, best_member_return. The PNG needs matplotlib;
without it the CSVs are still written.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mujoco_thresholds import curve


@dataclass
class Args:
    runs: tyro.conf.Positional[list[str]] = field(default_factory=list)
    """run folders"""
    out: str = "docs/figures"
    prefix: str = ""
    threshold: float | None = None
    """drawn as a horizontal line when given"""


def population_of(run: Path) -> int:
    """Members per generation, from the run's newest checkpoint's config."""
    import torch

    ckpts = sorted((run / "checkpoints").glob("ckpt_*.pt"))
    if not ckpts:
        raise SystemExit(f"{run}: no checkpoint to read the population size from")
    algo = torch.load(ckpts[-1], map_location="cpu", weights_only=True)["config"]["algo"]
    return int(algo.get("population_size") or 2 * algo["directions"])


def main(a: Args) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    by_env: dict[str, list[tuple[str, list[dict]]]] = {}
    for r in a.runs:
        run = Path(r)
        if not run.is_dir():
            raise SystemExit(f"{run}: not a folder")
        rows = curve(run, population_of(run))
        if not rows:
            raise SystemExit(f"{run}: no charts/best_member_return in its TensorBoard events")
        path = out / f"{a.prefix}{run.name}.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        last = rows[-1]
        print(f"{run.name}: {last['best_member_return']:.1f} at generation {last['generation']}, "
              f"{last['training_episodes']:,} training episodes, {last['seconds'] / 60:.1f} min; {path}")
        env = run.name.split("_")[1] if run.name.count("_") >= 2 else run.name
        by_env.setdefault(env, []).append((run.name, rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: CSVs only (pip install matplotlib)")
        return
    for env, runs in by_env.items():
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        for name, rows in runs:
            ret = [row["best_member_return"] for row in rows]
            axes[0].plot([row["training_episodes"] for row in rows], ret, label=name)
            axes[1].plot([row["seconds"] / 60 for row in rows], ret, label=name)
        for ax, xlabel in zip(axes, ("training episodes", "wall-clock (minutes)")):
            if a.threshold is not None:
                ax.axhline(a.threshold, color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("return scored each generation")
        axes[0].legend(fontsize=8)
        fig.suptitle(env)
        fig.tight_layout()
        png = out / f"{a.prefix}{env}.png"
        fig.savefig(png, dpi=100)
        print(f"plot: {png}")


if __name__ == "__main__":
    main(tyro.cli(Args))
