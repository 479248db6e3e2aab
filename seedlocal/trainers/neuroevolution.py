"""``seedlocal train ga|es|ars|random-search``: neuroevolution on the pipeline.

The learner thread asks the algorithm for a population, posts it to the
``PopulationPolicy`` (a work queue of member x episode jobs served by the
inference thread in batched forward passes, ``policies/population.py``),
waits for every return, tells the algorithm (``algos/ga.py``, ``es.py``,
``ars.py``, ``random_search.py``), logs and checkpoints, once per
generation. Each run config names its algorithm's parts (``GARun.name``,
``.algo_module``, ``.evolver``); the evolver (``trainers/evolvers.py``) runs
its generations. The run's life around this is ``trainers/run.py``'s.

Counters: ``generation``, ``frames`` and ``episodes`` advance by whole
generations, and a checkpoint holds them with the state they produced. A
long generation (Atari: minutes) is followed while it runs: a progress line
(members finished, frames, frames/s, the longest episode still playing) and
the frame budget see its frames as they are stepped, and a run that stops
inside it (budget, Ctrl-C) reports them in summary.json. Its checkpoint
still holds the last whole generation, so a resumed run evaluates the
abandoned one again and counts its frames anew: summary.json's ``frames``
are the checkpoint's plus those of the generation the run stopped inside.

With ``--learners G`` each rank evaluates its part of every population
(``trainers/evolvers.py``, docs/distributed.md); the counters advance by
every rank's frames and episodes, and the budgets are judged between
generations, together.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, ClassVar

import torch

from seedlocal.algos import ars, es, ga, random_search
from seedlocal.algos.neuroevo import NOISE_TABLE_SEED, ParamSpace
from seedlocal.config.checks import (check_network_fits, network_error, task_kind, validate_bridge,
                                     validate_pipeline, validate_run_options)
from seedlocal.config.resume import budget_left
from seedlocal.config.machine import Machine
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig, RunConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.errors import ConfigError, fail
from seedlocal.networks import PolicyNet, action_identity, checkpoint_network, encoder_identity, obs_identity
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.population import PopulationPolicy
from seedlocal.policies.population_forward import strategies
from seedlocal.shape import pipeline_shape, widened
from seedlocal.trainers.evolvers import ARSEvolver, ESEvolver, Evolver, GAEvolver, RandomSearchEvolver
from seedlocal.trainers.run import Family, Run, Trainer, blank, checkpoint_env, image_frames, rebuilding, run


def _pipeline_default() -> PipelineConfig:
    # Slots are scratch here (no learner reads them): short unrolls, few buffers.
    return PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=8)


@dataclass
class NeuroevoRun(RunConfig):
    # Each algorithm's run names its own parts (class attributes: neither a dataclass field nor a tyro option).
    name: ClassVar[str]
    """the command's name (``seedlocal train <name>``), the checkpoint identity's algo and the run name's part"""
    algo_module: ClassVar[ModuleType]
    """the algorithm's math (``algos/``), whose ``validate`` checks ``algo``"""
    evolver: ClassVar[type[Evolver]]
    """what runs its generations (``trainers/evolvers.py``)"""

    pipeline: PipelineConfig = field(default_factory=_pipeline_default)
    generations: int = 100
    """generations to run (0 = until another budget ends); a checkpoint is written after each"""
    total_frames: int = 0
    """emulator frames to spend (0 = no frame budget)"""
    episodes_per_member: int = 1
    """episodes averaged into each member's fitness"""
    best_episodes: int = 5
    """episodes that score the best member each generation (ES centre, random-search winner)"""
    max_episode_frames: int = -1
    """end an evaluation episode after this many emulator frames (steps x frame skip), scored on its return so
    far: -1 = by env kind (20,000 for image frames, as the deep-GA paper's Atari runs; 10,000 for small grids;
    none otherwise), 0 = never"""
    greedy: bool = True
    """act by argmax (the deep-GA convention) rather than sampling (Discrete actions)"""
    action_noise: float = 0.0
    """Box actions: std of Gaussian noise added to each action while evaluating (Salimans et al.: 0.01)"""
    reward_shift: float = 0.0
    """taken from every step's reward in the fitness, not in the returns reported"""
    remove_survival_bonus: bool = False
    """take MuJoCo locomotion's survival bonus out of the fitness (Hopper, Walker2d, Ant: 1 per step; Humanoid:
    5), as ARS does, so that standing still scores nothing; other envs are unchanged"""
    forward: str = "auto"
    """population forward: auto (times the others on the first batches and keeps the fastest);
    MLPs: bmm, mulsum, vmap; the MinAtar and Nature CNNs: bmm, vmap, loop; the IMPALA ResNet: vmap, loop"""

    def budget_spent(self, counters: dict) -> None:
        budget_left("generations", self.generations, counters.get("generation", 0), "generations")
        budget_left("total_frames", self.total_frames, counters.get("frames", 0), "frames")

    def per_rank(self, ranks: int) -> NeuroevoRun:
        """Unchanged: every rank asks the whole population and evaluates its part (``trainers/evolvers.py``) on
        its shape's envs (the run's divided). More ranks than members, or than the envs divide among, are refused
        (the command line asks before it starts any rank)."""
        if ranks > self.algo.population_size:
            fail("learners", ranks, f"each rank evaluates a part of the population of {self.algo.population_size}: "
                 "give at most that many ranks")
        pipeline_shape(self.pipeline, self.bridge, ranks=ranks)
        return self

    def sized_for(self, machine: Machine) -> NeuroevoRun:
        """On a GPU, image frames get ``machine.gpu_envs`` envs in workers of 32 and a population of at least 256
        (issue 33's GA target: P >= 256 Nature CNNs in one batched forward) and at least one member per env;
        everything else, and every CPU run, keeps the preset's sizes (docs/tuning.md)."""
        if not machine.accelerator or not hasattr(self.algo, "population_size") or not image_frames(self.env):
            return self
        # Unmeasured on a GPU: the envs follow V-trace's measured 8 per core; the population is the target.
        p = widened(self.pipeline, machine.gpu_envs(), GPU_ENVS_PER_WORKER, self.bridge.remote_envs)
        population = max(GPU_POPULATION, self.algo.population_size, pipeline_shape(p).num_local_envs)
        return dataclasses.replace(self, pipeline=p, algo=dataclasses.replace(self.algo, population_size=population))


GPU_ENVS_PER_WORKER = 32  # the default pipeline's workers
GPU_POPULATION = 256  # even, as ES's antithetic pairs need


@dataclass
class GARun(NeuroevoRun):
    name: ClassVar[str] = "ga"
    algo_module: ClassVar[ModuleType] = ga
    evolver: ClassVar[type[Evolver]] = GAEvolver

    algo: ga.GAParams = field(default_factory=ga.GAParams)


@dataclass
class ESRun(NeuroevoRun):
    name: ClassVar[str] = "es"
    algo_module: ClassVar[ModuleType] = es
    evolver: ClassVar[type[Evolver]] = ESEvolver

    algo: es.ESParams = field(default_factory=es.ESParams)


@dataclass
class RandomSearchRun(NeuroevoRun):
    name: ClassVar[str] = "random-search"
    algo_module: ClassVar[ModuleType] = random_search
    evolver: ClassVar[type[Evolver]] = RandomSearchEvolver

    algo: random_search.RSParams = field(default_factory=random_search.RSParams)


@dataclass
class ARSRun(NeuroevoRun):
    name: ClassVar[str] = "ars"
    algo_module: ClassVar[ModuleType] = ars
    evolver: ClassVar[type[Evolver]] = ARSEvolver

    algo: ars.ARSParams = field(default_factory=ars.ARSParams)


def _mujoco_pipeline(envs: int, workers: int = 2) -> PipelineConfig:
    # Every member's episode at once where the cores allow: episodes last up to 1,000 steps.
    return PipelineConfig(num_workers=workers, envs_per_worker=envs // workers, unroll_length=8)


def _grid_pipeline() -> PipelineConfig:
    # MinAtar's games step in Python at tens of thousands of steps/s: every member's episode at once.
    return PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=8)


# Atari frames: Uber's released Atari configurations (deep-neuroevolution, gpu_implementation/configurations/
# ga_atari_config.json and es_atari_config.json): GA mutation power 0.002 (P = 1,000, the top 20 as parents,
# 10 elite candidates over 30 episodes there); ES sigma 0.02, Adam 0.01, L2 0.005 (P = 5,000 there, on a
# network with virtual batch norm, which seedlocal's Nature CNN has not). Populations of 64, one env slot per
# member; a generation takes many minutes on a CPU, so runs are bounded by time.
# Small grids (MinAtar, docs/minatar.md): the one-conv torso as both learners use it; sticky actions make
# every episode noisy, so the ES centre and the GA elite are scored over 5 episodes.
# Continuous control (docs/mujoco.md): the networks, noise and normalisation of each paper, the populations
# scaled to a workstation's cores (the papers ran hundreds to thousands of CPUs). ES takes the survival bonus out
# of the fitness, as ARS does: with it in, ES on Hopper-v5 stood still at ~1,000 for 10 minutes; without it three
# seeds climbed to 1,136-2,892 in the same time (docs/mujoco.md).
ES_PRESETS: dict[str, ESRun] = {
    "cartpole": ESRun(),
    "atari": ESRun(
        env=EnvConfig(id="Frostbite-v5"), generations=0, seconds=3600.0, best_episodes=5,
        algo=es.ESParams(population_size=64, sigma=0.02, learning_rate=0.01, weight_decay=0.005)),
    "minatar": ESRun(
        env=EnvConfig(id="MinAtar/Breakout-v1"), pipeline=_grid_pipeline(), generations=0, seconds=600.0,
        best_episodes=5, algo=es.ESParams(population_size=64, sigma=0.02, learning_rate=0.01, weight_decay=0.005)),
    "mujoco": ESRun(
        env=EnvConfig(id="HalfCheetah-v5"), pipeline=_mujoco_pipeline(40), generations=0, seconds=3600.0,
        network=NetworkConfig(hidden=(64, 64), obs_norm=True), action_noise=0.01, best_episodes=3,
        remove_survival_bonus=True,
        algo=es.ESParams(population_size=40, sigma=0.02, learning_rate=0.01, weight_decay=0.005)),
}
GA_PRESETS: dict[str, GARun] = {
    "cartpole": GARun(),
    "atari": GARun(
        env=EnvConfig(id="Frostbite-v5"), generations=0, seconds=3600.0,
        algo=ga.GAParams(population_size=64, truncation=16, sigma=0.002, elite_candidates=4, elite_episodes=5)),
    "minatar": GARun(
        env=EnvConfig(id="MinAtar/Breakout-v1"), pipeline=_grid_pipeline(), generations=0, seconds=600.0,
        algo=ga.GAParams(population_size=64, truncation=16, sigma=0.01, elite_candidates=4, elite_episodes=5)),
    "mujoco": GARun(
        env=EnvConfig(id="HalfCheetah-v5"), pipeline=_mujoco_pipeline(64), generations=0, seconds=3600.0,
        network=NetworkConfig(hidden=(64, 64), obs_norm=True),
        algo=ga.GAParams(population_size=64, truncation=16, sigma=0.02, elite_candidates=4, elite_episodes=3)),
}
RANDOM_SEARCH_PRESETS: dict[str, RandomSearchRun] = {"cartpole": RandomSearchRun()}
# ARS V2-t: a linear policy on normalised states, the survival bonus out of the fitness.
ARS_PRESETS: dict[str, ARSRun] = {
    "cartpole": ARSRun(),
    "mujoco": ARSRun(
        env=EnvConfig(id="HalfCheetah-v5"), pipeline=_mujoco_pipeline(16), generations=0, seconds=3600.0,
        network=NetworkConfig(hidden=(), obs_norm=True), remove_survival_bonus=True, best_episodes=2,
        algo=ars.ARSParams(directions=8, top=4, step_size=0.02, noise=0.03)),
}


def validate(cfg: NeuroevoRun):
    validate_run_options(cfg)
    validate_pipeline(cfg.pipeline)
    shape = pipeline_shape(cfg.pipeline, cfg.bridge)
    if cfg.pipeline.cuda_graphs:
        fail("pipeline.cuda_graphs", True, "population evaluation does not use it (its batches change members every step)")
    validate_bridge(cfg.bridge, cfg.pipeline)
    spec = validate_env(cfg.env)
    cfg.algo_module.validate(cfg.algo)
    for name in ("generations", "total_frames"):
        if getattr(cfg, name) < 0:
            fail(name, getattr(cfg, name), "must be >= 0")
    if cfg.seconds < 0:
        fail("seconds", cfg.seconds, "must be >= 0")
    if not (cfg.generations or cfg.total_frames or cfg.seconds):
        fail("generations", 0, "with no frame or time budget the run would never end")
    for name in ("episodes_per_member", "best_episodes"):
        if getattr(cfg, name) < 1:
            fail(name, getattr(cfg, name), "must be positive")
    if cfg.max_episode_frames < -1:
        fail("max_episode_frames", cfg.max_episode_frames, "must be >= 0 (0 = no cap), or -1 (by env kind)")
    for name in ("action_noise", "reward_shift"):
        if not getattr(cfg, name) >= 0:
            fail(name, getattr(cfg, name), "must be >= 0")
    if cfg.action_noise and spec.num_actions is not None:
        fail("action_noise", cfg.action_noise, "perturbs Box actions; this env's actions are Discrete")
    if cfg.network.lstm_size:
        fail("network.lstm_size", cfg.network.lstm_size, "a genome is a feed-forward network here: leave it 0")
    try:
        # The population's vectors and one row per env slot, at least.
        copies = cfg.algo.population_size + shape.num_envs
        net = check_network_fits(lambda: build_policy(cfg, spec), copies, "network.hidden",
                                 f"{copies:,} copies (the population's vectors and one per env slot)")
    except ValueError as e:
        raise ConfigError(network_error(e)) from None
    forwards = ("auto",) + strategies(net)
    if cfg.forward not in forwards:
        fail("forward", cfg.forward, f"expected one of {', '.join(forwards)} for a {net.kind} network")
    return spec


# The per-step survival bonus ("healthy reward") of Gymnasium's MuJoCo locomotion tasks (v4, v5), by name.
SURVIVAL_BONUS = {"Hopper": 1.0, "Walker2d": 1.0, "Ant": 1.0, "Humanoid": 5.0}


def fitness_shift(cfg: NeuroevoRun, spec) -> float:
    """What the fitness takes from every step's reward."""
    base = spec.env_id.split(":")[-1].split("-")[0]
    return cfg.reward_shift + (SURVIVAL_BONUS.get(base, 0.0) if cfg.remove_survival_bonus else 0.0)


# Atari episodes end after this many frames unless --max-episode-frames says otherwise. The deep GA (Such et al.
# 2017, arXiv:1712.06567) capped them at 20,000 frames, as we recall the paper; Uber's released code agrees
# (uber-research/deep-neuroevolution: configurations/frostbite_ga.json and
# gpu_implementation/configurations/ga_atari_config.json set episode_cutoff_mode 5000 steps, and
# gpu_implementation/ga.py evaluates with max_frames = 5000 * 4). Salimans et al. 2017's ES code also cuts
# episodes at a timestep limit (an adaptive one, as we recall); we do not recall a number of theirs, so none
# is used here. Without a cap, one member that survives without scoring holds its whole generation up to the
# emulator's own limit (envpool's Atari v5: 27,000 steps, 108,000 frames).
ATARI_EPISODE_FRAMES = 20_000
# MinAtar's games have no time limit but Freeway's 2,500 frames, and a member that keeps Breakout's ball in play
# never ends its episode: 10,000 frames (= steps) is four Freeway episodes, far past what the papers' agents
# reach per episode in 5M frames.
GRID_EPISODE_FRAMES = 10_000


def episode_frame_cap(cfg: NeuroevoRun, spec) -> int:
    """Frames after which an evaluation episode ends (0: none): ``max_episode_frames``, or with -1 the
    deep-GA cap for image frames (Atari; football too, whose episodes envpool ends first, at 400 to 3,000
    steps), ``GRID_EPISODE_FRAMES`` for small grids (MinAtar) and none for other envs."""
    if cfg.max_episode_frames >= 0:
        return cfg.max_episode_frames
    kind = task_kind(spec)
    return ATARI_EPISODE_FRAMES if kind in ("atari", "football") else GRID_EPISODE_FRAMES if kind == "minatar" else 0


def episode_step_cap(cfg: NeuroevoRun, spec) -> int:
    """``episode_frame_cap`` in agent steps: an episode ends at the first step whose frames reach the cap."""
    return -(-episode_frame_cap(cfg, spec) // spec.frames_per_step)


def build_policy(cfg: NeuroevoRun, spec) -> PolicyNet:
    n = cfg.network
    return PolicyNet(spec, n.encoder, tuple(n.hidden), obs_norm=n.obs_norm)


def identity(cfg: NeuroevoRun, spec) -> dict:
    return {"algo": cfg.name, "env_id": spec.env_id, "num_actions": spec.num_actions,
            **obs_identity(spec), **action_identity(spec), "network": "policy",
            **encoder_identity(spec, cfg.network.encoder), "hidden": list(cfg.network.hidden),
            **({"obs_norm": True} if cfg.network.obs_norm else {}),
            # Genomes name slices of this table: vectors rebuilt from another would differ.
            "noise": f"table seed {NOISE_TABLE_SEED:#x}"}


LONG_GENERATION_S = 120.0  # a generation this long is told about, once


class _BudgetSpent(Exception):
    """A budget (``args[0]``: "seconds" or "frames") ended inside a generation."""


class NeuroevoTrainer(Trainer):
    x_axis = "generation"
    checkpoint_parts = ("algo_state", "best_params", "best_return", "counters")
    consume = False  # unrolls are scratch here: no learner reads them

    @classmethod
    def algo_name(cls, cfg) -> str:
        return cfg.name

    def __init__(self, cfg: NeuroevoRun, spec, device, ranks: Solo = Solo()):
        super().__init__(cfg, spec, device, ranks)
        self.algo = cfg.name
        self.template = build_policy(cfg, spec)
        self.space = ParamSpace(self.template)
        self.evolver = cfg.evolver(cfg, self.space)
        self.counters = {"generation": 0, "frames": 0, "episodes": 0}
        self.gen_s, self.frames_run = 0.0, 0  # time inside generations (this session): the rate leaves start-up out
        self.reached, self.generated = False, False
        self.values: dict = {}
        self._counted = (0, 0, 0, 0)  # ``_totals`` when the counters last advanced
        self._inside: float | None = None  # when the generation in evaluation began; None between generations
        self._obs_norm = self.template.obs_norm  # as of the last whole generation (see advance)

    def identity(self) -> dict:
        return identity(self.cfg, self.spec)

    def restore(self, saved: dict) -> None:
        self.evolver.restore(saved["algo_state"])
        self.evolver.best_params, self.evolver.best_return = saved["best_params"], saved["best_return"]
        if self.template.obs_norm is not None:
            self.template.obs_norm.load_state_dict(saved["obs_norm"])

    def state(self) -> dict:
        out = {"algo_state": self.evolver.state_dict(), "best_params": self.evolver.best_params,
               "best_return": self.evolver.best_return}
        if self._obs_norm is not None:  # the population's shared statistics (no genome holds them)
            out["obs_norm"] = self._obs_norm.state_dict()
        return out

    def acting_state(self) -> dict | None:
        """The best member so far (the elite, the ES centre), as a checkpoint holds it."""
        if self.evolver.best_params is None:
            return None
        out = {"best_params": self.evolver.best_params}
        if self._obs_norm is not None:
            out["obs_norm"] = self._obs_norm.state_dict()
        return out

    def position(self) -> tuple[int, int]:
        return self.counters["generation"], self.counters["frames"]

    def join_ranks(self, ranks) -> None:
        """Split populations: every rank holds the same state already (from the run's seed, or from the same
        checkpoint); each evaluates its part of every population (``Evolver.ranks``)."""
        self.evolver.ranks = ranks

    def describe(self) -> str:
        cap = episode_frame_cap(self.cfg, self.spec)
        return (f"{self.algo} on {self.spec.env_id}, {self.space.size:,d} parameters per network"
                + (f", episodes cut at {cap:,d} frames" if cap else ""))

    def policy(self):
        cfg = self.cfg
        self.population = PopulationPolicy(self.template, self.shape.envs_per_group,
                                           self.shape.num_groups, self.device, greedy=cfg.greedy,
                                           strategy=cfg.forward, action_noise=cfg.action_noise,
                                           reward_shift=fitness_shift(cfg, self.spec),
                                           max_episode_steps=episode_step_cap(cfg, self.spec))
        if self.ranks.world > 1:
            self.population.pool_stats = self.ranks.pool_moments
        return self.population

    def learner_threads(self) -> int:
        return self.cfg.pipeline.learner_threads or torch.get_num_threads()

    def start(self, run: Run) -> None:
        self._counted = self._totals(run.loop)

    def spent(self, run: Run) -> str | None:
        cfg, c = self.cfg, self.counters
        if self.reached:
            return "target"
        return next((budget for budget, over in (
            ("generations", cfg.generations and c["generation"] >= cfg.generations),
            ("frames", cfg.total_frames and c["frames"] >= cfg.total_frames),
            ("seconds", self._out_of_time(run))) if over), None)

    def _out_of_time(self, run: Run) -> bool:
        """Whether the time budget has ended: for one rank, for all (a rank that stopped alone would leave the
        others waiting in the next fitness all-gather)."""
        if self.ranks.world == 1:
            return run.out_of_time()
        return bool(self.ranks.sum([float(run.out_of_time())])[0])

    def _totals(self, loop) -> tuple[int, int, int, int]:
        """Running totals the counters advance by: rows served to members
        (each one step of a member's episode), env steps (idle slots and
        auto-reset steps too: a group steps all its envs), evaluation
        episodes scored, and those of them the frame cap ended."""
        pop = self.population
        return pop.forward_envs, loop.stats.env_steps, pop.episodes_scored, pop.episodes_capped

    def _uncounted(self) -> tuple[int, int]:
        """(frames, episodes) of evaluation played since the counters last
        advanced: the generation in evaluation's so far."""
        pop, (served, _, scored, _) = self.population, self._counted
        return (pop.forward_envs - served) * self.frames_per_step, pop.episodes_scored - scored

    def advance(self, run: Run) -> str | None:
        """One generation, evaluated in the pipeline, then its scalars."""
        pop, pool = self.population, run.pipe.pool
        t0 = self._inside = time.monotonic()
        w0, fwd0 = pool.worker_stats(), pop.forward_s
        self.generated = False
        try:
            stats = self.evolver.generation(pop, self._watch_generation(run, t0))
        except _BudgetSpent as spent:
            return spent.args[0]  # still inside: the summary counts what this generation stepped
        # The statistics the next population plays under (committed inside
        # the generation): a checkpoint pairs them with the state that asked it.
        self._obs_norm = self.template.obs_norm
        self._count_generation(run, stats, t0, w0, fwd0)
        if self.cfg.stop_at_return and stats["best_member_return"] >= self.cfg.stop_at_return:
            c = self.counters
            self.reached = True  # spent() says so once this generation is logged and saved
            run.summary.update(generations_to_target=c["generation"], frames_to_target=c["frames"],
                               steps_to_target=c["frames"] // self.frames_per_step)
        self.generated = True
        return None

    def _watch_generation(self, run: Run, t0: float) -> Callable[[], None]:
        """What a generation calls every 0.5 s while it waits for episodes
        (Job.wait: a blocking wait, no spinning). The budgets hold inside a
        generation too (long or endless episodes, a hung env), abandoning it
        (``_BudgetSpent``); the checkpoint keeps the last whole one."""
        c, told, watching = self.counters, [False], [False]

        def check() -> None:
            if not watching[0]:
                # The envs owe steps from the first wait on, not while the
                # population is built (64 Nature CNNs: seconds).
                watching[0] = True
                run.watch.start()
            if run.waiting(t0):
                raise _BudgetSpent("seconds")
            # Data-parallel ranks judge budgets between generations only, together (``spent``).
            if (self.cfg.total_frames and self.ranks.world == 1
                    and c["frames"] + self._uncounted()[0] >= self.cfg.total_frames):
                raise _BudgetSpent("frames")
            self._progress_inside(run, t0)
            if time.monotonic() - t0 >= LONG_GENERATION_S and not told[0]:
                told[0] = True
                print(f"\nseedlocal: generation {c['generation'] + 1} has waited {LONG_GENERATION_S:.0f} s for its "
                      "episodes to end (members are scored on whole episodes; if this env's episodes never end, "
                      "cap them with --max-episode-frames N, register it with a time limit, "
                      "gymnasium.register(..., max_episode_steps=N), or give --seconds)", flush=True)

        return check

    def _count_generation(self, run: Run, stats: dict, t0: float, w0: dict, fwd0: float) -> None:
        """The counters advance by the generation just evaluated (begun at
        ``t0``, when the workers' times were ``w0`` and the forward time
        ``fwd0``), and its scalars are made."""
        loop, pop, c = run.loop, self.population, self.counters
        dt = time.monotonic() - t0
        self.gen_s += dt
        # Read once: the inference thread goes on serving the next population,
        # whose rows count towards the next generation.
        counted = self._totals(loop)
        moved = [now - then for now, then in zip(counted, self._counted)]
        if self.ranks.world > 1:  # every rank's: the counters and rank 0's scalars are the run's
            moved = [int(v) for v in self.ranks.sum(moved)]
        served, stepped, scored, capped = moved
        self._counted, self._inside = counted, None
        frames, w1 = served * self.frames_per_step, run.pipe.pool.worker_stats()
        c["generation"] += 1
        c["frames"] += frames
        self.frames_run += frames
        c["episodes"] += scored
        loop.stats.episodes.take()
        self.values = {f"charts/{k}": v for k, v in stats.items()}
        self.values.update({
            "charts/frames": c["frames"], "charts/episodes": c["episodes"],
            "perf/frames_per_generation": frames, "perf/frames_per_s": frames / dt,
            "perf/idle_share": 1.0 - served / stepped if stepped else 0.0, "perf/generation_s": dt,
            "perf/env_time_s": (w1["env_s"] - w0["env_s"]) / max(1, w1["threads"]),
            "perf/inference_time_s": pop.forward_s - fwd0,
            "perf/capped_share": capped / scored if scored else 0.0,
            "perf/worker_restarts": loop.stats.restarts,
        })

    def _progress_inside(self, run: Run, t0: float) -> None:
        """The progress line while a generation runs (the monitor rate-limits
        it: live on a terminal, every 10 s in a log file)."""
        jobs, pop = self.evolver.evaluating, self.population
        frames = self._uncounted()[0]
        dt = max(time.monotonic() - t0, 1e-9)
        run.monitor.progress(
            f"gen {self.counters['generation'] + 1:>4d}  members {sum(j.members_done() for j in jobs):>4d}"
            f"/{sum(j.members for j in jobs)} finished  frames {self.counters['frames'] + frames:>12,d}  "
            f"frames/s {frames / dt:>9,.0f}  longest episode {pop.longest_running() * self.frames_per_step:,d} "
            f"frames  {dt:,.0f} s")

    def log_due(self, run: Run, now: float) -> bool:
        return self.generated  # once per generation, with the generation as the x axis

    save_due = log_due

    def log(self, run: Run, now: float, last: bool = False) -> None:
        v = dict(self.values)
        if run.meter is not None:
            v.update(run.meter.scalars())
        run.monitor.scalars(self.counters["generation"], v)
        run.monitor.progress(
            f"gen {self.counters['generation']:>4d}  best {v['charts/best_fitness']:8.1f}  "
            f"mean {v['charts/mean_fitness']:8.1f}  best member {v['charts/best_member_return']:8.1f}  "
            f"frames {self.counters['frames']:>12,d}  frames/s {v['perf/frames_per_s']:>9,.0f}")

    def results(self, run: Run) -> dict:
        c, best = self.counters, self.evolver.best_return
        # A run stopped inside a generation (budget, Ctrl-C, error) reports the
        # frames it stepped there too; its checkpoint does not hold them.
        inside, (more_frames, more_episodes) = self._inside is not None, self._uncounted()
        if not inside:
            more_frames = more_episodes = 0
        gen_s = self.gen_s + (time.monotonic() - self._inside if inside else 0.0)
        frames = c["frames"] + more_frames
        return {"algo": self.algo, "env": self.spec.env_id, "generations": c["generation"],
                "steps": frames // self.frames_per_step, "frames": frames, "episodes": c["episodes"] + more_episodes,
                "best_member_return": best if math.isfinite(best) else None,
                "frames_per_s": round((self.frames_run + more_frames) / gen_s, 1) if gen_s else None,
                "forward": self.population.forward.strategy, "population": self.cfg.algo.population_size,
                **{k: run.summary.get(k) for k in ("generations_to_target", "steps_to_target", "frames_to_target")}}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        best = f"{self.evolver.best_return:.1f}" if math.isfinite(self.evolver.best_return) else "-"
        g = self.counters["generation"]
        frames = summary.get("frames", self.counters["frames"])  # with a generation stopped inside
        return (f"{g} generations, {frames:,d} frames, best member return {best}",
                None if g else "stopped before the first generation ended")


def train(cfg: NeuroevoRun) -> dict:
    return run(NeuroevoTrainer, cfg, validate(cfg), from_checkpoint)


def from_checkpoint(state: dict, device: torch.device, greedy: bool | None = None, epsilon: float = 0.0) -> PopulationPolicy:
    """A checkpoint's best member acting alone by the population's rule: argmax or a sample over Discrete
    actions as the run's ``greedy`` option said (``greedy`` None) or as asked, the output itself over a Box; with
    the population's observation statistics. ``epsilon`` is R2D2's; neuroevolution acts without it."""
    ident = state.get("identity", {})
    spec = checkpoint_env(state)
    with rebuilding(state):
        cfg = NeuroevoRun(network=checkpoint_network(ident, spec))
        net = blank(lambda: build_policy(cfg, spec))
        torch.nn.utils.vector_to_parameters(state["best_params"].float(), net.parameters())
        if net.obs_norm is not None:  # the population's shared statistics, saved beside the genomes
            net.obs_norm.load_state_dict(state["obs_norm"])
    trained = bool(state.get("config", {}).get("greedy", True))
    return PopulationPolicy.serving(net.to(device).eval(), spec, greedy=trained if greedy is None else greedy)


FAMILIES = tuple(Family(cls.name, cls, presets, train, from_checkpoint, data_parallel=True) for cls, presets in (
    (GARun, GA_PRESETS), (ESRun, ES_PRESETS), (ARSRun, ARS_PRESETS), (RandomSearchRun, RANDOM_SEARCH_PRESETS)))
