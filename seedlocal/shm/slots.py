"""The slot protocol between env workers and the inference loop.

A *group* is half of one worker's environments. Its slot in a small control segment says who may touch its rows:

    STEPPING      the worker: it steps the group's envs and writes the results into row ``target_row`` of ``target_buf``
    OBS_READY     the inference loop: observations are in that row
    ACTION_READY  the worker: actions are in row ``target_row - 1``
    RESET         the worker: reset every env of the group and write the first observations into row 0 of
                  ``target_buf`` (a fresh unroll); neuroevolution starts each generation this way
    UNBOUND       the worker, before its first reset: the group has no unroll yet (a restarted worker whose group
                  found every unroll held by the learner); it waits for the wake token, then the loop says RESET

Publication order (correct on weakly ordered CPUs such as ARM, not only x86): a side reads the rows a state guards
only after an *acquiring* operation that pairs with the other side's *releasing* one made after it wrote them,
never on the state alone (a plain store to ``state`` may become visible before the stores to the rows). The pairs
are POSIX semaphores (glibc's ``sem_post`` is a release RMW, ``sem_wait``/``sem_trywait`` an acquire RMW):

    worker:  write obs/reward rows; state = OBS_READY; ready[g].post()
    loop:    ready[g].try_acquire() succeeds  ->  read those rows
    loop:    write action rows; state = ACTION_READY (or RESET); wake[g].post()
    worker:  wake[g].wait() succeeds  ->  read state and the action row

Each transition posts exactly one token to the group's own semaphore and the reader takes one per transition, so a
token it takes is always the one posted after the rows it is about to read. ``obs_ready`` only wakes the loop (a
post per transition, plus control posts such as stop) and orders nothing. Waiting sides block in ``sem_timedwait``
(never spin), always with a timeout so that a dead peer is noticed.
"""

from __future__ import annotations

import multiprocessing as mp
from types import SimpleNamespace

from seedlocal.shm.arrays import ArraySpec, SharedArrays

STEPPING, OBS_READY, ACTION_READY, RESET, UNBOUND = range(5)  # a slot's states (the table above)
ERROR_BYTES = 400
TRACE_BYTES = 4096  # the env's own frames of a traceback: a user's env's, a few hundred bytes to a few KB


def write_error(control, group: int, exc: BaseException) -> None:
    """Record ``exc`` as the reason group ``group``'s worker is about to die."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    _write_text(control["group_error"][group], text.encode("utf-8", "replace")[:ERROR_BYTES - 1])


def write_trace(control, group: int, text: str) -> None:
    """Record the traceback of group ``group``'s env (its own frames); a longer one keeps its end, where it raised."""
    _write_text(control["group_trace"][group], text.encode("utf-8", "replace")[-(TRACE_BYTES - 1):])


def _write_text(row, data: bytes) -> None:
    row[:] = 0
    row[:len(data)] = list(data)


def read_text(control, field: str, group: int) -> str:
    """What ``write_error`` (``field`` "group_error") or ``write_trace`` ("group_trace") recorded for ``group``."""
    return bytes(control[field][group]).split(b"\0", 1)[0].decode("utf-8", "replace")


def control_specs(num_groups: int) -> list[ArraySpec]:
    G = (num_groups,)
    return [
        ArraySpec("state", G, "int32"), ArraySpec("target_buf", G, "int32"), ArraySpec("target_row", G, "int32"),
        ArraySpec("stop", (1,), "int32"),
        # Per-group counters that only the group's own thread writes. group_wait_since: perf_counter() when the group
        # began waiting for actions, 0 while it is not: readers count a wait still under way up to now, so a share
        # of one interval's time never takes in a wait begun before it.
        ArraySpec("group_wait_s", G, "float64"), ArraySpec("group_wait_since", G, "float64"),
        ArraySpec("group_env_s", G, "float64"), ArraySpec("group_steps", G, "int64"),
        ArraySpec("group_episodes", G, "int64"),
        # Remote groups (pipeline/bridge/server.py): the server bumps group_lost when a group's host goes away; the
        # loop rebinds the group fresh, sets group_lost_ack to match and posts the group's wake token.
        ArraySpec("group_lost", G, "int64"), ArraySpec("group_lost_ack", G, "int64"),
        ArraySpec("group_connected", G, "int8"),
        # Per actor host (at most one per group), written by the bridge server.
        ArraySpec("host_connected", G, "int8"), ArraySpec("host_steps", G, "int64"),
        ArraySpec("host_bytes", G, "int64"), ArraySpec("host_rtt_ms", (num_groups, 2), "float64"),
        ArraySpec("bridge_disconnects", (1,), "int64"),
        # Why a group's worker died: its exception as one line of UTF-8, for the learner's message, and the env's
        # frames of its traceback, which the learner shows once (pipeline/worker.py's _report).
        ArraySpec("group_error", (num_groups, ERROR_BYTES), "uint8"),
        ArraySpec("group_trace", (num_groups, TRACE_BYTES), "uint8"),
    ]


def create_control(num_groups: int) -> SharedArrays:
    return SharedArrays.create(control_specs(num_groups), "control")


class Signal:
    """A counting wake-up: ``post`` never blocks, ``wait`` blocks in the kernel. Tokens may outnumber events (a waiter
    re-checks the states after waking), so a spurious wake-up is harmless; a missed one costs at most its timeout."""

    def __init__(self, ctx: mp.context.BaseContext):
        self._sem = ctx.Semaphore(0)

    @property
    def name(self) -> str | None:
        """The POSIX semaphore's name ("/mp-..."), where it has one."""
        return getattr(getattr(self._sem, "_semlock", None), "name", None)

    def post(self) -> None:
        self._sem.release()

    def wait(self, timeout: float | None) -> bool:
        return self._sem.acquire(True, timeout)

    def try_acquire(self) -> bool:
        """Take a token if one is there (an acquire operation; never blocks)."""
        return self._sem.acquire(False)

    def drain(self) -> None:
        while self._sem.acquire(False):
            pass

    def close(self) -> None:
        """Unlink the semaphore's name now, not when this, its only reference, is collected (multiprocessing's way): a
        process SIGKILLed in between (an actor host retrying a learner) left a ``sem.mp-*`` that no sweep could name
        (the segment recording it goes at close). Afterwards a late ``post`` does nothing, a ``wait`` finds no token."""
        self._sem = _CLOSED


_CLOSED = SimpleNamespace(release=lambda: None, acquire=lambda block=True, timeout=None: False)
