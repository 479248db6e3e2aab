"""Preloaded by a forkserver in tests/test_lifecycle.py: writes how this process handles SIGINT while the
server is still importing its preloads, to the file $SIGINT_PROBE_FILE."""
import os
import signal

with open(os.environ["SIGINT_PROBE_FILE"], "w") as f:
    f.write("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "raises")
