"""Between R2D2's pipeline and its replay: finished unrolls in, batches out.

``ReplayFeeder`` takes each finished unroll into the replay (one stream per acting env; evaluation slots only report
returns), keeps the replay ratio (trained rows per acting step: while the learner is behind it takes no unrolls, so
actors park on full buffers instead of outrunning it), and turns replay samples into device batches
(``BatchStager``). A replay saved with a checkpoint goes through ``replay_to_checkpoint``.
"""

from __future__ import annotations

import queue
from collections import deque

import numpy as np
import torch

from seedlocal.dtypes import torch_dtype
from seedlocal.shm.rollout import obs_name
from seedlocal.trainers.replay import SequenceReplay


class ReplayFeeder:
    """``evaluating`` [envs] marks the evaluation slots; acting env i writes replay stream ``stream_of[i]``."""

    def __init__(self, replay: SequenceReplay, evaluating: np.ndarray, envs_per_group: int, unroll_length: int,
                 replay_ratio: float, batch_size: int, min_replay: int):
        self.replay, self.evaluating, self.E, self.T = replay, evaluating, envs_per_group, unroll_length
        self.stream_of = np.where(evaluating, -1, np.cumsum(~evaluating) - 1)
        self.ratio, self.batch_rows = replay_ratio, batch_size * unroll_length
        self.learn_from = max(min_replay, batch_size)
        self.added_steps = self.learned_rows = 0  # acting steps in, rows trained on (this session)
        self.episodes = 0  # acting envs' episodes since the trainer last took them
        self.recent_train: deque[float] = deque(maxlen=20)
        self.recent_eval: deque[float] = deque(maxlen=20)
        self._epochs: dict[int, int] = {}

    def behind(self) -> bool:
        """The learner owes updates: it learns instead of taking unrolls."""
        return self.replay.size >= self.learn_from and self.learned_rows < self.ratio * self.added_steps

    def owed_updates(self) -> int:
        """Updates the learner owes the replay ratio; none while the replay warms up (the actors step on)."""
        if self.replay.size < self.learn_from:
            return 0
        return int((self.ratio * self.added_steps - self.learned_rows) // self.batch_rows)

    def learned(self) -> None:
        self.learned_rows += self.batch_rows

    def take(self, loop, timeout: float) -> bool:
        """Ingest every finished unroll, waiting up to ``timeout`` for the first; False if none came."""
        try:
            b = loop.completed.get(timeout=timeout)
        except queue.Empty:
            return False
        while True:
            self.ingest(loop.store, b)
            loop.release(b)
            try:
                b = loop.completed.get_nowait()
            except queue.Empty:
                return True

    def ingest(self, store, b: int) -> None:
        """A finished unroll into the replay (acting envs) or the evaluation returns."""
        g, epoch = int(store["unroll_group"][b]), int(store["unroll_epoch"][b])
        T, replay = self.T, self.replay
        fresh = self._epochs.get(g) != epoch  # the group restarted: its streams break here
        self._epochs[g] = epoch
        done = store["terminated"][b, :T] | store["truncated"][b, :T]
        for e in range(self.E):
            env = g * self.E + e
            rets = store["ep_return"][b, np.flatnonzero(done[:, e]), e].tolist()
            if self.evaluating[env]:
                self.recent_eval.extend(rets)
                continue
            self.recent_train.extend(rets)
            self.episodes += len(rets)
            stream = int(self.stream_of[env])
            if fresh and replay.count[stream]:
                replay.cut(stream)
            replay.set_core(stream, int(replay.count[stream]), store["core_state"][b, e])
            replay.append(stream, {k: store[k][b, :T, e] for k in replay.fields})
            self.added_steps += T


class BatchStager:
    """Replay samples to learner batches on the device.

    On a CPU the sampled arrays are the batch. On CUDA each is copied into pinned memory (two sets, used in turn:
    the copy out of one may still be in flight while the next batch is written into the other) and goes to the
    device asynchronously; ``ahead`` tells the learner to sample the next batch while the current update runs. An
    update's priorities come back through a pinned buffer too, read only after the next batch is staged
    (``priorities_to_host`` then ``read``)."""

    def __init__(self, device: torch.device, obs_keys: list[str]):
        self.device, self.obs_keys = device, obs_keys
        self.ahead = device.type == "cuda"
        self._pinned: list[dict[str, torch.Tensor]] = [{}, {}]
        self._copied: list = [None, None]  # CUDA events: the last copy out of each set
        self._turn = 0
        # An update's priorities, and the event that says they arrived: made once. Each update's are read (and
        # copied by the replay) before the next update's are queued, so one buffer serves every update.
        self._prio: torch.Tensor | None = None
        self._prio_done = None

    def _host(self, name: str, arr: np.ndarray) -> torch.Tensor:
        arr = np.ascontiguousarray(arr)
        if not self.ahead:
            return torch.from_numpy(arr)
        pinned = self._pinned[self._turn]
        t = pinned.get(name)
        if t is None or t.shape != arr.shape or t.dtype != torch_dtype(arr.dtype):
            t = pinned[name] = torch.empty(arr.shape, dtype=torch_dtype(arr.dtype), pin_memory=True)
        t.numpy()[...] = arr
        return t

    def stage(self, sampled) -> tuple[dict, np.ndarray, np.ndarray, torch.Tensor]:
        """(batch on the device, slots, generations, importance weights) of ``replay.sample`` output."""
        rows, slots, gens, weights = sampled
        if self.ahead and self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()  # this set's last copy has left it
        t = {k: self._host(k, v).to(self.device, non_blocking=True) for k, v in rows.items()}
        w = self._host("__weights__", weights).to(self.device, non_blocking=True)
        if self.ahead:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
            self._turn ^= 1
        obs = {}
        for k in self.obs_keys:
            x = t.pop(k)
            if k == "obs" and x.dtype == torch.uint8 and x.dim() == 6:
                x = x.flatten(2, 3)  # [L, B, stack, C, H, W] -> [L, B, stack*C, H, W]
            obs[obs_name(k)] = x
        t["obs"] = obs
        t["core_state"] = t["core_state"].float()
        t["ignored_host"] = rows["ignored"]  # the learner's episode cuts, without asking the device
        return t, slots, gens, w

    def priorities_to_host(self, prio: torch.Tensor):
        if not self.ahead:
            return prio
        if self._prio is None or self._prio.shape != prio.shape or self._prio.dtype != prio.dtype:
            self._prio = torch.empty(prio.shape, dtype=prio.dtype, pin_memory=True)
            self._prio_done = torch.cuda.Event()
        self._prio.copy_(prio, non_blocking=True)
        self._prio_done.record()
        return self._prio, self._prio_done

    def read(self, prio) -> np.ndarray:
        if not self.ahead:
            return prio.numpy()
        out, done = prio
        done.synchronize()
        return out.numpy()


def replay_to_checkpoint(obj):
    """numpy inside a replay state -> tensors and plain types (checkpoints load with weights_only=True)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:  # lz4-compressed frames: bytes (None where nothing is stored yet)
            return {"__objects__": list(obj.shape), "items": obj.ravel().tolist()}
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k if not isinstance(k, tuple) else "__key__" + ",".join(map(str, k)): replay_to_checkpoint(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [replay_to_checkpoint(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def replay_from_checkpoint(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        if "__objects__" in obj:
            arr = np.empty(len(obj["items"]), object)
            arr[:] = obj["items"]
            return arr.reshape(obj["__objects__"])
        return {(tuple(int(x) for x in k[7:].split(",")) if isinstance(k, str) and k.startswith("__key__") else k):
                replay_from_checkpoint(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [replay_from_checkpoint(v) for v in obj]
    return obj
