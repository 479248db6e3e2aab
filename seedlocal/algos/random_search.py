"""Random search over initialisations: the baseline of the deep GA paper.

Reference: F. P. Such et al., 2017, "Deep Neuroevolution: Genetic Algorithms Are a Competitive Alternative for Training
Deep Neural Networks for Reinforcement Learning", arXiv:1712.06567 (section 4, "random search").

Conventions:
  * Each generation evaluates P fresh initialisation seeds (vectors via ``ParamSpace.init``) and keeps the best (seed,
    fitness) seen so far.
  * The best fitness is one evaluation, as reported by the caller: with noisy episodes it is an optimistic estimate.
  * Generation g draws from ``generation_rng(seed, g)``; ``ask`` draws nothing into the state, and ``tell`` recovers the
    seeds from ``len(fitness)``.
  * Fitness is higher-is-better; NaN is never kept; ties keep the earlier best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from seedlocal.algos.neuroevo import generation_rng, nan_to_worst, new_seeds
from seedlocal.errors import fail


@dataclass
class RSParams:
    """Random search hyperparameters."""

    population_size: int = 64
    """initialisation seeds evaluated per generation"""


def validate(p: RSParams, prefix: str = "algo") -> None:
    if p.population_size < 1:
        fail(f"{prefix}.population_size", p.population_size, "must be >= 1")


@dataclass(frozen=True)
class RSState:
    best_seed: int | None
    """initialisation seed of the best evaluation so far (None before any)"""
    best_fitness: float
    """its fitness (-inf before any)"""
    generation: int
    """generations completed"""
    rng: dict
    """{"seed": int}: the run's base seed"""


def init(seed: int) -> RSState:
    return RSState(best_seed=None, best_fitness=-math.inf, generation=0, rng={"seed": int(seed)})


def _seeds(state: RSState, n: int) -> list[int]:
    return new_seeds(generation_rng(state.rng["seed"], state.generation), n)


def ask(state: RSState, p: RSParams) -> list[int]:
    """P fresh initialisation seeds for this generation."""
    return _seeds(state, p.population_size)


def tell(state: RSState, fitness) -> RSState:
    """Keep the best of this generation if it beats the best so far."""
    f = nan_to_worst(fitness)
    seeds = _seeds(state, f.numel())
    best_seed, best_fitness = state.best_seed, state.best_fitness
    for s, x in zip(seeds, f.tolist()):
        if x > best_fitness:  # strict: ties keep the earlier best; -inf never wins
            best_seed, best_fitness = s, x
    return RSState(best_seed=best_seed, best_fitness=best_fitness, generation=state.generation + 1, rng=state.rng)
