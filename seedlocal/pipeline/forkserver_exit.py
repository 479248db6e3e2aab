"""Imported by the env workers' forkserver (``actors.WORKER_PRELOAD``): the server exits at once. Elsewhere: nothing.

The server leaves with its owner (the learner or the actor host), by SystemExit; an ordinary exit would first tear
down every module it preloaded (seconds on a loaded machine) while its workers wait for their PR_SET_PDEATHSIG. It
holds nothing that needs that teardown, so it ends with os._exit as its exit starts (docs/architecture.md).

It also ignores SIGINT and SIGHUP from its import on: the server ignores SIGINT itself only once its preloads are
imported (a Ctrl-C in a run's first second printed a traceback from envpool's import), and a SIGHUP to the process
group (a closed terminal) killed it, so that its workers died of their PR_SET_PDEATHSIG while the learner was
saving and stopping. Its workers ignore both anyway; the server still exits with the learner.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys


def _in_forkserver() -> bool:
    """Whether this import runs from multiprocessing's forkserver main loop (its preloading)."""
    # Nothing here may raise: the server skips a preload that fails with ImportError only, and dies of any other.
    code = getattr(getattr(sys.modules.get("multiprocessing.forkserver"), "main", None), "__code__", None)
    frame = sys._getframe() if code is not None else None
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


if _in_forkserver():
    # Registered after multiprocessing's own exit handler, so it runs first (atexit runs newest first).
    atexit.register(os._exit, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
