"""Deep genetic algorithm with genomes compressed to lists of seeds.

Reference: F. P. Such et al., 2017, "Deep Neuroevolution: Genetic Algorithms Are a Competitive Alternative for Training
Deep Neural Networks for Reinforcement Learning", arXiv:1712.06567 (section 3 and Algorithm 1).

Conventions (besides ``neuroevo``'s):
  * A genome is a tuple of ints: ``genome[0]`` seeds the initialisation and each later element one mutation
    (``mutate``), so theta = init(g[0]) + sigma * eps(g[1]) + sigma * eps(g[2]) + ... with eps(s) = ``noise(s, size)``.
    The sum is taken in order, one addition at a time, so a worker that keeps last generation's vectors (keyed by
    genome) builds each child bit for bit with a single mutation.
  * One generation: evaluate each of ``genomes`` once -> ``tell`` (the elite candidates) -> evaluate each candidate
    ``elite_episodes`` times -> ``advance``; ``children`` may play meanwhile.
  * The next population is [elite] + children; fitness ties go to the lower index, so an elite that ties with a child
    stays ahead of it. The state holds plain types only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seedlocal.algos.neuroevo import Generation, generation_rng, nan_to_worst, new_seeds, noise, require

Genome = tuple[int, ...]


@dataclass
class GAParams:
    """Deep GA hyperparameters (defaults: a small run; the paper used P = 1000 and up)."""

    population_size: int = 64
    """genomes per generation (P), the elite included"""
    truncation: int = 8
    """the top T genomes by fitness become the parents"""
    sigma: float = 0.05
    """mutation power: the scale of the Gaussian noise added per mutation"""
    elite_candidates: int = 4
    """the top C genomes are re-evaluated to choose the elite"""
    elite_episodes: int = 5
    """extra episodes per elite candidate"""


def validate(p: GAParams) -> None:
    require(p.population_size >= 2, p, "population_size", "must be >= 2 (the elite and at least one child)")
    require(p.truncation >= 1, p, "truncation", "must be >= 1")
    require(p.truncation <= p.population_size, p, "truncation",
            f"must be <= algo.population_size ({p.population_size})")
    require(p.sigma > 0, p, "sigma", "must be > 0")
    require(1 <= p.elite_candidates <= p.truncation, p, "elite_candidates",
            f"must be in [1, algo.truncation ({p.truncation})]")
    require(p.elite_episodes >= 1, p, "elite_episodes", "must be >= 1")


def mutate(parent_vec: Tensor, seed: int, sigma: float) -> Tensor:
    """One mutation: ``parent_vec + sigma * noise(seed)`` (a new tensor)."""
    step = sigma * noise(seed, parent_vec.numel())
    return parent_vec + step.to(parent_vec.device).view_as(parent_vec)


@dataclass(frozen=True)
class GAState(Generation):
    genomes: tuple[Genome, ...]
    """the population to evaluate, elite first from generation 1 on"""
    elite: Genome | None
    """the elite carried into this population (None in generation 0)"""


def init(p: GAParams, seed: int) -> GAState:
    """Generation 0: P genomes, each a fresh initialisation seed."""
    seeds = new_seeds(generation_rng(seed, 0), p.population_size)
    return GAState(genomes=tuple((s,) for s in seeds), generation=0, elite=None, rng={"seed": int(seed)})


def _ranked(state: GAState, fitness) -> list[int]:
    """Population indices, best fitness first (ties: lower index first)."""
    f = nan_to_worst(fitness)
    if f.numel() != len(state.genomes):
        raise ValueError(f"{f.numel()} fitness values for {len(state.genomes)} genomes")
    return torch.argsort(-f, stable=True).tolist()


def tell(state: GAState, p: GAParams, fitness) -> list[Genome]:
    """The elite candidates to re-evaluate: the top C distinct genomes by ``fitness``, then the previous elite."""
    candidates = list(dict.fromkeys(state.genomes[i] for i in _ranked(state, fitness)[: p.elite_candidates]))
    # The previous elite competes on fresh episodes, not its one noisy score here: one lucky episode cannot evict it.
    if state.elite is not None and state.elite not in candidates:
        candidates.append(state.elite)
    return candidates


def advance(state: GAState, p: GAParams, fitness, candidate_scores) -> GAState:
    """The next generation: [elite] + (P - 1) mutated children of the top T. ``candidate_scores[i]`` holds the
    extra-episode returns of ``tell(...)[i]``; the elite is the candidate with the best mean (ties: the earlier one)."""
    candidates = tell(state, p, fitness)
    if len(candidate_scores) != len(candidates):
        raise ValueError(f"{len(candidate_scores)} score lists for {len(candidates)} elite candidates")
    scores = [nan_to_worst(s) for s in candidate_scores]
    if any(s.numel() == 0 for s in scores):
        raise ValueError("every elite candidate needs at least one score")
    means = [float(s.mean()) for s in scores]
    elite = candidates[max(range(len(means)), key=means.__getitem__)]
    return state.next(genomes=(elite,) + children(state, p, fitness), elite=elite)


def children(state: GAState, p: GAParams, fitness) -> tuple[Genome, ...]:
    """The next generation's P - 1 children: mutations of the top T by ``fitness``. They depend on ``fitness`` alone,
    not on the elite's re-evaluation, so a caller may start evaluating them while the elite candidates still play."""
    parents = [state.genomes[i] for i in _ranked(state, fitness)[: p.truncation]]
    rng = generation_rng(state.rng["seed"], state.generation + 1)
    picks = rng.integers(0, len(parents), size=p.population_size - 1)
    seeds = new_seeds(rng, p.population_size - 1)
    return tuple(parents[int(k)] + (s,) for k, s in zip(picks, seeds))
