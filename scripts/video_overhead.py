"""What the videos during training cost the learner: Pong frames/s with ``--video-every-min 1`` against the
same run without, alternating (off, on, off, on by default), each run under an exclusive lock of the
machine's measurements (``flock -x /tmp/sl.lock``).

    python scripts/video_overhead.py                     # 2 x (off, on), 5 minutes each
    python scripts/video_overhead.py --pairs 1 --seconds 120

A run's frames/s is counted between its first and last TensorBoard points
(``charts/frames_per_s``'s steps and wall times, frames = 4 x steps), so
the start-up and the last checkpoint do not enter it. Prints one line per
run, the ratio of the means (on / off) and the ratio of each pair.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tyro


@dataclass
class Args:
    pairs: int = 2
    """(off, on) pairs to run, one after another"""
    seconds: float = 300.0
    """each run's wall-clock budget"""
    every_min: float = 1.0
    """--video-every-min of the runs with videos"""
    env: str = "Pong-v5"
    """environment (the Atari preset is picked by itself for an Atari id)"""
    lock: str = "/tmp/sl.lock"
    """each run holds this file's exclusive lock (empty: no lock)"""
    keep: str = ""
    """keep the runs here (default: a temporary folder, removed)"""


def frames_per_s(run_dir: Path, frames_per_step: int = 4) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    points = ea.Scalars("charts/frames_per_s")
    if len(points) < 2:
        raise SystemExit(f"{run_dir}: fewer than two TensorBoard points; give the runs more --seconds")
    first, last = points[0], points[-1]
    return (last.step - first.step) * frames_per_step / (last.wall_time - first.wall_time)


def one_run(args: Args, log_dir: Path, name: str, videos: bool) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "seedlocal", "train", "vtrace", "--env.id", args.env, "--seconds", str(args.seconds),
           "--log-dir", str(log_dir), "--run-name", name, "--no-progress", "--total-steps", "0"]
    if videos:
        cmd += ["--video-every-min", str(args.every_min)]
    if args.lock:
        cmd = ["flock", "-x", args.lock] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    made = len(list((log_dir / name / "videos").glob("*.gif")))
    return frames_per_s(log_dir / name), made


def main(args: Args) -> None:
    log_dir = Path(args.keep or tempfile.mkdtemp(prefix="video_overhead_"))
    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        for pair in range(args.pairs):
            for videos in (False, True):
                name = f"{'on' if videos else 'off'}{pair + 1}"
                fps, made = one_run(args, log_dir, name, videos)
                rates[videos].append(fps)
                print(f"{name}: {fps:,.0f} frames/s" + (f", {made} videos" if videos else ""), flush=True)
        off, on = (sum(rates[v]) / len(rates[v]) for v in (False, True))
        pairs = ", ".join(f"{b / a:.3f}" for a, b in zip(rates[False], rates[True]))
        print(f"{args.env}: videos every {args.every_min:g} min: {on:,.0f} frames/s against {off:,.0f} without, "
              f"ratio {on / off:.3f} (pairs: {pairs})")
    finally:
        if not args.keep:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
