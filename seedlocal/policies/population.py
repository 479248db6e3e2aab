"""A population of networks playing episodes: the work queue of (member, episode) jobs, one at a time on each env
slot (the README's "Neuroevolution" says how slots, held groups, asynchronous jobs and the episode cap behave). The
forward is ``policies/population_forward.py``'s, the shared observation statistics ``policies/population_norm.py``'s.

``seedlocal eval`` plays a checkpoint's member through the same class (``PopulationPolicy.serving``: that one member
on every slot), so eval acts by training's forward and action rule.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import numpy as np
import torch
from torch import nn

from seedlocal.algos.distributions import Categorical
from seedlocal.networks import PolicyNet, flatten_obs, legal_only
from seedlocal.pipeline.policy import HOLD, RESTART, SERVE, Policy, Unhold
from seedlocal.policies.population_forward import PopulationForward
from seedlocal.policies.population_norm import PopulationNorm
from seedlocal.spec import MASK_KEY


class Job:
    """The episodes of one population: ``returns[m]`` (raw) and ``fitness[m]`` (what selection sees: the return
    less ``reward_shift`` per step, see ``PopulationPolicy``) fill as member m's episodes end. ``stats``: the
    observation statistics every episode of the job is normalised by (None: the network has no ``obs_norm``)."""

    def __init__(self, params: torch.Tensor, episodes: int, stats: torch.Tensor | None = None):
        self.params, self.stats = params, stats
        # On CUDA the inference thread reads ``params`` and ``stats`` on its own stream: it waits for this event,
        # recorded after the kernels that made them.
        self.made = torch.cuda.current_stream(params.device).record_event() if params.is_cuda else None
        self.episodes = episodes
        self.returns: list[list[float]] = [[] for _ in range(params.shape[0])]
        self.fitness: list[list[float]] = [[] for _ in range(params.shape[0])]
        self.pending = params.shape[0] * episodes
        self.done = threading.Event()
        if not self.pending:
            self.done.set()

    def wait(self, check=None) -> list[list[float]]:
        """Block until every episode has a return; ``check`` runs every 0.5 s (it raises if the pipeline died)."""
        while not self.done.wait(0.5):
            if check is not None:
                check()
        return self.returns

    def members_done(self) -> int:
        """Members whose every episode has a return (read from any thread: the lists only grow)."""
        return sum(len(r) >= self.episodes for r in self.returns)


class PopulationPolicy(Policy):
    """The inference loop's policy during neuroevolution (see module docstring): ``submit`` (learner thread) posts
    jobs; ``plan``/``act`` (inference thread) run them."""

    plans = True

    def __init__(self, template: nn.Module, envs_per_group: int, num_groups: int, device: torch.device,
                 greedy: bool = True, strategy: str = "auto", action_noise: float = 0.0, reward_shift: float = 0.0,
                 max_episode_steps: int = 0, pool_stats: Callable | None = None):
        """``action_noise``, ``reward_shift``, ``max_episode_steps`` (0: no cap; a capped episode is scored on its
        return so far): the run's options (``NeuroevoRun``); a Box action is the network's output (mapped onto the
        env's bounds, ``envs/bounds.py``). With a template that has ``obs_norm``, the population shares observation
        statistics (``PopulationNorm``, ``commit_obs_stats``; ``pool_stats``: a split population's
        ``Ranks.pool_moments``, ``PopulationNorm.commit``'s ``pool``)."""
        self.E, self.device, self.greedy = envs_per_group, device, greedy
        self.continuous = bool(getattr(template, "continuous", False))
        self.action_noise, self.reward_shift, self.max_episode_steps = action_noise, reward_shift, max_episode_steps
        self.acting = ("its output" + (f" plus noise of std {action_noise:g}" if action_noise else "")
                       if self.continuous else "argmax" if greedy else "sampled")
        n = envs_per_group * num_groups
        self.forward = PopulationForward(template, n, device, strategy)
        self.norm = PopulationNorm(self.forward.norm_size, device) if self.forward.norm_size else None
        self.pinned = False  # ``serving``: one member on every env slot, whatever slot ids it is given
        self.pool_stats = pool_stats
        self.assign = np.full(n, -1, np.int64)  # member per env slot; -1 idle
        self.steps = np.zeros(n, np.int64)  # steps each slot's job episode has played (0 idle), for progress
        self._env_job: list[Job | None] = [None] * n
        self._lock = threading.Lock()
        self._queue: deque[tuple[Job, int]] = deque()
        self._spare: deque[tuple[Job, int]] = deque()  # taken only when _queue is empty
        self.forward_s, self.forward_envs = 0.0, 0  # time in the forward and rows it served, for perf scalars
        self.episodes_scored = 0  # evaluation episodes that ended (idle slots' episodes are not counted)
        self.episodes_capped = 0  # of those, ended by max_episode_steps
        self.unhold = Unhold()  # wakes the groups ``plan`` held when work arrives

    @classmethod
    def serving(cls, net: PolicyNet, spec, greedy: bool) -> PopulationPolicy:
        """``net`` alone on every env slot, without action noise: eval's policy for a neuroevolution checkpoint (and
        the videos'). The forward is the network's first strategy, not ``auto``, whose choice by timing could
        change an output's last bit from one eval to the next."""
        device = next(net.parameters()).device
        policy = cls(net, 1, 1, device, greedy=greedy)
        policy.forward.strategy = policy.forward.candidates[0]
        policy.spec, policy.pinned, policy.norm = spec, True, None  # nothing commits statistics in eval
        slot = torch.zeros(1, dtype=torch.long, device=device)
        policy.forward.load(slot, torch.nn.utils.parameters_to_vector(net.parameters()).unsqueeze(0), slot)
        policy.assign[0] = 0
        return policy

    # -- learner thread ---------------------------------------------------------

    def submit(self, params: torch.Tensor, episodes: int, front: bool = False, spare: bool = False) -> Job:
        """Queue ``episodes`` episodes of every member (row of ``params``); ``front`` puts them before the jobs
        already waiting; ``spare`` jobs start only on slots the other jobs leave free (a generation's tail), so
        work nobody waits for yet never delays a population."""
        norm = self.forward.template.obs_norm if self.forward.norm_size else None
        # A copy of the statistics committed now: a commit while the job plays does not reach its episodes (an
        # ARS pair is scored under one normalisation). Made before ``Job.made`` is recorded, as the parameters are.
        job = Job(params.to(self.device), episodes, None if norm is None else self.forward.stats_of(norm))
        # Interleave members so every one gets its first episode early.
        entries = [(job, m) for _ in range(episodes) for m in range(params.shape[0])]
        with self._lock:
            queue = self._spare if spare else self._queue
            if front:
                queue.extendleft(reversed(entries))
            else:
                queue.extend(entries)
        self.unhold()
        return job

    def longest_running(self) -> int:
        """Steps of the longest job episode still playing (0: none): what a generation waits for at its end."""
        return int(self.steps.max(initial=0))

    def commit_obs_stats(self) -> None:
        """Jobs submitted from now on normalise by the observations gathered so far too (``PopulationNorm.commit``);
        jobs already submitted keep theirs."""
        if self.norm is not None:
            self.norm.commit(self.forward.template, self.pool_stats)

    # -- inference thread -------------------------------------------------------

    def plan(self, groups: np.ndarray, first: np.ndarray, done: np.ndarray, ep_return: np.ndarray,
             ep_length: np.ndarray | None = None) -> np.ndarray:
        codes = np.full(len(groups), SERVE, np.int8)
        loads: dict[Job, list[tuple[int, int]]] = {}  # (env slot, member) pairs each job starts now
        with self._lock:
            for i, g in enumerate(groups.tolist()):
                lo = g * self.E
                a = self.assign[lo:lo + self.E]
                length = ep_length[i] if ep_length is not None else np.zeros(self.E, np.int64)
                ended = done[i] & (a >= 0)
                if self.max_episode_steps:
                    capped = (a >= 0) & ~done[i] & (length >= self.max_episode_steps)
                    self.episodes_capped += int(capped.sum())
                    ended |= capped
                for j in np.flatnonzero(ended).tolist():
                    job = self._env_job[lo + j]
                    ret = float(ep_return[i, j])  # a capped episode's return so far
                    job.returns[a[j]].append(ret)
                    job.fitness[a[j]].append(ret - self.reward_shift * float(length[j]))
                    self.episodes_scored += 1
                    job.pending -= 1
                    if job.pending == 0:
                        job.done.set()
                    self._env_job[lo + j] = None
                    a[j] = -1
                # Before new jobs start: a slot taking one now has played nothing of it yet.
                self.steps[lo:lo + self.E] = np.where(a >= 0, length, 0)
                for j in np.flatnonzero(first[i] & (a < 0)).tolist():
                    queue = self._queue or self._spare
                    if not queue:
                        break
                    job, m = queue.popleft()
                    a[j] = m
                    self._env_job[lo + j] = job
                    loads.setdefault(job, []).append((lo + j, m))
                if (a < 0).all():
                    # Idle: restart on fresh episodes if work waits (its envs are mid-episode), else let it sleep.
                    codes[i] = RESTART if self._queue or self._spare else HOLD
        for job, pairs in loads.items():
            envs, members = zip(*pairs)
            if job.made is not None:
                stream = torch.cuda.current_stream(job.params.device)
                stream.wait_event(job.made)
                job.params.record_stream(stream)  # not reused by the allocator before this stream is done
                if job.stats is not None:
                    job.stats.record_stream(stream)
            self.forward.load(torch.tensor(envs, device=self.device), job.params,
                              torch.tensor(members, device=self.device), job.stats)
        return codes

    def act(self, obs, core=None, env_ids=None, first=None):
        envs = env_ids if env_ids is not None else np.arange(next(iter(obs.values())).shape[0])
        slots = np.zeros_like(envs) if self.pinned else envs
        active = np.flatnonzero(self.assign[slots] >= 0)
        width = (self.forward.template.policy.out_features,) if self.continuous else ()
        actions = torch.zeros((len(envs),) + width, dtype=torch.float32 if self.continuous else torch.long,
                              device=self.device)
        if MASK_KEY in obs:  # envs without a job step too (their steps are not scored): a legal action each
            actions = obs[MASK_KEY].to(torch.uint8).argmax(-1)
        if len(active):
            t0 = time.perf_counter()
            if len(active) < len(envs):
                idx = torch.from_numpy(active).to(self.device)
                obs = {k: v[idx] for k, v in obs.items()}
            if self.norm is not None:
                self.norm.see(lambda: flatten_obs(self.forward.mlp_keys, obs, self.forward.obs_classes))
            # legal_only: the plan's and the statistics' forwards write the layers out, not PolicyNet.forward.
            out = legal_only(self.forward(slots[active], obs), obs)
            if self.continuous:
                chosen = out + self.action_noise * torch.randn_like(out) if self.action_noise else out
            else:
                chosen = out.argmax(-1) if self.greedy else Categorical.sample(out, self.generator)
            if len(active) < len(envs):
                actions[idx] = chosen
            else:
                actions = chosen
            self.forward_s += time.perf_counter() - t0
            self.forward_envs += len(active)
        return actions, {}, None
