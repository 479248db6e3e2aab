"""Command line (also ``python -m seedlocal``):

    seedlocal train vtrace [--preset atari] [--env.id Pong-v5] [...]
    seedlocal train r2d2 [--preset atari] [...]
    seedlocal train ga|es|random-search [--env.id CartPole-v1] [...]
    seedlocal eval --checkpoint runs/<run> [--episodes 10] [--video out.gif]
    seedlocal bench [--env Pong-v5] [...]
    seedlocal actors --connect HOST:PORT [...]   (an actor host for a learner's --bridge.listen)

Every command takes ``--help``. Configuration errors print one line naming
the field and exit with status 2 before any process starts.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import NoReturn

# Nothing heavy at import time (the trainers pull in torch, a second or
# two): a Ctrl-C while it loads must end as quietly as one during a run.

USAGE_HEAD = "usage: seedlocal {train ALGO,eval,bench,actors} [--help] [options]\n\n"
USAGE_TAIL = """
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
SIZED = (" The preset's sizes follow this machine's cores and GPU (docs/tuning.md, \"Sized to the machine\"); "
         "--no-machine-sizing keeps them as the preset has them.")
TUNED = (" --pipeline-config FILE: pipeline sizes from `seedlocal bench --autotune` "
         "(options given here still win).")
# Network options older command lines gave elsewhere (V-trace and R2D2 under --algo., neuroevolution at the
# top), each with its one spelling now; a bool's negation too.
RENAMED = {f"{old}{name}": f"--network.{name}" for old in ("--algo.", "--") for name in
           ("encoder", "hidden", "lstm-size", "lstm_size", "obs-norm", "obs_norm", "no-obs-norm", "no_obs_norm")}


def _usage() -> str:
    from seedlocal.families import usage

    return USAGE_HEAD + usage() + USAGE_TAIL


class Stopped(SystemExit):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every ``with``/``finally``
    releases processes and memory, and exits with 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _sigterm_as_exit(signum, frame):
    raise Stopped(signum)


# pipeline/ranks.py's LAUNCHED, not imported from there: that module loads torch, and the first line must not wait.
RANK_OF = "SEEDLOCAL_RANK_OF"


def _say(*args, **kwargs) -> None:
    """``print``, but once per run of data-parallel ranks: the launcher of ``--learners G`` says it, its ranks
    do not (they parse the same command line again); under torchrun, rank 0. Errors are not said this way:
    every rank's own failure is its own line."""
    if not os.environ.get(RANK_OF) and os.environ.get("RANK", "0") in ("", "0"):
        print(*args, **kwargs)


def _first_line(argv: list[str]) -> str | None:
    """A train command's first line, said before torch loads (seconds on a busy machine): the command and its
    preset where the command line alone tells it (given, or CartPole's defaults without --env.id); else the
    env's kind picks it, said in the next line."""
    from seedlocal.errors import ConfigError
    from seedlocal.families import TABLE

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


def _preset_cli(argv: list[str], fam):
    """Parse a family's run config: --preset picks the defaults, --resume the saved config
    (a preset may not be combined with it), --pipeline-config a tuned pipeline; options given
    explicitly override them all."""
    import tyro

    from seedlocal.families import TABLE

    default, args, saved, counters = preset_default(_renamed(argv), fam)
    description = (f"{TABLE[fam.name][1]}. Presets: " + ", ".join(f"--preset {p}" for p in fam.presets)
                   + " (each chosen by itself for an --env.id of its kind)." + SIZED + TUNED)
    cfg = tyro.cli(fam.run, args=whole_numbers(args, fam.run), default=default, prog=f"seedlocal train {fam.name}",
                   description=description)
    return check_resume(cfg, saved, counters)


def whole_numbers(args: list[str], cls) -> list[str]:
    """``--total-steps 1e6`` read as ``--total-steps 1000000``: an integer option given in e-notation (as CleanRL's
    and SB3's users write step counts) that is a whole number. tyro refused it with a box about int(); any other
    value is left for tyro to judge."""
    import re

    def whole(v: str) -> str:
        return str(int(float(v))) if re.fullmatch(r"[+-]?\d+(\.\d*)?[eE]\+?\d+", v) and float(v).is_integer() else v

    flags = _int_flags(cls)
    out, after = [], ""  # after: the option just read
    for a in args:
        name, eq, v = a.partition("=")
        if a.startswith("--") and eq and name in flags:
            a = f"{name}={whole(v)}"
        elif after in flags and not a.startswith("--"):
            a = whole(a)
        out.append(a)
        after = a
    return out


def _int_flags(cls, prefix: str = "") -> set[str]:
    """The command-line names of ``cls``'s int fields, nested dataclasses' under their dotted prefix (tyro's
    spelling, hyphens for underscores, and the underscored one)."""
    import dataclasses
    import typing

    flags = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        if dataclasses.is_dataclass(t):
            flags |= _int_flags(t, f"{prefix}{f.name}.")
        elif t is int:
            flags |= {f"--{prefix}{f.name}", f"--{prefix}{f.name}".replace("_", "-")}
    return flags


def preset_default(argv: list[str], fam) -> tuple[object, list[str], object | None, dict | None]:
    """What a train command's options apply to: the preset (``--preset``, or the one the env's kind picks)
    sized for this machine, or with ``--resume`` the run's saved config; then ``--pipeline-config``. Returns it,
    the options left for the parser, and the resumed run's saved config and counters (None for a new run), for
    ``check_resume``. The Python API (``seedlocal/api.py``) passes its keyword overrides here as options."""
    from seedlocal.errors import ConfigError

    default, args = _pop_preset(argv, fam.presets)
    sizing = "--no-machine-sizing" not in args
    args = [a for a in args if a != "--no-machine-sizing"]
    saved, counters = _resumed_default(args, fam)
    if saved is not None:
        if _option(argv, "--preset") is not None:
            raise ConfigError("preset: a resumed run keeps the configuration saved with it; "
                              "give the options to change explicitly instead")
        default = saved  # with the sizes it ran at: a resumed run is not sized again
    elif sizing:
        default = _machine_sized(args, default)
    default, args = _pop_pipeline_config(args, default)
    return default, args, saved, counters


def _renamed(args: list[str]) -> list[str]:
    """``args`` with the network options' old spellings (``RENAMED``) given their one spelling, each said in
    one line."""
    out = []
    for a in args:
        name, eq, value = a.partition("=")
        if name in RENAMED:
            _say(f"seedlocal: {name} is now {RENAMED[name]} (the old spelling will go)", file=sys.stderr,
                  flush=True)
            a = RENAMED[name] + eq + value
        out.append(a)
    return out


def _pop_preset(args: list[str], presets: dict) -> tuple[object, list[str]]:
    from seedlocal.errors import ConfigError

    rest, name = [], None
    it = iter(args)
    for a in it:
        if a == "--preset":
            name = _value(next(it, ""), "preset")
        elif a.startswith("--preset="):
            name = a.split("=", 1)[1]
        else:
            rest.append(a)
    if name is None:
        return _preset_for_env(rest, presets)[1], rest
    if name not in presets:
        raise ConfigError(f"preset={name!r}: expected one of {', '.join(presets)}")
    return presets[name], rest


def _preset_for_env(args: list[str], presets: dict) -> tuple[str, object]:
    """With no --preset, the preset made for the kind of env given by --env.id
    (``config.checks.task_kind``: Atari's for image frames, Football's for gfootball
    minimaps, MinAtar's for small grids, MuJoCo's for Box actions), so that a new task of
    a kind seedlocal supports starts from settings that learn it, not
    CartPole's. Said in one line; an env that cannot be described is left to
    the trainer's validation, which names the problem. Returns its name and the preset fitted to the env's
    frames: an env that cannot send single frames as envpool's Atari does (a Gymnasium env) sends its own,
    stacked beside the network only if they are single-channel ones."""
    env_id = _option(args, "--env.id")
    if env_id is None or _option(args, "--resume") is not None:
        return "cartpole", presets["cartpole"]
    from seedlocal.config.checks import task_kind
    from seedlocal.envs.spaces import describe

    backend = _option(args, "--env.backend") or "auto"
    try:
        # Arguments as validation passes them (id, backend, frame_stack), so its describe() is this cached one.
        spec = describe(env_id, backend, 0)
        kind = task_kind(spec)
    except Exception:
        return "cartpole", presets["cartpole"]
    quiet = bool({"-h", "--help"} & set(args))
    if kind == "cartpole" or kind not in presets:
        if not quiet:
            _say(f"seedlocal: --preset cartpole, the plain defaults: no other preset of this algorithm is made for "
                  f"{env_id}'s kind{_dict_images(spec)}", flush=True)
        return "cartpole", presets["cartpole"]
    from seedlocal.algos.frames import fit_frames

    preset = presets[kind]
    fitted = fit_frames(preset, spec, lambda: describe(env_id, backend, preset.env.frame_stack))
    if not quiet:
        what = {"atari": "image frames", "minatar": "small image grids", "football": "Google Research Football's "
                "minimap frames"}.get(kind, "a Box action space")
        frames = ("" if fitted is preset else f", its frames as the env sends them, stacked "
                  f"{fitted.frame_stack} deep beside the network" if getattr(fitted, "frame_stack", 0) > 1
                  else ", its frames as the env sends them")
        _say(f"seedlocal: --preset {kind}, made for {what} like {env_id}'s{frames} (--preset cartpole for the "
              "plain defaults)", flush=True)
    return kind, fitted


def _dict_images(spec) -> str:
    """Words for a Dict observation's image fields, which auto gives a CNN each beside the MLP, or ""."""
    from seedlocal.networks import image_fields

    images = image_fields(spec)
    if not images:
        return ""
    many = len(images) > 1
    return (f" (the Dict's image field{'s' * many} {', '.join(map(repr, images))} get{'' if many else 's'} a CNN "
            f"of {'their' if many else 'its'} own beside the MLP of the other fields; --network.encoder mlp "
            f"flattens {'them' if many else 'it'} into the MLP)")


def _machine_sized(args: list[str], preset):
    """``preset`` sized for this machine (``RunConfig.sized_for``: its cores, and whether the device
    --pipeline.device names, or the preset's, is a GPU), what changed said in one line. Options given on the
    command line still win; --bridge.remote-envs is taken in, so that it stays a multiple of a worker's envs."""
    import dataclasses

    from seedlocal.config.machine import Machine
    from seedlocal.config.resume import config_changes

    machine = Machine.detect(_option(args, "--pipeline.device") or preset.pipeline.device)
    remote = _option(args, "--bridge.remote-envs")
    base = preset
    if remote is not None and remote.isdigit():
        base = dataclasses.replace(preset, bridge=dataclasses.replace(preset.bridge, remote_envs=int(remote)))
    sized = base.sized_for(machine)
    changes = [c.replace(":", "", 1) for c in config_changes(base, sized) if not _given(args, c.split(":")[0])]
    if changes and not {"-h", "--help"} & set(args):
        free = preset.sized_for(machine).pipeline  # as sized without the remote envs
        unlike = [c.replace(":", "", 1) for c in config_changes(sized.pipeline, free, "pipeline.")]
        note = (f" (workers of the preset's size, so that --bridge.remote-envs {remote} makes whole ones; without it"
                f" {', '.join(unlike)})" if unlike else "")
        _say(f"seedlocal: sized for this machine ({machine}): {', '.join(changes)}{note}; --no-machine-sizing "
              "keeps the preset's", flush=True)
    return sized


def _given(args: list[str], field: str) -> bool:
    """Whether ``args`` set the config's ``field`` (dotted, e.g. algo.lr_decay), in any of tyro's spellings."""
    parent, _, leaf = field.rpartition(".")
    prefix = f"--{parent}." if parent else "--"
    flags = {prefix + name for leaf_ in (leaf, leaf.replace("_", "-")) for name in (leaf_, "no-" + leaf_, "no_" + leaf_)}
    return any(a.split("=", 1)[0] in flags for a in args)


def _value(value: str, field: str) -> str:
    """The value after an option, which must not be the next option."""
    if not value or value.startswith("--"):
        from seedlocal.errors import ConfigError

        raise ConfigError(f"{field}: needs a value")
    return value


def _option(args: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in ``args`` (the last one given)."""
    value = None
    for i, a in enumerate(args):
        if a == name:
            value = _value(args[i + 1] if i + 1 < len(args) else "", name[2:].replace("-", "_"))
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _resumed_default(args: list[str], fam) -> tuple[object | None, dict | None]:
    """With ``--resume``, the run's saved configuration becomes the default,
    so only options given on this command line change it; also its counters."""
    path = _option(args, "--resume")
    if not path:
        return None, None
    from seedlocal.checkpoint import load
    from seedlocal.config.resume import saved_config
    from seedlocal.errors import ConfigError
    from seedlocal.families import of_checkpoint

    state = load(path)
    wrote = of_checkpoint(state)
    if wrote is not fam:
        raise ConfigError(f"resume={path!r}: {state.get('path')} is a {wrote.name} run; resume it with "
                          f"seedlocal train {wrote.name} --resume {path}")
    saved = state.get("config")
    return (saved_config(fam.run, saved, state["path"]) if isinstance(saved, dict) else None), dict(
        state.get("counters", {}))


def _envs_per_group(pipeline) -> int:
    """The group size of ``pipeline``; 0 where it makes no shape (validation names the field once the command
    line, which may mend it, is read)."""
    from seedlocal.errors import ConfigError
    from seedlocal.shape import pipeline_shape

    try:
        return pipeline_shape(pipeline).envs_per_group
    except ConfigError:
        return 0


def _pop_pipeline_config(args: list[str], default):
    """``--pipeline-config FILE`` (from ``seedlocal bench --autotune``): its
    fields become the pipeline's defaults; explicit --pipeline.* options win."""
    import dataclasses

    path = _option(args, "--pipeline-config")
    if path is None:
        return default, args
    from seedlocal.measure.autotune import load_pipeline_file

    rest, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--pipeline-config":
            skip = True
        elif not a.startswith("--pipeline-config="):
            rest.append(a)
    from seedlocal.config.resume import config_changes

    fields = load_pipeline_file(path)
    tuned = dataclasses.replace(default, pipeline=dataclasses.replace(default.pipeline, **fields))
    group = _envs_per_group(tuned.pipeline)
    fitted = tuned.fit_to_groups(group)  # e.g. V-trace's batch, whole groups (an explicit option still wins)
    for change in config_changes(tuned, fitted):
        _say(f"seedlocal: {path}: {change.replace(':', '', 1)}, to fit its {group} envs per group", flush=True)
    return fitted, rest


def _parse(argv: list[str]):
    import tyro

    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        raise SystemExit(0)
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        from seedlocal.measure.bench import BenchConfig

        return cmd, tyro.cli(BenchConfig, args=whole_numbers(rest, BenchConfig), prog="seedlocal bench")
    if cmd == "actors":
        from seedlocal.pipeline.bridge.client import ActorsConfig

        return cmd, tyro.cli(ActorsConfig, args=whole_numbers(rest, ActorsConfig), prog="seedlocal actors",
                             description="An actor host: steps environments for a learner's bridge.")
    if cmd == "eval":
        from seedlocal.evaluate import EvalConfig

        return cmd, tyro.cli(EvalConfig, args=whole_numbers(rest, EvalConfig), prog="seedlocal eval")
    if cmd == "train":
        from seedlocal.families import TABLE, family

        if not rest or rest[0] in ("-h", "--help"):
            print(_usage())
            raise SystemExit(0)
        if rest[0] not in TABLE:
            import difflib

            near = difflib.get_close_matches(rest[0], list(TABLE), n=1, cutoff=0.6)
            print(f"seedlocal: error: train needs an algorithm ({', '.join(TABLE)}), got {rest[0]}"
                  f"{f' (did you mean {near[0]}?)' if near else ''}\n\n{_usage()}", file=sys.stderr)
            raise SystemExit(2)
        return "train", _preset_cli(rest[1:], family(rest[0]))
    print(f"seedlocal: error: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
    raise SystemExit(2)


def check_resume(cfg, saved, counters: dict | None):
    """``cfg``, unless it resumes a run (saved config ``saved``, checkpoint
    ``counters``) whose budget is already spent, which would start its workers
    only to stop at once and rewrite its summary with an empty one, or names
    another folder for it: a resumed run goes on where its checkpoints are."""
    from seedlocal.errors import ConfigError

    if counters is None:
        return cfg
    for name in ("run_name", "log_dir"):
        if saved is not None and getattr(cfg, name) != getattr(saved, name):
            raise ConfigError(f"{name}={getattr(cfg, name)!r}: a resumed run goes on in its own folder "
                              f"({cfg.resume}); leave --{name.replace('_', '-')} out")
    cfg.budget_spent(counters)
    return cfg


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with SIGHUP ignored (an ignored
    signal survives its exec). It shares the terminal's process group and,
    unlike for SIGINT and SIGTERM, does not ignore SIGHUP itself: a closed
    terminal would kill it, and its replacement would complain on stderr
    about every semaphore the run then releases."""
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def run() -> NoReturn:
    """The ``seedlocal`` command (its console script, and ``python -m seedlocal``): ``main()``, then ``exit_now``."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """End the command with ``code`` without tearing the interpreter down.

    After a run has written and closed everything, Python's teardown frees torch's, envpool's and gRPC's modules
    object by object: 1.5 s of one core on the 2-core test machine, on every command and every learner rank. Here
    the exit handlers run as at a normal exit (W&B's, logging's, multiprocessing's), stdout and stderr are flushed,
    and the process ends. Where a thread that is not a daemon is still running, Python would wait for it: so does
    this, by exiting the usual way."""
    import atexit
    import threading

    main_thread = threading.main_thread()
    if not hasattr(atexit, "_run_exitfuncs") or any(
            t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (main() said so already) or a stream closed
            pass
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
    first = _first_line(argv)
    if first:
        _say(first, flush=True)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    # A closed terminal (SIGHUP) ends a run as SIGTERM does: checkpoint, clean
    # exit. Unless it is ignored already: under nohup a run must outlive it.
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _sigterm_as_exit)
    try:
        return _run(argv)
    except KeyboardInterrupt as e:
        print(_stopped_line(e, argv), file=sys.stderr)
        return 130
    except Stopped as e:
        print(_stopped_line(e, argv), file=sys.stderr)
        return e.code


def _run(argv: list[str]) -> int:
    from seedlocal.errors import CheckpointError, ConfigError, Diverged, WorkerDied

    try:
        cmd, cfg = _parse(argv)
        if cmd == "train" and cfg.learners > 1:
            from seedlocal.families import check_learners
            from seedlocal.pipeline.ranks import from_environment, launch

            check_learners(cfg)  # a rank count the run cannot be divided into, refused before any rank starts
            if from_environment() is None:  # not yet a rank (torchrun's or ours): start them
                return launch(argv, cfg.learners, cfg.dist_timeout_s)
        _start_resource_tracker()
        if cmd == "bench":
            from seedlocal.measure import main as bench

            bench(cfg)
        elif cmd == "eval":
            from seedlocal.evaluate import main as evaluate

            evaluate(cfg)
        elif cmd == "actors":
            from seedlocal.pipeline.bridge.client import run as actors

            return actors(cfg)
        else:
            from seedlocal.families import of_config

            of_config(cfg).train(cfg)
    except (ConfigError, CheckpointError) as e:
        print(f"seedlocal: error: {e}", file=sys.stderr)
        return 2
    except (WorkerDied, Diverged) as e:
        # The env's own traceback is on stderr already (from the worker); the
        # learner's would only show where it noticed.
        print(f"seedlocal: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno not in _ENVIRONMENT_ERRNOS or not e.filename:  # a bug's OSError keeps its traceback
            raise
        # The disk filled, the folder went read-only or away mid-run: the
        # path and the reason are the whole story.
        where = f"{e.filename}: " if e.filename else ""
        print(f"seedlocal: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT,
                       errno.ENAMETOOLONG, errno.ENOMEM}


if __name__ == "__main__":
    run()
