"""CUDA plumbing of the inference loop, for a learner and an inference thread in one process on one device: how it
shares the learner's weights (``WeightLock``) and replays its forward passes (``GraphedStep``). docs/pipeline.md,
"Inference beside the learner on one GPU", has the why of both.
"""

from __future__ import annotations

import contextlib
import threading

import torch


class WeightLock:
    """A lock, plus CUDA events, between the optimiser's writes of the learner's weights and the inference thread's
    reads of them in place (SEED's way, DESIGN decision 4): the learner wraps each ``optimizer.step()`` in ``with
    lock:``, the inference thread each forward in ``with lock.reading():``. On CUDA, where the inference thread has
    its own stream, a read first waits for the event recorded after the last write, and a write for the last read's."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._lock = threading.Lock()
        self._wrote = self._read = None  # CUDA events (recorded only on CUDA)

    def _after(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def __enter__(self) -> WeightLock:
        self._lock.acquire()
        self._after(self._read)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.cuda:
                self._wrote = torch.cuda.current_stream(self.device).record_event()  # this thread's stream
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def reading(self):
        with self._lock:
            self._after(self._wrote)
            yield
            if self.cuda:
                self._read = torch.cuda.current_stream(self.device).record_event()


class GraphedStep:
    """``step(obs, core)`` (a network's one-step forward) replayed from CUDA graphs, one per batch size rounded up to
    a power of two, in one memory pool; ``capture`` takes every size a run will serve before the learner starts, an
    unannounced one is captured when it comes. Inputs are copied into static buffers (pad rows' outputs dropped),
    outputs cloned out (the caller may keep them); parameters are read where they live (docs/pipeline.md)."""

    def __init__(self, step, device: torch.device):
        self.step, self.device = step, torch.device(device)  # a CUDA one: checks.validate_pipeline refuses others
        self.graphs: dict[int, tuple] = {}
        self.pool = None

    @staticmethod
    def bucket(n: int) -> int:
        return 1 << max(0, n - 1).bit_length()

    def capture(self, sizes, obs: dict[str, torch.Tensor], core: torch.Tensor | None = None) -> None:
        """Capture the graph of every bucket that batches of ``sizes`` rows fall in and has none yet; ``obs`` and
        ``core`` give each input's row shape and dtype."""
        for size in sorted({self.bucket(int(n)) for n in sizes} - self.graphs.keys()):
            self._capture(size, obs, core)

    def _capture(self, size: int, obs: dict[str, torch.Tensor], core):
        # On the configured device (cuda:1 too): torch.cuda.graph's capture stream belongs to the current one.
        with torch.cuda.device(self.device):
            static_obs = {k: v.new_zeros((size,) + v.shape[1:], device=self.device) for k, v in obs.items()}
            static_core = None if core is None else core.new_zeros((size,) + core.shape[1:], device=self.device)
            # Warm-up off the capturing stream (lazy initialisation, cuDNN's algorithm choice), as torch asks.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.step(static_obs, static_core)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a learner thread may be launching work while this one captures.
            with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(self.device),
                                  capture_error_mode="thread_local"):
                out = self.step(static_obs, static_core)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[size] = (graph, static_obs, static_core, out)

    def __call__(self, obs: dict[str, torch.Tensor], core=None):
        n = next(iter(obs.values())).shape[0]
        size = self.bucket(n)
        if size not in self.graphs:  # a size that came unannounced
            self._capture(size, obs, core)
        graph, static_obs, static_core, out = self.graphs[size]
        for k, v in obs.items():
            static_obs[k][:n].copy_(v)
        if core is not None:
            static_core[:n].copy_(core)
        graph.replay()
        return tuple(None if o is None else o[:n].clone() for o in out)
