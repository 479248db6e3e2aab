"""The neuroevolution families' recipes (``seedlocal train ga|es|ars|random-search``; ``recipes/__init__.py``).
The trainer is ``trainers/neuroevolution.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import ClassVar

from seedlocal.algos import ars, es, ga, random_search
from seedlocal.algos.neuroevo import NOISE_TABLE_SEED
from seedlocal.config.checks import check_network_fits
from seedlocal.config.machine import Machine
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig, RunConfig
from seedlocal.errors import fail, fail_if
from seedlocal.networks import PolicyNet, action_identity, encoder_identity, obs_identity
from seedlocal.policies.population_forward import PopulationForward
from seedlocal.recipes import Given, Kind, Recipe
from seedlocal.shape import sized_pipeline


@dataclass
class NeuroevoRun(RunConfig):
    # Each algorithm's run names its own parts (class attributes: neither a dataclass field nor a tyro option).
    name: ClassVar[str]
    """the command's name (``seedlocal train <name>``), the checkpoint identity's algo and the run name's part"""
    algo_module: ClassVar[ModuleType]
    """the algorithm's math (``algos/``), whose ``validate`` checks ``algo``"""
    budgets: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("generations", "generation", "generations"), ("total_frames", "frames", "frames"))

    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=32, unroll_length=8))  # slots are scratch (no learner reads them): short unrolls
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


@dataclass
class GARun(NeuroevoRun):
    name: ClassVar[str] = "ga"
    algo_module: ClassVar[ModuleType] = ga

    algo: ga.GAParams = field(default_factory=ga.GAParams)


@dataclass
class ESRun(NeuroevoRun):
    name: ClassVar[str] = "es"
    algo_module: ClassVar[ModuleType] = es

    algo: es.ESParams = field(default_factory=es.ESParams)


@dataclass
class RandomSearchRun(NeuroevoRun):
    name: ClassVar[str] = "random-search"
    algo_module: ClassVar[ModuleType] = random_search

    algo: random_search.RSParams = field(default_factory=random_search.RSParams)


@dataclass
class ARSRun(NeuroevoRun):
    name: ClassVar[str] = "ars"
    algo_module: ClassVar[ModuleType] = ars

    algo: ars.ARSParams = field(default_factory=ars.ARSParams)


GPU_ENVS_PER_WORKER = 32  # the default pipeline's workers
GPU_POPULATION = 256  # even, as ES's antithetic pairs need


def sizing(cfg: NeuroevoRun, kind: Kind, machine: Machine, given: Given) -> dict:
    """On a GPU, image frames get ``machine.gpu_envs`` envs in workers of 32 and a population of at least 256
    (issue 33's GA target: P >= 256 Nature CNNs in one batched forward) and at least one member per env;
    everything else, and every CPU run, keeps the preset's sizes (docs/tuning.md)."""
    if not machine.accelerator or "population_size" not in vars(cfg.algo) or not kind.frames:
        return {}  # ARS's population (2 x its directions) is not an option: its preset's sizes stay
    # Unmeasured on a GPU: the envs follow V-trace's measured 8 per core; the population is the target.
    out, local = sized_pipeline(cfg.pipeline, machine.gpu_envs(), GPU_ENVS_PER_WORKER, cfg.bridge.remote_envs, given)
    population = max(GPU_POPULATION, cfg.algo.population_size, local)
    if not given("algo.population_size") and population != cfg.algo.population_size:
        out["algo.population_size"] = population
    return out


def per_rank(cfg: NeuroevoRun, ranks: int, shape_of) -> NeuroevoRun:
    """Unchanged: every rank asks the whole population and evaluates its part (``trainers/evolvers.py``); more
    ranks than members are refused."""
    if ranks > cfg.algo.population_size:
        fail("learners", ranks, f"each rank evaluates a part of the population of {cfg.algo.population_size}: "
             "give at most that many ranks")
    return cfg


def _mujoco_pipeline(envs: int, workers: int = 2) -> PipelineConfig:
    # Every member's episode at once where the cores allow: episodes last up to 1,000 steps.
    return PipelineConfig(num_workers=workers, envs_per_worker=envs // workers, unroll_length=8)


# Atari frames: Uber's released Atari configurations (deep-neuroevolution, gpu_implementation/configurations/
# ga_atari_config.json and es_atari_config.json): GA mutation power 0.002 (P = 1,000, the top 20 as parents,
# 10 elite candidates over 30 episodes there); ES sigma 0.02, Adam 0.01, L2 0.005 (P = 5,000 there, on a
# network with virtual batch norm, which seedlocal's Nature CNN has not). Populations of 64, one env slot per
# member; a generation takes many minutes on a CPU, so runs are bounded by time.
# Small grids (MinAtar, docs/minatar.md): the one-conv torso as both learners use it, the default pipeline (its
# games step in Python at tens of thousands of steps/s: every member's episode at once); sticky actions make
# every episode noisy, so the ES centre and the GA elite are scored over 5 episodes.
# Continuous control (docs/mujoco.md): the networks, noise and normalisation of each paper, the populations
# scaled to a workstation's cores. ES takes the survival bonus out of the fitness, as ARS does: with it in, ES
# on Hopper-v5 stood still (docs/mujoco.md).
ES_PRESETS: dict[str, ESRun] = {
    "cartpole": ESRun(),
    "atari": ESRun(
        env=EnvConfig(id="Frostbite-v5"), generations=0, seconds=3600.0, best_episodes=5,
        algo=es.ESParams(population_size=64, sigma=0.02, learning_rate=0.01, weight_decay=0.005)),
    "minatar": ESRun(
        env=EnvConfig(id="MinAtar/Breakout-v1"), generations=0, seconds=600.0, best_episodes=5,
        algo=es.ESParams(population_size=64, sigma=0.02, learning_rate=0.01, weight_decay=0.005)),
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
        env=EnvConfig(id="MinAtar/Breakout-v1"), generations=0, seconds=600.0,
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


# The per-step survival bonus ("healthy reward") of Gymnasium's MuJoCo locomotion tasks (v4, v5), by name.
SURVIVAL_BONUS = {"Hopper": 1.0, "Walker2d": 1.0, "Ant": 1.0, "Humanoid": 5.0}


def fitness_shift(cfg: NeuroevoRun, spec) -> float:
    """What the fitness takes from every step's reward."""
    base = spec.env_id.split(":")[-1].split("-")[0]
    return cfg.reward_shift + (SURVIVAL_BONUS.get(base, 0.0) if cfg.remove_survival_bonus else 0.0)


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


def episode_frame_cap(cfg: NeuroevoRun, kind: Kind) -> int:
    """Frames after which an evaluation episode ends (0: none): ``max_episode_frames``, or with -1 the env
    kind's (``Kind.episode_frames``; the deep GA's 20,000 for Atari: uber-research/deep-neuroevolution's
    gpu_implementation/ga.py, max_frames = 5000 * 4). Without a cap, one member that survives without scoring
    holds its whole generation up to the emulator's own limit (envpool's Atari v5: 108,000 frames)."""
    return cfg.max_episode_frames if cfg.max_episode_frames >= 0 else kind.episode_frames


def check(cfg: NeuroevoRun, spec, shape) -> None:
    """The neuroevolution families' own refusals, one line each naming the field."""
    fail_if(bool, cfg.pipeline, ("cuda_graphs",),
            "population evaluation does not use it (its batches change members every step)", "pipeline.")
    cfg.algo_module.validate(cfg.algo)
    fail_if(lambda v: v < 0, cfg, ("generations", "total_frames", "seconds"), "must be >= 0")
    if not (cfg.generations or cfg.total_frames or cfg.seconds):
        fail("generations", 0, "with no frame or time budget the run would never end")
    fail_if(lambda v: v < 1, cfg, ("episodes_per_member", "best_episodes"), "must be positive")
    fail_if(lambda v: v < -1, cfg, ("max_episode_frames",), "must be >= 0 (0 = no cap), or -1 (by env kind)")
    fail_if(lambda v: not v >= 0, cfg, ("action_noise", "reward_shift"), "must be >= 0")
    if cfg.action_noise and spec.num_actions is not None:
        fail("action_noise", cfg.action_noise, "perturbs Box actions; this env's actions are Discrete")
    fail_if(bool, cfg.network, ("lstm_size",), "a genome is a feed-forward network here: leave it 0", "network.")
    copies = cfg.algo.population_size + shape.num_envs
    net = check_network_fits(lambda: build_policy(cfg, spec), copies, "network.hidden",
                             f"{copies:,} copies (the population's vectors and one per env slot)")
    forwards = ("auto",) + PopulationForward(net, num_slots=0, device="meta").candidates  # shapes only
    if cfg.forward not in forwards:
        fail("forward", cfg.forward, f"expected one of {', '.join(forwards)} for a {net.kind} network")


RECIPES = tuple(Recipe(cls.name, cls, presets, check, sizing=sizing, per_rank=per_rank) for cls, presets in (
    (GARun, GA_PRESETS), (ESRun, ES_PRESETS), (ARSRun, ARS_PRESETS), (RandomSearchRun, RANDOM_SEARCH_PRESETS)))
