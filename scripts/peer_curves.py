"""Learning curves of seedlocal runs beside a peer's (CleanRL) runs, from
their TensorBoard events: one CSV per run and one PNG per environment with
the return against agent steps and against wall-clock, every run overlaid.

    python scripts/peer_curves.py /work/peers/runs/cleanrl /work/peers/runs/seedlocal --out docs/figures --prefix mujoco_
    python scripts/peer_curves.py runs/HalfCheetah-v5__vtrace__1__* peer/runs/HalfCheetah-v4__ppo_* --log-time

Each argument is a run folder (event files in it) or a folder of run
folders, as CleanRL's ``runs/`` and seedlocal's ``--log-dir`` are, or a CSV
this script wrote before (``<prefix><env>_<system>_<algo>_s<seed>.csv``;
pass the same ``--prefix``), so a curve whose run folder is gone can still be
plotted beside new runs. A run is read as:

- CleanRL (``charts/episodic_return``, one point per episode against
  ``global_step``): the return is the mean of the last 20 episodes, one row
  per episode from the 20th on;
- seedlocal (``charts/return_mean20`` against agent steps, logged every
  ``--log-every-s``): that mean as logged, beside ``charts/episode_return``
  (the mean of the episodes that ended since the previous point).

Per run, ``<out>/<prefix><env>_<system>_<algo>_s<seed>.csv`` holds steps,
seconds, return_mean20, episodes (ended so far), episode_return (CleanRL:
that episode; seedlocal: the interval's mean) and entropy (the last logged
policy entropy: CleanRL's Gaussian entropy summed over action dimensions,
seedlocal's ``losses/entropy``). ``<out>/<prefix><Env>.png`` (per env name
without its version, so a CleanRL ``Hopper-v4`` run and a seedlocal
``Hopper-v5`` run share a plot) has two panels: return against steps and
against minutes.

Seconds count from the run's first event, written when its TensorBoard
writer opens: CleanRL opens it before making its envs, seedlocal before
starting its env workers, so both clocks include env setup and neither
includes the Python imports before it. A resumed seedlocal run's clock
includes the time it was stopped.

The summary printed per env gives each run's return at the steps and at the
seconds that every run of that env reached (equal steps, equal wall-clock).
Needs tensorboard; the PNG needs matplotlib (``pip install matplotlib``),
without which the CSVs are still written.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_curve import first_reach

FIELDS = ["steps", "seconds", "return_mean20", "episodes", "episode_return", "entropy", "eval_return"]


@dataclass
class Args:
    runs: tyro.conf.Positional[list[str]]
    """run folders (TensorBoard event dirs), or folders holding run folders"""
    out: str = "runs/peer_curves"
    """folder for the CSVs and PNGs"""
    prefix: str = ""
    """prefix of every file written (e.g. mujoco_)"""
    window: int = 20
    """episodes in CleanRL's moving mean (seedlocal logs its own mean of 20)"""
    log_time: bool = False
    """wall-clock axis on a log scale (when one system runs many times longer)"""
    targets: list[str] = field(default_factory=list)
    """ENV=RETURN pairs (env name without version, e.g. Hopper=3120): a dashed line, and steps/minutes to reach it"""


@dataclass
class Run:
    path: Path
    system: str  # "cleanrl" or "seedlocal"
    algo: str
    env_id: str
    seed: str
    rows: list[dict]

    @property
    def env(self) -> str:
        return re.sub(r"-v\d+$", "", self.env_id)

    @property
    def label(self) -> str:
        name = {"cleanrl": "CleanRL", "minatar": "MinAtar's"}.get(self.system, "seedlocal")
        return f"{name} {self.algo} {self.env_id} s{self.seed}"


def run_dirs(paths: list[str]) -> list[Path]:
    """Folders that hold event files: each path itself, or its subfolders;
    MinAtar example logs (``*.minatar.log``, scripts/peer_minatar.sh); CSVs written before."""
    found = []
    for p in map(Path, paths):
        if p.is_file() and (p.name.endswith(MINATAR_LOG) or p.suffix == ".csv"):
            found.append(p)
            continue
        if not p.is_dir():
            raise SystemExit(f"{p}: no such folder")
        if any(p.glob("events.out.tfevents.*")):
            found.append(p)
        else:
            found += sorted(d for d in p.iterdir() if d.is_dir() and any(d.glob("events.out.tfevents.*")))
        found += sorted(p.glob(f"*{MINATAR_LOG}"))
    return found


MINATAR_LOG = ".minatar.log"
# MinAtar's examples (dqn.py, AC_lambda.py) with -v log every 1,000th episode: its return, an exponential
# average of all returns (weight 0.01 on the newest, so about the last 100 episodes), the frame count and the
# mean seconds per frame so far (so seconds = frames x that).
_MINATAR_LINE = re.compile(r"Episode (\d+) \| Return: ([-\d.e]+) \| Avg return: ([-\d.e]+) \| Frame: (\d+) "
                           r"\| Time per frame: ([\d.e-]+)")
MINATAR_GAMES = {"breakout": "Breakout", "space_invaders": "SpaceInvaders", "freeway": "Freeway",
                 "asterix": "Asterix", "seaquest": "Seaquest"}


def episode_rows(episodes, window: int, entropy=lambda step: "") -> list[dict]:
    """One row per episode (steps, seconds, return), from the ``window``-th on, with the mean of the last
    ``window`` returns: how a peer's per-episode log becomes the curve seedlocal logs as return_mean20."""
    rows, last = [], deque(maxlen=window)
    for n, (steps, seconds, ret) in enumerate(episodes, 1):
        last.append(ret)
        if len(last) == window:
            rows.append({"steps": steps, "seconds": seconds, "return_mean20": round(sum(last) / window, 3),
                         "episodes": n, "episode_return": round(ret, 3), "entropy": entropy(steps)})
    return rows


def read_minatar_log(path: Path, window: int = 20) -> Run:
    """A run of MinAtar's own example agents, from what scripts/peer_minatar.sh keeps
    (``<game>_<dqn|AC_lambda>_s<seed>.minatar.log``): their v0 envs (all 6 actions). Where the
    episode CSV beside the log exists (``.minatar.csv``, scripts/minatar_episodes.py), the curve is the
    mean of the last ``window`` episodes as for the other systems; else the log's every-1,000th-episode
    running average."""
    named = re.fullmatch(r"(\w+?)_(dqn|AC_lambda)_s(\w+)", path.name[:-len(MINATAR_LOG)])
    if named is None:
        raise SystemExit(f"{path}: expected a name <game>_<dqn|AC_lambda>_s<run>{MINATAR_LOG} "
                         "(as scripts/peer_minatar.sh writes it)")
    game, algo, seed = named.groups()
    rows = []
    episodes_csv = path.with_name(path.name[:-len(MINATAR_LOG)] + ".minatar.csv")
    if episodes_csv.exists():
        with open(episodes_csv, newline="") as f:
            episodes = list(csv.DictReader(f))
        rows = episode_rows(((int(e["frames"]), float(e["seconds"]), float(e["return"])) for e in episodes), window)
        return Run(path, "minatar", algo.replace("_", ""), f"MinAtar/{MINATAR_GAMES.get(game, game)}-v0", seed, rows)
    for m in _MINATAR_LINE.finditer(path.read_text()):
        episodes, ret, avg, frames, per_frame = m.groups()
        rows.append({"steps": int(frames), "seconds": round(int(frames) * float(per_frame), 1),
                     "return_mean20": round(float(avg), 3), "episodes": int(episodes),
                     "episode_return": float(ret), "entropy": ""})
    return Run(path, "minatar", algo.replace("_", ""), f"MinAtar/{MINATAR_GAMES.get(game, game)}-v0", seed, rows)


def _text(ea, tag: str) -> str:
    return ea.Tensors(tag)[0].tensor_proto.string_val[0].decode() if tag in ea.Tags().get("tensors", []) else ""


def _at_or_before(points: list, step: int) -> float:
    """Value of the last point at or before ``step`` (points sorted by step)."""
    value = float("nan")
    for p in points:
        if p.step > step:
            break
        value = p.value
    return value


def _count(v: float) -> int | str:
    return "" if math.isnan(v) else int(v)


_SAVED = re.compile(r"(.+)_(seedlocal|cleanrl|minatar)_([A-Za-z0-9]+)_s(\w+)\.csv")


def read_saved_csv(path: Path, prefix: str) -> Run:
    """A run's CSV as ``write_csv`` wrote it; its env id comes back from the file name (the first ``_`` of a
    namespaced id was its ``/``: ``MinAtar_Breakout-v1`` is ``MinAtar/Breakout-v1``)."""
    m = _SAVED.fullmatch(path.name[len(prefix):] if path.name.startswith(prefix) else "")
    if m is None:
        raise SystemExit(f"{path}: expected a name {prefix}<env>_<seedlocal|cleanrl|minatar>_<algo>_s<seed>.csv "
                         "(as this script writes them, with the same --prefix)")
    env, system, algo, seed = m.groups()
    def value(key: str, text: str | None) -> float | int | str:
        if text in ("", None):
            return ""
        return int(float(text)) if key in ("steps", "episodes") else float(text)

    with open(path, newline="") as f:
        rows = [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
    return Run(path, system, algo, env.replace("_", "/", 1), seed, rows)


def read_run(path: Path, window: int = 20, prefix: str = "") -> Run | None:
    if path.suffix == ".csv":
        return read_saved_csv(path, prefix)
    if path.is_file():
        return read_minatar_log(path, window)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    t0 = ea.FirstEventTimestamp()
    entropy = sorted(ea.Scalars("losses/entropy"), key=lambda e: e.step) if "losses/entropy" in tags else []
    rows = []
    if "charts/episodic_return" in tags:  # CleanRL: one point per episode
        hp = dict(re.findall(r"^\|(\w+)\|(.*)\|$", _text(ea, "hyperparameters/text_summary"), re.MULTILINE))
        parts = path.name.split("__")  # CleanRL's run name: env__exp__seed__time
        env_id = hp.get("env_id") or parts[0]
        seed = hp.get("seed") or (parts[2] if len(parts) > 2 else "?")
        algo = (hp.get("exp_name") or "ppo").split("_")[0]
        episodes = sorted(ea.Scalars("charts/episodic_return"), key=lambda e: (e.step, e.wall_time))
        rows = episode_rows(((e.step, round(e.wall_time - t0, 1), e.value) for e in episodes), window,
                            lambda step: round(_at_or_before(entropy, step), 4))
        system = "cleanrl"
    elif "charts/return_mean20" in tags or "charts/eval_return" in tags:  # seedlocal (R2D2: the second)
        config = _text(ea, "config/text_summary").strip("`\n")
        try:
            config = json.loads(config)
        except ValueError:
            config = {}
        env_id = config.get("env", {}).get("id") or path.name
        seed = str(config.get("env", {}).get("seed", "?"))
        summary = path / "summary.json"
        algo = json.loads(summary.read_text()).get("algo", "") if summary.exists() else ""
        algo = algo or next((a for a in ("vtrace", "r2d2") if f"__{a}__" in path.name), "vtrace")
        ep_ret = {e.step: e.value for e in ea.Scalars("charts/episode_return")} if "charts/episode_return" in tags else {}
        ep_n = sorted(ea.Scalars("charts/episodes"), key=lambda e: e.step) if "charts/episodes" in tags else []
        # R2D2 logs the mean of its last 20 training episodes as charts/episode_return, and its
        # evaluation slots' (epsilon 0.001) as charts/eval_return.
        r2d2 = "charts/return_mean20" not in tags
        evals = {e.step: e.value for e in ea.Scalars("charts/eval_return")} if r2d2 else {}
        for e in sorted(ea.Scalars("charts/episode_return" if r2d2 else "charts/return_mean20"), key=lambda e: e.step):
            rows.append({"steps": e.step, "seconds": round(e.wall_time - t0, 1),
                         "return_mean20": round(e.value, 3), "episodes": _count(_at_or_before(ep_n, e.step)),
                         "episode_return": round(ep_ret.get(e.step, float("nan")), 3),
                         "entropy": round(_at_or_before(entropy, e.step), 4),
                         "eval_return": round(evals[e.step], 3) if e.step in evals else ""})
        system = "seedlocal"
    else:
        return None
    return Run(path, system, algo, env_id, seed, rows)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def value_at(rows: list[dict], key: str, x: float) -> float:
    """return_mean20 of the last row with ``key`` at or below ``x``."""
    below = [r for r in rows if r[key] <= x]
    return below[-1]["return_mean20"] if below else float("nan")


def plot(env: str, runs: list[Run], path: Path, log_time: bool, target: float | None) -> bool:
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed, so no {path.name}: pip install matplotlib (the CSVs are written)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in runs:
        style = {"linestyle": "-" if r.system == "seedlocal" else "--", "label": r.label}
        a.plot([x["steps"] / 1e6 for x in r.rows], [x["return_mean20"] for x in r.rows], **style)
        b.plot([x["seconds"] / 60 for x in r.rows], [x["return_mean20"] for x in r.rows], **style)
        evals = [x for x in r.rows if x.get("eval_return", "") != ""]
        if evals:  # R2D2's evaluation slots, beside its training episodes
            style = {"linestyle": ":", "label": f"{r.label} (evaluation, epsilon 0.001)"}
            a.plot([x["steps"] / 1e6 for x in evals], [x["eval_return"] for x in evals], **style)
            b.plot([x["seconds"] / 60 for x in evals], [x["eval_return"] for x in evals], **style)
    a.set_xlabel("agent steps (millions)")
    b.set_xlabel("wall-clock (minutes" + (", log scale)" if log_time else ")"))
    if log_time:
        b.set_xscale("log")
    a.set_ylabel("mean return, last 20 episodes" + (" (MinAtar's: its running average)" if any(r.system == "minatar" for r in runs) else ""))
    for ax in (a, b):
        ax.grid(alpha=0.3)
        if target is not None:
            ax.axhline(target, color="gray", linestyle=":", linewidth=1)
    a.legend(fontsize=8)
    fig.suptitle(f"{env}: " + ", ".join(sorted({r.env_id for r in runs})))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run_line(run: Run, tail: int = 50) -> str:
    """A run's end in one line: its last point, the mean of its last ``tail`` points (steadier), its
    evaluation return where it logs one (R2D2), and where it stood at 1M steps (item 16's random-play check)."""
    last, rows = run.rows[-1], run.rows[-tail:]
    line = (f"{run.label}: {last['return_mean20']:.1f} at {last['steps']:,d} steps, {last['seconds'] / 60:.1f} min "
            f"({last['steps'] / max(last['seconds'], 1e-9):,.0f} steps/s over the run); last {len(rows)} points "
            f"{sum(r['return_mean20'] for r in rows) / len(rows):.1f}")
    evals = [r["eval_return"] for r in rows if r.get("eval_return", "") != ""]
    if evals:
        line += f"; evaluation {evals[-1]:.1f} (last {len(evals)}: {sum(evals) / len(evals):.1f})"
    if last["steps"] >= 1_000_000:
        line += f"; {value_at(run.rows, 'steps', 1_000_000):.1f} at 1M steps"
    return line


def main(args: Args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets = {k: float(v) for k, v in (t.split("=", 1) for t in args.targets)}
    by_env: dict[str, list[Run]] = {}
    written: set[str] = set()
    paths = run_dirs(args.runs)
    if not paths:
        raise SystemExit(f"no TensorBoard event files in {' '.join(args.runs) or '(no folders given)'} or their subfolders")
    for path in paths:
        run = read_run(path, args.window, args.prefix)
        if run is None:
            print(f"{path}: neither charts/episodic_return (CleanRL) nor charts/return_mean20 (seedlocal); skipped")
            continue
        if not run.rows:
            print(f"{path}: fewer than {args.window} episodes (MinAtar's log alone: 1,000); skipped")
            continue
        name = f"{args.prefix}{run.env_id.replace('/', '_')}_{run.system}_{run.algo}_s{run.seed}"
        if name in written:
            name += f"_{path.name}"
        written.add(name)
        write_csv(run.rows, out / f"{name}.csv")
        by_env.setdefault(run.env, []).append(run)
        print(f"{run_line(run)}; {out / name}.csv  [{path}]")
    for env, runs in by_env.items():
        steps = min(r.rows[-1]["steps"] for r in runs)
        seconds = min(r.rows[-1]["seconds"] for r in runs)
        print(f"\n{env}: return (mean of 20) at {steps:,d} steps and at {seconds / 60:.1f} min, "
              "the most that every run reached")
        for r in runs:
            line = (f"  {r.label:<40} {value_at(r.rows, 'steps', steps):>9.1f} at equal steps"
                    f"   {value_at(r.rows, 'seconds', seconds):>9.1f} at equal wall-clock")
            if env in targets:
                hit = first_reach(r.rows, targets[env])
                line += (f"   {targets[env]:g} reached at {hit['steps']:,d} steps, {hit['seconds'] / 60:.1f} min"
                         if hit else f"   never reached {targets[env]:g}")
            print(line)
        png = out / f"{args.prefix}{env.replace('/', '_')}.png"
        if plot(env, runs, png, args.log_time, targets.get(env)):
            print(f"  plot: {png}")


if __name__ == "__main__":
    main(tyro.cli(Args))
