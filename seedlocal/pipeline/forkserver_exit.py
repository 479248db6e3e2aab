"""Imported by the env workers' forkserver only (``actors.WORKER_PRELOAD``): the server exits at once.

The server leaves when its owner (the learner or the actor host) does: it sees the end of its keep-alive pipe
and raises SystemExit. An ordinary interpreter exit then tears down every module it preloaded (numpy, envpool,
the worker), about 0.35 s of CPU here and seconds on a loaded machine, and only when the server is gone does
Linux send its workers their PR_SET_PDEATHSIG. The server holds nothing that needs that teardown (it owns no
segments and flushes nothing), so it ends with os._exit at the start of its exit instead: 0.02 s.

It also ignores SIGINT and SIGHUP from its import on. The server ignores SIGINT itself only once its preloads are
imported, so a Ctrl-C in the first second of a run printed a KeyboardInterrupt traceback from envpool's import; and
a SIGHUP to the process group (a closed terminal) killed the server, whose workers then died of their
PR_SET_PDEATHSIG and were restarted while the learner was saving and stopping. Its workers (its only children,
which inherit this) ignore both anyway: the learner stops them, and the server still exits with the learner.

Anywhere else, importing this module does nothing.
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
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


if _in_forkserver():
    # Registered after multiprocessing's own exit handler, so it runs first (atexit runs newest first).
    atexit.register(os._exit, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
