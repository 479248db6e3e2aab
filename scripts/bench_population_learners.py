"""A population of V-trace learners in one batched call against one call per member, alternated in one run.

Update (``--part update``): every member learns one batch of the MinAtar preset's shape (32 unrolls of 32 steps,
2 passes of 4 minibatches, clip 0.2) by P ``learner_step`` calls one after another, then by one
``population_learner_step`` over a ``MemberStack``; rounds alternate which goes first. Forward (``--part
forward``): ``--rows`` env rows per member through each member's own network (P calls) or ``MembersForward`` (one).
Prints one JSON line: the median seconds of each and their ratio (sequential / batched: above 1, batched wins).

    python scripts/bench_population_learners.py                          # P = 8 MinAtar torsos on this CPU
    python scripts/bench_population_learners.py --device cuda --members 16
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import tyro

from seedlocal.algos.member_stack import MemberStack
from seedlocal.algos.population_vtrace import population_learner_step
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.networks import ActorCritic
from seedlocal.policies.members import MembersForward
from seedlocal.spec import EnvSpec, TensorSpec


@dataclass
class Args:
    members: int = 8
    """P, the population's size"""
    device: str = "cpu"
    part: Literal["update", "forward", "both"] = "both"
    rounds: int = 3
    """timed rounds of each (after one untimed round of each)"""
    unrolls: int = 32
    """unrolls per member's batch (the MinAtar preset's 32)"""
    unroll_length: int = 32
    rows: int = 64
    """env rows per member in one forward batch (the MinAtar preset's 2 groups of 32)"""


SPEC = EnvSpec("MinAtar/Breakout-v1", "gymnasium", {"": TensorSpec((10, 10, 4), "bool")}, TensorSpec((), "int64"), 3,
               None, None, 1)
PARAMS = VTraceParams(batch_size=32, echo=2, minibatches=4, clip=0.2, normalize_advantages=True, learning_rate=1e-3,
                      lam=0.95, entropy_cost=0.01, max_grad_norm=0.5, separate_critic=False)


def _batch(a: Args, g: torch.Generator, device) -> dict:
    L, B = a.unroll_length + 1, a.unrolls
    out = {"obs": {"": torch.rand(L, B, 10, 10, 4, generator=g) > 0.8},
           "action": torch.randint(0, 3, (L, B), generator=g), "reward": torch.randn(L, B, generator=g),
           "terminated": torch.rand(L, B, generator=g) < 0.02, "ignored": torch.rand(L, B, generator=g) < 0.02,
           "behaviour_logits": torch.randn(L, B, 3, generator=g)}
    out = {k: ({f: t.to(device) for f, t in v.items()} if isinstance(v, dict) else v.to(device))
           for k, v in out.items()}
    return {**out, "core_state": None}


def _timed(fn, device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _alternate(a: Args, device, first, second) -> tuple[float, float]:
    """Median seconds of ``first`` and ``second``, one warm-up each, then rounds alternating which runs first."""
    _timed(first, device), _timed(second, device)
    times = ([], [])
    for r in range(a.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            times[i].append(_timed((first, second)[i], device))
    return float(np.median(times[0])), float(np.median(times[1]))


def bench_update(a: Args, device) -> dict:
    torch.manual_seed(0)
    seq = [ActorCritic(SPEC, encoder="minatar").to(device) for _ in range(a.members)]
    nets = [ActorCritic(SPEC, encoder="minatar").to(device) for _ in range(a.members)]
    params = [PARAMS] * a.members
    seq_opts = [make_optimizer(n.parameters(), PARAMS) for n in seq]
    opts = [make_optimizer(n.parameters(), PARAMS) for n in nets]
    stack = MemberStack(nets)
    g = torch.Generator().manual_seed(1)
    batches = [_batch(a, g, device) for _ in range(a.members)]
    gens = [torch.Generator().manual_seed(i) for i in range(a.members)]

    def sequential():
        for i in range(a.members):
            learner_step(seq[i], seq_opts[i], batches[i], params[i], shuffle=gens[i])

    def batched():
        population_learner_step(stack, opts, batches, params, shuffles=gens)

    s, b = _alternate(a, device, sequential, batched)
    return {"update_sequential_s": s, "update_batched_s": b, "update_sequential_over_batched": s / b}


def bench_forward(a: Args, device) -> dict:
    torch.manual_seed(0)
    nets = [ActorCritic(SPEC, encoder="minatar").to(device) for _ in range(a.members)]
    forward = MembersForward(MemberStack(nets))
    rows = np.repeat(np.arange(a.members), a.rows)
    obs = {"": (torch.rand(len(rows), 10, 10, 4) > 0.8).to(device)}

    @torch.inference_mode()
    def sequential():
        for m, net in enumerate(nets):
            net({"": obs[""][m * a.rows:(m + 1) * a.rows]})

    s, b = _alternate(a, device, sequential, lambda: forward(rows, obs))
    return {"forward_sequential_s": s, "forward_batched_s": b, "forward_sequential_over_batched": s / b}


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what Python's platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(a: Args) -> None:
    device = torch.device(a.device)
    out = {"members": a.members, "device": str(device), "threads": torch.get_num_threads(), "cpu": cpu_name()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    if a.part in ("update", "both"):
        out.update(bench_update(a, device))
    if a.part in ("forward", "both"):
        out.update(bench_forward(a, device))
    print(json.dumps(out))


if __name__ == "__main__":
    main(tyro.cli(Args))
