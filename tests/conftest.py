"""Every test must leave no process and no shared-memory segment behind."""

import os

import psutil
import pytest

from seedlocal.shm.arrays import SEGMENT_PREFIX


def seedlocal_segments(pid: int | None = None) -> set[str]:
    prefix = SEGMENT_PREFIX + (f"{pid}_" if pid is not None else "")
    return {f for f in os.listdir("/dev/shm") if f.startswith(prefix)}


def live_children() -> list[psutil.Process]:
    # The resource tracker is multiprocessing's own helper: it outlives runs on purpose.
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()):
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
