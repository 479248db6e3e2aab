"""Unrolls to learner batches: ``Batcher`` copies each unroll of the store's [buffers, L, E, ...] once, into its
columns of a preallocated time-major batch [L, k*E, ...] (pinned on CUDA, copied to the device on a side stream; on
a CPU learner the host set is the batch); ``Prefetcher`` does this in a thread, one batch ahead (docs/pipeline.md).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from seedlocal.dtypes import torch_dtype
from seedlocal.shm.rollout import obs_name

# Store field -> batch key (obs fields keep their own names under "obs").
FIELDS = {"action": "action", "reward": "reward", "terminated": "terminated", "truncated": "truncated",
          "ignored": "ignored", "out.logits": "behaviour_logits", "out.gaussian": "behaviour_gaussian"}


@dataclass
class Batch:
    """A learner batch and what the learner must hand back when done with it."""

    data: dict
    bufs: list[int]
    slot: int
    ready: object = None  # CUDA event: the batch's copy to the device has finished
    groups: list[int] | None = None  # the group that filled each unroll (read when copied: an unroll
    # released early may be rebound to another group before the learner is done)
    epochs: list[int] | None = None  # how often that group had restarted when it filled it (its envs reset)


class Batcher:
    """Copies k unrolls into one of ``sets`` preallocated time-major batches."""

    def __init__(self, store: dict, obs_keys: list[str], k: int, device: torch.device, sets: int = 2):
        self.store, self.k, self.device = store, k, device
        self.fields = {name: key for name, key in FIELDS.items() if name in store}
        self.obs_keys = list(obs_keys)
        self.cuda = device.type == "cuda"
        # k unrolls side by side on their envs' axis: [L, E, ...] -> [L, k*E, ...], core_state [E, 2, H] -> [k*E, 2, H].
        self._axis = {name: 0 if name == "core_state" else 1 for name in
                      self.obs_keys + list(self.fields) + (["core_state"] if "core_state" in store else [])}
        shapes = {name: [d * k if i == axis else d for i, d in enumerate(store[name].shape[1:])]
                  for name, axis in self._axis.items()}
        self.host_t: list[dict[str, torch.Tensor]] = [
            {n: torch.empty(shape, dtype=torch_dtype(store[n].dtype), pin_memory=self.cuda)
             for n, shape in shapes.items()} for _ in range(sets)]
        self.host = [{n: t.numpy() for n, t in ht.items()} for ht in self.host_t]
        self.dev = [{n: torch.empty_like(t, device=device) for n, t in ht.items()} if self.cuda else {}
                    for ht in self.host_t]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._released = [None] * sets  # CUDA events: the learner's last use of each device set
        self._copied = [None] * sets  # CUDA events: the last host-to-device copy out of each host set

    def fill(self, bufs: list[int], slot: int) -> Batch:
        """Copy unrolls ``bufs`` (``k`` of them) into set ``slot``: the one host copy of each field."""
        host = self.host[slot]
        if self._copied[slot] is not None:
            # The last copy out of this pinned set may be in flight: the learner waited for it on the device only.
            self._copied[slot].synchronize()
        for name, dst in host.items():
            np.concatenate([self.store[name][b] for b in bufs], axis=self._axis[name], out=dst)
        tensors, ready = self.host_t[slot], None
        if self.cuda:
            with torch.cuda.stream(self.stream):
                if self._released[slot] is not None:
                    self.stream.wait_event(self._released[slot])  # the learner is done reading this set
                for name, t in tensors.items():
                    self.dev[slot][name].copy_(t, non_blocking=True)
                ready = self.stream.record_event()
            self._copied[slot] = ready
            tensors = self.dev[slot]
        data = {"obs": {obs_name(n): tensors[n] for n in self.obs_keys},
                **{key: tensors[name] for name, key in self.fields.items()},
                "core_state": tensors.get("core_state"),
                "policy_version": self.store["policy_version"][bufs][:, :-1].copy()}
        return Batch(data, list(bufs), slot, ready, groups=self.store["unroll_group"][bufs].tolist(),
                     epochs=self.store["unroll_epoch"][bufs].tolist())

    def use(self, batch: Batch) -> dict:
        """The learner's side: make its stream wait for the batch's copy."""
        if batch.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(batch.ready)
        return batch.data

    def done(self, batch: Batch) -> None:
        """The learner has queued its last work on ``batch``: its set may be refilled."""
        if self.cuda:
            self._released[batch.slot] = torch.cuda.current_stream(self.device).record_event()


class Prefetcher(threading.Thread):
    """Collects k completed unrolls, fills a free set and queues the batch, one ahead of the learner. With
    ``release_early`` the unrolls go back to the actors once copied; else (``algo.sync``) once the learner is done."""

    def __init__(self, loop, batcher: Batcher, release_early: bool):
        super().__init__(name="seedlocal-prefetch", daemon=True)
        self.loop, self.batcher, self.release_early = loop, batcher, release_early
        self.ready: queue.Queue[Batch | BaseException] = queue.Queue()
        self._free: queue.Queue[int] = queue.Queue()
        for s in range(len(batcher.host)):
            self._free.put(s)
        self._halt = threading.Event()
        self._pending: list[int] = []  # unrolls collected by next() without the thread

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                slot = self._get(self._free)
                bufs = [self._get(self.loop.completed) for _ in range(self.batcher.k)]
                if slot is None or None in bufs:  # halted
                    return
                batch = self.batcher.fill(bufs, slot)
                if self.release_early:
                    for b in bufs:
                        self.loop.release(b)
                self.ready.put(batch)
        except BaseException as e:  # handed to the learner, which raises it
            self.ready.put(e)

    def _get(self, q: queue.Queue):
        """The next item of ``q``; None once halted."""
        while not self._halt.is_set():
            with contextlib.suppress(queue.Empty):
                return q.get(timeout=0.2)
        return None

    def next(self, timeout: float) -> Batch | None:
        """The next batch, or None after ``timeout`` seconds without one. Without the thread started (``algo.sync``:
        the actors wait for every update, so there is none to fetch ahead) the caller collects and copies it."""
        if not self.is_alive() and not self.release_early:
            return self._collect_here(timeout)
        try:
            item = self.ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def _collect_here(self, timeout: float) -> Batch | None:
        # None after ``timeout`` in all, even while unrolls keep arriving: the caller checks its budget and its
        # workers between calls (a batch of many unrolls may take minutes to fill). What came stays pending.
        pending, end = self._pending, time.monotonic() + timeout
        while len(pending) < self.batcher.k:
            try:
                pending.append(self.loop.completed.get(timeout=max(0.0, end - time.monotonic())))
            except queue.Empty:
                return None
        self._pending = []
        return self.batcher.fill(pending, self._free.get_nowait())

    def done(self, batch: Batch) -> None:
        """The learner is done with ``batch``: release its unrolls (sync) and its set."""
        self.batcher.done(batch)
        if not self.release_early:
            for b in batch.bufs:
                self.loop.release(b)
        self._free.put(batch.slot)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
