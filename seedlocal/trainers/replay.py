"""Prioritized sequence replay that stores each step once (R2D2; the design: docs/r2d2.md, "How it runs").

Each env has one *stream*: a ring of its steps in the order they happened, each stored once (for Atari a single
84x84 frame; the stack is rebuilt at sampling time). A sequence is an index range over a stream, starting every
``stride`` steps, ``length`` = burn_in + unroll + 1 rows long, with the recurrent state the actor had at its
start: overlapping sequences share their rows. Priorities live in a float64 sum tree over sequence slots; a new
sequence enters at the largest priority of the last ``PRIORITY_WINDOW`` updates, and each slot's generation
stamp drops a priority computed for a sequence overwritten since it was sampled. With ``compress`` frames are
stored lz4-compressed one by one (its decompression runs at GB/s).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from seedlocal.shm.rollout import obs_key
from seedlocal.spec import episode_starts

PRIORITY_WINDOW = 100  # learner updates whose largest priority a new sequence enters at
# What a replay's checkpoint holds as plain arrays (state_dict), besides its data, tree and queues.
_ARRAYS = ("ep_start", "count", "cur_ep", "after_ignored", "core", "slot_env", "slot_start", "slot_gen", "next_start")


class SumTree:
    """Non-negative priorities of ``capacity`` items; batched update and sampling."""

    def __init__(self, capacity: int):
        self.depth = (max(1, capacity) - 1).bit_length()  # levels below the root
        self.leaves = 1 << self.depth
        self.tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(idx) + self.leaves]

    def update(self, idx: np.ndarray, priority: np.ndarray) -> None:
        pos = np.asarray(idx, np.int64) + self.leaves
        self.tree[pos] = priority
        for _ in range(self.depth):  # each level up to the root
            pos = np.unique(pos >> 1)
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaves whose cumulative-priority interval holds each value of ``mass`` (in [0, total))."""
        mass = np.array(mass, np.float64)
        pos = np.ones(len(mass), np.int64)
        for _ in range(self.depth):
            left = self.tree[2 * pos]
            right = mass >= left
            mass = np.where(right, mass - left, mass)
            pos = 2 * pos + right
        leaf = pos - self.leaves
        # Rounding can land on an empty leaf at an interval's edge: step back to a filled one.
        empty = self.tree[pos] <= 0
        if empty.any():
            filled = np.flatnonzero(self.tree[self.leaves:] > 0)
            leaf[empty] = filled[np.clip(np.searchsorted(filled, leaf[empty]) - 1, 0, len(filled) - 1)]
        return leaf

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` leaves by stratified sampling proportional to priority."""
        total = self.total
        if total <= 0:
            raise ValueError("sampling from an empty sum tree")
        mass = (np.arange(n) + rng.random(n)) * (total / n)
        return self.find(np.minimum(mass, np.nextafter(total, 0)))


class SequenceReplay:
    """Per-env step streams, prioritized sequences over them (see module docstring).

    ``fields`` maps a per-step field name to (shape, dtype); a lone observation's (``obs``) is stacked ``stack``
    deep at sampling time. Steps arrive per env with ``append``; a sequence slot exists for
    every ``stride``-aligned start whose ``length`` rows are complete."""

    def __init__(self, num_envs: int, sequences: int, length: int, stride: int,
                 fields: dict[str, tuple[tuple[int, ...], str]], core_shape: tuple[int, ...],
                 stack: int = 1, alpha: float = 0.9, compress: bool = False, seed: int = 0):
        self.length, self.stride, self.capacity, self.fields = length, stride, sequences, fields
        self.frame, self.stack, self.alpha, self.compress = obs_key(""), max(1, stack), alpha, compress
        # Room for every live sequence of an env plus the one being filled and the frames stacked before it.
        self.cap = max(1, -(-sequences // num_envs)) * stride + length + self.stack
        self.data = {name: np.empty((num_envs, self.cap), object) if compress and name == self.frame
                     else np.zeros((num_envs, self.cap) + tuple(shape), dtype)
                     for name, (shape, dtype) in fields.items()}
        # Where each step's episode began (absolute step number), for stacking within an episode.
        self.ep_start = np.zeros((num_envs, self.cap), np.int64)
        self.count = np.zeros(num_envs, np.int64)  # steps written per env (absolute write position)
        self.cur_ep = np.zeros(num_envs, np.int64)
        self.after_ignored = np.ones(num_envs, bool)
        self.core = np.zeros((self.capacity,) + tuple(core_shape), np.float32)
        self.pending_core: dict[tuple[int, int], np.ndarray] = {}
        self.tree = SumTree(self.capacity)
        self.slot_env, self.slot_start, self.slot_gen = (np.zeros(self.capacity, np.int64) for _ in range(3))
        self.free = deque(range(self.capacity))
        self.live: list[deque] = [deque() for _ in range(num_envs)]  # (start, slot) per env, oldest first
        self.next_start = np.zeros(num_envs, np.int64)
        self.recent_max: deque[float] = deque(maxlen=PRIORITY_WINDOW)  # per update, newest last
        self.rng = np.random.default_rng(seed)
        self.added = 0  # sequences ever added

    @property
    def max_priority(self) -> float:
        """What a new sequence enters at (1 before the first update)."""
        return max(self.recent_max) if self.recent_max else 1.0

    # -- saving -----------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to continue sampling where this replay stood (for --checkpoint-replay)."""
        return {**{k: getattr(self, k) for k in _ARRAYS}, "data": self.data, "tree": self.tree.tree,
                "free": list(self.free), "live": [list(d) for d in self.live], "pending_core": dict(self.pending_core),
                "recent_max": list(self.recent_max), "added": self.added, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict`` saved by a replay of the same geometry (else ValueError)."""
        for name, arr in state["data"].items():
            if name not in self.data or arr.shape != self.data[name].shape or arr.dtype != self.data[name].dtype:
                raise ValueError(f"the saved replay's {name!r} has shape {getattr(arr, 'shape', None)}, this run's "
                                 f"{self.data[name].shape if name in self.data else 'has no such field'}")
        if state["tree"].shape != self.tree.tree.shape:
            raise ValueError("the saved replay holds a different number of sequences")
        for k in _ARRAYS:
            setattr(self, k, state[k])
        self.data, self.tree.tree = dict(state["data"]), state["tree"]
        self.free = deque(state["free"])
        self.live = [deque(map(tuple, d)) for d in state["live"]]
        self.pending_core = dict(state["pending_core"])
        # Replays saved before the window kept one all-time maximum.
        self.recent_max = deque(state.get("recent_max", [state.get("max_priority", 1.0)]), maxlen=PRIORITY_WINDOW)
        self.added = state["added"]
        self.rng.bit_generator.state = state["rng"]

    # -- writing ----------------------------------------------------------------

    def cut(self, env: int) -> None:
        """The env's stream breaks (a restarted worker, a lost host): start sequences afresh."""
        start = -(-int(self.count[env]) // self.stride) * self.stride
        self.count[env] = self.next_start[env] = start
        self.after_ignored[env] = True
        # States kept for sequences that will now never complete would stay (and be checkpointed) for ever.
        self.pending_core = {k: v for k, v in self.pending_core.items() if k[0] != env}

    def set_core(self, env: int, step: int, core: np.ndarray) -> None:
        """The recurrent state the actor had before absolute step ``step`` of ``env``."""
        if step % self.stride == 0:
            self.pending_core[(env, step)] = np.array(core, np.float32)

    def append(self, env: int, rows: dict[str, np.ndarray]) -> None:
        """Steps of one env, in order: each of the replay's fields [n, ...] (``ignored`` marks auto-reset rows)."""
        n = len(rows["ignored"])  # an unroll's algo.unroll_length >= 1
        steps = self.count[env] + np.arange(n)  # absolute
        pos = steps % self.cap
        # Evict sequences whose rows (or the frames stacked before them) these steps overwrite.
        oldest_kept = self.count[env] + n - self.cap
        live = self.live[env]
        while live and live[0][0] - (self.stack - 1) < oldest_kept:
            _, slot = live.popleft()
            self.tree.update(np.array([slot]), np.array([0.0]))
            self.slot_gen[slot] += 1  # a priority computed for the sequence it held is dropped
            self.free.append(slot)
        for name, values in rows.items():
            if self.compress and name == self.frame:
                import lz4.block

                col = self.data[name]
                for i, p in enumerate(pos.tolist()):
                    col[env, p] = lz4.block.compress(np.ascontiguousarray(values[i]).tobytes(), store_size=False)
            else:
                self.data[name][env, pos] = values
        ign = np.asarray(rows["ignored"], bool)
        first = episode_starts(ign, before=self.after_ignored[env])
        # Each row's episode began at the latest start at or before it (or where the last append's did).
        latest = np.maximum.accumulate(np.where(first, np.arange(n), -1))
        self.ep_start[env, pos] = np.where(latest >= 0, steps[np.maximum(latest, 0)], self.cur_ep[env])
        self.cur_ep[env] = self.ep_start[env, pos[-1]]
        self.after_ignored[env] = ign[-1]
        self.count[env] += n
        while self.next_start[env] + self.length <= self.count[env]:
            self._add_sequence(env, int(self.next_start[env]))
            self.next_start[env] += self.stride

    def _add_sequence(self, env: int, start: int) -> None:
        core = self.pending_core.pop((env, start), None)
        # Skipped: a start without its recurrent state (e.g. the stream was cut), or with no free slot.
        if core is None or not self.free:
            return
        slot = self.free.popleft()
        self.slot_env[slot], self.slot_start[slot] = env, start
        self.slot_gen[slot] += 1
        self.core[slot] = core
        self.tree.update(np.array([slot]), np.array([self.max_priority ** self.alpha]))
        self.live[env].append((start, slot))
        self.added += 1

    # -- reading ----------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.capacity - len(self.free)

    def sample(self, batch: int, beta: float) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """(rows [L, B, ...] per field, slots, generations, importance weights)."""
        slots = self.tree.sample(batch, self.rng)
        probs = self.tree.get(slots) / self.tree.total
        weights = (self.size * probs) ** (-beta)
        weights = (weights / weights.max()).astype(np.float32)
        env = self.slot_env[slots]
        steps = self.slot_start[slots][None, :] + np.arange(self.length)[:, None]  # [L, B] absolute
        pos = steps % self.cap
        out = {name: self._stacked(env, steps) if name == self.frame else self.data[name][env[None, :], pos]
               for name in self.fields}
        out["core_state"] = self.core[slots]
        return out, slots, self.slot_gen[slots].copy(), weights

    def _frames(self, env: np.ndarray, pos: np.ndarray) -> np.ndarray:
        col = self.data[self.frame]
        if not self.compress:
            return col[env, pos]
        import lz4.block

        shape, dtype = self.fields[self.frame]
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        flat = [np.frombuffer(lz4.block.decompress(b, uncompressed_size=size), dtype).reshape(shape)
                for b in col[env.ravel(), pos.ravel()]]
        return np.stack(flat).reshape(pos.shape + tuple(shape))

    def _stacked(self, env: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """[L, B, stack, *frame]: frames t-stack+1 .. t of each row, repeating an episode's first frame."""
        e2 = np.broadcast_to(env[None, :], steps.shape)
        if self.stack == 1:
            return self._frames(e2, steps % self.cap)
        first = self.ep_start[e2, steps % self.cap]
        lags = steps[..., None] - np.arange(self.stack - 1, -1, -1)  # oldest first, as envpool stacks
        lags = np.maximum(lags, first[..., None])
        e3 = np.broadcast_to(env[None, :, None], lags.shape)
        uniq, inverse = np.unique(e3 * self.cap + lags % self.cap, return_inverse=True)
        frames = self._frames(uniq // self.cap, uniq % self.cap)
        return frames[inverse.reshape(lags.shape)]

    def update_priorities(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> int:
        """Apply new priorities where the slot still holds the sampled sequence; returns how many."""
        keep = self.slot_gen[slots] == gens
        if keep.any():
            p = np.maximum(np.asarray(priorities, np.float64)[keep], 1e-6)
            self.recent_max.append(float(p.max()))
            self.tree.update(slots[keep], p ** self.alpha)
        return int(keep.sum())

    def nbytes(self) -> int:
        """Bytes held, every field included (compressed frames at their compressed size)."""
        data = sum(sum(len(b) for b in arr.ravel() if b is not None) + arr.size * 8 if arr.dtype == object
                   else arr.nbytes for arr in self.data.values())
        return self.ep_start.nbytes + self.tree.tree.nbytes + 4 * self.slot_env.nbytes + data + self.core.nbytes
