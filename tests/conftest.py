"""Every test must leave no process and no shared-memory segment behind."""

import os
import time

# Before torch loads (here and in every process a test starts, which inherit it): the suite runs two test
# processes (pyproject's -n 2), each starting learners and env workers, on 2-core machines. OpenMP's threads spin
# after each parallel region by default, and with every core oversubscribed that spinning took the cores the
# other processes needed: tests/test_continuous.py, test_minatar.py, test_masks.py and test_frames.py took
# 110-129 s spinning and 56 s passive. A run alone keeps the default: MinAtar's preset stepped 11.2K steps/s
# with it, 10.2K passive (docs/tuning.md, "Two runs on the same cores").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import psutil  # noqa: E402
import pytest  # noqa: E402

from seedlocal.shm.arrays import SEGMENT_PREFIX  # noqa: E402


def seedlocal_segments(pid: int | None = None) -> set[str]:
    prefix = SEGMENT_PREFIX + (f"{pid}_" if pid is not None else "")
    return {f for f in os.listdir("/dev/shm") if f.startswith(prefix)}


def leaked_segments(settle_s: float = 5.0) -> set[str]:
    """seedlocal segments whose creating process (the pid in the name) is gone: what a finished run left.
    Segments of runs still going (another test run on the machine) are not counted, nor those that go within
    ``settle_s``: the other test process's, between a kill of their creator and its parent's or a sweep's unlink
    (test_lifecycle makes such an orphan on purpose). A leak stays."""
    deadline = time.monotonic() + settle_s
    while True:
        out = {name for name in seedlocal_segments()
               if not ((pid := name[len(SEGMENT_PREFIX):].split("_", 1)[0]).isdigit() and psutil.pid_exists(int(pid)))}
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


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
