"""Which unroll each group writes into: the allocator beside the batch server.

The store holds ``num_buffers`` unrolls (``shm/rollout.py``). An unroll is *free*, *bound* to the group filling it,
or *held* by the consumer (the learner) between its hand-off and ``release``. Each group is in one of three states:

    bound     it writes into one unroll: ``target_buf[g]``, row ``target_row[g]``
    parked    it filled its unroll, which went on to the consumer, and found no free one to continue in: its last
              observation and episode starts wait aside (its worker sleeps on its slot) until one is
    waiting   it must restart on fresh episodes (a dead worker, a lost actor host) and found no free unroll

Invariants (``tests/test_unrolls.py`` checks each):

* buffers are conserved: free + bound + held = ``num_buffers``, each once;
* no call blocks: a group that finds no free unroll parks or waits, and the batch server goes on serving the
  others, so a consumer waiting for more unrolls always gets them from the groups still bound;
* a parked group goes on from the observation it stopped at; a waiting one starts fresh (its old rows never handed on);
* first parked, first resumed: unbound groups are bound in the order they became unbound, and with a consumer a
  group that fills its unroll while others wait joins the back of the line instead of taking a free unroll ahead
  of them (else a consumer that releases one owner's unrolls at a time, a population's members, starves the others:
  docs/populations.md, "members starved one another").

All but ``release`` (the consumer's: it only touches the free list, under its lock) runs on the inference loop's thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

import numpy as np

BOUND, PARKED, WAITING = 0, 1, 2


class UnrollAllocator:
    def __init__(self, store, control, num_groups: int, obs_keys: list[str], epoch_of: Callable[[int], int],
                 hand_on: Callable[[int], None] | None = None):
        """``hand_on(buf)`` passes a full unroll to the consumer; None: none, it is free at once (neuroevolution)."""
        self.store, self.obs_keys, self.epoch_of = store, obs_keys, epoch_of
        self._tbuf, self._trow = control["target_buf"], control["target_row"]
        self.G, self.num_buffers, self.L = num_groups, store["unroll_group"].shape[0], store["reward"].shape[1]
        self._hand_on = hand_on
        self._free: deque[int] = deque(range(self.num_buffers))
        self._lock = threading.Lock()
        self.state = np.full(num_groups, WAITING, np.int8)
        self._parked_obs: dict[int, dict[str, np.ndarray]] = {}
        self._resume_first: dict[int, np.ndarray] = {}
        self._since = np.zeros(num_groups, np.int64)  # when each unbound group became unbound (a count)
        self._unbound_count = 0

    def unbound(self) -> np.ndarray:
        """Groups that hold no unroll (parked or waiting): they cannot be served."""
        return self.state != BOUND

    def waiting(self, g: int) -> bool:
        return self.state[g] == WAITING

    def take_resume_first(self, g: int) -> np.ndarray | None:
        """The episode-start flags a parked group stopped with (once, at its first serve after unparking)."""
        return self._resume_first.pop(g, None)

    def release(self, buf: int) -> None:
        with self._lock:
            self._free.append(buf)

    def _take(self) -> int | None:
        with self._lock:
            return self._free.popleft() if self._free else None

    def _unbind(self, g: int, state: int) -> None:
        self.state[g] = state
        self._unbound_count += 1
        self._since[g] = self._unbound_count

    def _bind(self, g: int, buf: int, row: int = 0) -> None:
        self._tbuf[g], self._trow[g] = buf, row
        self.store["unroll_group"][buf] = g
        self.store["unroll_epoch"][buf] = self.epoch_of(g)
        self.state[g] = BOUND

    def bind_all(self) -> None:
        """Every group into a fresh unroll, at start (preparation's shape has at least as many as groups)."""
        for g in range(self.G):
            self._bind(g, self._take())

    def rotate(self, g: int, first: np.ndarray) -> int | None:
        """Group ``g`` filled its unroll's bootstrap row: hand the unroll on and continue in a free one whose row 0
        is that same observation. Returns the new unroll, or None when none is free: ``g`` is parked, its
        observation and episode starts (``first``) kept aside."""
        old = int(self._tbuf[g])
        queued = self._hand_on is not None and bool(self.unbound().any())
        new = None if queued else self._take()  # behind the groups that wait for one (module docstring)
        if new is None:
            self._parked_obs[g] = {k: self.store[k][old, self.L - 1].copy() for k in self.obs_keys}
            self._resume_first[g] = first.copy()
            self._unbind(g, PARKED)
        else:
            self._bind(g, new)
            for k in self.obs_keys:
                self.store[k][new, 0] = self.store[k][old, self.L - 1]
        (self._hand_on or self.release)(old)
        return new

    def restart(self, g: int) -> bool:
        """Group ``g`` starts over on fresh episodes: its partial unroll (if it holds one) is given up, and it
        takes a fresh one if any is free (True). Otherwise it waits (False) and ``resume`` binds it later; until
        then its envs must not write (they have nowhere to)."""
        if self.state[g] == BOUND:
            self.release(int(self._tbuf[g]))
        self._parked_obs.pop(g, None)
        self._resume_first.pop(g, None)
        buf = self._take()
        if buf is None:
            self._unbind(g, WAITING)
            return False
        self._bind(g, buf)
        return True

    def resume(self) -> list[int]:
        """Bind parked and waiting groups while unrolls are free, in the order they became unbound. Parked groups
        go on at once (row 0 is their kept observation); returns the waiting ones bound, which the caller restarts."""
        started = []
        unbound = np.flatnonzero(self.state != BOUND)
        for g in unbound[np.argsort(self._since[unbound], kind="stable")].tolist():
            buf = self._take()
            if buf is None:
                break
            was = self.state[g]
            self._bind(g, buf)
            if was == PARKED:
                for k, v in self._parked_obs.pop(g).items():
                    self.store[k][buf, 0] = v
            else:
                started.append(g)
        return started
