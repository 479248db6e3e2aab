"""Each neuroevolution algorithm's generation on the population policy.

An ``Evolver`` holds one algorithm's state (``algos/ga.py``, ``es.py``,
``ars.py``, ``random_search.py``: the math) and runs its generations on the
``PopulationPolicy`` (``policies/population.py``): ``generation(pool) ->
stats``. One subclass per rhythm of submissions: GA (children beside the
elite candidates' re-evaluation), a centre with antithetic pairs around it
(ES and ARS) and random search (the winner beside the next population).
``trainers/neuroevolution.py`` drives them; each run config names its own
evolver (``NeuroevoRun.evolver``).

Jobs run asynchronously, so each generation overlaps what it can, and the
next population is submitted before this one's last work (the elite
candidates', the centre's or winner's episodes) ends, so the envs never wait
for the bookkeeping. A run that stops (or resumes) just re-evaluates the
population in its state.

Observation statistics (``obs_norm``) are committed once, just before that
submission, and a job normalises by those committed when it was submitted:
whatever selection compares was scored under one set (GA's elite beside the
children, ES's centre beside its population, an ARS pair), and the next
population sees this one's observations.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from types import ModuleType
from typing import ClassVar

import numpy as np
import torch

from seedlocal.algos import ars, es, ga, random_search
from seedlocal.algos.neuroevo import ParamSpace


class Evolver(ABC):
    """One algorithm behind one interface, for ``cfg`` (a ``NeuroevoRun``)
    over the networks of ``space``."""

    state_class: ClassVar[type]
    """the algorithm's state, rebuilt from a checkpoint's dict"""

    def __init__(self, cfg, space: ParamSpace):
        self.cfg, self.space = cfg, space
        self.best_params: torch.Tensor | None = None
        self.best_return = -math.inf
        self.state = self.init_state(cfg.env.seed)
        self._next = None  # the next population's job, already playing (GA: without its elite)
        self.evaluating: list = []  # the jobs of the population in evaluation (together P members), for progress

    @abstractmethod
    def init_state(self, seed: int):
        """Generation 0's state."""

    @abstractmethod
    def step(self, pool, check) -> tuple[list[float], float]:
        """One generation's evaluation and step: (the population's fitness,
        the best member's return)."""

    def state_dict(self) -> dict:
        return self.state if isinstance(self.state, dict) else dataclasses.asdict(self.state)

    def restore(self, d: dict) -> None:
        self.state = self.state_class(**d)

    def generation(self, pool, check=None) -> dict:
        """One generation (``step``) and its statistics."""
        fitness, best = self.step(pool, check)
        f = np.array(fitness)
        return {"best_fitness": float(f.max()), "mean_fitness": float(f.mean()),
                "median_fitness": float(np.median(f)), "best_member_return": best}

    @staticmethod
    def _means(job, check) -> list[float]:
        """Each member's mean fitness (its return, less any reward shift)."""
        job.wait(check)
        return [float(np.mean(f)) for f in job.fitness]

    def _set_best(self, vec: torch.Tensor, score: float, always: bool) -> None:
        # GA's elite and ES's centre are *the* current solution; random search
        # keeps the best network it has ever seen.
        if always or score > self.best_return:
            self.best_params, self.best_return = vec.clone(), score


class GAEvolver(Evolver):
    """The deep GA: the population's fitness, then its elite candidates
    scored beside the next generation's children."""

    state_class = ga.GAState

    def __init__(self, cfg, space: ParamSpace):
        super().__init__(cfg, space)
        self._cache: dict[tuple, torch.Tensor] = {}

    def init_state(self, seed: int) -> ga.GAState:
        return ga.init(self.cfg.algo, seed)

    def restore(self, d: dict) -> None:
        super().restore({**d, "genomes": tuple(tuple(g) for g in d["genomes"]),
                         "elite": tuple(d["elite"]) if d["elite"] is not None else None})

    def _genome_vec(self, g: tuple) -> torch.Tensor:
        # Children are one mutation from a cached parent: rebuilding a genome
        # from all its seeds every generation would cost a noise slice per seed.
        if g not in self._cache:
            parent = self._cache.get(g[:-1])
            self._cache[g] = (ga.mutate(parent, g[-1], self.cfg.algo.sigma) if parent is not None
                              else ga.rebuild(g, self.space, self.cfg.algo.sigma))
        return self._cache[g]

    def _vecs(self, genomes) -> torch.Tensor:
        return self.space.stack([self._genome_vec(g) for g in genomes])

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the elite's return)."""
        cfg, n_eps, means = self.cfg, self.cfg.episodes_per_member, self._means
        if self._next is None:
            self.evaluating = [pool.submit(self._vecs(self.state.genomes), n_eps)]
            fitness = means(self.evaluating[0], check)
        else:  # children already playing; the elite joins at the front of the queue
            elite = pool.submit(self._vecs(self.state.genomes[:1]), n_eps, front=True)
            self.evaluating = [elite, self._next]
            fitness = means(elite, check) + means(self._next, check)
        candidates = ga.tell(self.state, cfg.algo, fitness)
        pool.commit_obs_stats()
        scored = pool.submit(self._vecs(candidates), cfg.algo.elite_episodes, front=True)
        self._next = pool.submit(self._vecs(ga.children(self.state, cfg.algo, fitness)), n_eps)
        scored.wait(check)
        self.state = ga.advance(self.state, cfg.algo, fitness, scored.fitness)
        best = float(np.mean(scored.returns[candidates.index(self.state.elite)]))
        # Keep exactly the vectors of the next population: its children's
        # parents come from it.
        self._cache = {g: self._cache[g] for g in self.state.genomes}
        self._set_best(self._genome_vec(self.state.elite), best, always=True)
        return fitness, best


class CentreEvolver(Evolver):
    """Antithetic pairs around a centre, one step of the centre a generation
    (ES, ARS: ``algo``, the module of the math): the population's fitness,
    one step, the next population submitted while the old centre's episodes
    end."""

    algo: ClassVar[ModuleType]
    """``es`` or ``ars``: ``ask`` and ``tell`` of the same shapes"""

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the old centre's return)."""
        cfg, n_eps, alg = self.cfg, self.cfg.episodes_per_member, self.algo
        if self._next is None:
            seeds, params = alg.ask(self.state, cfg.algo)
            self._next = (seeds, pool.submit(params, n_eps))
        seeds, job = self._next
        self.evaluating = [job]
        centre = self.state.theta.clone()  # the population's centre: the state it was asked from
        # The centre's episodes only fill slots the population leaves free
        # and nothing waits for them until the next population plays: with
        # as many slots as members, scoring it first would add a wave of
        # a few episodes to every generation.
        scored = pool.submit(centre[None], cfg.best_episodes, spare=True)
        fitness = self._means(job, check)
        state = alg.tell(self.state, cfg.algo, seeds, fitness)
        following, params = alg.ask(state, cfg.algo)
        pool.commit_obs_stats()
        self._next = (following, pool.submit(params, n_eps))
        best = float(np.mean(scored.wait(check)[0]))
        # Only now: a run stopped while waiting saves this generation's
        # state, matching its counters, and re-evaluates it on resume.
        self.state = state
        self._set_best(centre, best, always=True)
        return fitness, best


class ESEvolver(CentreEvolver):
    """Salimans et al.'s ES, from an initialised network."""

    algo = es
    state_class = es.ESState

    def init_state(self, seed: int) -> es.ESState:
        return es.init(self.space.init(seed), seed)


class ARSEvolver(CentreEvolver):
    """ARS, from the zero policy (its Algorithm 2's M_0 = 0)."""

    algo = ars
    state_class = ars.ARSState

    def init_state(self, seed: int) -> ars.ARSState:
        return ars.init(self.space.size, seed)


class RandomSearchEvolver(Evolver):
    """Random search: the population's fitness, its winner scored beside the
    next population; the best network ever seen is kept."""

    state_class = random_search.RSState

    def init_state(self, seed: int) -> random_search.RSState:
        return random_search.init(seed)

    def _population(self, state: random_search.RSState) -> torch.Tensor:
        return self.space.stack([self.space.init(s) for s in random_search.ask(state, self.cfg.algo)])

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the winner's return)."""
        cfg, n_eps = self.cfg, self.cfg.episodes_per_member
        if self._next is None:
            params = self._population(self.state)
            self._next = (params, pool.submit(params, n_eps))
        params, job = self._next
        self.evaluating = [job]
        fitness = self._means(job, check)
        state = random_search.tell(self.state, fitness)
        top = params[int(np.argmax(fitness))]
        pool.commit_obs_stats()
        scored = pool.submit(top[None], cfg.best_episodes, front=True)
        following = self._population(state)
        self._next = (following, pool.submit(following, n_eps))
        best = float(np.mean(scored.wait(check)[0]))
        self.state = state  # only now, as ES: a run stopped while waiting saves the state its counters match
        self._set_best(top, best, always=False)
        return fitness, best
