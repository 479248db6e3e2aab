"""Checkpoints: written atomically, rotated, checked before use.

A checkpoint is one ``torch.save`` file under ``<run>/checkpoints/`` named ``ckpt_<steps>_<frames>.pt``. It is
written to a temporary file and renamed, so a crash mid-write never leaves a torn file where a good one was. Only
plain types and tensors are stored, so loading uses ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import numbers
import os
import pickle
import re
import secrets
import signal
import threading
import time
import warnings
from pathlib import Path

import torch

from seedlocal.errors import CheckpointError, ConfigError, Diverged

FORMAT = 1
_NAME = re.compile(r"ckpt_(\d+)_(\d+)\.pt$")
_NESTED = (torch.Tensor, dict, list, tuple)


def _non_finite(value, name: str = "") -> list[str]:
    """Names of the floating tensors in a checkpoint's state holding NaN or inf."""
    if isinstance(value, torch.Tensor):
        return [name] if value.is_floating_point() and not bool(torch.isfinite(value).all()) else []
    if isinstance(value, dict):
        return [n for k, v in value.items() if isinstance(v, _NESTED)
                for n in _non_finite(v, f"{name}.{k}" if name else str(k))]
    if isinstance(value, list | tuple):  # a saved replay may hold millions of plain items: no name for each
        return [n for i, v in enumerate(value) if isinstance(v, _NESTED) for n in _non_finite(v, f"{name}[{i}]")]
    return []


def new_run_dir(log_dir: str, name: str) -> Path:
    """``log_dir/name``, refusing one that already holds checkpoints."""
    run_dir = Path(log_dir) / name
    if all_checkpoints(run_dir / "checkpoints"):
        raise ConfigError(f"run_name={name!r}: {run_dir} already holds checkpoints; "
                          f"continue it with --resume {run_dir} or pick another name")
    return run_dir


def make_run_dir(run_dir: Path) -> None:
    """Create a run's folder, or fail naming it (before any process starts)."""
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"log_dir: cannot create {run_dir} ({e.strerror})") from None


def run_dir_of(path: str | Path) -> Path:
    """The run folder a checkpoint file belongs to: ``<run>/checkpoints/ckpt_*.pt``, or the file's own folder when
    it was copied elsewhere (never above it)."""
    p = Path(path).resolve()
    return p.parent.parent if p.parent.name == "checkpoints" else p.parent


def lock_run(run_dir: Path):
    """Hold ``<run>/.lock`` while a run writes there: a second run (or a resume) of the same folder is refused
    instead of mixing two curves and two sets of checkpoints. Released by closing the returned file, or by the
    kernel when the process dies."""
    f = open(Path(run_dir) / ".lock", "a+")
    if (holder := _held_by(f)) is not None:
        f.close()
        raise ConfigError(f"run_name: {run_dir} is in use by another seedlocal run (pid {holder}); "
                          "wait for it to end or pick another --run-name")
    f.truncate(0)  # "a+": the write then goes to its start
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


@contextlib.contextmanager
def signals_held(handled_only: bool = False):
    """Ctrl-C, SIGTERM or SIGHUP arriving mid-write is acted on right after it: an exception raised inside
    torch.save would abandon a half-written zip and report a crash where the user asked for a clean stop (eval holds
    them over an envpool step the same way: ``video.step``). ``handled_only``: hold only the signals a Python
    handler takes, so that one left to its default action still ends the process at once."""
    held: list[int] = []
    previous = {}
    main = threading.current_thread() is threading.main_thread()  # the only thread that may set handlers
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if main else ():
        handler = signal.getsignal(sig)
        if callable(handler) or (handler is signal.SIG_DFL and not handled_only):
            previous[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Only after a write that succeeded: a failed one's error (disk full) is the news, and it stops the run anyway.
    if held:
        signal.raise_signal(held[0])


def finish_run(run_dir: Path, summary: dict, failure: BaseException | None, save, results, last_log=None) -> None:
    """A trainer's last writes, in an order none of them can skip another: the final interval's scalars
    (``last_log``), the checkpoint (``save``; None for a run that never stepped), then ``summary`` updated with
    ``results()`` (after the save, so it names the newest checkpoint) and written. No files when the run is
    stopping because its folder cannot be written: they would fail the same way, and their error would hide this
    one (which names the newest checkpoint that was saved)."""
    unwritable = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # a full disk, a read-only or failing one
    writable = not (isinstance(failure, OSError) and failure.errno in unwritable)
    try:
        if last_log is not None:
            last_log()
    finally:
        try:
            if save is not None and writable:
                save()
        finally:
            summary.update(results())
            if writable:
                write_json(Path(run_dir) / "summary.json", summary)  # what a program reads of a finished run


def save(run_dir: Path, state: dict, steps: int, frames: int, keep: int = 3) -> None:
    if bad := _non_finite(state):
        last = newest(run_dir)
        raise Diverged(f"training diverged by step {steps:,d}: NaN or inf in {', '.join(bad[:3])}"
                       f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}; not saved"
                       f"{f', the last good checkpoint is {last}' if last else ''} (check the scale of the env's "
                       "rewards and observations; a lower learning rate or gradient clipping usually prevents this)")
    folder = Path(run_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".tmp-*.pt"):  # left by a process killed mid-write (the run lock is ours)
        stale.unlink(missing_ok=True)
    path = folder / f"ckpt_{steps:012d}_{frames}.pt"
    with signals_held():
        try:
            _write_atomically(path, lambda f: torch.save({"format": FORMAT, **state}, f))
        except OSError as e:
            last = newest(run_dir)
            raise OSError(e.errno, f"{e.strerror}; checkpoint not saved"
                          f"{f' (the newest one is {last})' if last else ''}", e.filename) from e
        if keep > 0:
            for old in all_checkpoints(folder)[:-keep]:
                old.unlink(missing_ok=True)


def set_aside_later(run_dir: Path, resumed_from: str | Path) -> str | None:
    """A resume from a checkpoint older than its run's newest (the newest was corrupt, or the user went back)
    would have the run's newest stay the abandoned later one: the summary, ``eval`` and the next ``--resume``
    would take it, and rotation would delete this run's own first saves. The later checkpoints move to
    ``checkpoints/abandoned_after_<step>_<time>/`` (nothing is deleted). Returns the line that says so, or None
    where nothing is later. Called with the run folder locked."""
    folder = Path(run_dir) / "checkpoints"
    match = _NAME.search(Path(resumed_from).name)
    if match is None:
        return None
    step = int(match.group(1))
    later = [c for c in all_checkpoints(folder) if int(_NAME.search(c.name).group(1)) > step]
    if not later:
        return None
    aside = folder / f"abandoned_after_{step:012d}_{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        aside.mkdir(exist_ok=True)
        for c in later:
            c.rename(aside / c.name)
    except OSError as e:  # never a reason to stop a run that has resumed
        return (f"seedlocal: warning: resumed from step {step:,d}, older than the run's newest checkpoint, whose "
                f"later checkpoints could not be moved aside ({e}): they stay the run's newest")
    return (f"seedlocal: resumed from step {step:,d}, older than the run's newest checkpoint: its {len(later)} later "
            f"checkpoint{'s' if len(later) > 1 else ''} moved to {aside} (nothing deleted), so this run's own "
            "checkpoints are the run's newest")


def newest(run_dir: Path) -> str | None:
    """The run's newest checkpoint file, if it has one (what its summary names)."""
    found = all_checkpoints(Path(run_dir) / "checkpoints")
    return str(found[-1]) if found else None


def write_json(path: str | Path, data: dict) -> None:
    """``data`` as strict JSON at ``path`` (its folder made), written atomically: a NaN or inf (a diverged
    run) is written as null."""
    text = json.dumps(_finite_or_none(data), indent=2, allow_nan=False) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, lambda f: f.write(text.encode()))


def _write_atomically(path: Path, write) -> None:
    """``write(binary file)`` into a temporary file beside ``path``, synced, then renamed over it. The file is
    made with mode 0666 less the umask, as any other file this user writes (mkstemp's would be 0600)."""
    tmp = path.parent / f".tmp-{secrets.token_hex(8)}{path.suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        # A full disk inside torch.save surfaces as a RuntimeError raised while handling the OSError: the
        # OSError, with the path, is the news.
        cause = e
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__context__
        if cause is not None and cause.errno is not None and (cause is not e or not e.filename):
            raise OSError(cause.errno, cause.strerror, str(path)) from e
        raise


def _finite_or_none(value):
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    value = float(value)  # numpy and torch scalars too
    return value if math.isfinite(value) else None


def _held_by(f) -> str | None:
    """Lock the open ``.lock`` file ``f``; None if that worked, else the pid written in it by the live run that
    holds it."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        f.seek(0)
        return f.read().strip() or "?"


def all_checkpoints(folder: Path) -> list[Path]:
    found = [p for p in Path(folder).glob("ckpt_*.pt") if _NAME.search(p.name)]
    return sorted(found, key=lambda p: int(_NAME.search(p.name).group(1)))


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        if found := all_checkpoints(p / "checkpoints") or all_checkpoints(p):
            return found[-1]
        with contextlib.suppress(OSError), open(p / ".lock") as f:  # the pid of a seedlocal run still writing it
            if (holder := _held_by(f)) is not None:
                raise CheckpointError(f"{p}: no checkpoint yet: this run is still going (pid {holder}); "
                                      "a run writes one periodically and when it stops: try again after that")
        raise CheckpointError(f"{p}: no checkpoint (ckpt_*.pt) in this directory or its checkpoints/")
    raise CheckpointError(f"{p}: no such checkpoint file or run directory")


def load(path: str | Path) -> dict:
    p = resolve(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torn, truncated, not a torch file, or unsafe pickle
        # One line naming the problem. torch's own message goes on for lines, with advice to load with
        # weights_only=False: never right for a file seedlocal wrote, and unsafe for one it did not.
        try:
            with open(p, "rb") as f:
                zipped = f.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
        except OSError as oe:
            raise CheckpointError(f"{p}: cannot be read ({oe.strerror})") from None
        why = ("not a file torch.save wrote" if not zipped else
               "it holds objects other than tensors and plain values, so it was not written by seedlocal"
               if isinstance(e, pickle.UnpicklingError) else "the file is truncated or corrupt")
        found = all_checkpoints(p.parent) if Path(path).is_dir() else []
        older = found[:found.index(p)] if p in found else []
        hint = f"; the run's next newest is {older[-1]}: pass that file instead" if older else ""
        raise CheckpointError(f"{p}: not a readable seedlocal checkpoint ({why}){hint}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p}: not a seedlocal checkpoint of format {FORMAT}")
    state["path"] = str(p)
    return state


# Identity keys added after checkpoints were first written: what an older checkpoint without the key had.
IDENTITY_BEFORE_KEY = {"optimizer": "adam", "box_actions": "clip"}


def check_compatible(state: dict, expected: dict, needs: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint whose identity (algorithm, env, network, optimizer) differs,
    or that lacks a part (``needs``) the caller restores from it."""
    missing = [k for k in needs if k not in state]
    if missing:
        raise CheckpointError(f"{state.get('path')}: lacks {', '.join(missing)}, so it cannot be resumed "
                              "(damaged, or not written by this trainer)")
    have = {**IDENTITY_BEFORE_KEY, **state.get("identity", {})}
    diffs = [f"{k}: checkpoint has {have.get(k)!r}, this run has {v!r}" for k, v in expected.items()
             if have.get(k) != v]
    if diffs:
        raise CheckpointError(f"{state.get('path')}: incompatible with this configuration; " + "; ".join(diffs))


def member_of(state: dict, member: int = -1) -> dict:
    """A population's checkpoint (``trainers/population.py``) as one learner's: member ``member``'s network and
    optimizer in place of the population's (-1: the member best at the save, by its last 20 episodes' mean), for
    the family's ``from_checkpoint``. One learner's checkpoint is itself (and refuses a member's index)."""
    members = state.get("members")
    if members is None:
        if member >= 0:
            raise CheckpointError(f"{state.get('path')}: holds one learner, not a population: give no --member")
        return state
    k = int(state["population"]["best"]) if member < 0 else member
    if k >= len(members):
        raise CheckpointError(f"{state.get('path')}: member {k} is not there: its population has members "
                              f"0..{len(members) - 1}")
    return {**state, **members[k], "member": k}
