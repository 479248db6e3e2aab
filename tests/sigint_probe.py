"""Preloaded by a forkserver in tests/test_lifecycle.py: writes how this process handles SIGINT while the
server is still importing its preloads (and SIGHUP), to the file $SIGINT_PROBE_FILE."""
import os
import signal

with open(os.environ["SIGINT_PROBE_FILE"], "w") as f:
    f.write(" ".join("ignored" if signal.getsignal(s) is signal.SIG_IGN else "handled" for s in (signal.SIGINT,
                                                                                              signal.SIGHUP)))
