"""Augmented Random Search: random directions, the best of them, a step.

Reference: H. Mania, A. Guy and B. Recht, 2018, "Simple random search provides a competitive approach to reinforcement
learning", arXiv:1803.07055 (Algorithm 2, section 3; its code, modestyachts/ARS).

Conventions (besides ``neuroevo``'s):
  * theta (the paper's M, a linear policy) starts at zero. Generation g draws N direction seeds, delta_k =
    ``noise(seed_k, size)``, and the population is ``antithetic``'s [theta + nu*delta_1, theta - nu*delta_1, ...].
  * The b directions with the highest max(r+_k, r-_k) are kept, exactly b of them (ties: the lower k first; the paper's
    code keeps every tie at the cut), and theta += alpha / (b * sigma_R) * sum_k (r+_k - r-_k) delta_k, sigma_R the
    (population) standard deviation of the 2b returns kept. b = N is V1, b < N is V1-t.
  * A non-finite return (NaN, +-inf) counts, in that sum and in sigma_R, as the generation's worst (or, for +inf, best)
    finite return.
  * V2 and V2-t are this update on states normalised by their running mean and standard deviation, which the caller
    does (``--network.obs-norm``: statistics the population shares, taken into use between generations), as it does
    the survival-bonus shift (``NeuroevoRun.remove_survival_bonus``).

Defaults: the paper's V2-t hyperparameters for Hopper-v1: step size alpha = 0.01, N = 8 directions, the top b = 4 of
them, exploration noise nu = 0.025. Its V2-t settings for HalfCheetah-v1 are alpha = 0.02, N = 32, b = 4, nu = 0.03 (the
code's default arguments, with which its README trains HalfCheetah-v1, are alpha = 0.02, N = b = 8, nu = 0.03).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seedlocal.algos.neuroevo import Generation, antithetic, nan_to_worst, noise_sum, require


@dataclass
class ARSParams:
    """ARS hyperparameters (defaults: the paper's Hopper-v1 V2-t)."""

    directions: int = 8
    """N: random directions per generation, each evaluated at theta + nu*delta and theta - nu*delta"""
    top: int = 4
    """b: the directions whose better side scored highest make the step (b = N: all of them, V1/V2)"""
    step_size: float = 0.01
    """alpha: the step, in units of the kept returns' standard deviation"""
    noise: float = 0.025
    """nu: the scale of the exploration noise"""

    @property
    def population_size(self) -> int:
        return 2 * self.directions


def validate(p: ARSParams) -> None:
    require(p.directions >= 1, p, "directions", "must be >= 1")
    require(1 <= p.top <= p.directions, p, "top", f"must be in [1, algo.directions ({p.directions})]")
    for name in ("step_size", "noise"):
        require(getattr(p, name) > 0, p, name, "must be > 0")


@dataclass(frozen=True, eq=False)  # eq=False: == on tensors is elementwise
class ARSState(Generation):
    theta: Tensor
    """[size] float32: the current parameters"""


def init(size: int, seed: int) -> ARSState:
    """The zero policy (Algorithm 2's M_0 = 0)."""
    return ARSState(theta=torch.zeros(size), generation=0, rng={"seed": int(seed)})


def ask(state: ARSState, p: ARSParams) -> tuple[list[int], Tensor]:
    """N direction seeds and the [2N, size] perturbed parameters (pairs +, -)."""
    seeds = state.seeds(p.directions)
    return seeds, antithetic(state.theta, seeds, p.noise)


def top_directions(fitness: Tensor, b: int) -> Tensor:
    """Indices of the b directions with the highest max(r+, r-), best first (ties: lower index first); ``fitness`` is
    [2N] in ``ask``'s order, NaN already made -inf (``nan_to_worst``)."""
    best = fitness.reshape(-1, 2).max(dim=1).values
    return torch.argsort(best, descending=True, stable=True)[:b]


def step(state: ARSState, p: ARSParams, seeds: list[int], fitness) -> Tensor:
    """alpha / (b sigma_R) * sum over the top b of (r+ - r-) delta."""
    f = nan_to_worst(fitness)
    if f.numel() != 2 * len(seeds):
        raise ValueError(f"{f.numel()} fitness values for {len(seeds)} directions")
    keep = top_directions(f, p.top)
    # -inf in the ranking (never preferred); in the sum the generation's worst finite return, not an infinite weight.
    finite = f[torch.isfinite(f)]
    f = f.clamp(finite.min(), finite.max()) if finite.numel() else torch.zeros_like(f)
    pairs = f.reshape(-1, 2)[keep]
    sigma = float(pairs.std(unbiased=False)) or 1.0  # 0: every kept return equal, every weight is 0 anyway
    g = noise_sum([plus - minus for plus, minus in pairs.tolist()], [seeds[k] for k in keep.tolist()],
                  state.theta.numel())
    return g * (p.step_size / (len(keep) * sigma))


def tell(state: ARSState, p: ARSParams, seeds: list[int], fitness) -> ARSState:
    """One ARS step from this generation's 2N fitnesses; returns the new state."""
    return state.next(theta=state.theta + step(state, p, seeds, fitness))
