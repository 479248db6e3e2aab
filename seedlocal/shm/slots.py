"""The slot protocol between env workers and the inference loop.

A *group* is half of one worker's environments. Each group owns one slot in a
small control segment; the slot's state says who may touch the group's rows:

    STEPPING      the worker: it is stepping the group's envs and will write
                  the results into row ``target_row`` of unroll ``target_buf``
    OBS_READY     the inference loop: observations are in that row
    ACTION_READY  the worker: actions are in row ``target_row - 1``
    RESET         the worker: reset every env of the group and write the
                  first observations into row 0 of ``target_buf`` (a fresh
                  unroll); neuroevolution starts each generation this way

State changes are published after the data they guard is written and are
followed by a semaphore post, which is a full memory barrier on every
platform Python supports. Waiting sides block in ``sem_timedwait`` (never
spin), always with a timeout so that a dead peer is noticed.
"""

from __future__ import annotations

import multiprocessing as mp

from seedlocal.shm.arrays import ArraySpec, SharedArrays

STEPPING = 0
OBS_READY = 1
ACTION_READY = 2
RESET = 3


def control_specs(num_groups: int) -> list[ArraySpec]:
    return [
        ArraySpec("state", (num_groups,), "int32"),
        ArraySpec("target_buf", (num_groups,), "int32"),
        ArraySpec("target_row", (num_groups,), "int32"),
        ArraySpec("stop", (1,), "int32"),
        # Per-group counters that only the group's own thread writes.
        ArraySpec("group_wait_s", (num_groups,), "float64"),
        ArraySpec("group_env_s", (num_groups,), "float64"),
        ArraySpec("group_steps", (num_groups,), "int64"),
    ]


def create_control(num_groups: int) -> SharedArrays:
    return SharedArrays.create(control_specs(num_groups), "control")


class Signal:
    """A counting wake-up: ``post`` never blocks, ``wait`` blocks in the kernel.

    Tokens may outnumber real events (a waiter re-checks the slot states after
    waking), so a spurious wake-up is harmless; a missed one costs at most the
    waiter's timeout.
    """

    def __init__(self, ctx: mp.context.BaseContext):
        self._sem = ctx.Semaphore(0)

    def post(self) -> None:
        self._sem.release()

    def wait(self, timeout: float | None) -> bool:
        return self._sem.acquire(True, timeout)

    def drain(self) -> None:
        while self._sem.acquire(False):
            pass
