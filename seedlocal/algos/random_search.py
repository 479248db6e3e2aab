"""Random search over initialisations: the baseline of the deep GA paper.

Reference: F. P. Such et al., 2017, "Deep Neuroevolution: Genetic Algorithms Are a Competitive Alternative for Training
Deep Neural Networks for Reinforcement Learning", arXiv:1712.06567 (section 4, "random search").

Conventions (besides ``neuroevo``'s):
  * Each generation evaluates P fresh initialisation seeds (vectors via ``ParamSpace.init``) and keeps the best (seed,
    fitness) seen so far.
  * The best fitness is one evaluation, as reported by the caller: with noisy episodes it is an optimistic estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from seedlocal.algos.neuroevo import Generation, nan_to_worst, require


@dataclass
class RSParams:
    """Random search hyperparameters."""

    population_size: int = 64
    """initialisation seeds evaluated per generation"""


def validate(p: RSParams) -> None:
    require(p.population_size >= 1, p, "population_size", "must be >= 1")


@dataclass(frozen=True)
class RSState(Generation):
    best_seed: int | None
    """initialisation seed of the best evaluation so far (None before any)"""
    best_fitness: float
    """its fitness (-inf before any)"""


def init(seed: int) -> RSState:
    return RSState(best_seed=None, best_fitness=-math.inf, generation=0, rng={"seed": int(seed)})


def ask(state: RSState, p: RSParams) -> list[int]:
    """P fresh initialisation seeds for this generation."""
    return state.seeds(p.population_size)


def tell(state: RSState, fitness) -> RSState:
    """Keep the best of this generation (``fitness`` of ``ask``'s seeds, in order) if it beats the best so far."""
    f = nan_to_worst(fitness)
    i = int(f.argmax())  # the first of equal bests
    if f[i] > state.best_fitness:  # strict: ties keep the earlier best; -inf never wins
        return state.next(best_seed=state.seeds(f.numel())[i], best_fitness=float(f[i]))
    return state.next()
