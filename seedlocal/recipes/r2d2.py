"""R2D2's recipe (``seedlocal train r2d2``; ``recipes/__init__.py``). The trainer is ``trainers/r2d2.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from seedlocal.algos.frames import net_spec, stack_problem
from seedlocal.algos.r2d2 import R2D2Params
from seedlocal.arithmetic import resolve_precision
from seedlocal.config.checks import check_network_fits, resolve_device, short_of_memory
from seedlocal.config.machine import Machine
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig, PopulationConfig, StepRunConfig
from seedlocal.errors import fail, fail_if
from seedlocal.networks import RecurrentQNet, encoder_identity, obs_identity
from seedlocal.recipes import Given, Kind, Recipe
from seedlocal.shape import ShapeNeeds, sized_pipeline


@dataclass
class R2D2Run(StepRunConfig):
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=8, min_batch_envs=4, unroll_length=0))
    network: NetworkConfig = field(default_factory=lambda: NetworkConfig(lstm_size=64))
    algo: R2D2Params = field(default_factory=R2D2Params)
    compress: bool = False
    """lz4-compress stored frames in replay"""
    population: PopulationConfig = field(default_factory=PopulationConfig)
    """several learners in one run: V-trace's only, not yet R2D2's (size 1)"""
    checkpoint_replay: bool = False
    """also save the replay with checkpoints (otherwise a resumed run starts with an empty replay)"""

    @classmethod
    def migrate(cls, saved: dict) -> dict:
        """Runs saved before pipeline.unroll_length 0 hold the default they ignored (they ran at
        algo.unroll_length): resume them as they ran."""
        saved = super().migrate(saved)
        pipe, algo = saved.get("pipeline"), saved.get("algo")
        if isinstance(pipe, dict) and isinstance(algo, dict) and pipe.get("unroll_length") != algo.get("unroll_length"):
            saved = {**saved, "pipeline": {**pipe, "unroll_length": 0}}
        return saved


GPU_ENVS_PER_WORKER = 16  # the Atari preset's worker, repeated


def sizing(cfg: R2D2Run, kind: Kind, machine: Machine, given: Given) -> dict:
    """On a GPU, image frames get ``machine.gpu_envs`` envs in workers of 16 (min_batch_envs scaled with them)
    and batches of at least 64 sequences, SEED's published batch (the Atari preset's 16 was cut for a CPU
    learner); everything else, and every CPU run, keeps the preset's sizes (docs/tuning.md)."""
    pipe, _ = sized_pipeline(cfg.pipeline, machine.gpu_envs(), GPU_ENVS_PER_WORKER, cfg.bridge.remote_envs, given)
    if not machine.accelerator or not kind.frames or not pipe:
        return {}
    # Unmeasured on a GPU: the envs follow V-trace's measured 8 per core; the rest of the recipe is the preset's.
    return {**pipe, **({} if given("algo.batch_size") else {"algo.batch_size": max(64, cfg.algo.batch_size)})}


def per_rank(cfg: R2D2Run, ranks: int, shape_of) -> R2D2Run:
    """Unchanged (each rank learns from its own replay, fed by its shape's envs), but a replay in checkpoints is
    one process's only (a resume would give rank 0's to every rank), and each rank keeps algo.eval_envs of its
    envs for evaluation."""
    if ranks > 1 and cfg.checkpoint_replay:
        fail("checkpoint_replay", True, f"with {ranks} learner ranks each rank keeps its own replay and a "
             "checkpoint holds one: give --no-checkpoint-replay (a resumed run's ranks start with empty replays)")
    envs = shape_of(cfg).num_envs
    if cfg.algo.eval_envs >= envs:
        fail("algo.eval_envs", cfg.algo.eval_envs, f"leaves no env of a learner rank's {envs} to fill its replay "
             f"({ranks} ranks)")
    return cfg


PRESETS: dict[str, R2D2Run] = {
    "cartpole": R2D2Run(),
    # SEED's Atari settings, with what a CPU learner cannot afford scaled down (batch, burn-in/unroll, replay size:
    # docs/r2d2.md, "Measured on this 2-core machine", has each and why); the rest as published.
    "atari": R2D2Run(
        env=EnvConfig(id="Pong-v5", frame_stack=1),
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, min_batch_envs=8, unroll_length=0),
        algo=R2D2Params(batch_size=16, burn_in=20, unroll_length=40, n_step=5, discount=0.997,
                        learning_rate=1e-4, adam_eps=1e-3, target_update_every=2500, replay_size=20_000,
                        min_replay=500, replay_ratio=1.0, eval_envs=2, reward_clip=1.0, max_grad_norm=40.0),
        network=NetworkConfig(encoder="nature", lstm_size=512), frame_stack=4, compress=True, total_steps=5_000_000,
    ),
    # Small pixel grids (MinAtar's 10 x 10 x C; the runs behind each value: docs/minatar.md): the one-conv torso,
    # no frame stack (MinAtar's trail channel shows motion), replay ratio 8 (at 2, Asterix and Seaquest stayed near
    # random play to 1M steps), batches of 64 short sequences (the published shape stayed at random on Breakout).
    "minatar": R2D2Run(
        env=EnvConfig(id="MinAtar/Breakout-v1"),
        pipeline=PipelineConfig(num_workers=2, envs_per_worker=16, min_batch_envs=8, unroll_length=0),
        algo=R2D2Params(batch_size=64, burn_in=4, unroll_length=10, n_step=3, discount=0.99,
                        learning_rate=1e-3, adam_eps=1e-4, target_update_every=100, replay_size=40_000,
                        min_replay=500, replay_ratio=8.0, eval_envs=2, max_grad_norm=40.0),
        network=NetworkConfig(encoder="minatar", lstm_size=128), total_steps=5_000_000,
    ),
}


def identity(cfg: R2D2Run, spec) -> dict:
    n = cfg.network
    return {"algo": "r2d2", "env_id": spec.env_id, "num_actions": spec.num_actions, "env_frame_stack": spec.frame_stack,
            **obs_identity(spec), "frame_stack": cfg.frame_stack,
            **encoder_identity(net_spec(spec, cfg.frame_stack), n.encoder), "hidden": list(n.hidden),
            "lstm_size": n.lstm_size}


def build_net(cfg: R2D2Run, spec, device: torch.device | None = None) -> RecurrentQNet:
    """The Q-network, its torso's precision that of ``device`` (default: the pipeline's)."""
    a, n = cfg.algo, cfg.network
    net = RecurrentQNet(net_spec(spec, cfg.frame_stack), encoder=n.encoder, hidden=tuple(n.hidden),
                        lstm_size=n.lstm_size)
    net.precision = resolve_precision(a.precision, net.kind, device or resolve_device(cfg.pipeline.device))
    return net


COMPRESSED_FRAME_SHARE = 1 / 8  # lz4 frames, estimated (Pong measured 1/21, docs/r2d2.md)


def replay_bytes_needed(cfg: R2D2Run, spec, num_envs: int) -> int:
    """Bytes the replay will hold when full (with ``compress``, frames at ``COMPRESSED_FRAME_SHARE``)."""
    a = cfg.algo
    per_env = -(-a.replay_size // num_envs)
    steps = num_envs * (per_env * a.unroll_length + a.burn_in + a.unroll_length + 1 + max(1, cfg.frame_stack))
    obs = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in spec.obs.values())
    per_step = obs * (COMPRESSED_FRAME_SHARE if cfg.compress else 1) + 8 + 4 + 3 + 8
    return int(steps * per_step) + a.replay_size * (2 * cfg.network.lstm_size * 4 + 40)


def shape_needs(cfg: R2D2Run) -> ShapeNeeds:
    """Unrolls of algo.unroll_length (its sequences' stride), two per group: one filling, one for the learner."""
    return ShapeNeeds(unroll_length=cfg.algo.unroll_length, buffers_per_group=2)


def check(cfg: R2D2Run, spec, shape) -> None:
    """R2D2's own refusals, one line each naming the field."""
    a, p = cfg.algo, cfg.pipeline
    if cfg.population.size != 1:
        fail("population.size", cfg.population.size, "not yet for R2D2: its replay and evaluation slots are one "
             "learner's (populations train with seedlocal train vtrace)")
    if spec.num_actions is None:
        fail("env.id", cfg.env.id, "R2D2 is Q-learning over a Discrete action space, and this env's actions are a "
             "Box: use seedlocal train vtrace --preset mujoco (a Gaussian policy), or es / ars / ga")
    if cfg.network.lstm_size < 1:
        fail("network.lstm_size", cfg.network.lstm_size, "R2D2's Q-network is recurrent: give its LSTM a size")
    if cfg.network.obs_norm:
        fail("network.obs_norm", True, "R2D2 does not normalise observations (V-trace and neuroevolution do)")
    if p.unroll_length and p.unroll_length != a.unroll_length:
        fail("pipeline.unroll_length", p.unroll_length, "R2D2's unrolls are its sequences' stride: leave it 0 "
             f"(= algo.unroll_length, {a.unroll_length}) and set --algo.unroll-length instead")
    fail_if(lambda v: v < 1, a, ("batch_size", "unroll_length", "n_step", "replay_size", "min_replay",
                                 "target_update_every"), "must be positive", "algo.")
    # max_grad_norm, reward_clip: 0 = off
    fail_if(lambda v: v < 0, a, ("burn_in", "eval_envs", "max_grad_norm", "reward_clip", "epsilon_alpha"),
            "must be >= 0", "algo.")
    if a.n_step >= a.unroll_length:
        fail("algo.n_step", a.n_step, f"must be shorter than algo.unroll_length ({a.unroll_length})")
    fail_if(lambda v: not 0 <= v <= 1, a, ("priority_exponent", "importance_exponent", "priority_eta",
                                           "epsilon_base", "eval_epsilon", "discount"), "must be in [0, 1]", "algo.")
    if a.replay_size < a.batch_size:
        fail("algo.replay_size", a.replay_size, f"smaller than a batch (algo.batch_size={a.batch_size})")
    if a.min_replay > a.replay_size:
        fail("algo.min_replay", a.min_replay, f"more than the replay holds (algo.replay_size={a.replay_size})")
    fail_if(lambda v: v <= 0, a, ("adam_eps", "learning_rate", "replay_ratio"), "must be positive", "algo.")
    envs = shape.num_envs
    if a.eval_envs >= envs:
        fail("algo.eval_envs", a.eval_envs, f"leaves no env to fill the replay (the run has {envs})")
    acting = envs - a.eval_envs
    per_env = -(-a.replay_size // acting)
    if per_env * a.unroll_length < a.burn_in + a.unroll_length + 1:
        fail("algo.replay_size", a.replay_size, "too small to hold one burn-in + unroll sequence per env")
    if (problem := stack_problem(spec, cfg.frame_stack)) is not None:
        fail("frame_stack", cfg.frame_stack, problem)
    check_network_fits(lambda: build_net(cfg, spec), 6, "network.hidden, network.lstm_size",
                       "the online and target networks, gradients, Adam state and the actors' copy")
    need = replay_bytes_needed(cfg, spec, acting)
    if (have := short_of_memory(need)) is not None:
        fail("algo.replay_size", a.replay_size, f"the replay needs {need / 1e9:.1f} GB"
             f"{' (frames at 1/8 size, compressed)' if cfg.compress else ''}, {have / 1e9:.1f} GB are available: "
             f"lower --algo.replay-size{'' if cfg.compress else ' (or use --compress for image observations)'}")


RECIPES = (Recipe("r2d2", R2D2Run, PRESETS, check, needs=shape_needs, sizing=sizing, per_rank=per_rank),)
