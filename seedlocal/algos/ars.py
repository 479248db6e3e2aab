"""Augmented Random Search: random directions, the best of them, a step.

Reference: H. Mania, A. Guy and B. Recht, 2018, "Simple random search
provides a competitive approach to reinforcement learning",
arXiv:1803.07055 (Algorithm 2; its code, modestyachts/ARS, for the details
below).

Conventions:
  * theta is a flat float32 CPU vector (``neuroevo.ParamSpace``), for ARS a
    linear policy, and starts at zero.
  * Generation g draws N direction seeds from ``generation_rng(seed, g)``;
    delta_k = ``noise(seed_k, size)`` and the population is ordered
    [theta + nu*delta_1, theta - nu*delta_1, theta + nu*delta_2, ...].
  * Fitness is higher-is-better; NaN counts as the worst. The top b
    directions by max(r+_k, r-_k) are kept (ties: the lower k first), and
    theta += alpha / (b * sigma_R) * sum_k (r+_k - r-_k) delta_k, sigma_R the
    standard deviation of the 2b returns kept (V1-t; b = N: V1).
  * V2 (and V2-t) is this update on states normalised by their running mean
    and standard deviation: the caller does that (``obs_norm``, shared by the
    population and updated between generations), as does the survival-bonus
    shift of Hopper, Walker2d, Ant and Humanoid (``remove_survival_bonus``).

Defaults: the paper's hyperparameters for Hopper-v1 V2-t (N = 8, b = 4,
alpha = 0.01, nu = 0.025); HalfCheetah-v1's were N = 32, b = 4, alpha = 0.02,
nu = 0.03 (the repository's README runs it with N = 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seedlocal.algos.neuroevo import generation_rng, nan_to_worst, new_seeds, noise
from seedlocal.errors import ConfigError


@dataclass
class ARSParams:
    """ARS hyperparameters (defaults: the paper's Hopper-v1 V2-t)."""

    directions: int = 8
    """N: random directions per generation, each evaluated at theta + nu*delta and theta - nu*delta"""
    top: int = 4
    """b: the directions whose better side scored highest make the step (b = N: all)"""
    step_size: float = 0.01
    """alpha"""
    noise: float = 0.025
    """nu: the scale of the exploration noise"""

    @property
    def population_size(self) -> int:
        return 2 * self.directions


def validate(p: ARSParams, prefix: str = "algo") -> None:
    if p.directions < 1:
        raise ConfigError(f"{prefix}.directions={p.directions!r}: must be >= 1")
    if not 1 <= p.top <= p.directions:
        raise ConfigError(f"{prefix}.top={p.top!r}: must be in [1, {prefix}.directions ({p.directions})]")
    for name in ("step_size", "noise"):  # `not x > 0`: NaN fails too
        if not getattr(p, name) > 0:
            raise ConfigError(f"{prefix}.{name}={getattr(p, name)!r}: must be > 0")


@dataclass(frozen=True, eq=False)  # eq=False: == on tensors is elementwise
class ARSState:
    theta: Tensor
    """[size] float32: the current parameters"""
    generation: int
    """generations completed"""
    rng: dict
    """{"seed": int}: the run's base seed"""


def init(size: int, seed: int) -> ARSState:
    return ARSState(theta=torch.zeros(size), generation=0, rng={"seed": int(seed)})


def ask(state: ARSState, p: ARSParams) -> tuple[list[int], Tensor]:
    """N direction seeds and the [2N, size] perturbed parameters (pairs +, -)."""
    seeds = new_seeds(generation_rng(state.rng["seed"], state.generation), p.directions)
    rows = []
    for s in seeds:
        step = p.noise * noise(s, state.theta.numel())
        rows += [state.theta + step, state.theta - step]
    return seeds, torch.stack(rows)


def top_directions(fitness: Tensor, b: int) -> Tensor:
    """Indices of the b directions with the highest max(r+, r-), best first (ties: lower index first)."""
    pairs = fitness.reshape(-1, 2)
    best = pairs.max(dim=1).values
    return torch.argsort(-best, stable=True)[:b]


def step(state: ARSState, p: ARSParams, seeds: list[int], fitness) -> Tensor:
    """alpha / (b sigma_R) * sum over the top b of (r+ - r-) delta."""
    f = nan_to_worst(fitness)
    if f.numel() != 2 * len(seeds):
        raise ValueError(f"{f.numel()} fitness values for {len(seeds)} directions")
    keep = top_directions(f, p.top)
    # A diverged evaluation (NaN: -inf here) is never preferred, but in the
    # step it counts as the generation's worst finite return, not as -inf.
    finite = f[torch.isfinite(f)]
    f = torch.where(torch.isfinite(f), f, finite.min() if finite.numel() else torch.zeros(()))
    pairs = f.reshape(-1, 2)[keep]
    sigma = float(pairs.std(unbiased=False))
    sigma = sigma if sigma > 0 else 1.0  # every kept return equal: no direction is better; the step is 0 anyway
    g = torch.zeros_like(state.theta)
    for k, (plus, minus) in zip(keep.tolist(), pairs.tolist()):
        g.add_(noise(seeds[k], g.numel()), alpha=plus - minus)
    return g * (p.step_size / (len(keep) * sigma))


def tell(state: ARSState, p: ARSParams, seeds: list[int], fitness) -> ARSState:
    """One ARS step from this generation's 2N fitnesses; returns the new state."""
    return ARSState(theta=state.theta + step(state, p, seeds, fitness), generation=state.generation + 1,
                    rng=state.rng)
