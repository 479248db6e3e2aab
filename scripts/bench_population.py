"""Population inference: one batched call vs the naive ways, in one run.

For P networks (one env slot each) of which a fraction is still playing,
times a forward pass three ways and prints the ratios:

- work queue:   one vmap call over the active slots only
- python loop:  one forward per active member, in a Python loop
  (seedlocal's PopulationForward times both on its first batch and keeps
  the faster; see its docstring)
- all + mask:   one vmap call over every slot, finished ones masked afterwards

    python scripts/bench_population.py --population 256 --network mlp
    python scripts/bench_population.py --population 64 --network nature --device cuda
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch
import tyro

from seedlocal.config import EnvConfig, resolve_device, validate_env
from seedlocal.models import PolicyNet
from seedlocal.population import PopulationForward


@dataclass
class Args:
    population: int = 256
    """P: networks, one env slot each"""
    network: str = "mlp"
    """mlp (CartPole-v1) or nature (Pong-v5 observations)"""
    active: tuple[float, ...] = (1.0, 0.5, 0.1)
    """fractions of slots still playing (a generation's tail has few)"""
    repeats: int = 20
    """timed forward passes per measurement (median reported)"""
    device: str = "auto"
    """cpu, cuda, auto"""


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(a: Args) -> None:
    device = resolve_device(a.device)
    spec = validate_env(EnvConfig(id="CartPole-v1" if a.network == "mlp" else "Pong-v5"))
    template = PolicyNet(spec).to(device)
    fwd = PopulationForward(template, strategy="vmap")
    flats = torch.randn(a.population, fwd.size, device=device) * 0.05
    shape = spec.obs[""].shape
    obs = (torch.randint(0, 255, (a.population,) + shape, dtype=torch.uint8, device=device)
           if a.network == "nature" else torch.randn((a.population,) + shape, device=device))
    print(f"{a.network}: {fwd.size:,d} parameters per network, P={a.population}, device {device}")
    print(f"{'active':>7s} {'work queue ms':>14s} {'python loop ms':>15s} {'all+mask ms':>12s} "
          f"{'loop/queue':>11s} {'all/queue':>10s}")
    rows = []
    for frac in a.active:
        k = max(1, int(round(frac * a.population)))
        idx = torch.randperm(a.population, device=device)[:k]

        def queue():
            return fwd(flats, {"": obs[idx]}, idx)

        def loop():
            with torch.inference_mode():
                return fwd.loop(flats, {"": obs[idx]}, idx)

        def all_masked():
            out = fwd(flats, {"": obs})
            return out[idx]

        tq, tl, ta = (_time(f, a.repeats, device) for f in (queue, loop, all_masked))
        rows.append({"active": frac, "work_queue_ms": tq * 1e3, "python_loop_ms": tl * 1e3,
                     "all_masked_ms": ta * 1e3, "loop_over_queue": tl / tq, "all_over_queue": ta / tq})
        print(f"{frac:7.2f} {tq * 1e3:14.2f} {tl * 1e3:15.2f} {ta * 1e3:12.2f} {tl / tq:11.1f} {ta / tq:10.2f}")
    print(json.dumps({"network": a.network, "population": a.population, "device": str(device), "rows": rows}))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(tyro.cli(Args))
