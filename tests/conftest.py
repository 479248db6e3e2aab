"""Every test must leave no process and no shared-memory segment behind."""

import os

import psutil
import pytest

from seedlocal.shm.arrays import SEGMENT_PREFIX


def seedlocal_segments(pid: int | None = None) -> set[str]:
    prefix = SEGMENT_PREFIX + (f"{pid}_" if pid is not None else "")
    return {f for f in os.listdir("/dev/shm") if f.startswith(prefix)}


def leaked_segments() -> set[str]:
    """seedlocal segments whose creating process (the pid in the name) is gone: what a finished run left.
    Segments of runs still going (another test run on the machine) are not counted."""
    out = set()
    for name in seedlocal_segments():
        pid = name[len(SEGMENT_PREFIX):].split("_", 1)[0]
        if not (pid.isdigit() and psutil.pid_exists(int(pid))):
            out.add(name)
    return out


def _helper(cmdline: list[str]) -> bool:
    line = " ".join(cmdline)
    return "resource_tracker" in line or "multiprocessing.forkserver" in line


def live_children() -> list[psutil.Process]:
    # The resource tracker and the workers' forkserver are multiprocessing's own helpers: they outlive runs on
    # purpose (and exit with this process). The workers forked from the server are still counted.
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and not _helper(c.cmdline()):
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(autouse=True)
def no_leftovers():
    before = seedlocal_segments(os.getpid())
    yield
    left = live_children()
    assert not left, f"test left child processes: {[(p.pid, p.name()) for p in left]}"
    assert seedlocal_segments(os.getpid()) == before, "test left shared-memory segments in /dev/shm"
