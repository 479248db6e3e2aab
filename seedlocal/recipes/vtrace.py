"""V-trace's recipe (``seedlocal train vtrace``; ``recipes/__init__.py``). The trainer is ``trainers/vtrace.py``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from seedlocal.algos.frames import net_spec, stack_problem, stacking
from seedlocal.algos.vtrace import VTraceParams
from seedlocal.config.checks import check_network_fits
from seedlocal.config.machine import Machine
from seedlocal.algos import pbt
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig, PopulationConfig, StepRunConfig
from seedlocal.errors import fail, fail_if
from seedlocal.networks import ActorCritic, action_identity, encoder_identity, obs_identity
from seedlocal.recipes import Given, Kind, Recipe
from seedlocal.shape import ShapeNeeds, sized_pipeline, whole_groups


@dataclass
class VTraceRun(StepRunConfig):
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=8, unroll_length=16, min_batch_envs=4))
    algo: VTraceParams = field(default_factory=VTraceParams)
    population: PopulationConfig = field(default_factory=PopulationConfig)
    """several learners in one run (docs/populations.md)"""


GPU_ENVS_PER_WORKER = 32  # a sized run's workers (issue 33's H200 run: 4 workers of 32)
UNROLLS_PER_MINIBATCH = 16  # the H200 run's 128 unrolls in 8 minibatches; the 2-core Atari preset's are 4


def sizing(cfg: VTraceRun, kind: Kind, machine: Machine, given: Given) -> dict:
    """On a GPU, image frames (Atari, Football) get ``machine.gpu_envs`` envs in workers of 32, a batch of every
    local env (whole groups), minibatches of 16 unrolls, and a constant learning rate over twice the step
    budget (issue 33's sized H200 run still learned past where the preset's rate decays to 0: docs/gpu.md);
    MinAtar's lets its actors run ahead (algo.sync off). Others, and every CPU run, keep the preset (docs/tuning.md)."""
    if not machine.accelerator:
        return {}
    if kind.name == "minatar":
        # Actors run ahead where that reached the target in no more frames than sync on (MinAtar Breakout, 3
        # seeds: docs/tuning.md); its sizes stay. Atari keeps sync on: its clip 0.1 is unmeasured at a lag.
        return {} if given("algo.sync") or cfg.algo.sync == "off" else {"algo.sync": "off"}
    pipe, local = sized_pipeline(cfg.pipeline, machine.gpu_envs(), GPU_ENVS_PER_WORKER, cfg.bridge.remote_envs, given)
    if not kind.frames or not pipe:
        return {}
    # Measured at 16 cores on Atari only; twice the preset's budget covers the 16M frames that run went to at
    # its constant rate (docs/tuning.md, "What was measured" and "What is not").
    batch = cfg.algo.batch_size if given("algo.batch_size") else local
    out = {**pipe, "algo.batch_size": batch, "algo.minibatches": max(1, batch // UNROLLS_PER_MINIBATCH),
           "algo.lr_decay": False, "total_steps": 2 * cfg.total_steps}
    return {k: v for k, v in out.items() if not given(k)}


def derive(cfg: VTraceRun, given: Given) -> dict:
    """A batch the user did not give, rounded up to whole groups of the pipeline that holds, for each member."""
    members = max(1, cfg.population.size)
    batch = whole_groups(-(-cfg.algo.batch_size // members), cfg.pipeline) * members
    return {} if given("algo.batch_size") or batch == cfg.algo.batch_size else {"algo.batch_size": batch}


def per_rank(cfg: VTraceRun, ranks: int, shape_of) -> VTraceRun:
    """A rank's batch: algo.batch_size / G unrolls where that is a whole number of its groups (of its shape,
    ``shape_of(cfg)``), so that G ranks' update is the one-process recipe's (the same rows per update and per
    minibatch); else the whole batch on every rank. Every env remote: the batch stays whole."""
    batch, share = cfg.algo.batch_size, cfg.algo.batch_size // ranks
    # (An LSTM's minibatches hold whole unrolls: at most a rank's batch of them.)
    if cfg.pipeline.num_workers and ranks > 1 and batch % ranks == 0 and share % shape_of(cfg).envs_per_group == 0 \
            and cfg.algo.minibatches <= share:
        return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, batch_size=share))
    return cfg


# The presets' learner beside CartPole's: PPO's settings (lam as GAE's lambda), with each preset's own clip.
CLIPPED = dict(normalize_advantages=True, optimizer="adam", optimizer_eps=1e-5, lam=0.95, max_grad_norm=0.5,
               init="orthogonal")

PRESETS: dict[str, VTraceRun] = {
    "cartpole": VTraceRun(),
    # Sized for a workstation's data rate, not a cluster's (docs/tuning.md): small batches and many updates, on
    # envpool's v5 frames (84x84 gray), stacked 4 deep beside the network (algos/frames.py, docs/pipeline.md).
    "atari": VTraceRun(
        env=EnvConfig(id="Pong-v5", frame_stack=1), frame_stack=4,
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, unroll_length=64),
        algo=VTraceParams(**CLIPPED, batch_size=16, echo=4, minibatches=4, clip=0.1, learning_rate=2.5e-4,
                          entropy_cost=0.01, reward_clip=1.0, separate_critic=False),
        network=NetworkConfig(encoder="nature"), total_steps=2_500_000,
    ),
    # Small pixel grids (MinAtar's 10 x 10 x C, docs/minatar.md): the Atari preset's learner on shorter unrolls, in
    # fewer passes at a larger step size: the network is tiny, so the CPU learner's cost is per minibatch, not weight.
    "minatar": VTraceRun(
        env=EnvConfig(id="MinAtar/Breakout-v1"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=32),
        algo=VTraceParams(**CLIPPED, batch_size=32, echo=2, minibatches=4, clip=0.2, learning_rate=1e-3,
                          discount=0.99, entropy_cost=0.01, separate_critic=False),
        network=NetworkConfig(encoder="minatar"), total_steps=5_000_000,
    ),
    # SEED's Google Research Football (docs/football.md) on envpool's gfootball/ ids: one 72 x 96 x 4 minimap
    # (SMM) frame and the scoring reward; the Atari preset's rhythm and Nature CNN, with the longer horizon
    # and smaller entropy bonus of GRF's own PPO scripts (gamma 0.993, entropy 0.003), 19 actions.
    "football": VTraceRun(
        env=EnvConfig(id="gfootball/academy_empty_goal_close-v1"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, unroll_length=32),
        algo=VTraceParams(**CLIPPED, batch_size=16, echo=4, minibatches=4, clip=0.1, learning_rate=3.4e-4,
                          discount=0.993, entropy_cost=0.003, reward_clip=1.0, separate_critic=False),
        network=NetworkConfig(encoder="nature"), total_steps=1_000_000,
    ),
    # Continuous control as SEED's MuJoCo PPO config and "What Matters in On-Policy RL" run it (docs/mujoco.md):
    # separate 2 x 64 tanh MLPs for policy and value, a Gaussian with a state-independent std.
    "mujoco": VTraceRun(
        env=EnvConfig(id="HalfCheetah-v5"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, unroll_length=128),
        algo=VTraceParams(**CLIPPED, batch_size=16, echo=10, minibatches=32, clip=0.2, learning_rate=3e-4,
                          discount=0.99, entropy_cost=0.0, separate_critic=True, reward_scale=True, init_std=0.5),
        network=NetworkConfig(obs_norm=True), total_steps=1_000_000,
    ),
}


def identity(cfg: VTraceRun, spec) -> dict:
    """What a checkpoint must match to be resumed or evaluated with this config."""
    a, n, stack = cfg.algo, cfg.network, stacking(spec, cfg.frame_stack)
    # The frame stacks only where set: checkpoints from before them keep the identity they were saved with.
    stacks = {**({"env_frame_stack": spec.frame_stack} if spec.frame_stack else {}),
              **({"frame_stack": stack} if stack > 1 else {})}
    return {"algo": "vtrace", "env_id": spec.env_id, "num_actions": spec.num_actions,
            **obs_identity(spec), **action_identity(spec), **stacks,
            **encoder_identity(net_spec(spec, stack), n.encoder), "hidden": list(n.hidden), "lstm_size": n.lstm_size,
            "separate_critic": a.separate_critic, **({"obs_norm": True} if n.obs_norm else {}),
            "optimizer": a.optimizer}


def build_model(cfg: VTraceRun, spec) -> ActorCritic:
    a, n = cfg.algo, cfg.network
    return ActorCritic(net_spec(spec, stacking(spec, cfg.frame_stack)), encoder=n.encoder, hidden=tuple(n.hidden),
                       lstm_size=n.lstm_size, separate_critic=a.separate_critic, init=a.init, obs_norm=n.obs_norm,
                       init_std=a.init_std)


def shape_needs(cfg: VTraceRun) -> ShapeNeeds:
    """Batches of whole groups, and one unroll per group, at least a batch: while the learner works on a batch,
    actors fill the next one (or, with algo.sync, wait), so the policy lag stays about one batch of updates."""
    return ShapeNeeds(batch_envs=cfg.algo.batch_size, buffers_per_group=1)


def check(cfg: VTraceRun, spec, shape) -> None:
    """V-trace's own refusals, one line each naming the field."""
    a = cfg.algo
    if (problem := stack_problem(spec, cfg.frame_stack)) is not None:
        fail("frame_stack", cfg.frame_stack, problem)
    check_population(cfg, shape)
    batch = cfg.algo.batch_size // max(1, cfg.population.size)  # a member's share (the whole without a population)
    for values in member_values(cfg):  # each member's hyperparameters (the run's own without a population)
        _check_params(dataclasses.replace(a, **values), cfg.pipeline.unroll_length, cfg.network.lstm_size, batch)
    check_network_fits(lambda: build_model(cfg, spec), 5, "network.hidden, network.lstm_size",
                       "its weights, gradients, Adam state and the actors' copy")


def _check_params(a: VTraceParams, unroll: int, lstm: int, batch: int) -> None:
    """One learner's hyperparameters (each member's in a population), its batch of ``batch`` unrolls."""
    if a.echo < 1:
        fail("algo.echo", a.echo, "must be >= 1 (updates each batch of unrolls takes part in)")
    if a.minibatches < 1:
        fail("algo.minibatches", a.minibatches, "must be >= 1 (updates per pass over a batch)")
    if lstm and a.minibatches > batch:
        fail("algo.minibatches", a.minibatches,
             f"with an LSTM a minibatch holds whole unrolls: at most a batch's ({batch})")
    if a.minibatches > batch * unroll:
        fail("algo.minibatches", a.minibatches, f"more than the {batch * unroll} rows of a batch")
    if a.proximal == "batch" and a.clip == 0:
        fail("algo.proximal", a.proximal, "keeps the clipped surrogate near the learner's policy: give algo.clip > 0")
    if not 0 <= a.clip < 1:
        fail("algo.clip", a.clip, "must be in [0, 1) (0 = IMPALA's policy gradient)")
    fail_if(lambda v: v <= 0, a, ("learning_rate", "optimizer_eps", "rho_bar", "c_bar", "init_std"), "must be positive",
            "algo.")
    fail_if(lambda v: not 0 <= v <= 1, a, ("discount", "lam"), "must be in [0, 1]", "algo.")
    fail_if(lambda v: v < 0, a, ("entropy_cost", "baseline_cost", "reward_clip", "max_grad_norm"), "must be >= 0",
            "algo.")
    if not 0 < a.rmsprop_alpha < 1:
        fail("algo.rmsprop_alpha", a.rmsprop_alpha, "must be in (0, 1)")


# The hyperparameters a member may have of its own (a sweep's and PBT's names): the ones learner_step reads at
# each batch. The network's (init, separate_critic), the batch's shape and the optimizer's kind are the run's.
MEMBER_HYPERPARAMETERS = ("learning_rate", "entropy_cost", "baseline_cost", "clip", "max_grad_norm", "discount",
                          "lam", "rho_bar", "c_bar", "reward_clip")
# Where PBT perturbs a hyperparameter with no range of --population.sweep: /10 .. x10 of its start value, capped
# where the value has a ceiling of its own.
PBT_SPAN, PBT_CAPS = 10.0, {"clip": 0.99, "discount": 1.0, "lam": 1.0}


def _space(cfg: VTraceRun) -> dict:
    space = pbt.parse_space(cfg.population.sweep, "population.sweep", known=MEMBER_HYPERPARAMETERS)
    for name, dist in space.items():  # every member hyperparameter is a number (a range's ends are checked already)
        bad = [v for v in getattr(dist, "values", ()) if isinstance(v, str) or not math.isfinite(v)]
        if bad:
            fail("population.sweep", f"{name}={','.join(map(str, dist.values))}",
                 f"{bad[0]!r} is not a finite number, which {name} is")
    return space


def member_values(cfg: VTraceRun) -> list[dict]:
    """Each member's own hyperparameters (names of ``algo``): none in mode seeds, one value set of
    --population.sweep each in sweep and pbt (drawn from population.seed)."""
    pop = cfg.population
    if pop.size <= 1 or pop.mode == "seeds":
        return [{} for _ in range(max(1, pop.size))]
    return pbt.sweep_values(_space(cfg), pop.size, pop.seed)


def pbt_space(cfg: VTraceRun) -> dict:
    """What PBT's explore perturbs: each --population.perturb name within --population.sweep's distribution
    where it gives one, else log-uniform over /10 .. x10 of its start value (capped, ``PBT_CAPS``); a name whose
    start value is 0 and has no range is left alone (a factor cannot move 0)."""
    sweep, out = _space(cfg), {}
    for name in cfg.population.perturb:
        if name in sweep:
            out[name] = sweep[name]
        elif (value := float(getattr(cfg.algo, name))) > 0:
            high = min(value * PBT_SPAN, PBT_CAPS.get(name, math.inf))
            out[name] = pbt.LogUniform(value / PBT_SPAN, max(high, value))
    return out


def check_population(cfg: VTraceRun, shape) -> None:
    """A population's refusals: members own whole env groups and whole groups of the batch; one process;
    feed-forward networks; options of the mode that is on."""
    pop, groups = cfg.population, shape.num_groups
    if pop.size < 1:
        fail("population.size", pop.size, "must be >= 1 (1 = one learner)")
    if pop.size == 1:
        if pop.mode != "seeds":
            fail("population.mode", pop.mode, "a sweep or PBT needs population.size >= 2")
        return
    if cfg.learners > 1:
        fail("learners", cfg.learners, "a population with --learners > 1 is not yet supported (its members "
             "would split across ranks): give --learners 1")
    if cfg.network.lstm_size:
        fail("network.lstm_size", cfg.network.lstm_size, "not yet with a population: its members' one inference "
             "call is vmapped, and torch.func has no vmap rule for an LSTM cell")
    for name, on in (("network.obs_norm", cfg.network.obs_norm), ("algo.reward_scale", cfg.algo.reward_scale)):
        if on:
            fail(name, on, "not yet with a population (each member would keep running statistics of its own)")
    if groups < pop.size or groups % pop.size:
        fail("population.size", pop.size, f"members own whole env groups: the run's {groups} groups (2 per "
             f"worker) do not divide among {pop.size} members; give --pipeline.num-workers "
             f"{pop.size // math.gcd(2, pop.size)} (or a multiple)")
    if shape.unrolls_per_batch % pop.size:
        fail("algo.batch_size", cfg.algo.batch_size, f"each member learns from algo.batch_size / {pop.size} envs' "
             f"unrolls, whole groups of {shape.envs_per_group}: give a multiple of {pop.size * shape.envs_per_group}")
    if pop.mode == "seeds" and pop.sweep:
        fail("population.sweep", " ".join(pop.sweep), "is for --population.mode sweep or pbt")
    if pop.mode == "sweep" and not pop.sweep:
        fail("population.sweep", "", "mode sweep needs at least one NAME=a,b,c or NAME=lo..hi")
    if pop.mode == "pbt":
        pbt.PBTParams(pop.quantile, pop.resample_probability).check()
        if pop.interval < 1:
            fail("population.interval", pop.interval, "must be >= 1 (a member's env steps between PBT rounds)")
        for name in pop.perturb:
            if name not in MEMBER_HYPERPARAMETERS:
                fail("population.perturb", name, pbt.unknown_hyperparameter(name, MEMBER_HYPERPARAMETERS))
        if not pbt_space(cfg):
            fail("population.perturb", " ".join(pop.perturb), "leaves PBT nothing to perturb (each is 0 here and "
                 "has no --population.sweep range)")


RECIPES = (Recipe("vtrace", VTraceRun, PRESETS, check, needs=shape_needs, sizing=sizing, derive=derive,
                 per_rank=per_rank),)
