"""The ``seedlocal`` command (also ``python -m seedlocal``): train, eval, bench and actors (``USAGE``), each
with ``--help``. Configuration errors print one line naming the field and exit with status 2 before any process
starts.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import importlib
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import NoReturn

from seedlocal.config.request import COMMAND_OPTIONS, command_class, from_command_line, whole_numbers
from seedlocal.errors import CheckpointError, ConfigError, Diverged, WorkerDied
from seedlocal.families import TABLE, family, recipe

# Nothing heavy at import time (the trainers pull in torch, a second or two): a Ctrl-C while it loads must end
# as quietly as one during a run.

USAGE = "usage: seedlocal {train ALGO,eval,bench,actors} [--help] [options]\n\n" + "\n".join(
    f"  train {name:<14s} {title}" for name, (_, title) in TABLE.items()) + """
  train ALGO --help    its options and presets: --preset NAME, or without it the preset
                       made for --env.id's kind (image frames, small grids, Box actions);
                       --pipeline-config FILE: pipeline sizes from seedlocal bench --autotune
  eval                 play a saved checkpoint: mean/std return, optional video
  bench                pipeline efficiency vs the best raw envpool configuration (ratios
                       from one run); --learning adds the V-trace learner; --autotune picks
                       sizes for this machine and writes them for train --pipeline-config FILE
  actors               step envs for a learner on another host (train ... --bridge.listen
                       HOST:PORT --bridge.remote-envs N); see docs/multihost.md

From Python: seedlocal.train(ALGO, **options) -> Summary, seedlocal.evaluate(CHECKPOINT, ...);
the options as keywords, a group as a dict: network={"hidden": (64,)} (README, "From Python").
"""
# The other commands' configs: (module, class, --help's description; None: the class's docstring).
CONFIGS = {"bench": ("seedlocal.measure.bench", "BenchConfig", None),
           "actors": ("seedlocal.pipeline.bridge.client", "ActorsConfig",
                      "An actor host: steps environments for a learner's bridge."),
           "eval": ("seedlocal.evaluate", "EvalConfig", None)}
RANK_COMMAND = "__rank"  # ``seedlocal __rank ALGO JOB``: a learner rank of a run its starting command prepared


class Stopped(SystemExit):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C (every ``with``/``finally`` releases processes and memory), and
    exits with 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _sigterm_as_exit(signum, frame):
    raise Stopped(signum)


def _say(*args, **kwargs) -> None:
    """``print``, but once per run of torchrun's data-parallel ranks (each parses the same command line): by rank 0.
    The ranks ``--learners G`` starts parse none (they take their launcher's prepared run). Errors: each rank's."""
    if os.environ.get("RANK", "0") in ("", "0"):
        print(*args, **kwargs)


def _first_line(argv: list[str]) -> str | None:
    """A train command's first line, said before torch loads (seconds on a busy machine): the command and its
    preset where the command line alone tells it; else the env's kind picks it, said in the next line."""
    if len(argv) < 2 or argv[0] != "train" or argv[1] not in TABLE or {"-h", "--help"} & set(argv):
        return None
    try:
        preset, env_id, resume = (_option(argv[2:], f"--{name}") for name in ("preset", "env.id", "resume"))
    except ConfigError:
        return None  # the command line's parse names it
    head = f"seedlocal: train {argv[1]}"
    if resume:
        return f"{head}: resuming {resume} with the configuration saved with it"
    if preset:
        return f"{head} --preset {preset}" + (f" on {env_id}" if env_id else "")
    if env_id:
        return f"{head} on {env_id}: the env's kind picks the preset (--preset NAME to choose one)"
    return f"{head} --preset cartpole: the defaults, on CartPole-v1 (--env.id ID or --preset NAME for another)"


def _stopped_line(e: BaseException, argv: list[str]) -> str:
    """What a stopped run left behind, from the run folder its trainer set on the exception."""
    run_dir = getattr(e, "seedlocal_run_dir", None)  # set by a trainer that got as far as its loop
    if run_dir is None:
        what = getattr(e, "seedlocal_kept", None) or "nothing written"  # eval: the returns so far
    else:
        from seedlocal.checkpoint import newest

        found = {"checkpoint": newest(run_dir), "summary": (run_dir / "summary.json").exists()}
        parts = [name for name, there in found.items() if there]
        what = f"{' and '.join(parts)} in {run_dir}" if parts else f"before the run began; nothing saved in {run_dir}"
    how = f"stopped by {signal.Signals(e.signum).name}" if isinstance(e, Stopped) else "interrupted"
    line = f"\nseedlocal: {how}; stopped cleanly ({what})"
    if run_dir is not None and found["checkpoint"] and argv[:1] == ["train"]:
        from seedlocal.monitor import next_commands

        line += "\n" + next_commands(argv[1], run_dir)
    return line


def _option(args: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in ``args`` (the last one given); ConfigError where ``--name``
    is followed by no value (the end, or the next option)."""
    value = None
    for i, a in enumerate(args):
        if a == name:
            value = args[i + 1] if i + 1 < len(args) else ""
            if not value or value.startswith("--"):
                raise ConfigError(f"{name[2:].replace('-', '_')}: needs a value")
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _parse(argv: list[str]):
    """``(command, what it runs)``: a train command's prepared run (``seedlocal/prepare.py``), another's config."""
    import tyro

    if argv[:1] in ([], ["-h"], ["--help"]) or argv[:1] == ["train"] and argv[1:2] in ([], ["-h"], ["--help"]):
        print(USAGE)  # no command, or train without an algorithm
        raise SystemExit(0)
    cmd, rest = argv[0], argv[1:]
    if cmd in CONFIGS:
        module, name, description = CONFIGS[cmd]
        cls = getattr(importlib.import_module(module), name)
        return cmd, tyro.cli(cls, args=whole_numbers(rest, cls), prog=f"seedlocal {cmd}", description=description)
    if cmd == "train":
        if rest[0] not in TABLE:
            near = difflib.get_close_matches(rest[0], list(TABLE), n=1, cutoff=0.6)
            print(f"seedlocal: error: train needs an algorithm ({', '.join(TABLE)}), got {rest[0]}"
                  f"{f' (did you mean {near[0]}?)' if near else ''}\n\n{USAGE}", file=sys.stderr)
            raise SystemExit(2)
        return "train", _prepared(rest[0], rest[1:])
    print(f"seedlocal: error: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    raise SystemExit(2)


def _prepared(name: str, args: list[str]):
    """``seedlocal train <name> ARGS``: one request from the options, prepared once, its notes said (``_say``).
    ``--help`` shows the options with the defaults the request would run with, and exits."""
    from seedlocal.prepare import prepare

    r = recipe(name)
    request = from_command_line(name, r.run, args)
    if {"-h", "--help"} & set(args):
        _help(name, r, request)
    prepared = prepare(request, r)
    for line in prepared.notes:
        _say(line, flush=True)
    return prepared


def _help(name: str, r, request) -> None:
    import tyro

    from seedlocal.prepare import for_help

    cls = command_class(r.run)
    default = cls(run=for_help(request, r), **{n: getattr(request, n) for n in COMMAND_OPTIONS})
    description = (f"{TABLE[name][1]}. Presets: " + ", ".join(f"--preset {p}" for p in r.presets)
                   + " (each chosen by itself for an --env.id of its kind). The preset's sizes follow this "
                   "machine's cores and GPU (docs/tuning.md, \"Sized to the machine\"); options given here win.")
    tyro.cli(cls, args=["--help"], default=default, prog=f"seedlocal train {name}", description=description)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with SIGHUP ignored (which survives its exec): it ignores SIGINT
    and SIGTERM but not SIGHUP, so a closed terminal would kill it, and its replacement would complain on stderr
    about every semaphore the run then releases."""
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def run() -> NoReturn:
    """The ``seedlocal`` command (console script, ``python -m seedlocal``)."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """End the command with ``code`` without Python's teardown of torch, envpool and gRPC (seconds of CPU on every
    command and rank: docs/architecture.md): the exit handlers run (W&B's, logging's, multiprocessing's), stdout
    and stderr are flushed, and the process ends. A non-daemon thread still running is waited for: the usual exit."""
    import atexit
    import threading

    main_thread = threading.main_thread()
    if not hasattr(atexit, "_run_exitfuncs") or any(
            t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (main() said so already) or a stream closed
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        try:
            return _main(argv)
        finally:
            # Flushed here, where a reader that went away (`seedlocal train vtrace --help | head`) can be caught,
            # not at the interpreter's exit, which would print a BrokenPipeError traceback.
            sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can be said on stdout: send what is still buffered nowhere, so the exit stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # what a shell reports for a program that SIGPIPE ended


def _main(argv: list[str]) -> int:
    if first := _first_line(argv):
        _say(first, flush=True)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    # A closed terminal (SIGHUP) ends a run as SIGTERM does, unless it is ignored already (nohup).
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _sigterm_as_exit)
    said = ["train", argv[1]] if argv[:1] == [RANK_COMMAND] else argv  # a rank says what its command would
    try:
        return _run(argv)
    except (KeyboardInterrupt, Stopped) as e:
        # Rank 0 says what the run left; another rank wrote nothing. (A rank has joined through pipeline.ranks; a
        # process that has not loaded it is no rank, and need not load torch to learn so.)
        ranks = sys.modules.get("seedlocal.pipeline.ranks")
        if ranks is None or (ranks.from_environment() or (0,))[0] == 0:
            print(_stopped_line(e, said), file=sys.stderr)
        return e.code if isinstance(e, Stopped) else 130


def _run(argv: list[str]) -> int:
    try:
        if argv[:1] == [RANK_COMMAND]:  # one of the ranks a train command launched (below)
            cmd, cfg = "train", pickle.loads(Path(argv[2]).read_bytes())  # the prepared run (launch_ranks)
        else:
            cmd, cfg = _parse(argv)
        if cmd == "train" and cfg.config.learners > 1:
            from seedlocal.pipeline.ranks import from_environment

            if from_environment() is None:  # not yet a rank (torchrun's or ours): start them
                return launch_ranks(cfg)[0]
        _start_resource_tracker()
        if cmd in ("bench", "eval"):
            importlib.import_module({"bench": "seedlocal.measure", "eval": "seedlocal.evaluate"}[cmd]).main(cfg)
        elif cmd == "actors":
            from seedlocal.pipeline.bridge.client import run as actors
            from seedlocal.prepare import host_env

            return actors(cfg, host_env)
        else:
            family(cfg.recipe.name).train(cfg)
    except (ConfigError, CheckpointError, WorkerDied, Diverged) as e:
        # A worker's env traceback is on stderr already; the learner's would only show where it noticed.
        print(f"seedlocal: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ConfigError, CheckpointError)) else 1
    except OSError as e:
        if e.errno not in _ENVIRONMENT_ERRNOS or not e.filename:  # a bug's OSError keeps its traceback
            raise
        # The disk filled, the folder went read-only or away mid-run: the path and the reason are the whole story.
        print(f"seedlocal: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def launch_ranks(prepared, command: list[str] | None = None, interrupt_ranks: bool = False) -> tuple[int, str]:
    """The ``learners`` data-parallel ranks of a ``prepared`` run, each a process that trains it as prepared here
    (``seedlocal __rank ALGO JOB``, or ``command JOB``), started and watched by ``ranks.launch``; returns the exit
    status, and what rank 0 wrote of how it ended (``RANK0_OUTCOME``; "" for the command line's ranks)."""
    import tempfile

    from seedlocal.pipeline.ranks import launch

    cfg = prepared.config
    with tempfile.TemporaryDirectory(prefix="seedlocal-ranks-") as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps(prepared))
        status = launch([*([] if command else [RANK_COMMAND, prepared.recipe.name]), str(job)], cfg.learners,
                        cfg.dist_timeout_s, command=command, interrupt_ranks=interrupt_ranks)
        outcome = job.with_name(job.name + RANK0_OUTCOME)
        return status, outcome.read_text() if outcome.exists() else ""


RANK0_OUTCOME = ".rank0.json"  # beside a ranks' job file: how rank 0's training ended (seedlocal.train's ranks)


_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT,
                       errno.ENAMETOOLONG, errno.ENOMEM}
