"""Training from Python: ``seedlocal.train(family, **overrides) -> Summary``.

    import seedlocal

    summary = seedlocal.train("vtrace", total_steps=30_000, network={"hidden": (32, 32)})
    steps, returns = summary.scalars("charts/episode_return")
    seedlocal.evaluate(summary.run_dir, episodes=5)

``family`` is a ``seedlocal train`` command (``families.py``); the overrides are its options by name, a
sub-config a dict of its own (``config/overrides.py``), prepared as the command line's (``preset=``,
``machine_sizing=False``, ``resume=``, ``pipeline_config=`` are its command options). What the command line
would print as one ``seedlocal: error:`` line is raised with that line as a ``SeedlocalError`` (``errors.py``).
Ctrl-C (a notebook's interrupt) saves a checkpoint and raises KeyboardInterrupt (a SIGTERM, SystemExit(143))
once every process and shared-memory segment of the run is gone; the workers' forkserver stays for the next
run.

``learners=G`` > 1 starts G data-parallel learner ranks as the command line does, each a process training the
run prepared here (``_rank_main``), and returns rank 0's summary; what rank 0 stopped with is raised here as the
same kind of ``SeedlocalError``, and an interrupt stops every rank cleanly (SIGTERM) first.

``seedlocal.evaluate`` is ``evaluate.evaluate`` (``seedlocal eval``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from seedlocal import errors, families
from seedlocal.cli import (RANK0_OUTCOME, Stopped, _sigterm_as_exit, _start_resource_tracker, _stopped_line, exit_now,
                           launch_ranks)
from seedlocal.config.overrides import unknown
from seedlocal.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Summary:
    """A run that ended, as its ``summary.json`` holds it (``data``; also ``summary["key"]``), with where it is."""

    run_dir: Path
    """the run's folder: TensorBoard events, checkpoints/, summary.json"""
    checkpoint: Path | None
    """its newest checkpoint (None: nothing was trained)"""
    status: str
    """done, interrupted or error"""
    stopped_by: str | None
    """the budget or target that ended it: steps, frames, generations, seconds or target"""
    algo: str
    env: str
    steps: int
    frames: int
    seconds: float
    mean_return: float | None
    """the mean return of the last 20 training episodes (neuroevolution: the best member's, on fresh episodes)"""
    data: dict

    @classmethod
    def read(cls, run_dir: str | Path) -> Summary:
        """The summary a run wrote into ``run_dir`` (a run stopped by an exception: its ``seedlocal_run_dir``)."""
        path = Path(run_dir) / "summary.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"run_dir={str(run_dir)!r}: no readable summary.json there ({e})") from None
        ckpt = data.get("checkpoint")
        return cls(run_dir=Path(data.get("run_dir", run_dir)), checkpoint=Path(ckpt) if ckpt else None,
                   status=data.get("status", ""), stopped_by=data.get("stopped_by"), algo=data.get("algo", ""),
                   env=data.get("env", ""), steps=data.get("steps", 0), frames=data.get("frames", 0),
                   seconds=data.get("seconds", 0.0),
                   mean_return=data.get("mean_return_last20", data.get("best_member_return")), data=data)

    def __getitem__(self, key: str):
        return self.data[key]

    def scalars(self, tag: str = "charts/episode_return") -> tuple[list[int], list[float]]:
        """One TensorBoard scalar of the run, from its event files: (x axis, values); the x axis is agent steps
        (neuroevolution: generations). Names: ``seedlocal/monitor.py``."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(self.run_dir), size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        if tag not in tags:
            raise ConfigError(unknown(tag, tags).replace("no such option", f"no such scalar in {self.run_dir}"))
        points = events.Scalars(tag)
        return [p.step for p in points], [p.value for p in points]


def train(family: str, **overrides) -> Summary:
    """Train ``family`` (``vtrace``, ``r2d2``, ``ga``, ``es``, ``ars``, ``random-search``) with the command line's
    options as keywords (module docstring); returns the run's summary once a budget or target ends it."""
    from seedlocal.pipeline.actors import refuse_unguarded_main

    refuse_unguarded_main(f"seedlocal.train({family!r}, ...)")
    prepared = _prepared(family, overrides)
    if prepared.config.learners > 1:
        from seedlocal.pipeline.ranks import from_environment

        if from_environment() is None:  # not a rank already (torchrun's): start them, each a _rank_main
            code = "import sys; from seedlocal.api import _rank_main; _rank_main(sys.argv[1])"
            with _sigterm_unwinds():  # the launcher then stops its ranks cleanly (SIGTERM) as it unwinds
                status, outcome = launch_ranks(prepared, command=[sys.executable, "-c", code], interrupt_ranks=True)
                return _ranks_outcome(family, status, json.loads(outcome) if outcome else {})
    _start_resource_tracker()
    try:
        with _sigterm_unwinds():
            summary = families.family(family).train(prepared)
    except (KeyboardInterrupt, Stopped) as e:
        print(_stopped_line(e, ["train", family]), file=sys.stderr)  # saved, and what to type next
        raise
    return Summary.read(summary["run_dir"])


def _ranks_outcome(family: str, status: int, outcome: dict) -> Summary:
    """Rank 0's summary, or the exception it ended with (KeyboardInterrupt where this process was interrupted),
    carrying the run folder as one process's run does."""
    run_dir = Path(outcome["run_dir"]) if outcome.get("run_dir") else None
    if status == 0 and outcome and "error" not in outcome:
        return Summary.read(run_dir)
    if status == 130 or outcome.get("error") in ("KeyboardInterrupt", "Stopped"):
        e: BaseException = KeyboardInterrupt()
    elif outcome.get("error"):
        e = getattr(errors, outcome["error"], errors.SeedlocalError)(outcome["message"])
    else:
        e = errors.WorkerDied(f"learner rank 0 ended with status {status} and left no outcome (its own line, "
                              "or the launcher's, says why)")
    e.seedlocal_run_dir = run_dir
    if isinstance(e, KeyboardInterrupt):
        print(_stopped_line(e, ["train", family]), file=sys.stderr)
    raise e


def _rank_main(job: str) -> None:
    """One learner rank of ``seedlocal.train``: trains the prepared run pickled in ``job``;
    rank 0 writes beside it how that ended (the run folder, or the error). Ends as ``cli.exit_now``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C comes as SIGTERM, from the launcher
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    prepared = pickle.loads(Path(job).read_bytes())
    _start_resource_tracker()
    outcome, code = {}, 0
    try:
        outcome["run_dir"] = families.family(prepared.recipe.name).train(prepared)["run_dir"]
    except (errors.SeedlocalError, KeyboardInterrupt, SystemExit) as e:
        kind = next(c.__name__ for c in type(e).__mro__ if c.__module__ in ("seedlocal.errors", "builtins"))
        where = getattr(e, "seedlocal_run_dir", None)
        outcome = {"error": "Stopped" if isinstance(e, SystemExit) else kind, "message": str(e),
                   "run_dir": str(where) if where else None}
        code = 130 if isinstance(e, KeyboardInterrupt) else e.code if isinstance(e, Stopped) else 1
        if os.environ.get("RANK") != "0" and isinstance(e, errors.SeedlocalError):
            print(f"seedlocal: error: {e}", file=sys.stderr, flush=True)  # rank 0's is raised by the caller
    if os.environ.get("RANK") == "0":
        Path(job + RANK0_OUTCOME).write_text(json.dumps(outcome))  # read by the launcher (cli.launch_ranks)
    # Stopped and saved: a SIGTERM still on its way (every rank gets one when the caller dies; one blocked in a
    # collective takes it late) would only break into the exit handlers with a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_now(code)


@contextmanager
def _sigterm_unwinds():
    """While a run goes, SIGTERM (a script stopped by its scheduler) unwinds it as the command line's does,
    then SystemExit(143); only where it would otherwise kill at once (the main thread, no handler of the
    caller's own)."""
    own = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, _sigterm_as_exit) if own else None
    try:
        yield
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous)


def run_config(family: str, **overrides):
    """The run configuration ``seedlocal.train(family, **overrides)`` trains, as the command line prepares it from
    the same options (preset, machine sizing, resume, pipeline file, then the options): for a look before a run."""
    return _prepared(family, overrides).config


def _prepared(family: str, overrides: dict):
    """The run ``seedlocal.train(family, **overrides)`` asks for, prepared once; its notes printed."""
    from seedlocal.config.request import from_keywords
    from seedlocal.prepare import prepare

    recipe = families.family(family).recipe
    prepared = prepare(from_keywords(recipe.run, dict(overrides)), recipe)
    for line in prepared.notes:
        print(line, flush=True)
    return prepared
