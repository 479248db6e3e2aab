"""Reproduce an Atari learning curve: train V-trace with ``--preset atari``
for a frame or time budget, then write the return curve as CSV and PNG with
frames and wall-clock on the x axes.

    python scripts/atari_curve.py --seeds 1 2 --frames 10000000
    python scripts/atari_curve.py --env Breakout-v5 --minutes 30 -- --algo.echo 2
    python scripts/atari_curve.py --plot-only runs/curves/Pong-v5__s1 runs/curves/Pong-v5__s2

Everything after ``--`` is passed to ``seedlocal train vtrace``. Seeds run
one after another (never two at once: they would share the cores and each
curve's wall-clock would be wrong). Per run, ``<run>/curve.csv`` holds one
row per logging point: frames, steps, seconds since start, the mean return
of the last 20 episodes and the policy entropy; ``<out>/curve.png`` draws
every run given.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass
class Args:
    env: str = "Pong-v5"
    """Atari env id (envpool's v5 preprocessing)"""
    seeds: list[int] = field(default_factory=lambda: [1])
    """seeds to run, one after another"""
    frames: int = 10_000_000
    """frame budget per seed (emulator frames = 4 x agent steps)"""
    minutes: float = 0.0
    """wall-clock budget per seed (0 = none); whichever budget ends first"""
    target: float = 0.0
    """return marked on the plot and reported as frames/minutes to reach it"""
    out: str = "runs/curves"
    """folder for the runs, curve.csv files and curve.png"""
    plot_only: list[str] = field(default_factory=list)
    """just plot these run folders (each with TensorBoard events) and exit"""


def read_curve(run_dir: Path) -> list[dict]:
    """Rows of (frames, steps, seconds, return_mean20, entropy) from a run's events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    if "charts/return_mean20" not in tags:
        return []
    fps = ea.Scalars("charts/frames_per_s")
    steps_per_s = ea.Scalars("charts/steps_per_s")
    frames_per_step = round(fps[-1].value / steps_per_s[-1].value) if steps_per_s and steps_per_s[-1].value else 4
    entropy = {e.step: e.value for e in ea.Scalars("losses/entropy")} if "losses/entropy" in tags else {}
    t0 = min(e.wall_time for e in ea.Scalars(tags[0]))
    return [{"frames": e.step * frames_per_step, "steps": e.step, "seconds": round(e.wall_time - t0, 1),
             "return_mean20": round(e.value, 3), "entropy": round(entropy.get(e.step, float("nan")), 4)}
            for e in ea.Scalars("charts/return_mean20")]


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["frames", "steps", "seconds", "return_mean20", "entropy"])
        w.writeheader()
        w.writerows(rows)


def first_reach(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r["return_mean20"] >= target), None)


def plot(curves: dict[str, list[dict]], path: Path, title: str, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, rows in curves.items():
        a.plot([r["frames"] / 1e6 for r in rows], [r["return_mean20"] for r in rows], label=name)
        b.plot([r["seconds"] / 60 for r in rows], [r["return_mean20"] for r in rows], label=name)
    a.set_xlabel("emulator frames (millions)")
    b.set_xlabel("wall-clock (minutes)")
    a.set_ylabel("mean return, last 20 episodes")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        if target is not None:
            ax.axhline(target, color="gray", linestyle="--", linewidth=1)
    a.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Args, train_args: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = [Path(p) for p in args.plot_only]
    if not run_dirs:
        from seedlocal.cli import main as seedlocal

        for seed in args.seeds:
            name = f"{args.env}__s{seed}"
            argv = ["train", "vtrace", "--preset", "atari", "--env.id", args.env, "--env.seed", str(seed),
                    "--total-steps", str(args.frames // 4), "--log-dir", str(out), "--run-name", name,
                    *(["--seconds", str(args.minutes * 60)] if args.minutes else []), *train_args]
            print("seedlocal " + " ".join(argv), flush=True)
            code = seedlocal(argv)
            if code:
                raise SystemExit(code)
            run_dirs.append(out / name)
    curves = {}
    for run in run_dirs:
        rows = read_curve(run)
        if not rows:
            print(f"{run}: no charts/return_mean20 points (fewer than 20 episodes?)")
            continue
        write_csv(rows, run / "curve.csv")
        curves[run.name] = rows
        last = rows[-1]
        hit = first_reach(rows, args.target)
        reach = (f"; reached {args.target:g} at {hit['frames'] / 1e6:.2f}M frames, {hit['seconds'] / 60:.1f} min"
                 if hit else f"; never reached {args.target:g}")
        print(f"{run.name}: final return(20) {last['return_mean20']:.1f} at {last['frames'] / 1e6:.2f}M frames, "
              f"{last['seconds'] / 60:.1f} min{reach}; {run / 'curve.csv'}")
    if curves:
        plot(curves, out / "curve.png", f"{args.env}: seedlocal V-trace --preset atari", args.target)
        print(f"plot: {out / 'curve.png'}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    main(tyro.cli(Args, args=own), rest)
