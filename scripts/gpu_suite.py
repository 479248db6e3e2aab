#!/usr/bin/env python3
"""The whole GPU checklist in one command (issue 20): every step timed out on
its own, the suite as a whole inside one wall-clock budget (default 540 s).

On the lent GPU machine (the device ``run`` tool: carry [".whl", ".assets"],
made here by ``bash ../shared/tools/device-kit.sh`` then ``bash scripts/device_extra_wheels.sh``), one call:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PWD ENVPOOL_ASSETS_PATH=$PWD/.assets && bash scripts/gpu_suite.sh $OUT

and, in another call, the Pong V-trace learning curve of ``seedlocal train vtrace --env.id Pong-v5`` as a
user types it (the preset and its machine sizing picked by themselves), up to the budget, with its minutes to
--curve-target (+18):

    ... && bash scripts/gpu_suite.sh --curve $OUT

Here, without a GPU, ``bash scripts/gpu_suite.sh --cpu-dry-run /tmp/suite``
runs every step with tiny sizes on the CPU (CartPole-v1; pytest only
collects the cuda tests), so the suite's own mechanics can be checked.

Steps (``--print-steps`` lists them with their commands):
  env                    imports of everything the suite needs (printing what is missing), torch /
                         CUDA / cuDNN versions, nvidia-smi, the Atari env made once
  pytest_cuda            python -m pytest -m cuda (tests/test_cuda.py): pass/fail counts
  learner_precision      one Atari-preset V-trace update in fp32, tf32 and bf16 (scripts/bench_learner_budget.py
                         --precisions): the measurement that --algo.precision auto (tf32 on CUDA) awaits
  bench_model[_graphs]   seedlocal bench on Pong-v5, all cores, the training network: ratio_model >= 0.9
  bench_model_wide       the same at a worker per 8 cores and 64 envs each (the default is 1 x 32)
  bench_learning[_graphs]  the same with --learning: ratio_learning >= 0.8
  bench_transport        --transport-only on CartPole-v1 (512 envs): >= 1M steps/s
  bench_transport_pong   --transport-only with Pong's observations (figure only)
  raw_ceiling            seedlocal bench --raw-ceiling: envpool's own best settings at 1, 2, 4 ... all threads
                         against bench_model's raw kinds (bench_best_over_ceiling >= 0.95), and the per-thread scaling
  population_forward     scripts/bench_population.py --network nature, P = 256 (forward only: the script
                         refuses --part train for nature); its steps/s ceiling against bench_model's raw Pong
  population_train       scripts/bench_population.py --part train (GA, CartPole MLPs, P = 256): >= 0.8 x raw
  population_learners    scripts/bench_population_run.py: 16 MinAtar V-trace learners in one run against one
                         learner of the preset, total frames/s (issue 46; >= 0.8 reported, not enforced)
  train_vtrace / train_r2d2 / train_ga   60-second runs on Pong-v5 at the machine-sized presets: summary.json,
                         the last progress line, frames/s over bench_model's raw (issue 33's targets: V-trace >= 0.75
                         and >= 70K frames/s, R2D2 >= 0.5, GA >= 0.75 with P >= 256)

and, in a third call of the same length, the peer: CleanRL's ppo_atari_envpool.py for the same seconds
(``scripts/peer_cleanrl_atari.py``; carry ``.peer`` too, made by ``scripts/peer_cleanrl_prepare.sh``):

    ... && bash scripts/gpu_suite.sh --peer $OUT

Written under the output folder (few files: the device machine sends back at
most 8): ``results.jsonl`` (one JSON object per step: name, command, status,
rc, seconds, the JSON the step printed, figures and targets), ``suite.log``
(every step's full output) and, with ``--curve``, ``curve.csv`` /
``curve.png`` / ``curve.tfevents``. Run folders go to ``<out>/runs/<step>``
and are deleted once read (``--keep-runs`` keeps them).

Exit status: 0 if every step ran and exited 0 (targets are reported, not
enforced), 1 if one failed, timed out or was skipped for lack of time,
2 without CUDA (after the import checks; one line on stderr) or on bad
arguments. Only the standard library is imported here: the suite must run
to say what is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PY = sys.executable or "python3"
SEEDLOCAL = [PY, "-m", "seedlocal"]  # not pip-installed on the GPU machine: PYTHONPATH has the repo root

# Modules the suite's commands import, and what needs them.
REQUIRED = {
    "torch": "everything", "numpy": "everything", "envpool": "environments", "tyro": "the CLI",
    "gymnasium": "envpool / fallback worker", "grpc": "the gRPC bridge", "tensorboard": "logging, bench --learning",
    "seedlocal": "the project", "seedlocal.cli": "the CLI", "seedlocal.measure.bench": "seedlocal bench",
    "seedlocal.trainers.vtrace": "train vtrace", "seedlocal.trainers.r2d2": "train r2d2",
    "seedlocal.trainers.neuroevolution": "train ga", "lz4": "R2D2 --preset atari (replay compression)",
    "pytest": "pytest -m cuda", "psutil": "tests/conftest.py",
}
OPTIONAL = {"matplotlib": "--curve's PNG (CSV only without it)", "PIL": "seedlocal eval --video",
            "pytest_timeout": "pytest's timeout = 600 in pyproject.toml"}

# Issue 33's targets for the trainers as a user runs them on a 16-core GPU box (machine-sized presets):
# frames/s over bench_model's best raw envpool frames/s on the same box.
TRAIN_TARGETS = {"vtrace": [("over_raw", ">=", 0.75), ("frames_per_s", ">=", 70_000)],
                 "r2d2": [("over_raw", ">=", 0.5)],
                 "ga": [("over_raw", ">=", 0.75), ("population", ">=", 256)]}

# The dry run's V-trace and R2D2 runs: a few dozen V-trace updates on CartPole-v1, R2D2's replay filling.
DRY_TRAIN_STEPS = 3000

TARGET_OPS = {">=": lambda v, t: v >= t, "==": lambda v, t: v == t, "<=": lambda v, t: v <= t}


@dataclass
class Step:
    name: str
    argv: Callable[[float], list[str]]
    """the command, given the seconds it is allotted (train steps shorten their --seconds to fit)"""
    timeout: float
    """the most seconds it may run"""
    min_s: float
    """the fewest seconds worth starting it with; later steps' min_s is kept back for them"""
    figures: Callable[[dict, dict], dict] = lambda rec, ctx: {}
    """(its record, earlier records by name) -> figures"""
    targets: list[tuple[str, str, float]] = field(default_factory=list)
    """(figure, op, value): reported beside the figure, not enforced"""
    show: tuple[str, ...] = ()
    """figures printed in its summary line besides the targets"""
    run_dir: Path | None = None
    """a trainer's --log-dir: summary.json and the run are read from it, then deleted"""
    note: str = ""


# ---------------------------------------------------------------- the steps


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,d}"
    return str(v)


def _last_json(rec: dict) -> dict:
    objs = rec.get("json") or []
    return objs[-1] if objs else {}


def _pick(d: dict, keys) -> dict:
    return {k: d[k] for k in keys if d.get(k) is not None}


def env_figures(rec: dict, ctx: dict) -> dict:
    j = _last_json(rec)
    f = _pick(j, ("python", "torch", "cuda", "cudnn", "cuda_available", "gpu", "gpu_memory_gib", "cpu_count",
                  "env_made"))
    f["missing"] = sorted(j.get("missing", {})) if j else ["(the probe printed nothing)"]
    f["missing_optional"] = sorted(j.get("missing_optional", {}))
    return f


def pytest_figures(rec: dict, ctx: dict) -> dict:
    out = {}
    for line in reversed(rec.get("tail", [])):
        counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?|"
                            r"tests? collected)", line)
        if counts:
            for n, what in counts:
                what = {"error": "errors", "warning": "warnings", "test collected": "collected",
                        "tests collected": "collected"}.get(what, what)
                out[what] = int(n)
            break
    for k in ("failed", "errors"):
        if out and k not in out and "collected" not in out:
            out[k] = 0
    return out


def bench_figures(keys: tuple[str, ...], detail: str = "", detail_keys: tuple[str, ...] = ()):
    """The bench's last JSON line: ``keys`` from its top level, ``detail_keys`` from
    ``detail`` (e.g. model_detail) as ``<detail's first word>_<key>``."""
    def figures(rec: dict, ctx: dict) -> dict:
        j = _last_json(rec)
        f = _pick(j, keys)
        if detail and isinstance(j.get(detail), dict):
            f.update({f"{detail.split('_')[0]}_{k}": v for k, v in _pick(j[detail], detail_keys).items()})
        return f
    return figures


def precision_figures(rec: dict, ctx: dict) -> dict:
    j = _last_json(rec)
    f = _pick(j, ("device", "fastest", "frames_per_batch"))
    f["learn_s"] = {p: round(v, 4) for p, v in (j.get("learn_s") or {}).items()}
    return f


def population_forward_figures(rec: dict, ctx: dict) -> dict:
    j = _last_json(rec)
    f = _pick(j, ("network", "population", "device"))
    rows = j.get("rows") or []
    for r in rows:
        best = r.get("best")
        ms = r.get(f"{best}_ms")
        if ms:
            f[f"best_ms_active_{r['active']:g}"] = ms
            f[f"best_active_{r['active']:g}"] = best
    full = next((r for r in rows if r.get("active") == 1.0), None)
    if full and full.get(f"{full['best']}_ms"):
        # P networks, one step each, per best forward: the steps/s the forward alone can serve.
        f["forward_steps_per_s"] = j["population"] / (full[f"{full['best']}_ms"] / 1e3)
        raw = _last_json(ctx.get("bench_model", {})).get("raw_best_steps_per_s")
        if raw:
            f["raw_best_steps_per_s"] = raw
            f["forward_over_raw"] = f["forward_steps_per_s"] / raw
    return f


def population_train_figures(rec: dict, ctx: dict) -> dict:
    f = {}
    for j in rec.get("json") or []:
        if j.get("part") == "train":
            a = j["algo"]
            f.update({f"{a}_ratio_raw": j.get("ratio_raw"), f"{a}_eval_frames_per_s": j.get("eval_frames_per_s"),
                      f"{a}_generations": j.get("generations"), "raw_envpool_steps_per_s": j.get("raw_envpool_steps_per_s"),
                      "envs": j.get("envs"), "population": j.get("population")})
    return {k: v for k, v in f.items() if v is not None}


def train_figures(rec: dict, ctx: dict) -> dict:
    s = rec.get("summary") or {}
    f = _pick(s, ("status", "stopped_by", "steps", "frames", "updates", "generations", "episodes",
                  "mean_return_last20", "eval_return_last20", "best_member_return", "seconds", "frames_per_s"))
    if "frames_per_s" not in f and s.get("frames") and s.get("seconds"):
        f["frames_per_s"] = s["frames"] / s["seconds"]
    return f


def over_raw_figures(rec: dict, ctx: dict) -> dict:
    """A trainer's frames/s (summary.json: its whole run, start-up included) over bench_model's best raw
    envpool frames/s on the same box, with the run's population where it has one."""
    f = train_figures(rec, ctx)
    s = rec.get("summary") or {}
    if s.get("population"):
        f["population"] = s["population"]
    raw = _last_json(ctx.get("bench_model", {}))
    if f.get("frames_per_s") and raw.get("raw_best_steps_per_s"):
        f["raw_best_frames_per_s"] = raw["raw_best_steps_per_s"] * raw.get("frames_per_step", 1)
        f["over_raw"] = f["frames_per_s"] / f["raw_best_frames_per_s"]
    return f


def ceiling_figures(rec: dict, ctx: dict) -> dict:
    j = _last_json(rec)
    f = _pick(j, ("ceiling_steps_per_s", "bench_raw_best_steps_per_s", "bench_best_over_ceiling",
                  "scaling_efficiency", "envs"))
    for r in j.get("per_threads") or []:
        f[f"best_steps_per_s_{r['threads']}t"] = r["best"]["steps_per_s"]
    if j.get("per_threads"):
        b = j["per_threads"][-1]["best"]
        f["best_setting"] = f"num_envs {b['num_envs']}, batch {b['batch_size']}, affinity {b['thread_affinity_offset']}"
    return f


def peer_figures(rec: dict, ctx: dict) -> dict:
    return _pick(_last_json(rec), ("status", "sps", "frames_per_s", "frames", "games", "return_mean20",
                                   "reached_target_minutes", "reached_target_frames", "minutes"))


def curve_figures(rec: dict, ctx: dict) -> dict:
    return _pick(_last_json(rec), ("points", "final_return_mean20", "best_return_mean20", "final_frames",
                                   "final_minutes", "reached_target_minutes", "reached_target_frames", "csv", "png",
                                   "png_note"))


MODEL_KEYS = ("ratio_model", "model_policy_steps_per_s", "raw_best_steps_per_s", "raw_best", "ratio_random",
              "random_policy_steps_per_s", "num_workers", "envs_per_worker", "env_threads", "frames_per_step",
              "cuda_graphs", "device")
LEARN_KEYS = ("ratio_learning", "learning_steps_per_s", "raw_best_steps_per_s", "num_workers", "envs_per_worker",
              "env_threads", "cuda_graphs", "device")
TRANS_KEYS = ("transport_steps_per_s", "transport_batches_per_s", "collect_ms_p50", "collect_ms_p99",
              "envs_per_worker", "device")
GRAPHS = ["--cuda-graphs"]


@dataclass(frozen=True)
class Sizes:
    """The checklist's sizes: tiny ones for the CPU dry run (the mechanics, not the figures), a GPU box's otherwise."""
    b_model: list[str]
    b_learn: list[str]
    b_trans: list[str]
    b_ceiling: list[str]
    pytest: list[str]
    pop_fwd: list[str]
    pop_train: list[str]
    pop_learners: list[str]
    """scripts/bench_population_run.py's options: a population of V-trace learners against one (issue 46)"""
    precisions: list[str]
    trains: dict[str, list[str]]
    """each trainer's command head"""
    train_s: float
    """a trainer's --seconds at most"""
    overhead: float
    """a trainer's start-up and exit, kept out of its --seconds"""
    t_bench: float
    t_small: float
    t_ceiling: float
    t_train: float
    m_bench: float
    m_train: float


def dry_sizes() -> Sizes:
    overhead = 6.0
    return Sizes(
        b_model=["--envs-per-worker", "16", "--seconds", "0.3", "--warmup", "0.2", "--rounds", "1"],
        b_learn=["--learning", "--skip-model", "--seconds", "0.3", "--warmup", "0.2", "--rounds", "1"],
        b_trans=["--envs-per-worker", "64", "--seconds", "0.3", "--warmup", "0.2", "--rounds", "1"],
        b_ceiling=["--env-threads", "2", "--envs-per-worker", "16", "--seconds", "0.05", "--warmup", "0.02"],
        pytest=[PY, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-m", "cuda", "--collect-only", "-q",
                "tests/test_cuda.py"],
        pop_fwd=["--network", "mlp", "--part", "forward", "--population", "16", "--active", "1.0", "0.5",
                 "--repeats", "2"],
        # Two generations, whatever the time: two seconds of them made none under two pytest processes (issue 44).
        pop_train=["--part", "train", "--algos", "ga", "--population", "16", "--generations", "2", "--seconds", "0",
                   "--raw-seconds", "0.3", "--num-workers", "1", "--envs-per-worker", "16"],
        pop_learners=["--members", "2", "--steps", "2048", "--rounds", "1", "--runs", "single", "population-preset"],
        precisions=["--preset", "cartpole", "--precisions", "fp32", "bf16", "--repeats", "1"],
        trains={"vtrace": ["train", "vtrace"], "r2d2": ["train", "r2d2"], "ga": ["train", "ga"]},
        # No cap on a trainer's --seconds, only the room its timeout leaves: the dry run's trainers end at their
        # work bound (seconds of CartPole), and the timeout (40 + 26) is room for a slow machine.
        train_s=math.inf, overhead=overhead,
        t_bench=60, t_small=60, t_ceiling=60, t_train=40 + 26, m_bench=5, m_train=overhead + 1)


def gpu_sizes() -> Sizes:
    train_s, overhead = 60.0, 25.0
    return Sizes(
        b_model=["--seconds", "1.5", "--warmup", "1", "--rounds", "2"],
        b_learn=["--learning", "--skip-model", "--seconds", "3", "--warmup", "3", "--rounds", "1"],
        b_trans=["--seconds", "2", "--warmup", "1", "--rounds", "2"],
        b_ceiling=["--num-workers", "2", "--envs-per-worker", "64", "--seconds", "0.6", "--warmup", "0.2"],
        # --timeout: a hung test fails alone instead of eating the step (and every count) at pyproject's 600 s.
        # -v: each test's name and outcome as it ends, so a step cut off by the budget still says which failed
        # (the H200's first run lost that); --tb=short keeps the tracebacks that follow inside the log.
        pytest=[PY, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-m", "cuda", "-v", "--tb=short", "-rfEs",
                "--timeout", "90", "--durations", "5", "tests/test_cuda.py"],
        pop_fwd=["--network", "nature", "--part", "forward", "--population", "256"],
        pop_train=["--part", "train", "--algos", "ga", "--population", "256", "--seconds", "8"],
        # 16 MinAtar learners of the preset's batch shape (8 workers of 64 envs) against the preset's one learner.
        pop_learners=["--members", "16", "--steps", "500000", "--rounds", "1", "--runs", "single", "population-preset"],
        precisions=["--precisions", "fp32", "tf32", "bf16", "--repeats", "5"],  # the Atari preset's update
        trains={"vtrace": ["train", "vtrace", "--preset", "atari"], "r2d2": ["train", "r2d2", "--preset", "atari"],
                "ga": ["train", "ga"]},
        train_s=train_s, overhead=overhead,
        # raw_ceiling: 12 of envpool's settings at 1, 2, 4, 8 and all threads, 0.8 s each: about 80 s on 16 cores.
        t_bench=80, t_small=50, t_ceiling=50 + 60, t_train=train_s + overhead + 5, m_bench=25, m_train=overhead + 10)


@dataclass(frozen=True)
class Plan:
    """What every step's command is built from."""
    dry: bool
    env: str
    dev: str
    cores: str
    runs: Path
    """the trainers' run folders"""
    z: Sizes
    bench_args: list[str] = field(default_factory=list)
    """appended to every bench command: the last value given wins"""

    @property
    def bench(self) -> list[str]:
        return [*SEEDLOCAL, "bench", "--device", self.dev, "--env-threads", self.cores]


def build_steps(a: argparse.Namespace, out: Path) -> list[Step]:
    dry = a.cpu_dry_run
    env = a.env or ("CartPole-v1" if dry else "Pong-v5")
    cores = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    plan = Plan(dry=dry, env=env, dev="cpu" if dry else "cuda", cores=cores, runs=out / "runs",
                z=dry_sizes() if dry else gpu_sizes())
    if a.curve:
        return [probe_step(plan), *curve_steps(plan, a, out)]
    if a.peer:
        return [probe_step(plan), peer_step(plan, a)]
    plan = replace(plan, bench_args=shlex.split(a.bench_args))
    return [probe_step(plan), *check_steps(plan), *bench_steps(plan), *population_steps(plan), *train_steps(plan)]


def probe_step(p: Plan) -> Step:
    # The probe imports everything (torch, envpool, gymnasium, matplotlib ...): 5-6 s on a busy 2-core box.
    return Step("env", lambda t: [PY, str(SCRIPT), "--probe", p.env], timeout=90, min_s=15 if p.dry else 20,
                figures=env_figures,
                show=("torch", "cuda", "cudnn", "gpu", "cuda_available", "missing", "missing_optional"))


def curve_steps(p: Plan, a: argparse.Namespace, out: Path) -> list[Step]:
    seconds = a.curve_seconds or (6 if p.dry else 520)
    overhead = 8 if p.dry else 20  # start-up (torch, CUDA, workers) and the exit's checkpoint

    def curve_cmd(t):
        # What a user types (issue 33): the preset is picked by the env's kind and sized for this machine
        # (its first lines say so); only the time budget and the log folder are added.
        s = max(1.0, min(seconds, t - overhead))
        return [*SEEDLOCAL, "train", "vtrace", "--env.id", p.env, *(["--pipeline.device", p.dev] if p.dry else []),
                "--seconds", f"{s:g}", "--log-dir", str(p.runs / "curve")]

    return [Step("curve_train", curve_cmd, timeout=seconds + overhead, min_s=overhead + (2 if p.dry else 60),
                 figures=train_figures, run_dir=p.runs / "curve",
                 show=("steps", "frames", "episodes", "mean_return_last20", "frames_per_s")),
            Step("curve_post", lambda t: [PY, str(SCRIPT), "--curve-post", str(p.runs / "curve"), str(out),
                                          str(a.curve_target)],
                 timeout=60, min_s=5 if p.dry else 15, figures=curve_figures,
                 targets=[("best_return_mean20", ">=", a.curve_target)],
                 show=("final_return_mean20", "final_minutes", "reached_target_minutes", "png_note"))]


def peer_step(p: Plan, a: argparse.Namespace) -> Step:
    seconds = a.curve_seconds or (8 if p.dry else 520)
    overhead = 5 if p.dry else 15

    def peer_cmd(t):
        # CleanRL's defaults as they are; on the CPU (dry run) --no-cuda, CleanRL's own flag.
        s = max(1.0, min(seconds, t - overhead))
        return [PY, "scripts/peer_cleanrl_atari.py", "--seconds", f"{s:g}", "--target", f"{a.curve_target:g}",
                "--log-dir", str(p.runs / "peer"), "--", "--env-id", a.env or "Pong-v5",
                *(["--no-cuda"] if p.dry else [])]

    return Step("peer_cleanrl", peer_cmd, timeout=seconds + overhead, min_s=overhead + 2,
                figures=peer_figures, targets=[("return_mean20", ">=", a.curve_target)],
                show=("frames_per_s", "games", "return_mean20", "reached_target_minutes"),
                note="CleanRL's ppo_atari_envpool.py, unmodified, behind the envpool 1.x shim; "
                     "compare with --curve's run of the same seconds on the same box")


def check_steps(p: Plan) -> list[Step]:
    """The CUDA tests, and the learner's update in each arithmetic."""
    return [Step("pytest_cuda", lambda t: p.z.pytest, timeout=60 if p.dry else 150, min_s=5 if p.dry else 30,
                 figures=pytest_figures, targets=[] if p.dry else [("failed", "==", 0), ("errors", "==", 0)],
                 show=("collected", "passed", "failed", "errors", "skipped"),
                 note="--collect-only: no CUDA here" if p.dry else ""),
            Step("learner_precision", lambda t: [PY, "scripts/bench_learner_budget.py", "--device", p.dev,
                                                 *p.z.precisions],
                 timeout=p.z.t_small, min_s=p.z.m_bench, figures=precision_figures,
                 show=("learn_s", "fastest"),
                 note="one V-trace update per arithmetic: what --algo.precision auto should be on this GPU")]


def bench_steps(p: Plan) -> list[Step]:
    """seedlocal bench: the model, learning and transport ratios to raw envpool, and envpool's own ceiling."""
    return [*bench_model_steps(p), *bench_learning_steps(p), *bench_transport_steps(p),
            # Issue 33, item 4: is bench_model's raw limit envpool's real ceiling here, or a setting the bench chose?
            Step("raw_ceiling", lambda t: [*SEEDLOCAL, "bench", "--env", p.env, "--raw-ceiling",
                                           *(["--env-threads", p.cores] if not p.dry else []), *p.z.b_ceiling],
                 timeout=p.z.t_ceiling, min_s=p.z.m_bench, figures=ceiling_figures,
                 targets=[("bench_best_over_ceiling", ">=", 0.95)],
                 show=("ceiling_steps_per_s", "bench_raw_best_steps_per_s", "scaling_efficiency", "best_setting"),
                 note="envpool's own settings (async, batch ~ threads, num_envs 2-3 x batch, pinned or not) "
                      "against the bench's three kinds, per thread count")]


def bench_model_steps(p: Plan) -> list[Step]:
    # _wide: the presets and the bench's default are sized for 2 cores (16-32 envs in one worker); on the H200's
    # 16 cores that left ratio_model at 0.363 with batches of 16 (docs/gpu.md). The same bench with a worker per
    # 8 cores and 64 envs each is the figure a GPU-sized preset would start from.
    wide = ["--num-workers", str(max(1, (os.cpu_count() or 1) // 8)), "--envs-per-worker", "64"]
    # Without CUDA the _graphs variants would run the very commands of the plain ones: the dry run leaves them out.
    variants = [("", [], "")] if p.dry else [
        ("", [], ""), ("_graphs", GRAPHS, ""),
        ("_wide", wide, "a worker per 8 cores, 64 envs each: sizes for a many-core machine")]
    return [Step(f"bench_model{suffix}", lambda t, extra=extra: [*p.bench, "--env", p.env, *p.z.b_model, *extra,
                                                                 *p.bench_args],
                 timeout=p.z.t_bench, min_s=p.z.m_bench, figures=bench_figures(MODEL_KEYS, "model_detail", (
                     "forward_ms_per_batch", "mean_batch", "worker_wait_share")),
                 targets=[("ratio_model", ">=", 0.9)],
                 show=("model_policy_steps_per_s", "raw_best_steps_per_s", "ratio_random", "num_workers",
                       "envs_per_worker", "model_forward_ms_per_batch"), note=why)
            for suffix, extra, why in variants]


def bench_learning_steps(p: Plan) -> list[Step]:
    return [Step(f"bench_learning{suffix}", lambda t, extra=extra: [*p.bench, "--env", p.env, *p.z.b_learn, *extra,
                                                                    *p.bench_args],
                 timeout=p.z.t_bench, min_s=p.z.m_bench, figures=bench_figures(LEARN_KEYS, "learning_detail", (
                     "updates_per_s", "learner_wait_share", "worker_wait_share")),
                 targets=[("ratio_learning", ">=", 0.8)],
                 show=("learning_steps_per_s", "raw_best_steps_per_s", "learning_updates_per_s",
                       "learning_learner_wait_share"))
            for suffix, extra in ((("", []),) if p.dry else (("", []), ("_graphs", GRAPHS)))]


def bench_transport_steps(p: Plan) -> list[Step]:
    steps = [Step("bench_transport", lambda t: [*p.bench, "--env", "CartPole-v1", "--transport-only", *p.z.b_trans,
                                                *p.bench_args],
                  timeout=p.z.t_small, min_s=p.z.m_bench, figures=bench_figures(TRANS_KEYS),
                  targets=[("transport_steps_per_s", ">=", 1e6)],
                  show=("transport_batches_per_s", "collect_ms_p50", "envs_per_worker"))]
    if not p.dry:  # Pong's 28 KB observations through the same transport: a figure, no target
        steps.append(Step("bench_transport_pong", lambda t: [*p.bench, "--env", p.env, "--transport-only",
                                                             *p.z.b_trans, *p.bench_args],
                          timeout=p.z.t_small, min_s=15, figures=bench_figures(TRANS_KEYS),
                          show=("transport_steps_per_s", "transport_batches_per_s", "collect_ms_p50")))
    return steps


def population_steps(p: Plan) -> list[Step]:
    pop = [PY, "scripts/bench_population.py", "--device", p.dev]
    return [Step("population_forward", lambda t: [*pop, *p.z.pop_fwd], timeout=p.z.t_small, min_s=p.z.m_bench,
                 figures=population_forward_figures, targets=[("forward_over_raw", ">=", 0.8)],
                 show=("forward_steps_per_s", "raw_best_steps_per_s", "best_ms_active_1", "best_active_1"),
                 note="forward only (bench_population refuses --part train with --network nature); "
                      "forward_over_raw: its steps/s ceiling over bench_model's raw envpool"),
            Step("population_train", lambda t: [*pop, *p.z.pop_train], timeout=p.z.t_small, min_s=p.z.m_bench,
                 figures=population_train_figures, targets=[("ga_ratio_raw", ">=", 0.8)],
                 show=("ga_eval_frames_per_s", "raw_envpool_steps_per_s", "ga_generations", "envs"),
                 note="GA on CartPole-v1 MLPs, the only end-to-end population bench"),
            Step("population_learners", lambda t: [PY, "scripts/bench_population_run.py", *p.z.pop_learners,
                                                   "--log-dir", str(p.runs / "population_learners")],
                 timeout=90 if p.dry else 240, min_s=p.z.m_bench, figures=population_learners_figures,
                 targets=[("population_over_single", ">=", 0.8)], run_dir=p.runs / "population_learners",
                 show=("single_frames_per_s", "population_frames_per_s", "members"),
                 note="P MinAtar Breakout V-trace learners in one run (one inference call, one batched update "
                      "on CUDA), total frames/s over one learner's; issue 46")]


def population_learners_figures(rec: dict, ctx: dict) -> dict:
    j = _last_json(rec)
    med = j.get("median_frames_per_s") or {}
    argv = shlex.split(rec.get("command", ""))
    members = int(argv[argv.index("--members") + 1]) if "--members" in argv else None
    return {k: v for k, v in {"single_frames_per_s": med.get("single"),
                              "population_frames_per_s": med.get("population-preset"),
                              "population_over_single": j.get("population-preset/single"),
                              "members": members}.items() if v is not None}


def train_command(p: Plan, algo: str, t: float) -> list[str]:
    """A trainer's command with ``t`` seconds allotted. The dry run stops by work, not seconds: a CartPole member
    that balances for 500 steps can hold GA's first generation open past 3 s on a 2-core machine, and a loaded one
    may step nothing in a few seconds; the figures then say nothing."""
    if p.dry:
        stop = ["--generations", "1"] if algo == "ga" else ["--total-steps", str(DRY_TRAIN_STEPS)]
    else:
        stop = ["--generations", "0"] if algo == "ga" else ["--total-steps", "0"]
    s = max(1.0, min(p.z.train_s, t - p.z.overhead))
    return [*SEEDLOCAL, *p.z.trains[algo], "--env.id", p.env, "--pipeline.device", p.dev, "--seconds", f"{s:g}",
            *stop, "--log-dir", str(p.runs / f"train_{algo}")]


def train_steps(p: Plan) -> list[Step]:
    return [Step(f"train_{algo}", lambda t, algo=algo: train_command(p, algo, t), timeout=p.z.t_train,
                 min_s=p.z.m_train, figures=over_raw_figures, targets=[] if p.dry else TRAIN_TARGETS[algo],
                 run_dir=p.runs / f"train_{algo}",
                 show=("status", "steps", "frames_per_s", "over_raw", "population", "episodes",
                       "mean_return_last20", "eval_return_last20", "best_member_return", "generations"),
                 note="over_raw: the run's frames/s, start-up included, over bench_model's raw envpool")
            for algo in p.z.trains]


# ---------------------------------------------------------------- running


class Stop(Exception):
    """SIGTERM / SIGHUP on the suite: stop the step in flight, write what there is."""


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Runner:
    def __init__(self, out: Path, budget: float, grace: float, echo=print):
        self.out, self.grace, self.echo = out, grace, echo
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        out.mkdir(parents=True, exist_ok=True)
        self.results_path = out / "results.jsonl"
        self.log_path = out / "suite.log"
        self.results = open(self.results_path, "w", encoding="utf-8")
        self.log = open(self.log_path, "w", encoding="utf-8", errors="replace")
        self.lock = threading.Lock()
        self.records: dict[str, dict] = {}

    # Time kept back after a step's timeout: SIGTERM, the grace for a clean
    # exit, SIGKILL, and the reader threads draining.
    @property
    def stop_slack(self) -> float:
        return self.grace + 6.0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def write_log(self, text: str) -> None:
        with self.lock:
            self.log.write(text)
            self.log.flush()

    def allot(self, step: Step, later: list[Step]) -> float:
        """Seconds ``step`` may run: its own timeout, less what later steps need
        at least; but never less than its own least while the budget has that
        (earlier steps come first: a budget too small for all skips the last)."""
        left = self.deadline - time.monotonic() - self.stop_slack
        return min(step.timeout, max(left - sum(s.min_s for s in later), min(step.min_s, left)))

    def run(self, step: Step, index: int, total: int, later: list[Step], env: dict) -> dict:
        allotted = self.allot(step, later)
        rec: dict = {"name": step.name, "command": None, "status": None, "rc": None, "seconds": 0.0,
                     "timeout_s": round(max(0.0, allotted), 1)}
        if step.note:
            rec["note"] = step.note
        if allotted < step.min_s:
            return self.skip(step, rec, allotted, f"[{index}/{total}] {step.name}")
        argv = step.argv(allotted)
        rec["command"] = shlex.join(argv)
        self.echo(f"[{index}/{total}] {step.name} (at most {allotted:.0f} s, suite at {self.elapsed():.0f} s): "
                  f"{rec['command']}", flush=True)
        self.write_log(f"\n==== [{index}/{total}] {step.name}  suite +{self.elapsed():.1f}s  timeout {allotted:.0f}s\n"
                       f"$ {rec['command']}\n")
        stdout: list[str] = []
        tail: list[str] = []
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            rec.update(status="failed", reason=f"could not start: {e}")
            self.write_log(f"could not start: {e}\n")
            return self.finish(step, rec)
        rc, timed_out, interrupted = self.watch(proc, allotted, stdout, tail)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec["rc"] = rc
        rec["status"] = ("interrupted" if interrupted else "timeout" if timed_out else "ok" if rc == 0 else "failed")
        if timed_out:
            rec["reason"] = f"timed out after {allotted:.0f} s"
        self.read_output(step, rec, stdout, tail)
        rec = self.finish(step, rec)
        if interrupted:
            raise interrupted
        return rec

    def skip(self, step: Step, rec: dict, allotted: float, head: str) -> dict:
        """The step is not started: the budget left has less than its least."""
        rec.update(status="skipped", reason=f"budget: {max(0.0, allotted):.0f} s left for it, "
                                             f"it needs at least {step.min_s:.0f} s")
        rec["command"] = shlex.join(step.argv(step.timeout))
        self.echo(f"{head}: skipped ({rec['reason']})")
        self.write_log(f"\n==== {head}: skipped ({rec['reason']})\n")
        return self.finish(step, rec)

    def read_lines(self, pipe, keep: list[str] | None, tail: list[str]) -> None:
        """One of the step's pipes into the log, and into ``keep`` (stdout) and the last 200 lines of both."""
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.write_log(line + "\n")
            with self.lock:
                if keep is not None:
                    keep.append(line)
                tail.append(line)
                del tail[:-200]
        pipe.close()

    def watch(self, proc: subprocess.Popen, allotted: float, stdout: list[str], tail: list[str]):
        """Read the step's output until it exits, or stop it at its timeout or on a signal to the suite:
        (rc, timed out, the signal's exception)."""
        readers = [threading.Thread(target=self.read_lines, args=(proc.stdout, stdout, tail), daemon=True),
                   threading.Thread(target=self.read_lines, args=(proc.stderr, None, tail), daemon=True)]
        for r in readers:
            r.start()
        timed_out = interrupted = None
        try:
            rc = proc.wait(timeout=max(0.1, allotted))
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = self.stop(proc)
        except (KeyboardInterrupt, Stop) as e:
            interrupted = e
            rc = self.stop(proc)
        for r in readers:
            r.join(timeout=3)
        if any(r.is_alive() for r in readers):  # something it started still holds the pipes
            _kill_group(proc.pid, signal.SIGKILL)
            for r in readers:
                r.join(timeout=2)
        return rc, timed_out, interrupted

    def read_output(self, step: Step, rec: dict, stdout: list[str], tail: list[str]) -> None:
        """The JSON lines the step printed, its last other lines and, for a trainer, its run."""
        rec["json"] = [j for j in (_json_line(s) for s in stdout) if j is not None]
        with self.lock:  # the JSON is in rec["json"] already
            rec["tail"] = [ln[:300] for ln in tail if _json_line(ln) is None][-12:]
        self.write_log(f"==== {step.name}: {rec['status']}, rc {rec['rc']}, {rec['seconds']} s\n")
        if step.run_dir is not None:
            with self.lock:
                lines = list(tail)
            self.read_run(step, rec, lines)

    def stop(self, proc: subprocess.Popen) -> int | None:
        """SIGTERM to the step (seedlocal checkpoints and cleans up on it),
        SIGKILL after the grace, then to whatever it left in its group."""
        try:
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                rc = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                rc = None
            time.sleep(1.0)  # its resource tracker unlinks what the killed process held
            _kill_group(proc.pid, signal.SIGKILL)
            return rc

    def read_run(self, step: Step, rec: dict, lines: list[str]) -> None:
        """summary.json and the last progress line of a trainer's run; then the run folder goes."""
        summaries = sorted(step.run_dir.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
        if summaries:
            rec["run_dir"] = str(summaries[-1].parent)
            try:
                rec["summary"] = json.loads(summaries[-1].read_text())
            except (OSError, ValueError) as e:
                rec["summary_error"] = str(e)
        else:
            rec["summary_error"] = f"no summary.json under {step.run_dir}"
        progress = [ln.strip() for ln in lines if re.match(r"\s*(steps|gen)\s+[\d,]+\s", ln)]
        if progress:
            rec["progress"] = progress[-1]

    def finish(self, step: Step, rec: dict) -> dict:
        try:
            rec["figures"] = step.figures(rec, self.records) if rec["status"] != "skipped" else {}
        except Exception as e:  # a parser's bug must not lose the record
            rec["figures"] = {}
            rec["figures_error"] = f"{type(e).__name__}: {e}"
        rec["targets"] = []
        for key, op, value in step.targets:
            v = rec["figures"].get(key)
            met = TARGET_OPS[op](v, value) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            rec["targets"].append({"figure": key, "target": f"{op} {_fmt(value)}", "value": v, "met": met})
        rec["suite_elapsed_s"] = round(self.elapsed(), 1)
        self.records[step.name] = rec
        self.results.write(json.dumps(rec, default=str) + "\n")
        self.results.flush()
        line = summary_line(step, rec)
        self.echo("    " + line, flush=True)
        self.write_log(line + "\n")
        return rec

    def close(self) -> None:
        self.results.close()
        self.log.close()


def _json_line(s: str) -> dict | None:
    s = s.strip()
    if not (s.startswith("{") and s.endswith("}")):
        return None
    try:
        j = json.loads(s)
    except ValueError:
        return None
    return j if isinstance(j, dict) else None


def summary_line(step: Step, rec: dict) -> str:
    parts = [f"{step.name:22s} {rec['status']:9s} {rec['seconds']:6.1f}s"]
    if rec["status"] not in ("ok", "skipped") and rec.get("rc") is not None:
        parts.append(f"rc {rec['rc']}")
    if rec["status"] == "skipped":
        return "  ".join(parts + [f"| {rec.get('reason', '')}"])
    for t in rec.get("targets", []):
        met = {True: "met", False: "NOT met", None: "no figure"}[t["met"]]
        parts.append(f"{t['figure']} {_fmt(t['value'])} (target {t['target']}: {met})")
    figs = rec.get("figures", {})
    for k in step.show:
        if k in figs and figs[k] is not None:
            v = figs[k]
            parts.append(f"{k} {(', '.join(map(str, v)) or 'none') if isinstance(v, list) else _fmt(v)}")
    if rec.get("progress"):
        parts.append(f"last progress: {rec['progress']}")
    if rec["status"] in ("failed", "timeout", "interrupted") or rec.get("summary_error"):
        why = rec.get("reason") or rec.get("summary_error") or next(
            (ln for ln in reversed(rec.get("tail", [])) if ln.strip()), "")
        parts.append(f"| {why.strip()[:200]}")
    return "  ".join(parts)


def subprocess_env() -> dict:
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in (str(Path(p).resolve()) for p in paths):
        paths.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the log as it happens, and survives a kill
    return env


def run_suite(a: argparse.Namespace) -> int:
    out = Path(a.out).resolve()
    steps = build_steps(a, out)
    if a.only:
        wanted = {"env", *a.only.split(",")}
        unknown = wanted - {s.name for s in steps}
        if unknown:
            print(f"gpu_suite: error: --only: no step named {', '.join(sorted(unknown))} "
                  f"(steps: {', '.join(s.name for s in steps)})", file=sys.stderr)
            return 2
        steps = [s for s in steps if s.name in wanted]
    if a.print_steps:
        for s in steps:
            print(json.dumps({"name": s.name, "timeout_s": s.timeout, "min_s": s.min_s,
                              "command": shlex.join(s.argv(s.timeout))}))
        return 0
    try:
        runner = Runner(out, budget=a.budget - 3.0, grace=a.grace if a.grace is not None else (3.0 if a.cpu_dry_run else 10.0))
    except OSError as e:
        print(f"gpu_suite: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    mode = "curve" if a.curve else "peer" if a.peer else "suite"
    print(f"gpu_suite: {mode}{' (CPU dry run)' if a.cpu_dry_run else ''}, {len(steps)} steps, budget {a.budget:g} s; "
          f"results {runner.results_path}, log {runner.log_path}", flush=True)
    runner.write_log(f"gpu_suite {mode}: {' '.join(map(shlex.quote, sys.argv))}\nbudget {a.budget:g} s, "
                     f"python {PY}, cwd {ROOT}\n")
    env = subprocess_env()
    status = 0
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for i, step in enumerate(steps):
            rec = runner.run(step, i + 1, len(steps), steps[i + 1:], env)
            if rec["status"] != "ok":
                status = 1
            if step.name == "env" and not a.cpu_dry_run and not rec["figures"].get("cuda_available"):
                f = rec["figures"]
                print(f"gpu_suite: refused: no CUDA device (torch {f.get('torch', 'missing')}, built for CUDA "
                      f"{f.get('cuda')}); the import checks are in {runner.results_path}; --cpu-dry-run runs "
                      f"the suite's mechanics on a CPU", file=sys.stderr, flush=True)
                return 2
            if step.run_dir is not None and not a.keep_runs:
                prune(step, rec, out, curve=a.curve)
    except (KeyboardInterrupt, Stop) as e:
        print(f"gpu_suite: stopped ({e or 'interrupted'}); results so far in {runner.results_path}", file=sys.stderr)
        return 130
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        if not a.keep_runs:
            try:
                (out / "runs").rmdir()
            except OSError:
                pass
        lines = [summary_line(s, runner.records[s.name]) for s in steps if s.name in runner.records]
        runner.write_log("\n==== summary\n" + "\n".join(lines) + "\n")
        runner.close()
    print(f"\n==== summary ({runner.elapsed():.0f} s of {a.budget:g} s)", flush=True)
    for ln in lines:
        print(ln)
    return status


def prune(step: Step, rec: dict, out: Path, curve: bool) -> None:
    """The run folder has been read into results.jsonl: it goes, so that the
    output folder keeps the few files the device machine sends back (the
    curve's TensorBoard events are kept as curve.tfevents)."""
    if curve:
        events = sorted(step.run_dir.glob("*/events.out.tfevents.*"), key=lambda p: p.stat().st_size)
        if events and events[-1].stat().st_size <= 15 * 2 ** 20:
            shutil.copyfile(events[-1], out / "curve.tfevents")
        return  # curve_post reads the run; main() prunes after it
    shutil.rmtree(step.run_dir, ignore_errors=True)


# ---------------------------------------------------------------- subcommands run as steps


def probe(env_id: str) -> int:
    """Import everything, print what is missing, the versions, nvidia-smi; the last line is JSON."""
    import platform

    info: dict = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "missing": {},
                  "missing_optional": {}, "versions": {},
                  "pythonpath": os.environ.get("PYTHONPATH", ""),
                  "envpool_assets_path": os.environ.get("ENVPOOL_ASSETS_PATH")}
    probe_imports(info)
    probe_torch(info)
    if "envpool" not in info["missing"]:
        probe_env(info, env_id)
    probe_nvidia_smi(info)
    for name, v in sorted(info["versions"].items()):
        print(f"  {name:26s} {v or '(imported)'}")
    print("missing: " + ("; ".join(f"{k} ({v})" for k, v in info["missing"].items()) or "nothing"))
    print("missing, optional: " + ("; ".join(f"{k} ({v})" for k, v in info["missing_optional"].items()) or "nothing"))
    print(f"torch {info.get('torch')}, CUDA {info.get('cuda')}, cuDNN {info.get('cudnn')}, "
          f"cuda available: {info.get('cuda_available')}, GPU {info.get('gpu')}")
    print(json.dumps(info, default=str), flush=True)
    return 1 if info["missing"] else 0


def probe_imports(info: dict) -> None:
    """Each module the suite needs, imported: its version, or why it is missing."""
    import importlib

    for group, key in ((REQUIRED, "missing"), (OPTIONAL, "missing_optional")):
        for name, why in group.items():
            try:
                m = importlib.import_module(name)
                info["versions"][name] = str(getattr(m, "__version__", "") or "")
            except BaseException as e:  # noqa: BLE001  (an import can raise anything, SystemExit included)
                info[key][name] = f"{type(e).__name__}: {e} (needed by {why})"


def probe_torch(info: dict) -> None:
    """torch's CUDA and cuDNN, the GPU, and one kernel run on it."""
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            p = torch.cuda.get_device_properties(0)
            info.update(gpu=p.name, gpu_count=torch.cuda.device_count(), gpu_capability=f"{p.major}.{p.minor}",
                        gpu_memory_gib=round(p.total_memory / 2 ** 30, 1),
                        bf16=bool(torch.cuda.is_bf16_supported()))
            x = torch.ones(1024, device="cuda")
            info["cuda_works"] = float((x * 2).sum().item()) == 2048.0
    except BaseException as e:  # noqa: BLE001
        info.setdefault("cuda_available", False)
        info["torch_error"] = f"{type(e).__name__}: {e}"


def probe_env(info: dict, env_id: str) -> None:
    """The suite's env made once by envpool."""
    try:
        import envpool

        e = envpool.make(env_id, env_type="gymnasium", num_envs=1)
        obs, _ = e.reset()
        e.close()
        info["env_made"] = f"{env_id} {getattr(obs, 'shape', '?')}"
    except BaseException as e:  # noqa: BLE001
        info["missing"][f"{env_id} (envpool.make)"] = f"{type(e).__name__}: {e}"


def probe_nvidia_smi(info: dict) -> None:
    """nvidia-smi printed whole, and its per-GPU query kept."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        info["nvidia_smi"] = None
        return
    for args, key in (([], None), (["--query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,"
                                    "temperature.gpu,power.limit,clocks.max.sm", "--format=csv"], "nvidia_smi")):
        try:
            r = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
            print(r.stdout + r.stderr, flush=True)
            if key:
                info[key] = r.stdout.strip().splitlines()
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi_error"] = str(e)


def curve_post(log_dir: str, out: str, target: float) -> int:
    """The curve from the run's TensorBoard events (scripts/atari_curve.py's
    reader): curve.csv, and curve.png where matplotlib is installed."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import atari_curve

    runs = sorted(Path(log_dir).glob("*/events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        print(f"no TensorBoard events under {log_dir}")
        print(json.dumps({"points": 0}))
        return 1
    run = runs[-1].parent
    rows = atari_curve.read_curve(run)
    res: dict = {"run": str(run), "points": len(rows)}
    if not rows:
        print(f"{run}: no charts/return_mean20 points (fewer than 20 episodes?)")
        print(json.dumps(res))
        return 1
    csv_path = Path(out) / "curve.csv"
    atari_curve.write_csv(rows, csv_path)
    hit = atari_curve.first_reach(rows, target)
    res.update(csv=str(csv_path), final_return_mean20=rows[-1]["return_mean20"],
               best_return_mean20=max(r["return_mean20"] for r in rows), final_frames=rows[-1]["frames"],
               final_minutes=round(rows[-1]["seconds"] / 60, 2),
               reached_target_minutes=round(hit["seconds"] / 60, 2) if hit else None,
               reached_target_frames=hit["frames"] if hit else None)
    try:
        png = Path(out) / "curve.png"
        atari_curve.plot({run.name: rows}, png, f"{run.name}: seedlocal V-trace", target)
        res["png"] = str(png)
    except ImportError as e:
        res["png"] = None
        res["png_note"] = f"no PNG: {e}; curve.csv only"
    print(f"{run.name}: {len(rows)} points, final return(20) {res['final_return_mean20']:.1f} at "
          f"{res['final_frames'] / 1e6:.2f}M frames, {res['final_minutes']:.1f} min; "
          + (f"reached {target:g} at {res['reached_target_minutes']} min" if hit else f"never reached {target:g}"))
    print(json.dumps(res), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"] and len(argv) == 2:
        return probe(argv[1])
    if argv[:1] == ["--curve-post"] and len(argv) == 4:
        return curve_post(argv[1], argv[2], float(argv[3]))
    p = argparse.ArgumentParser(prog="gpu_suite", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder for results.jsonl, suite.log (and the curve's files)")
    p.add_argument("--curve", action="store_true", help="the Pong V-trace learning curve instead of the checklist")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="every step with tiny sizes on the CPU (CartPole-v1): the suite's own mechanics")
    p.add_argument("--budget", type=float, default=540.0, help="wall-clock seconds for the whole suite (default 540)")
    p.add_argument("--env", default="", help="env id for the benches, trainers and curve (default Pong-v5; "
                                             "CartPole-v1 in the dry run)")
    p.add_argument("--only", default="", help="comma-separated step names to run (env always runs)")
    p.add_argument("--keep-runs", action="store_true", help="keep the trainers' run folders under OUT/runs")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds a timed-out step gets to exit after SIGTERM (default 10; 3 in the dry run)")
    p.add_argument("--peer", action="store_true",
                   help="the peer instead: CleanRL's ppo_atari_envpool.py for --curve-seconds on the same box "
                        "(scripts/peer_cleanrl_atari.py; .peer/ made by scripts/peer_cleanrl_prepare.sh)")
    p.add_argument("--curve-seconds", type=float, default=0.0,
                   help="--curve, --peer: training seconds (default 520, shortened to fit the budget)")
    p.add_argument("--curve-target", type=float, default=18.0, help="--curve: return to reach (default 18)")
    p.add_argument("--bench-args", default="", help="extra options for every seedlocal bench step, e.g. "
                                                    "'--num-workers 2 --envs-per-worker 64'")
    p.add_argument("--print-steps", action="store_true", help="print each step's command as JSON and exit")
    a = p.parse_args(argv)
    if a.curve and a.peer:
        p.error("--curve and --peer are two calls: the same seconds each, one after the other")
    if not a.budget > 0 or not math.isfinite(a.budget):
        p.error(f"--budget {a.budget!r}: must be positive")
    code = run_suite(a)
    if a.curve and not a.keep_runs:
        shutil.rmtree(Path(a.out).resolve() / "runs", ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
