"""Time and episodes to a return threshold on MuJoCo, for ES and ARS.

    python scripts/mujoco_thresholds.py --algo ars --env Hopper-v5 --threshold 3120 --seeds 1 2 3
    python scripts/mujoco_thresholds.py --algo es --env HalfCheetah-v5 --threshold 3430 --minutes 30

Each seed runs ``seedlocal train <algo> --preset mujoco`` until the centre's
(ES) or the current policy's (ARS) return, scored every generation on fresh
episodes, reaches the threshold, or the time budget ends; seeds run one
after another (never two at once: they would share the cores). Then
``seedlocal eval`` scores the final policy on 20 more episodes. One JSON
line per seed: generations, training episodes (the population's: what the
ARS paper's Table 1 counts) and all episodes (the per-generation scoring of
the centre included), agent steps, wall-clock seconds, the eval mean. Per
run, ``<out>/<algo>_<env>_s<seed>.csv`` holds the curve (generation,
seconds, episodes, steps, best member return) from TensorBoard, and
``<out>/<algo>_<env>.png`` overlays the seeds' curves against training
episodes and against minutes, the threshold dotted (``--plot-only`` draws it
again from the CSVs of runs already made).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tyro


@dataclass
class Args:
    algo: str = "ars"
    """es or ars (their --preset mujoco)"""
    env: str = "Hopper-v5"
    threshold: float = 3120.0
    """the return to reach (Hopper 3120, HalfCheetah 3430: Salimans et al.'s and ARS's thresholds)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    minutes: float = 10.0
    """time budget per seed"""
    out: str = "runs/thresholds"
    extra: list[str] = field(default_factory=list)
    """more options for seedlocal train (e.g. --algo.step-size 0.01)"""
    plot_only: bool = False
    """only draw <out>/<algo>_<env>.png from the seeds' CSVs already there"""


def curve(run_dir: Path, population: int) -> list[dict]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    if "charts/best_member_return" not in tags:
        return []
    best = ea.Scalars("charts/best_member_return")
    eps = {e.step: e.value for e in ea.Scalars("charts/episodes")}
    frames = {e.step: e.value for e in ea.Scalars("charts/frames")}
    t0 = best[0].wall_time - ea.Scalars("perf/generation_s")[0].value
    return [{"generation": e.step, "seconds": round(e.wall_time - t0, 2), "episodes": int(eps.get(e.step, 0)),
             "training_episodes": e.step * population, "frames": int(frames.get(e.step, 0)),
             "best_member_return": round(e.value, 2)} for e in best]


def plot(a: Args, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for seed in a.seeds:
        name = f"{a.algo}_{a.env}_s{seed}"
        with open(out / f"{name}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        ret = [float(r["best_member_return"]) for r in rows]
        axes[0].plot([int(r["training_episodes"]) for r in rows], ret, label=name)
        axes[1].plot([float(r["seconds"]) / 60 for r in rows], ret, label=name)
    for ax, xlabel in zip(axes, ("training episodes", "wall-clock (minutes)")):
        ax.axhline(a.threshold, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("return scored each generation")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{a.algo.upper()} on {a.env}, threshold {a.threshold:,.0f}")
    fig.tight_layout()
    path = out / f"{a.algo}_{a.env}.png"
    fig.savefig(path, dpi=100)
    return path


def main(a: Args) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.plot_only:
        print(plot(a, out))
        return
    for seed in a.seeds:
        name = f"{a.algo}_{a.env}_s{seed}"
        cmd = [sys.executable, "-m", "seedlocal", "train", a.algo, "--preset", "mujoco", "--env.id", a.env,
               "--env.seed", str(seed), "--stop-at-return", str(a.threshold), "--seconds", str(a.minutes * 60),
               "--log-dir", str(out), "--run-name", name, "--no-progress", *a.extra]
        subprocess.run(cmd, check=True)
        summary = json.loads((out / name / "summary.json").read_text())
        config = json.loads(subprocess.run(
            [sys.executable, "-c", "import json,sys,torch; s=torch.load(sys.argv[1], weights_only=True);"
             "print(json.dumps(s['config']['algo']))", summary["checkpoint"]],
            capture_output=True, text=True, check=True).stdout)
        population = config.get("population_size") or 2 * config["directions"]
        rows = curve(out / name, population)
        with open(out / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["generation"])
            w.writeheader()
            w.writerows(rows)
        ev = subprocess.run([sys.executable, "-m", "seedlocal", "eval", "--checkpoint", str(out / name),
                             "--episodes", "20", "--policy", "argmax"], capture_output=True, text=True)
        mean = float(ev.stdout.split("return mean ")[1].split()[0]) if "return mean" in ev.stdout else None
        reached = summary["stopped_by"] == "target"
        print(json.dumps({
            "algo": a.algo, "env": a.env, "seed": seed, "threshold": a.threshold, "reached": reached,
            "generations": summary["generations"], "training_episodes": summary["generations"] * population,
            "episodes": summary["episodes"], "steps": summary["steps"], "seconds": summary["seconds"],
            "best_member_return": summary["best_member_return"], "eval20_mean": mean}), flush=True)
    print(plot(a, out))


if __name__ == "__main__":
    main(tyro.cli(Args))
