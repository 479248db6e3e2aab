"""The config's schema: the dataclasses tyro parses and the Python API builds, their fields and one-line docs
(what checks them is ``checks.py``; what a resumed run makes of a saved one, ``resume.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    """environment id: any envpool id (Atari *-v5, classic control, MiniGrid, gfootball ...) or a registered Gymnasium id"""
    backend: Literal["auto", "envpool", "gymnasium", "null"] = "auto"
    """auto: envpool if it has the id, else the Gymnasium fallback; null: no env (transport ceiling)"""
    seed: int = 1
    """base seed; environment i of the run gets seed + i"""
    frame_stack: int = 0
    """frames an Atari observation stacks (envpool's stack_num); 0 = the env's default (4)"""
    box_actions: Literal["rescale", "clip"] = "rescale"
    """Box actions: rescale = the policy acts in [-1, 1], mapped onto each finite pair of the space's bounds
    (a range of [0, 100] is reached from the first update); clip = the policy's action itself, clipped to the
    bounds (infinite bounds are clipped under both)"""


@dataclass
class PipelineConfig:
    num_workers: int = 2
    """env worker processes"""
    envs_per_worker: int = 32
    """environments per worker, stepped in two equal groups (double buffering)"""
    env_threads: int = 0
    """envpool threads over all workers; 0 = one per CPU core this process may use (taskset, a cpuset)"""
    unroll_length: int = 32
    """steps per unroll (T); each unroll stores T + 1 observations (R2D2: 0 = algo.unroll_length, the only
    length it takes)"""
    num_buffers: int = 0
    """unrolls in shared memory; 0 = V-trace: one per group, at least a batch; R2D2: two per group; else three"""
    min_batch_envs: int = 0
    """inference waits for this many ready envs (0 = half of all envs, one group per worker) ..."""
    batch_timeout_ms: float = 2.0
    """... or this long after the first is ready, whichever comes first"""
    device: str = "auto"
    """where the policy runs: auto (cuda if present, else cpu), cpu, cuda, cuda:N"""
    cuda_graphs: bool = False
    """replay the inference forward as CUDA graphs, one per batch size padded to a power of two
    (CUDA only; off by default until measured faster on a GPU)"""
    max_restarts: int = 3
    """restarts allowed per env worker within pipeline.restart_window_s before the run stops with an error
    (an env that always fails stops the run fast; rare crashes over a long run do not)"""
    restart_window_s: float = 600.0
    """the window max_restarts counts over (0 = the whole run)"""
    stall_s: float = 10.0
    """seconds without an env step before the run names the workers still inside an env's step (a hung env;
    the run then ends at its time budget); a single stuck worker is named after 3 x this"""
    inference_threads: int = 1
    """torch CPU threads of the inference thread (cores are better spent on environments)"""
    learner_threads: int = 0
    """torch CPU threads of the learner thread; 0 = one per CPU core this process may use"""


@dataclass
class BridgeConfig:
    listen: str = ""
    """HOST:PORT where actor hosts connect (seedlocal actors --connect); empty = no bridge; a bare :PORT binds
    loopback"""
    remote_envs: int = 0
    """environments stepped on actor hosts, a multiple of pipeline.envs_per_worker (hosts run workers like it)"""
    token_file: str = ""
    """file holding the shared secret (default: the SEEDLOCAL_BRIDGE_TOKEN environment variable)"""
    tls_cert: str = ""
    """PEM certificate chain for TLS (with tls_key); actor hosts pass the CA with --tls-ca"""
    tls_key: str = ""
    """PEM private key for TLS"""
    insecure: bool = False
    """listen beyond loopback without TLS: the network is trusted (traffic can be read and altered on the way)"""
    handshakes_per_peer: int = 2
    """streams one address may have in the handshake at once (an actor host needs one); more are refused until
    one ends, so that a stranger cannot take every stream the learner has"""


@dataclass
class NetworkConfig:
    """The network every family builds, under one name (``--network.*``) whatever the algorithm."""

    encoder: Literal["auto", "mlp", "minatar", "nature", "impala"] = "auto"
    """torso: auto = MinAtar's one-conv torso for grids under 36 x 36 (e.g. 10 x 10 x C), the Nature CNN from
    36 x 36 up, an MLP otherwise; a Dict's uint8 or bool image fields get such a torso each beside an MLP of
    its other fields (a conv encoder named here is every image field's; mlp flattens them all into the MLP);
    impala (the IMPALA ResNet) only when asked"""
    hidden: tuple[int, ...] = (64, 64)
    """MLP hidden sizes (the MLP torso; a linear policy: none)"""
    lstm_size: int = 0
    """an LSTM core of this size after the torso (0 = none; R2D2 needs one, neuroevolution takes none)"""
    obs_norm: bool = False
    """normalise vector observations by running mean and variance (clipped to +-10), statistics kept in the
    network and its checkpoints (continuous control presets; a population shares them between generations)"""


@dataclass
class PopulationConfig:
    """Several learners in one run (``--population.*``; docs/populations.md): each member its own network,
    optimizer, hyperparameters, random streams and whole env groups, all served in one inference call."""

    size: int = 1
    """members (1 = one learner, the run as without a population); each owns groups / size whole env groups"""
    mode: Literal["seeds", "sweep", "pbt"] = "seeds"
    """seeds: the same hyperparameters, seeds seed, seed+1, ...; sweep: one value set of --population.sweep per
    member; pbt: population-based training over --population.perturb (starting from --population.sweep's draws)"""
    sweep: tuple[str, ...] = ()
    """hyperparameters to vary, NAME=a,b,c (a list) or NAME=lo..hi (log-uniform), e.g. learning_rate=1e-4..1e-2
    (names are algo.* options; sweep and pbt)"""
    perturb: tuple[str, ...] = ("learning_rate", "entropy_cost", "clip", "max_grad_norm")
    """pbt: the hyperparameters an exploited member perturbs (x0.8 or x1.2, within --population.sweep's range
    where it gives one, else within /10 .. x10 of the start value)"""
    interval: int = 50_000
    """pbt: a member's env steps between rounds of exploit and explore"""
    quantile: float = 0.25
    """pbt: share of members in the bottom (they copy a top member's weights and optimizer) and in the top"""
    resample_probability: float = 0.25
    """pbt: chance that a perturbed hyperparameter is drawn afresh from its distribution instead"""
    seed: int = 0
    """the sweep's draws and PBT's choices (the members' own seeds are env.seed + member)"""


# Options of the network that older runs saved (and older command lines gave) elsewhere: under algo.
# (V-trace, R2D2) or at the top (neuroevolution).
NETWORK_OPTIONS = ("encoder", "hidden", "lstm_size", "obs_norm")


@dataclass
class RunConfig:
    """What every family's run shares: the env, the pipeline and the bridge that step it, the network, and
    the budget, logging and checkpoint options every family uses. A family's own options follow these
    (``trainers/*.py``); a budget only some families count in (steps, generations) is theirs."""

    budgets: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    """the budgets a resumed run must have left (not a field): (field, its checkpoint counter, the counter's unit)"""

    env: EnvConfig = field(default_factory=EnvConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    seconds: float = 0.0
    """wall-clock budget in seconds; 0 = none"""
    stop_at_return: float = 0.0
    """stop early once this return is reached (0 = never): the mean of the last 20 episodes (R2D2: of its
    evaluation slots; neuroevolution: the best member's over its evaluation episodes)"""
    run_name: str = ""
    """folder under log_dir (default: <env>__<algo>__<seed>__<date-time>)"""
    log_dir: str = "runs"
    """where runs (TensorBoard events, checkpoints) are written"""
    keep_checkpoints: int = 3
    """newest checkpoints kept per run (0 = all)"""
    resume: str = ""
    """run directory or checkpoint to continue; same config, same TensorBoard curve"""
    progress: bool = True
    """live progress on the terminal"""
    track: bool = False
    """send the curves, config, videos and summary to Weights & Biases (pip install 'seedlocal[wandb]';
    WANDB_MODE=offline keeps them under <run>/wandb)"""
    wandb_project_name: str = "seedlocal"
    """W&B project (with --track)"""
    wandb_entity: str = ""
    """W&B team or user (with --track; empty = your default entity)"""
    video_every_min: float = 0.0
    """minutes between videos of the current policy, one episode played on the CPU beside training, not in its
    envs (TensorBoard's images, W&B with --track; 0 = none)"""
    learners: int = 1
    """data-parallel learner ranks on this box (torch.distributed: NCCL on GPUs, gloo on CPUs), each with its own
    GPU or share of the cores, workers and envs; gradients averaged (under torchrun: its --nproc-per-node)"""
    dist_timeout_s: float = 60.0
    """seconds a learner rank waits for the others in a collective before it stops, naming the one missing"""

    @classmethod
    def migrate(cls, saved: dict) -> dict:
        """A saved config as this schema reads it: runs saved before ``network`` held its options under
        ``algo`` (V-trace, R2D2) or at the top (neuroevolution), or before ``env.box_actions`` (they clipped, and
        go on doing so); a family with more to mend extends this."""
        env = saved.get("env")
        if isinstance(env, dict) and "box_actions" not in env:
            saved = {**saved, "env": {**env, "box_actions": "clip"}}
        if "network" in saved:
            return saved
        algo = saved.get("algo") if isinstance(saved.get("algo"), dict) else {}
        network = {k: src[k] for src in (saved, algo) for k in NETWORK_OPTIONS if k in src}
        rest = {k: v for k, v in saved.items() if k not in NETWORK_OPTIONS}
        if algo:
            rest["algo"] = {k: v for k, v in algo.items() if k not in NETWORK_OPTIONS}
        return {**rest, "network": network}


@dataclass
class StepRunConfig(RunConfig):
    """A run counted in agent steps, logged and saved by the clock (V-trace, R2D2)."""

    budgets: ClassVar[tuple[tuple[str, str, str], ...]] = (("total_steps", "steps", "steps"),)

    total_steps: int = 300_000
    """agent steps (env.step calls over all envs) to train for; 0 = no step limit"""
    log_every_s: float = 2.0
    """seconds between TensorBoard points"""
    checkpoint_every_min: float = 5.0
    """minutes between checkpoints (one is also written at exit, Ctrl-C included)"""
    frame_stack: int = 0
    """frames stacked beside the network for single-channel image frames (Atari presets: 4 over env.frame_stack 1)"""
