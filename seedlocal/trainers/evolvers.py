"""Each neuroevolution algorithm's generation on the population policy.

An ``Evolver`` holds one algorithm's state (``algos/ga.py``, ``es.py``, ``ars.py``, ``random_search.py``: the
math) and runs its generations on the ``PopulationPolicy`` (``policies/population.py``): ``generation(pool) ->
stats``, one subclass per rhythm of submissions.

Jobs run asynchronously: the next population is submitted before this one's last work (the elite candidates',
the centre's or winner's episodes) ends, so the envs never wait for the bookkeeping. A run that stops (or
resumes) just re-evaluates the population in its state. Observation statistics (``obs_norm``) are committed once,
just before that submission, and a job normalises by those committed when it was submitted: whatever selection
compares was scored under one set, and the next population sees this one's observations.

Split populations (``--learners G``, docs/distributed.md): every rank holds the same state, evaluates its own part
of the members and extra episodes (``Solo.part``), and all-gathers every member's scores in rank order, so every
rank takes the same step; a checksum of the states, compared each generation, stops a run whose ranks differ.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import ClassVar

import numpy as np
import torch

from seedlocal.algos import ars, es, ga, random_search
from seedlocal.algos.neuroevo import ParamSpace
from seedlocal.errors import WorkerDied
from seedlocal.pipeline.ranks import Solo


class RanksDiverged(WorkerDied):
    """Data-parallel ranks hold different states after the same generation."""


class Evolver(ABC):
    """One algorithm behind one interface, for ``cfg`` (a ``NeuroevoRun``) over the networks of ``space``."""

    ranks: Solo = Solo()
    """the data-parallel ranks the population is split among (set by the trainer's ``join_ranks``)"""

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
        """One generation's evaluation and step: (the population's fitness, the best member's return)."""

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.state)

    def restore(self, d: dict) -> None:
        self.state = type(self.state)(**d)  # a checkpoint's dict as the algorithm's state class (init_state's)

    def generation(self, pool, check=None) -> dict:
        """One generation (``step``) and its statistics."""
        fitness, best = self.step(pool, check)
        if self.ranks.world > 1:
            self._same_everywhere()
        f = np.array(fitness)
        return {"best_fitness": float(f.max()), "mean_fitness": float(f.mean()),
                "median_fitness": float(np.median(f)), "best_member_return": best}

    def _same_everywhere(self) -> None:
        """Every rank's state is this one's (a checksum of it, all-gathered), or the run stops."""
        sums = [row[0] for row in self.ranks.gather([float(self.checksum())])]
        if len(set(sums)) > 1:
            raise RanksDiverged(f"learner rank {self.ranks.rank}: the ranks' {type(self).__name__[:-7]} states "
                                f"differ after the same generation (checksums "
                                f"{', '.join(f'{int(c):#010x}' for c in sums)})")

    def checksum(self) -> int:
        """CRC-32 of the state's tensors and numbers, in ``state_dict`` order."""
        crc = 0
        for k, v in sorted(self.state_dict().items()):
            data = v.detach().cpu().contiguous().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode()
            crc = zlib.crc32(k.encode() + data, crc)
        return crc

    def _mine(self, items):
        """This rank's part of a population's rows, genomes or seeds (all of them for one process)."""
        part = self.ranks.part(len(items))
        return items[part.start:part.stop]

    def _everyone(self, jobs: list, check, episodes: int) -> tuple[list[list[float]], list[list[float]]]:
        """(fitness, returns) of every rank's members in rank order, ``episodes`` values each: this rank's
        ``jobs`` (its part, in population order) all-gathered with the other ranks'. A job whose members are
        one member's share of its episodes gives them as ``episodes`` = 1, one value per "member"."""
        for job in jobs:
            job.wait(check)
        fitness = [x for job in jobs for member in job.fitness for x in member]
        returns = [x for job in jobs for member in job.returns for x in member]
        rows = self.ranks.gather(fitness + returns)  # each rank's fitness, then its returns
        halves = [[x for row in rows for x in row[:len(row) // 2]], [x for row in rows for x in row[len(row) // 2:]]]
        return tuple([flat[i:i + episodes] for i in range(0, len(flat), episodes)] for flat in halves)

    def _means(self, jobs: list, check) -> list[float]:
        """Each member's mean fitness (its return, less any reward shift), every rank's members."""
        return [float(np.mean(f)) for f in self._everyone(jobs, check, self.cfg.episodes_per_member)[0]]

    def _one_members_return(self, job, check) -> float:
        """The mean return of one member's episodes, which the ranks shared (``job``: this rank's share)."""
        return float(np.mean([r for r, in self._everyone([job], check, 1)[1]]))


class GAEvolver(Evolver):
    """The deep GA: the population's fitness, then its elite candidates scored beside the next generation's children."""

    def __init__(self, cfg, space: ParamSpace):
        super().__init__(cfg, space)
        self._cache: dict[tuple, torch.Tensor] = {}

    def init_state(self, seed: int) -> ga.GAState:
        return ga.init(self.cfg.algo, seed)

    def restore(self, d: dict) -> None:
        super().restore({**d, "genomes": tuple(tuple(g) for g in d["genomes"]),
                         "elite": tuple(d["elite"]) if d["elite"] is not None else None})

    def _genome_vec(self, g: tuple) -> torch.Tensor:
        # Children are one mutation from a cached parent (ga.py's conventions), not a noise slice per seed. A split
        # population's rank did not build every parent: it mutates on from the longest cached ancestor.
        if g not in self._cache:
            k = next((k for k in range(len(g) - 1, 0, -1) if g[:k] in self._cache), 0)
            vec = self._cache[g[:k]] if k else self.space.init(g[0])
            for s in g[max(k, 1):]:
                vec = ga.mutate(vec, s, self.cfg.algo.sigma)
            self._cache[g] = vec
        return self._cache[g]

    def _vecs(self, genomes) -> torch.Tensor:
        return self.space.stack([self._genome_vec(g) for g in genomes])

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the elite's return)."""
        cfg, n_eps, genomes = self.cfg, self.cfg.episodes_per_member, self.state.genomes
        mine = self.ranks.part(len(genomes))  # of the elite (member 0) and the children (1..P-1)
        if self._next is None:
            self.evaluating = [pool.submit(self._vecs(genomes[mine.start:mine.stop]), n_eps)]
        else:  # children already playing; the elite joins at the front of the queue
            elite = [pool.submit(self._vecs(genomes[:1]), n_eps, front=True)] if 0 in mine else []
            self.evaluating = elite + [self._next]
        fitness = self._means(self.evaluating, check)
        candidates = ga.tell(self.state, cfg.algo, fitness)
        pool.commit_obs_stats()
        scored = pool.submit(self._vecs(self._mine(candidates)), cfg.algo.elite_episodes, front=True)
        children = ga.children(self.state, cfg.algo, fitness)
        self._next = pool.submit(self._vecs(children[max(mine.start, 1) - 1:max(mine.stop, 1) - 1]), n_eps)
        scores, returns = self._everyone([scored], check, cfg.algo.elite_episodes)
        self.state = ga.advance(self.state, cfg.algo, fitness, scores)
        best = float(np.mean(returns[candidates.index(self.state.elite)]))
        # Keep exactly the vectors of the next population: its children's parents come from it (a split
        # population's rank keeps their parents too, for the members another rank built).
        keep = set(self.state.genomes) | ({g[:-1] for g in self.state.genomes} if self.ranks.world > 1 else set())
        self._cache = {g: v for g, v in self._cache.items() if g in keep}
        self.best_params, self.best_return = self._genome_vec(self.state.elite).clone(), best
        return fitness, best


class CentreEvolver(Evolver):
    """Antithetic pairs around a centre, one step of the centre a generation (ES, ARS: ``algo``, the module of the
    math): the population's fitness, one step, the next population submitted while the old centre's episodes end."""

    algo: ClassVar[ModuleType]
    """``es`` or ``ars``: ``ask`` and ``tell`` of the same shapes"""

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the old centre's return)."""
        cfg, n_eps, alg = self.cfg, self.cfg.episodes_per_member, self.algo
        if self._next is None:
            seeds, params = alg.ask(self.state, cfg.algo)
            self._next = (seeds, pool.submit(self._mine(params), n_eps))
        seeds, job = self._next
        self.evaluating = [job]
        centre = self.state.theta.clone()  # the population's centre: the state it was asked from
        # The centre's episodes only fill slots the population leaves free and nothing waits for them until the
        # next population plays: with as many slots as members, scoring it first would add a wave of a few
        # episodes to every generation.
        scored = pool.submit(centre[None], len(self.ranks.part(cfg.best_episodes)), spare=True)
        fitness = self._means([job], check)
        state = alg.tell(self.state, cfg.algo, seeds, fitness)
        following, params = alg.ask(state, cfg.algo)
        pool.commit_obs_stats()
        self._next = (following, pool.submit(self._mine(params), n_eps))
        best = self._one_members_return(scored, check)
        # Only now: a run stopped while waiting saves this generation's state, matching its counters, and
        # re-evaluates it on resume.
        self.state = state
        self.best_params, self.best_return = centre.clone(), best
        return fitness, best


class ESEvolver(CentreEvolver):
    """Salimans et al.'s ES, from an initialised network."""

    algo = es

    def init_state(self, seed: int) -> es.ESState:
        return es.init(self.space.init(seed), seed)


class ARSEvolver(CentreEvolver):
    """ARS, from the zero policy (its Algorithm 2's M_0 = 0)."""

    algo = ars

    def init_state(self, seed: int) -> ars.ARSState:
        return ars.init(self.space.size, seed)


class RandomSearchEvolver(Evolver):
    """Random search: the population's fitness, its winner scored beside the next population; the best network
    ever seen is kept."""

    def init_state(self, seed: int) -> random_search.RSState:
        return random_search.init(seed)

    def _population(self, state: random_search.RSState) -> tuple[list[int], torch.Tensor]:
        """The population's seeds, and this rank's part of its vectors."""
        seeds = random_search.ask(state, self.cfg.algo)
        return seeds, self.space.stack([self.space.init(s) for s in self._mine(seeds)])

    def step(self, pool, check) -> tuple[list[float], float]:
        """(fitness, the winner's return)."""
        cfg, n_eps = self.cfg, self.cfg.episodes_per_member
        if self._next is None:
            seeds, params = self._population(self.state)
            self._next = (seeds, params, pool.submit(params, n_eps))
        seeds, params, job = self._next
        self.evaluating = [job]
        fitness = self._means([job], check)
        state = random_search.tell(self.state, fitness)
        i, mine = int(np.argmax(fitness)), self.ranks.part(len(seeds))
        top = params[i - mine.start] if i in mine else self.space.init(seeds[i])  # built by another rank
        pool.commit_obs_stats()
        scored = pool.submit(top[None], len(self.ranks.part(cfg.best_episodes)), front=True)
        following, params = self._population(state)
        self._next = (following, params, pool.submit(params, n_eps))
        best = self._one_members_return(scored, check)
        self.state = state  # only now, as ES: a run stopped while waiting saves the state its counters match
        if best > self.best_return:  # the best ever seen (GA's elite and ES's centre are the current solution)
            self.best_params, self.best_return = top.clone(), best
        return fitness, best
