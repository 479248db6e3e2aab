"""The inference loop: batches ready groups, runs the policy, writes actions.

Each :meth:`InferenceLoop.step`

1. waits in the kernel for ``min_batch_envs`` ready observations, or ``batch_timeout_s`` after the first (``_collect``);
2. hands every group that filled its unroll's last row to the consumer and rebinds it to a free unroll whose row 0
   is the same observation (``pipeline/unrolls.py``); with none free the group is *parked* (its worker sleeps) until
   one is released, which bounds the policy lag by the number of unrolls, and the others are served on (``_rotate``);
3. gathers the observations into a staging buffer (pinned on CUDA) and copies it to the device (``_stage``);
4. runs the policy (``_act``);
5. scatters actions and outputs into the same rows and gives the slots back to their workers (``_scatter``).

A dead worker is restarted on fresh episodes (its partial unrolls dropped, its recurrent state zeroed) or,
once ``max_restarts`` is spent, the loop raises ``WorkerDied`` naming it.
"""

from __future__ import annotations

import contextlib
import math
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from seedlocal.dtypes import numpy_dtype, torch_dtype
from seedlocal.errors import Diverged
from seedlocal.pipeline.actors import ActorPool
from seedlocal.pipeline.policy import HOLD, RESTART, SERVE, Policy, Unhold
from seedlocal.pipeline.unrolls import UnrollAllocator
from seedlocal.shm.rollout import obs_name
from seedlocal.shm.slots import ACTION_READY, OBS_READY, RESET, STEPPING, UNBOUND


class LoopStopped(Exception):
    """Raised inside ``step`` once ``request_stop`` was called."""


class EpisodeLog:
    """Finished episodes: the inference thread ``add``s each batch's, a reader ``take``s the count and sums since its
    last take (exact, however many end between reads) and the last ``keep``; memory stays bounded if none reads."""

    def __init__(self, keep: int = 1000):
        self._lock = threading.Lock()
        self._count, self._return_sum, self._length_sum = 0, 0.0, 0
        self._recent: deque[tuple[float, int]] = deque(maxlen=keep)

    def add(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        with self._lock:
            self._count += len(returns)
            self._return_sum += float(np.sum(returns, dtype=np.float64))
            self._length_sum += int(np.sum(lengths, dtype=np.int64))
            self._recent.extend(zip(returns.tolist(), lengths.tolist()))

    def take(self) -> "Episodes":
        with self._lock:
            out = Episodes(self._count, self._return_sum, self._length_sum, list(self._recent))
            self._count, self._return_sum, self._length_sum = 0, 0.0, 0
            self._recent.clear()
        return out


class Episodes(NamedTuple):
    count: int
    return_sum: float
    length_sum: int
    recent: list[tuple[float, int]]  # the last (return, length) pairs, oldest first, at most EpisodeLog.keep


@dataclass
class LoopStats:
    """Counters the loop updates per batch; read and reset by loggers."""

    env_steps: int = 0
    batches: int = 0
    batch_envs: int = 0
    forward_s: float = 0.0
    collect_s: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    episodes: EpisodeLog = field(default_factory=EpisodeLog)
    restarts: int = 0
    timeouts: int = 0  # batches served short because batch_timeout_s ran out
    first_batch_at: float = 0.0  # time.monotonic() when the first batch went back to its workers


def to_host(actions: torch.Tensor, outputs: dict[str, torch.Tensor],
            pack: bool | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What the workers need of a batch, as numpy. On an accelerator (``pack`` defaults to that) the actions and
    every output go in one float32 block, so a batch costs one device-to-host copy and one wait rather than one
    per field; integer actions survive the round trip exactly (< 2**24)."""
    pack = actions.device.type != "cpu" if pack is None else pack
    if not pack:
        return actions.cpu().numpy(), {name: t.cpu().numpy() for name, t in outputs.items()}
    n = actions.shape[0]
    parts = [actions, *outputs.values()]
    block = torch.cat([t.reshape(n, -1).float() for t in parts], dim=1).cpu().numpy()
    out, o = [], 0
    for t in parts:  # column slices, not np.split: this runs once a batch, in the loop's thread
        w = math.prod(t.shape[1:])
        out.append(block[:, o:o + w].reshape(t.shape).astype(np.float32 if t.dtype == torch.bfloat16
                                                               else numpy_dtype(t.dtype)))
        o += w
    return out[0], dict(zip(outputs, out[1:]))


@dataclass(slots=True)
class _Batch:
    """One batch, passed between the phases of ``InferenceLoop.step`` (one object, no copy per phase)."""

    groups: np.ndarray  # [k] the ready groups
    bufs: np.ndarray  # [k] each one's unroll
    rows: np.ndarray  # [k] and row
    first: np.ndarray  # [k, E] whether each env's observation starts an episode
    # The step that produced them, read by _plan only: the groups it ``stepped`` [k] (bool), their rows
    # ``prev`` (as buf * L + row) and ``done`` [stepped, E]; ``steps`` counts the env steps answered.
    stepped: np.ndarray
    prev: np.ndarray
    done: np.ndarray
    steps: int
    flat: np.ndarray | None = None  # [k] buf * L + row, set by _act once _rotate moved no group any more
    actions: np.ndarray | None = None  # [k * E, ...] and {name: [k * E, ...]}, set by _act
    outputs: dict[str, np.ndarray] | None = None

    def keep(self, mask: np.ndarray) -> bool:
        """Keep the groups where ``mask`` is True (``stepped``, ``prev``, ``done`` as they were); whether any is."""
        self.groups, self.bufs, self.rows, self.first = (
            self.groups[mask], self.bufs[mask], self.rows[mask], self.first[mask])
        return bool(len(self.groups))


class InferenceLoop:
    poll_s = 0.25  # the longest a wait for ready groups sleeps before it checks the workers anyway
    check_every_s = 0.1  # a waitpid per worker: cheap

    def __init__(self, pool: ActorPool, policy: Policy, device: torch.device, batch_timeout_s: float,
                 consume: bool = False, threads: int = 1):
        """``consume``: full unrolls go to ``completed`` for a consumer, which ``release``s each (else they are
        free again at once). ``threads``: torch's CPU threads for whichever thread serves batches (a count per
        OS thread, so a learner in another thread keeps its own)."""
        self.pool, self.policy, self.device, self.threads = pool, policy, device, threads
        self.store, ctl, layout = pool.store, pool.control, pool.layout
        self._state, self._tbuf, self._trow = ctl["state"], ctl["target_buf"], ctl["target_row"]
        self.E, self.L, self.G = pool.envs_per_group, layout.length, pool.shape.num_groups
        self.min_batch_envs, self.batch_timeout_s = max(1, pool.shape.min_batch_envs), batch_timeout_s
        self.version = 0  # bumped by the learner after each parameter update
        self.stats = LoopStats()
        self.completed: queue.Queue[int] = queue.Queue()
        self._obs_keys = layout.obs_keys()
        self.unrolls = UnrollAllocator(self.store, ctl, self.G, self._obs_keys, pool.epoch_of,
                                       hand_on=self.completed.put if consume else None)
        self._last_check = 0.0
        self._stop = threading.Event()
        self._held = np.zeros(self.G, bool)  # parked by a planning policy (their workers sleep) until ``unhold``
        # Groups whose ready token the loop took: their rows are published to it (shm/slots.py) until handed back.
        self._owned = np.zeros(self.G, bool)
        self._unhold = policy.unhold if policy.unhold is not None else Unhold()
        self._unhold.connect(pool.obs_ready.post)  # a planning policy's request to serve held groups wakes the loop
        # Which groups actor hosts step, behind the bridge (None: none).
        self._remote = np.arange(self.G) >= pool.num_local_groups if pool.num_remote_groups else None
        # What every batch reuses, made once. [buffers * rows, envs, ...] views of the store's fields: one index per
        # row (buf * L + row) reaches a field, so one np.take gathers a batch's observations.
        fields = self._obs_keys + ["terminated", "truncated", "ignored", "ep_return", "ep_length", "action",
                                   "policy_version", *(f"out.{name}" for name in layout.outputs)]
        self._flat = {k: self.store[k].reshape((-1,) + self.store[k].shape[2:]) for k in fields}
        self._env_ids = np.arange(self.G * self.E).reshape(self.G, self.E)  # group g's env slots (env_ids)
        # The policy reads a batch of k groups as the first k * E rows of the staging buffer [G * E, ...]; np.take
        # gathers into its [G, E, ...] view.
        self._staging = {k: torch.empty((self.G * self.E,) + self.store[k].shape[3:], dtype=torch_dtype(
            self.store[k].dtype), pin_memory=self.device.type == "cuda") for k in self._obs_keys}
        self._staging_np = {k: v.numpy().reshape((self.G, self.E) + v.shape[1:]) for k, v in self._staging.items()}
        # Its first k groups' rows, for each k a batch can have (a torch slice costs more than the batch's copy).
        self._staged = {k: [v[:n * self.E] for n in range(self.G + 1)] for k, v in self._staging.items()}
        spec = self.policy.core_state
        self.core = None if spec is None else torch.zeros((self.G, self.E) + spec.shape, device=self.device)

    def release(self, buf: int) -> None:
        """The consumer is done with a completed unroll (any thread)."""
        self.unrolls.release(buf)
        if self.unrolls.unbound().any():
            self.pool.obs_ready.post()  # wake the loop to move a parked or waiting group on

    def _start_fresh(self, g: int) -> bool:
        """Group ``g`` drops its partial unroll for fresh episodes (``_batch_core`` zeroes their recurrent state);
        whether it found a free unroll to start in (else it waits for one: ``UnrollAllocator.restart``)."""
        self._owned[g] = False
        return self.unrolls.restart(g)

    def _resume(self) -> None:
        """Unrolls were released: parked groups go on, waiting ones start fresh."""
        for g in self.unrolls.resume():
            if self._remote is not None and self._remote[g]:
                self._ack_remote(g)
            else:
                self._hand_back(g, RESET)  # the restarted worker waits for this (UNBOUND) before its reset

    def start(self) -> None:
        # Every batch size (whole groups, 1 to all), e.g. for CUDA graph capture, before any learner or worker runs.
        zeros = {obs_name(k): torch.zeros_like(v[:1], device=self.device) for k, v in self._staging.items()}
        self.policy.prepare([k * self.E for k in range(1, self.G + 1)], zeros)
        self._state[:] = STEPPING
        self.unrolls.bind_all()
        self.pool.start()

    def _check_workers(self) -> None:
        self._last_check = time.monotonic()
        if self._remote is not None:
            self.pool.check_server()
            ctl = self.pool.control
            for g in np.flatnonzero(ctl["group_lost"] != ctl["group_lost_ack"]).tolist():
                if not self.unrolls.waiting(g):  # (a waiting one is acknowledged once it has an unroll)
                    self._restart_remote(g)
        for w in self.pool.dead_workers():
            if self.pool.control["stop"][0]:
                return
            self.pool.show_traceback(w)  # the first death's, once
            self.pool.begin_restart(w)  # raises WorkerDied once restarts are spent
            print(f"seedlocal: {self.pool.describe_exit(w)}; restarted it on fresh episodes", file=sys.stderr,
                  flush=True)
            for g in self.pool.shape.groups_of(w):
                if not self._start_fresh(g):  # its new worker waits for an unroll (UNBOUND), the others run on
                    self._state[g] = UNBOUND
            self.pool.spawn(w)
            self.stats.restarts += 1

    def _restart_remote(self, g: int) -> None:
        """Remote group ``g`` lost its actor host: like a dead worker's group, it starts fresh; the bridge server
        is told (``_ack_remote``) once it has an unroll, and until then no host can take the group."""
        self.pool.ready[g].drain()
        self.pool.wake[g].drain()
        self._state[g] = STEPPING
        self.stats.restarts += 1
        if self._start_fresh(g):
            self._ack_remote(g)

    def _ack_remote(self, g: int) -> None:
        ctl = self.pool.control
        ctl["group_lost_ack"][g] = ctl["group_lost"][g]
        self.pool.wake[g].post()  # the release that publishes the rebind

    def _collect(self) -> np.ndarray:
        t0 = time.perf_counter()
        deadline = None
        while True:
            if self._stop.is_set():
                raise LoopStopped
            if self._unhold.take():
                self._held[:] = False
            unbound = self.unrolls.unbound()
            if unbound.any():
                self._resume()
                unbound = self.unrolls.unbound()
            self._claim()
            # Held, parked, waiting and host-less remote groups cannot become ready: waiting for them would cost
            # a full timeout per batch whenever only a few groups have work.
            idle = self._held | unbound
            ready = np.flatnonzero(self._owned & ~idle)
            now = time.perf_counter()
            if self._remote is not None:
                idle = idle | self._remote & (self.pool.control["group_connected"] == 0)
            need = min(self.min_batch_envs, max(1, self.G - np.count_nonzero(idle)) * self.E)
            if len(ready) * self.E >= need:
                break
            if deadline is not None and now >= deadline:
                if len(ready):
                    self.stats.timeouts += 1
                    break
                # Its groups are gone (a dead worker's, un-owned by _check_workers): nothing to act on, so wait afresh.
                deadline = None
            if len(ready) and deadline is None:
                deadline = now + self.batch_timeout_s
            woke = self.pool.obs_ready.wait(self.poll_s if deadline is None else max(0.0, deadline - now))
            if not woke or time.monotonic() - self._last_check > self.check_every_s:
                self._check_workers()
        self.stats.collect_s.append(time.perf_counter() - t0)
        return ready

    def _claim(self) -> None:
        """Take the ready token of every OBS_READY group that posted it: only those rows may be read (acquire)."""
        for g in np.flatnonzero((self._state == OBS_READY) & ~self._owned).tolist():
            if self.pool.ready[g].try_acquire():
                self._owned[g] = True

    def _hand_back(self, g: int | np.ndarray, state: int) -> None:
        """Give group ``g`` (or an array of groups) back to its worker in ``state``."""
        self._owned[g] = False
        self._state[g] = state
        for one in np.atleast_1d(g).tolist():
            self.pool.wake[one].post()  # release: publishes the rows written for it

    def step(self) -> int:
        """Serve one batch; returns the number of env steps it answered. Its phases are the module docstring's,
        with ``_gather`` (where the rows are, the episodes the last step ended) and a planning policy's ``_plan``
        (hold or restart groups) after the wait; a phase that leaves no group ends the batch there."""
        batch = self._gather(self._collect())
        if (not self.policy.plans or self._plan(batch)) and self._rotate(batch):
            self._act(batch)
            self._scatter(batch)
        return batch.steps

    def _gather(self, ready: np.ndarray) -> _Batch:
        """The ready groups' rows, whether each env's observation starts an episode, and the episode ends of the
        step that produced them (added to ``stats.episodes``)."""
        flat, E = self._flat, self.E
        bufs, rows = self._tbuf[ready].astype(np.int64), self._trow[ready].astype(np.int64)
        stepped = rows > 0
        prev = (bufs * self.L + rows)[stepped] - 1
        ignored = flat["ignored"].take(prev, axis=0)
        n_stepped = len(prev)
        # An observation starts an episode where the step before it was ignored (spec.py's episode_starts).
        if n_stepped == len(ready):  # (take made a new array: first is the batch's own)
            first = ignored
        else:
            first = np.ones((len(ready), E), bool)  # a fresh unroll's row 0: a reset
            first[stepped] = ignored
            for i in np.flatnonzero(~stepped):
                resumed = self.unrolls.take_resume_first(int(ready[i]))
                if resumed is not None:  # a parked group going on with its episodes
                    first[i] = resumed
        done = flat["terminated"].take(prev, axis=0) | flat["truncated"].take(prev, axis=0)
        if done.any():
            rets, lens = flat["ep_return"].take(prev, axis=0)[done], flat["ep_length"].take(prev, axis=0)[done]
            self.stats.episodes.add(rets, lens)
        self.stats.env_steps += n_stepped * E
        return _Batch(ready, bufs, rows, first, stepped, prev, done, n_stepped * E)

    def _plan(self, b: _Batch) -> bool:
        """Offer the groups to the policy's ``plan`` with their envs' episode ends, returns and lengths; the
        groups it holds or restarts leave the batch. False once none is left."""
        flat, shape = self._flat, (len(b.groups), self.E)
        done, ret, length = np.zeros(shape, bool), np.zeros(shape, np.float32), np.zeros(shape, np.int32)
        done[b.stepped] = b.done
        ret[b.stepped] = flat["ep_return"].take(b.prev, axis=0)
        length[b.stepped] = flat["ep_length"].take(b.prev, axis=0)
        codes = np.asarray(self.policy.plan(b.groups, b.first, done, ret, length))
        if (codes == SERVE).all():
            return True
        for g, code in zip(b.groups.tolist(), codes.tolist()):
            if code == HOLD:
                self._held[g] = True
            elif code == RESTART:
                started = self._start_fresh(g)
                assert started, "a served group held an unroll, free again now"
                self._hand_back(g, RESET)
        return b.keep(codes == SERVE)

    def _rotate(self, b: _Batch) -> bool:
        """Groups whose unroll is full hand it on and go on in row 0 of a free one; with none free they leave the
        batch, parked. False once none is left."""
        full = np.flatnonzero(b.rows == self.L - 1)
        if not full.size:  # most batches
            return True
        keep = np.ones(len(b.groups), bool)
        for i in full.tolist():
            new = self.unrolls.rotate(int(b.groups[i]), b.first[i])
            if new is None:  # parked until the consumer releases an unroll
                keep[i] = False
            else:
                b.bufs[i], b.rows[i] = new, 0
        return bool(keep.all()) or b.keep(keep)

    def _act(self, b: _Batch) -> None:
        """The forward: the batch's recurrent state and observations on the device, the policy, its actions and
        outputs back on the host (into ``b.actions``, ``b.outputs``)."""
        b.flat = b.bufs * self.L + b.rows
        core = self._batch_core(b)
        obs = self._stage(b)
        t0 = time.perf_counter()
        actions, outputs, new_core = self.policy.act(obs, core, self._env_ids[b.groups].ravel(), b.first.ravel())
        b.actions, b.outputs = to_host(actions, outputs)
        if b.actions.dtype.kind == "f" and not np.isfinite(b.actions).all():
            # Never sent: a simulator stepped with NaN goes on silently with NaN state.
            raise Diverged("the policy produced a NaN or infinite action (its weights or its observation "
                           "statistics diverged); no env was stepped with it")
        self.stats.forward_s += time.perf_counter() - t0
        if new_core is not None:
            self.core[torch.from_numpy(b.groups)] = new_core.unflatten(0, (len(b.groups), self.E))

    def _batch_core(self, b: _Batch) -> torch.Tensor | None:
        """The groups' recurrent state [k * E, ...], zeroed at episode starts; stored for each unroll starting here."""
        if self.core is None:
            return None
        core = self.core[torch.from_numpy(b.groups)]
        core[torch.from_numpy(b.first)] = 0.0
        starting = np.flatnonzero(b.rows == 0)
        if len(starting):  # the state each new unroll starts from: one copy for them all
            self.store["core_state"][b.bufs[starting]] = core[torch.from_numpy(starting)].cpu().numpy()
        return core.flatten(0, 1)

    def _stage(self, b: _Batch) -> dict[str, torch.Tensor]:
        """The batch's observations: one ``np.take`` per field into the staging buffer, then on the device."""
        k = len(b.groups)
        obs = {}
        for key in self._obs_keys:
            # mode="clip": with out= and the default mode="raise", numpy gathers into a temporary and copies that
            # (3x a memcpy for Pong frames); the rows are the allocator's own, always in range.
            np.take(self._flat[key], b.flat, axis=0, out=self._staging_np[key][:k], mode="clip")
            obs[obs_name(key)] = self._staged[key][k].to(self.device, non_blocking=True)
        return obs

    def _scatter(self, b: _Batch) -> None:
        """Actions, outputs and policy version into the batch's rows; its groups, a row on, back to their workers."""
        flat, k, E = self._flat, len(b.groups), self.E
        flat["action"][b.flat] = b.actions.reshape((k, E) + b.actions.shape[1:])
        for name, v in b.outputs.items():
            flat[f"out.{name}"][b.flat] = v.reshape((k, E) + v.shape[1:])
        flat["policy_version"][b.flat] = self.version
        self._trow[b.groups] = b.rows + 1
        self._hand_back(b.groups, ACTION_READY)
        if not self.stats.batches:
            self.stats.first_batch_at = time.monotonic()
        self.stats.batches += 1
        self.stats.batch_envs += k * E

    def run(self, seconds: float) -> None:
        torch.set_num_threads(self.threads)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.step()

    def request_stop(self) -> None:
        """Make ``step``/``run_until_stopped`` return soon, from any thread."""
        self._stop.set()
        self.pool.obs_ready.post()

    def run_until_stopped(self) -> None:
        """Serve batches until ``request_stop``; for an inference thread. On CUDA it enqueues on a stream of its own
        (not behind the learner's kernels); the weights are ordered by the policy's ``WeightLock``, everything made
        before it starts (recurrent state, frame stacks) by one wait here (docs/pipeline.md)."""
        torch.set_num_threads(self.threads)
        cuda = self.device.type == "cuda"
        with contextlib.suppress(LoopStopped), (
                torch.cuda.stream(torch.cuda.Stream(self.device)) if cuda else contextlib.nullcontext()):
            if cuda:
                torch.cuda.current_stream(self.device).wait_stream(torch.cuda.default_stream(self.device))
            while True:
                self.step()


class StallWatch:
    """Notices a learner waiting on envs that make no progress (a hung env; docs/pipeline.md, "Failure handling").

    The learner calls ``start`` as it begins to wait and ``poll`` while it waits: after ``after`` s without an env
    step, ``poll`` names (every ``every`` s) the local workers still inside an env's step or reset; a lone stuck
    worker is named after ``3 x after`` s. With a bridge a whole-run stall is said only where a local worker is
    stuck (the bridge meter reports waiting for actor hosts)."""

    def __init__(self, loop: InferenceLoop, after: float = 10.0, every: float = 30.0):
        self.loop, self.after, self.every = loop, after, every
        n = loop.pool.num_local_groups
        self.enabled, self._hosts_too = n > 0, loop.pool.num_remote_groups > 0
        self._said = self._said_one = -float("inf")
        self._group_steps, self._group_t, self._candidate = np.zeros(n, np.int64), np.zeros(n), np.zeros(n, bool)
        self.start()

    def start(self) -> None:
        self._steps, self._t = self.loop.stats.env_steps, time.monotonic()

    def _waiting(self) -> np.ndarray:
        """Local groups in their env (STEPPING) or not taking actions (ACTION_READY: a stopped or starved process)."""
        state = self.loop.pool.control["state"][:self.loop.pool.num_local_groups]
        return (state == STEPPING) | (state == ACTION_READY)

    def _stuck_workers(self, now: float, over: float) -> str:
        """Workers with a group ``_waiting``, without a step, at every poll for ``over`` s (timed from the first
        poll that saw it so: polls may be far apart while the learner works)."""
        steps = self.loop.pool.control["group_steps"][:self.loop.pool.num_local_groups].copy()
        candidate = (steps == self._group_steps) & self._waiting()
        self._group_t[candidate & ~self._candidate] = now
        self._group_steps, self._candidate = steps, candidate
        return self._names(candidate & (now - self._group_t >= over))

    def _names(self, groups: np.ndarray) -> str:
        """"env worker(s) W (pid P), ..." for the workers of ``groups``; "" for none."""
        pool = self.loop.pool
        workers = sorted({pool.shape.worker_of(g) for g in np.flatnonzero(groups).tolist()})
        names = [f"{w} (pid {pool.procs[w].pid})" for w in workers if pool.procs[w] is not None]
        return f"env worker{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else ""

    def poll(self) -> None:
        if not self.enabled:
            return
        now, steps = time.monotonic(), self.loop.stats.env_steps
        if steps != self._steps:
            self._steps, self._t = steps, now
            stuck = self._stuck_workers(now, 3 * self.after)
            if stuck and now - self._said_one >= self.every:
                self._said_one = now
                print(f"seedlocal: {stuck} made no step for {3 * self.after:.0f} s while the others run (a hung env, "
                      "or a stopped process?)", flush=True)
            return
        stalled = now - self._t
        if stalled < self.after or now - self._said < self.every:
            return
        # No env of the run has stepped for ``after`` s, so a group waiting now has waited that long: its state
        # decides (the per-group counts _stuck_workers compares may be from a poll long before the stall).
        names = self._names(self._waiting())
        if names or not self._hosts_too:
            self._said = now
            where = (f"{names} still inside an env's step or reset, or not taking their actions" if names
                     else "no local env group is stepping")
            print(f"seedlocal: no env steps for {stalled:.0f} s: {where} (a hung env?); "
                  "the run stops at its time budget or on Ctrl-C", flush=True)


class InferenceThread(threading.Thread):
    """Serves the loop until ``stop``; an error is kept for the learner to raise."""

    def __init__(self, loop: InferenceLoop):
        super().__init__(name="inference", daemon=True)
        self.loop, self.error = loop, None

    def run(self) -> None:
        try:
            self.loop.run_until_stopped()
        except BaseException as e:  # surfaced in the learner thread by check()
            self.error = e

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.loop.request_stop()
        self.join(10)
