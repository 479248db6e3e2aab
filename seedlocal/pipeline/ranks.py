"""Data-parallel learner ranks on one box, on torch.distributed (docs/distributed.md).

A run of G ranks is G copies of the single-process run: each rank has its own env workers, inference loop, learner
and share of the envs (its own env seeds), and they meet in collectives only where the update must be the same
everywhere:

* the parameters start equal (``broadcast_``, from rank 0);
* each update's gradients are averaged, weighted by each rank's valid rows (``average_gradients``), so that G
  half-batches give the whole batch's gradient, before clipping;
* statistics that shape the update are pooled: observation normalisation and the reward scaler
  (``pool_moments``), advantage normalisation (``masked_moments``);
* whether to stop is decided together once per update (``sum``), so that no rank stops alone and leaves the
  others waiting in a collective.

Scalars (the stop decision, pooled statistics, a population's scores) go over a CPU group (``scalar_group``);
NCCL carries only what lives on the GPU. ``Solo`` is the single-process run: every method returns its input and no
torch.distributed call is made. A peer that dies or hangs makes the next collective fail (at once for a closed
socket, after ``--dist-timeout-s`` for a silent peer): it becomes ``PeerLost``, one line naming the rank. ``launch``
is ``--learners G`` without torchrun: G copies of this command, each told its rank in torchrun's environment variables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from seedlocal.config.checks import usable_cores
from seedlocal.errors import ConfigError, WorkerDied
from seedlocal.normalize import merge_moments

LAUNCHED = "SEEDLOCAL_RANK_OF"  # set by ``launch`` in each rank's environment: the launcher's pid


class PeerLost(WorkerDied):
    """A collective failed: another rank died, hung past the timeout, or stopped."""


class Solo:
    """One learner: every collective is the identity."""

    rank, world, main = 0, 1, True

    def share(self, cfg):
        return cfg

    def broadcast_(self, module: torch.nn.Module) -> None:
        pass

    def average_gradients(self, params, weight) -> None:
        pass

    def masked_moments(self, x: torch.Tensor, valid: torch.Tensor):
        n = valid.sum().clamp(min=1)
        mean = torch.where(valid, x, 0.0).sum() / n
        return mean, (torch.where(valid, (x - mean) ** 2, 0.0).sum() / n).sqrt()

    def pool_moments(self, n: float, mean, var):
        return n, mean, var

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def part(self, n: int) -> range:
        """This rank's share of ``n`` things (a population's members, a member's episodes): contiguous, in rank
        order, sizes differing by one at most; some ranks get none when ``n`` < G."""
        return range(n * self.rank // self.world, n * (self.rank + 1) // self.world)

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values`` (any number each), in rank order."""
        return [list(values)]

    def close(self) -> None:
        pass


class Ranks(Solo):
    """This process's rank in a group of ``world`` (torch.distributed already initialised)."""

    def __init__(self, rank: int, world: int, local_rank: int, timeout_s: float, device: str = "cpu",
                 scalars=None):
        """``device``: where the gradients and the advantages' moments are reduced (NCCL's: cuda). ``scalars``:
        the process group of host numbers' collectives, on the CPU (``scalar_group``; None: the default, a CPU one)."""
        self.rank, self.world, self.local_rank, self.timeout_s = rank, world, local_rank, timeout_s
        self.main, self.device, self.scalars = rank == 0, torch.device(device), scalars
        self._flat: torch.Tensor | None = None  # the gradients' all-reduce buffer, kept from update to update

    def share(self, cfg):
        """This rank's config: learner threads left at 0 are cores / G, its own GPU (cuda:LOCAL_RANK, wrapping
        round the GPUs there are), its own bridge port (bridge.listen's + RANK). Its shape and its share of the
        batch are preparation's (``prepare.for_rank``); docs/distributed.md."""
        p, cores = cfg.pipeline, max(1, usable_cores() // self.world)
        device = p.device
        if device in ("auto", "cuda") and torch.cuda.is_available():
            device = f"cuda:{self.local_rank % torch.cuda.device_count()}"
        p = dataclasses.replace(p, device=device, learner_threads=p.learner_threads or cores)
        bridge = cfg.bridge
        if bridge.listen:
            host, _, port = bridge.listen.rpartition(":")
            if int(port):  # port 0 picks a free one on every rank
                bridge = dataclasses.replace(bridge, listen=f"{host}:{int(port) + self.rank}")
        return dataclasses.replace(cfg, pipeline=p, bridge=bridge)

    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except (RuntimeError, ValueError) as e:  # what gloo and NCCL raise for a closed socket or a timeout
            others = [r for r in range(self.world) if r != self.rank]
            who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {others}"
            reason = _first_sentence(str(e)) or type(e).__name__
            raise PeerLost(f"learner rank {self.rank}: {who} stopped answering in {what} (died, hung past "
                           f"--dist-timeout-s {self.timeout_s:g}, or stopped): {reason}") from None

    def broadcast_(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers (observation statistics) on every rank."""
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                self._call("the start (broadcast of the parameters)", dist.broadcast, t.data, 0)

    def average_gradients(self, params, weight) -> None:
        """Every rank's gradients, each weighted by ``weight`` (its valid rows), averaged: one all-reduce of one
        flat buffer of the gradients and the weight, reused while it fits (a Nature CNN's is 6.7 MB). With no valid
        row on any rank the gradients are zero, as one process's would be."""
        grads = [p.grad for p in params if p.grad is not None]
        n = sum(g.numel() for g in grads) + 1
        dtype, device = torch.promote_types(grads[0].dtype, torch.float32), grads[0].device
        if self._flat is None or (self._flat.numel(), self._flat.dtype, self._flat.device) != (n, dtype, device):
            self._flat = torch.empty(n, dtype=dtype, device=device)
        flat = self._flat
        parts = flat[:-1].split([g.numel() for g in grads])
        for g, part in zip(grads, parts):
            part.copy_(g.reshape(-1))
        flat[-1:].copy_(torch.as_tensor(weight, dtype=flat.dtype).reshape(1))
        flat[:-1].mul_(flat[-1])
        self._call("the gradient all-reduce", dist.all_reduce, flat)
        flat[:-1].div_(flat[-1].clamp(min=1))
        for g, part in zip(grads, parts):
            g.copy_(part.view_as(g))

    def masked_moments(self, x: torch.Tensor, valid: torch.Tensor):
        """Mean and (population) standard deviation of ``x`` over every rank's valid rows."""
        first = torch.stack([torch.where(valid, x, 0.0).sum(), valid.sum().to(x.dtype)])
        self._call("advantage normalisation", dist.all_reduce, first)
        n = first[1].clamp(min=1)
        mean = first[0] / n
        sq = torch.where(valid, (x - mean) ** 2, 0.0).sum()
        self._call("advantage normalisation", dist.all_reduce, sq)
        return mean, (sq / n).sqrt()

    def pool_moments(self, n: float, mean: torch.Tensor, var: torch.Tensor):
        """(count, mean, var) of every rank's rows, from each rank's (float64 vectors on the CPU): gathered
        and merged in rank order, so that every rank computes the same numbers."""
        k = len(mean)
        mine = torch.cat([torch.tensor([float(n)], dtype=torch.float64), mean.cpu(), var.cpu()])
        got = [torch.empty_like(mine) for _ in range(self.world)]
        self._call("the running statistics", dist.all_gather, got, mine, group=self.scalars)
        total, m, v = 0.0, mean, var
        for row in got:
            c, row_m, row_v = float(row[0]), row[1:1 + k], row[1 + k:]
            if c:
                total, m, v = (c, row_m, row_v) if total == 0 else merge_moments(total, m, v, c, row_m, row_v)
        return total, m, v

    def sum(self, values: list[float]) -> list[float]:
        """Every rank's ``values`` added, on the CPU group: the host never waits here for the GPU's queue."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        self._call("the stop decision", dist.all_reduce, t, group=self.scalars)
        return t.tolist()

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values`` (float64, any number each), in rank order: their lengths all-gathered, then
        the values padded to the longest."""
        n = torch.tensor([len(values)], dtype=torch.int64)
        sizes = [torch.empty_like(n) for _ in range(self.world)]
        self._call("the population's fitness", dist.all_gather, sizes, n, group=self.scalars)
        sizes = [int(s) for s in sizes]
        mine = torch.zeros(max(1, *sizes), dtype=torch.float64)  # no empty all-gather
        mine[:len(values)] = torch.tensor([float(v) for v in values], dtype=torch.float64)
        got = [torch.empty_like(mine) for _ in range(self.world)]
        self._call("the population's fitness", dist.all_gather, got, mine, group=self.scalars)
        return [g[:k].tolist() for g, k in zip(got, sizes)]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _first_sentence(text: str) -> str:
    """gloo's message without its source location: "[.../pair.cc:553] Connection closed by peer [addr]:port. ..."."""
    text = text.strip().splitlines()[0] if text.strip() else ""
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0][:200]


def from_environment() -> tuple[int, int, int] | None:
    """(rank, world, local rank) from torchrun's (or ``launch``'s) environment variables, or None for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def join(cfg, device_kind: str = "cpu") -> Solo:
    """This process's place among the learner ranks: ``Solo()`` for one process (no torch.distributed call), else
    a ``Ranks`` in the group, gloo on CPUs and NCCL on GPUs (gloo with fewer GPUs than ranks: NCCL takes one each)."""
    found = from_environment()
    if found is None:
        if cfg.learners > 1:
            raise ConfigError(f"learners={cfg.learners}: this process was not started as a rank (by seedlocal "
                              "itself or torchrun)")
        return Solo()
    rank, world, local_rank = found
    if launched := os.environ.get(LAUNCHED):
        # Started by ``launch``: SIGTERM (a clean stop: checkpoint, segments) when the launcher dies, even by SIGKILL (a
        # notebook's kernel restarted), rather than train on unwatched to its budget; if it is gone already, stop here.
        from seedlocal.pipeline.worker import die_with_parent

        launcher = int(launched)
        if die_with_parent() and os.getppid() != launcher:  # (not on Linux: no such guard)
            raise PeerLost(f"learner rank {rank}: its launcher (pid {launcher}) is gone; not starting")
    if cfg.learners > 1 and cfg.learners != world:
        raise ConfigError(f"learners={cfg.learners}: torchrun started {world} ranks (WORLD_SIZE); give "
                          f"--learners {world} or leave it out")
    cuda = device_kind == "cuda"
    backend = "nccl" if cuda and torch.cuda.device_count() >= world else "gloo"
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    timeout = timedelta(seconds=cfg.dist_timeout_s)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return Ranks(rank, world, local_rank, cfg.dist_timeout_s, "cuda" if backend == "nccl" else "cpu",
                 scalars=scalar_group(backend, timeout))


def scalar_group(backend: str, timeout: timedelta):
    """The process group for the collectives of host numbers (``Ranks.sum``, ``gather``, ``pool_moments``):
    beside NCCL, a gloo group of the same ranks, so that reading them back never waits for the GPU's queue
    (docs/distributed.md, "Backends"). None (the default group) when that is gloo already."""
    return dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], world: int, timeout_s: float, command: list[str] | None = None,
           interrupt_ranks: bool = False) -> int:
    """Run ``seedlocal <argv>`` (or ``command`` + ``argv``) as ``world`` ranks on this box and wait for them. A rank
    that ends with an error or a signal is named in one line; the others get 2 x ``timeout_s`` to end by themselves
    before they are stopped (SIGTERM, then SIGKILL). On Ctrl-C the ranks got the terminal's SIGINT too; with
    ``interrupt_ranks`` (``seedlocal.train``: a notebook's interrupt reaches this process alone) they are sent
    SIGTERM here. Returns the exit status (130 after Ctrl-C)."""
    # A killed rank's segments are unlinked by its resource tracker, which would also say so in two warnings:
    # the launcher's one line names the rank instead.
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS", ""), "ignore:resource_tracker:UserWarning"]))
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           LAUNCHED: str(os.getpid()), "PYTHONWARNINGS": warnings}
    command = command or [sys.executable, "-m", "seedlocal"]
    procs = [subprocess.Popen([*command, *argv], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(world)]
    deadline, status = None, 0
    try:
        while any(p.returncode is None for p in procs):
            for r, p in enumerate(procs):
                if p.returncode is not None:
                    continue
                try:
                    rc = p.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                if rc < 0:  # a rank that fails names itself; one killed cannot (whichever of them ended first)
                    print(f"seedlocal: learner rank {r} (pid {p.pid}) was killed by {_signal_name(-rc)}; the other "
                          "ranks stop", file=sys.stderr, flush=True)
                if rc != 0 and deadline is None:
                    deadline = time.monotonic() + 2 * timeout_s
                    status = 1 if rc < 0 else rc
            if deadline is not None and time.monotonic() > deadline:
                break
    except KeyboardInterrupt:  # every rank got the terminal's SIGINT too: they save and stop by themselves
        status = 130
        for p in procs:
            if interrupt_ranks and p.poll() is None:
                p.terminate()
        end = time.monotonic() + 2 * timeout_s
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C ends the wait
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, end - time.monotonic()))
    finally:
        _stop(procs)
    return status


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stop(procs: list) -> None:
    """Ranks still running after their time: SIGTERM (a clean stop: checkpoint, segments unlinked), then SIGKILL."""
    left = [p for p in procs if p.poll() is None]
    for p in left:
        print(f"seedlocal: stopping learner rank {procs.index(p)} (pid {p.pid}), still running", file=sys.stderr,
              flush=True)
        p.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)  # a stopped rank (SIGSTOP, a debugger) takes its SIGTERM now
    for p in left:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
