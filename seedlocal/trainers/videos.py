"""Videos while training (``--video-every-min M``): every M minutes an episode of the current policy, drawn with
eval's frames (``video.record``), as an animated GIF in ``<run>/videos/``, TensorBoard's ``videos/episode`` and W&B.
The learner's thread only copies the acting weights to the CPU; a thread of its own at nice 19 rebuilds the policy
(the family's ``from_checkpoint``, as ``seedlocal eval``), plays it with a generator of its own (training's random
stream stays as it was), encodes and writes. A video due while the last is being made is skipped. docs/tracking.md
says how, and what it costs.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from contextlib import AbstractContextManager, suppress
from typing import Callable

import torch

from seedlocal import video
from seedlocal.pipeline.policy import Acting

MAX_STEPS = 2000  # steps a video shows at most (eval's --video-max-steps default)
EPSILON = 0.001  # R2D2 acts epsilon-greedily with seedlocal eval's default epsilon
TAG = "videos/episode"


class _Stopped(Exception):
    """The run is ending: the episode being recorded is dropped."""


def on_cpu(state):
    """A copy of ``state`` (nested dicts of tensors: ``Trainer.acting_state``) whose tensors are on the CPU and no
    longer the learner's: it goes on updating its own while the copy is played."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: on_cpu(v) for k, v in state.items()}
    return state


def _lowest_priority() -> None:
    """This thread (and the threads it starts: envpool's) at nice 19; Linux sets priority per thread."""
    with suppress(OSError, AttributeError):  # another kernel: the video still plays, at the learner's priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    torch.set_num_threads(1)


class TrainingVideos(AbstractContextManager):
    """The run's videos, for ``run``: ``maybe`` from the learner's thread after each unit of learning;
    ``close`` (or leaving the ``with`` block) drops an episode being recorded and ends the thread."""

    def __init__(self, trainer, cfg, monitor, from_checkpoint: Callable):
        """Every ``cfg.video_every_min`` minutes (none at 0; rank 0's only), played by ``from_checkpoint``."""
        # What a checkpoint of the run holds besides the trainer's state.
        self.base = {"identity": trainer.identity(), "config": dataclasses.asdict(cfg)}
        self.every_s = (cfg.video_every_min if trainer.ranks.main else 0.0) * 60.0
        self.monitor, self.spec = monitor, trainer.spec
        self.from_checkpoint, self.seed = from_checkpoint, cfg.env.seed + 10_000
        self.made = 0
        self._due = time.monotonic() + self.every_s
        self._cond = threading.Condition()
        self._job: tuple | None = None  # handed over, and kept until its video is done
        self._stop = False
        self._thread = None
        if self.every_s > 0:
            self._thread = threading.Thread(target=self._serve, name="seedlocal-videos", daemon=True)
            self._thread.start()

    def maybe(self, now: float, trainer) -> None:
        """Hand the current policy to the video thread if a video is due and the last one is done."""
        if self._thread is None or now < self._due:
            return
        self._due = now + self.every_s
        with self._cond:
            if self._job is not None:
                return  # the last video is still being made: this one is skipped
        state = trainer.acting_state()
        if state is None:  # nothing to act with yet (a population before its first generation)
            return
        x = trainer.counters[trainer.x_axis]
        job = ({**self.base, **on_cpu(state), "path": f"{self.monitor.run_dir} at {trainer.x_axis} {x:,d}"},
               trainer.x_axis, x)
        with self._cond:
            self._job = job
            self._cond.notify_all()

    def _serve(self) -> None:
        _lowest_priority()
        while True:
            with self._cond:
                while self._job is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                job = self._job
            try:
                self._record(*job)
            except _Stopped:
                return
            except video.RenderUnavailable as e:
                print(f"seedlocal: no videos during training: {e}", flush=True)
                return
            except Exception as e:  # a video is not worth the run: say it once and go on without
                print(f"seedlocal: no more videos during training: one failed ({type(e).__name__}: {e})", flush=True)
                return
            finally:
                with self._cond:
                    self._job = None
                    self._cond.notify_all()

    def _record(self, state: dict, x_axis: str, x: int) -> None:
        policy = self.from_checkpoint(state, torch.device("cpu"), None, EPSILON)
        policy.generator = torch.Generator().manual_seed(self.seed + self.made)  # not training's global stream
        act = Acting(policy, 1)

        def acting(obs):
            if self._stop:
                raise _Stopped
            return act(obs)

        frames = video.record(acting, self.spec, self.seed + self.made, MAX_STEPS)
        gif, h, w = video.encode_gif(frames)
        path = self.monitor.run_dir / "videos" / f"{x_axis}_{x:012d}.gif"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(gif)
        self.monitor.image_summary(TAG, gif, h, w, x)
        if self.monitor.tracker is not None:
            self.monitor.tracker.video(TAG, path, x)
        self.made += 1

    def close(self, finish: bool = False) -> None:
        """End the thread: at once (the episode being recorded is dropped), or with ``finish`` once the video
        handed over last is written (a run that ends by its budget keeps the last video it asked for)."""
        if self._thread is None:
            return
        with self._cond:
            said = False
            while finish and self._job is not None and self._thread.is_alive():
                if not said:
                    print("seedlocal: finishing the last training video (its episode plays to its end)", flush=True)
                    said = True
                self._cond.wait(timeout=1.0)
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)  # an env step at most, then the encoding of the frames so far
        self._thread = None

    def __exit__(self, kind, exc, tb) -> None:
        """An error or Ctrl-C drops the video being made; a run's normal end finishes it."""
        self.close(finish=kind is None)
