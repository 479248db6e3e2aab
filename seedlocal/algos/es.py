"""Evolution strategies with antithetic sampling, centred ranks and Adam.

Reference: T. Salimans et al., 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement Learning",
arXiv:1703.03864 (Algorithm 2 and section 2.2: mirrored sampling, fitness shaping, weight decay).

Conventions (besides ``neuroevo``'s):
  * Generation g draws P/2 seeds; eps_i = ``noise(seed_i, size)``, and the population is ordered [theta + sigma*eps_1,
    theta - sigma*eps_1, theta + sigma*eps_2, ...].
  * With r = the centred ranks of all P fitnesses (tied fitnesses share their mean rank, so a pair that scored the same
    adds nothing), g = sum_i (r(+i) - r(-i)) * eps_i / (P * sigma), and Adam (bias-corrected) ascends g - weight_decay *
    theta.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seedlocal.algos.neuroevo import Generation, antithetic, centered_ranks, nan_to_worst, noise_sum, require


@dataclass
class ESParams:
    """ES hyperparameters (defaults as in Salimans et al. except the population)."""

    population_size: int = 64
    """perturbations per generation (P); even, since they come in antithetic pairs"""
    sigma: float = 0.05
    """standard deviation of the parameter noise"""
    learning_rate: float = 0.03
    """Adam step size"""
    weight_decay: float = 0.005
    """L2 coefficient pulling theta towards 0"""
    beta1: float = 0.9
    """Adam first-moment decay"""
    beta2: float = 0.999
    """Adam second-moment decay"""
    adam_eps: float = 1e-8
    """Adam denominator epsilon"""


def validate(p: ESParams) -> None:
    require(p.population_size >= 2, p, "population_size", "must be >= 2 (one antithetic pair)")
    require(p.population_size % 2 == 0, p, "population_size", "must be even (antithetic pairs)")
    for name in ("sigma", "learning_rate", "adam_eps"):
        require(getattr(p, name) > 0, p, name, "must be > 0")
    require(p.weight_decay >= 0, p, "weight_decay", "must be >= 0")
    for name in ("beta1", "beta2"):
        require(0 <= getattr(p, name) < 1, p, name, "must be in [0, 1)")


@dataclass(frozen=True, eq=False)  # eq=False: == on tensors is elementwise
class ESState(Generation):
    theta: Tensor
    """[size] float32: the current parameters"""
    m: Tensor
    """[size] Adam first moment"""
    v: Tensor
    """[size] Adam second moment"""
    t: int
    """Adam steps taken"""


def init(theta0: Tensor, seed: int) -> ESState:
    theta = theta0.detach().to(device="cpu", dtype=torch.float32).reshape(-1).clone()
    return ESState(theta=theta, m=torch.zeros_like(theta), v=torch.zeros_like(theta),
                   t=0, generation=0, rng={"seed": int(seed)})


def ask(state: ESState, p: ESParams) -> tuple[list[int], Tensor]:
    """P/2 noise seeds and the [P, size] perturbed parameters (pairs +, -)."""
    seeds = state.seeds(p.population_size // 2)
    return seeds, antithetic(state.theta, seeds, p.sigma)


def gradient(state: ESState, p: ESParams, seeds: list[int], fitness) -> Tensor:
    """The ES estimate of the gradient of expected fitness (no weight decay)."""
    ranks = centered_ranks(nan_to_worst(fitness))
    if ranks.numel() != 2 * len(seeds):
        raise ValueError(f"{ranks.numel()} fitness values for {len(seeds)} antithetic pairs")
    g = noise_sum((ranks[0::2] - ranks[1::2]).tolist(), seeds, state.theta.numel())
    return g / (ranks.numel() * p.sigma)


def tell(state: ESState, p: ESParams, seeds: list[int], fitness) -> ESState:
    """One Adam ascent step on the ES gradient estimate; returns the new state."""
    ascent = gradient(state, p, seeds, fitness) - p.weight_decay * state.theta
    t = state.t + 1
    m = p.beta1 * state.m + (1 - p.beta1) * ascent
    v = p.beta2 * state.v + (1 - p.beta2) * ascent * ascent
    m_hat = m / (1 - p.beta1**t)
    v_hat = v / (1 - p.beta2**t)
    theta = state.theta + p.learning_rate * m_hat / (v_hat.sqrt() + p.adam_eps)
    return state.next(theta=theta, m=m, v=v, t=t)
