"""A population's shared observation statistics: gathered while it plays, taken into use between generations.

Every member of a population normalises its observations by the same statistics (ARS's V2, Mania et al. 2018),
whatever member saw them: gathered by the inference thread (``see``), merged into the template's ``obs_norm`` by the
learner thread between generations (``commit``; on CUDA a CUDA event hands the rows over between their streams), and
copied by every job submitted after that (``PopulationForward.stats_of``).
"""

from __future__ import annotations

import threading
from typing import Callable

import torch
from torch import nn

from seedlocal.normalize import RunningNorm, merge_moments

OBS_STATS_EVERY = 4  # with shared observation statistics: every this many batches adds its rows


class PopulationNorm:
    """Observations seen since the last commit (``size`` features each), and the commit."""

    def __init__(self, size: int, device: torch.device):
        self.size, self.device = size, device
        # A RunningNorm made, written and (through ``_written``, a CUDA event) handed over by the inference thread.
        self._seen = self._written = None
        self._lock = threading.Lock()
        self._batches = 0

    def see(self, rows: Callable[[], torch.Tensor]) -> None:
        """One batch served (inference thread): every ``OBS_STATS_EVERY``-th adds its rows (``rows()``, [n,
        size], made only then)."""
        self._batches += 1
        if self._batches % OBS_STATS_EVERY:
            return
        with self._lock:
            if self._seen is None:  # made here, on this thread's stream, as its updates are
                self._seen = RunningNorm(self.size).to(self.device)
                self._written = torch.cuda.Event() if self._seen.count.is_cuda else None
            self._seen.update(rows())
            if self._written is not None:  # what commit waits for before it reads
                self._written.record(torch.cuda.current_stream(self.device))

    def commit(self, template: nn.Module, pool: Callable | None = None) -> None:
        """Take the observations gathered since the last commit into ``template.obs_norm``, the statistics
        that jobs submitted from now on normalise by (a new module swapped in whole: the one a checkpoint or a
        submission holds is never written again). ``pool``: data-parallel ranks' ``pool_moments``, which merges
        every rank's observations, so that every rank's jobs normalise by the same statistics."""
        with self._lock:
            seen, written = self._seen, self._written
            self._seen = self._written = None
        if seen is not None and written is not None:
            # The inference stream wrote ``seen``; this (the learner's) stream reads it only after that write, and
            # the allocator reuses its memory only after these reads.
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(written)
            for t in seen.buffers():
                t.record_stream(stream)
        if pool is not None:  # every rank's observations, merged in rank order: on every rank at every commit
            mine = seen if seen is not None else RunningNorm(self.size)  # none of its own: count 0, mean 0, var 1
            n, mean, var = pool(float(mine.count), mine.mean.cpu(), mine.var.cpu())
            seen = self._holding(n, mean, var) if n else None
        if seen is None or float(seen.count) == 0:
            return
        current = template.obs_norm
        if float(current.count) == 0:
            moments = float(seen.count), seen.mean, seen.var
        else:
            moments = merge_moments(float(current.count), current.mean, current.var, float(seen.count), seen.mean,
                                    seen.var)
        template.obs_norm = self._holding(*moments, current.clip, current.eps)

    def _holding(self, count: float, mean: torch.Tensor, var: torch.Tensor, *clip_eps: float) -> RunningNorm:
        """A new RunningNorm of ``size`` features holding these moments (``clip_eps``: RunningNorm's defaults)."""
        norm = RunningNorm(self.size, *clip_eps).to(self.device)
        norm.count.fill_(count)
        norm.mean.copy_(mean)
        norm.var.copy_(var)
        return norm
