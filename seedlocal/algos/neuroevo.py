"""Shared pieces of the neuroevolution algorithms (GA, ES, ARS, random search), and their common conventions.

References: F. P. Such et al., 2017, "Deep Neuroevolution: Genetic Algorithms Are a Competitive Alternative for Training
Deep Neural Networks for Reinforcement Learning", arXiv:1712.06567; T. Salimans et al., 2017, "Evolution Strategies as a
Scalable Alternative to Reinforcement Learning", arXiv:1703.03864.

Conventions:
  * A parameter vector is a flat float32 CPU tensor in ``parameters()`` order.
  * Everything random is named by an int seed, so a vector can be rebuilt from a few seeds anywhere (the workers of both
    papers ship seeds, not weights).
  * Perturbations are slices of one block of Gaussian noise (the *noise table*, ``noise``) drawn once from a fixed
    seed, as in both papers' code: a seed names an offset, so a perturbation costs a slice, not a generator call.
  * The algorithms keep no generator state: the draws of generation g come from ``generation_rng(seed, g)``, so a state
    (a ``Generation``) is resumable, and ``dataclasses.asdict`` of it loads with ``torch.load(weights_only=True)``.
    ``ask`` draws nothing into it: asking twice gives the same seeds.
  * Fitness is higher-is-better; NaN counts as the worst (``nan_to_worst``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

from seedlocal.errors import fail


class ParamSpace:
    """The parameters of a template module, seen as one flat vector."""

    def __init__(self, template: nn.Module):
        # Our own CPU float32 copy: init() must not depend on where (or in which dtype) the caller keeps its module.
        self.template = copy.deepcopy(template).cpu().float()
        self.size = sum(p.numel() for p in self.template.parameters())

    def init(self, seed: int) -> Tensor:
        """Freshly initialised parameters, a pure function of ``seed``."""
        module = copy.deepcopy(self.template)
        with torch.random.fork_rng(devices=[]):
            # CPU only: torch.manual_seed would also reseed CUDA, which fork_rng(devices=[]) does not restore.
            torch.default_generator.manual_seed(seed)
            for m in module.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        return parameters_to_vector(module.parameters()).detach().clone()

    def stack(self, flats: list[Tensor]) -> Tensor:
        """[P, size] matrix of P parameter vectors (P = 0 too: a rank with no member of a small population)."""
        return torch.stack([f.reshape(self.size) for f in flats]) if flats else torch.empty(0, self.size)


NOISE_TABLE_SEED = 0x5EED
MIN_NOISE_TABLE = 1 << 22  # 16 MiB of float32


def noise_table_length(size: int) -> int:
    """The noise table's length for ``size`` parameters: a power of two, at least 4 Mi floats and 8 x ``size``."""
    return max(MIN_NOISE_TABLE, 1 << (8 * size - 1).bit_length())


@functools.lru_cache(maxsize=4)
def noise_table(length: int) -> Tensor:
    """The standard normal float32 noise table, drawn once per process from a fixed seed: the same everywhere."""
    return torch.randn(length, generator=torch.Generator().manual_seed(NOISE_TABLE_SEED), dtype=torch.float32)


def noise(seed: int, size: int) -> Tensor:
    """Standard normal float32 vector named by ``seed``: the table slice at offset ``seed mod (length - size + 1)``. Two
    seeds' vectors are independent unless their offsets coincide (a shifted slice shares no position's draw). A view
    into the shared table: add it to something, never write to it."""
    table = noise_table(noise_table_length(size))
    offset = seed % (table.numel() - size + 1)
    return table[offset:offset + size]


def antithetic(theta: Tensor, seeds: list[int], scale: float) -> Tensor:
    """[2 len(seeds), size]: theta + scale * noise(s), then theta - scale * noise(s), for each seed in turn."""
    steps = [scale * noise(s, theta.numel()) for s in seeds]
    return torch.stack([row for step in steps for row in (theta + step, theta - step)])


def noise_sum(weights: list[float], seeds: list[int], size: int) -> Tensor:
    """sum_i weights[i] * noise(seeds[i], size), one seed at a time: memory stays O(size), however many seeds."""
    g = torch.zeros(size, dtype=torch.float32)
    for w, s in zip(weights, seeds):
        g.add_(noise(s, size), alpha=w)
    return g


def centered_ranks(x: Tensor) -> Tensor:
    """Ranks of the 1-D ``x`` mapped linearly onto [-0.5, 0.5] (Salimans et al.), so the transform ignores the scale of
    the fitness and outliers. Tied values share the mean of the ranks they span: games with small integer scores
    (MinAtar, Atari early on) tie most of a population, and ranking ties by position would turn each tied antithetic
    pair into a step along its own noise. NaN counts as the worst value."""
    x = nan_to_worst(x.detach())
    n = x.numel()
    if n <= 1:
        return torch.zeros(n, dtype=torch.float32)
    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    ranks = (first + (counts - 1) / 2).to(torch.float64)[inverse]
    return (ranks / (n - 1) - 0.5).to(torch.float32)


def new_seeds(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` fresh seeds in [0, 2**31), as Python ints (picklable, any framework)."""
    return [int(s) for s in rng.integers(0, 2**31, size=n)]


def generation_rng(seed: int, generation: int) -> np.random.Generator:
    """The generator for the draws of one generation of a run. A fixed-length key keeps streams apart: SeedSequence
    pads short entropy with zeros, so [seed] and [seed, 0] would collide."""
    return np.random.default_rng([seed, generation])


def require(ok: bool, p, name: str, rule: str) -> None:
    """A ``validate`` rule: refuse ``p.<name>`` unless ``ok``, written as what must hold (``x > 0``: NaN fails)."""
    if not ok:
        fail(f"algo.{name}", getattr(p, name), rule)


@dataclasses.dataclass(frozen=True, eq=False)
class Generation:
    """The fields every algorithm's state starts with; the state classes add their own."""

    generation: int
    """generations completed"""
    rng: dict
    """{"seed": int}: the run's base seed"""

    def seeds(self, n: int) -> list[int]:
        """``n`` fresh seeds from this generation's ``generation_rng``."""
        return new_seeds(generation_rng(self.rng["seed"], self.generation), n)

    def next(self, **fields):
        """The next generation's state: this one with ``fields`` replaced."""
        return dataclasses.replace(self, generation=self.generation + 1, **fields)


def nan_to_worst(values: Tensor) -> Tensor:
    """float64 copy with NaN as -inf, so a diverged evaluation is never selected."""
    x = torch.as_tensor(values, dtype=torch.float64).cpu().reshape(-1)
    # Not nan_to_num: it would also clamp +-inf to finite values.
    return torch.where(torch.isnan(x), torch.full_like(x, -float("inf")), x)
