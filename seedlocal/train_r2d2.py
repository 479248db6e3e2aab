"""``seedlocal train r2d2``: recurrent prioritized replay on the SEED pipeline.

The inference thread computes Q-values centrally with the online network
and acts epsilon-greedily, each env slot with its own epsilon for the whole
run (Ape-X's schedule); it keeps every env's recurrent state, stored with
each unroll, and for Atari every env's frame stack: envpool sends single
84x84 frames, stacked here on the learner's side for acting and by the
replay for training, so a stacked tensor never crosses shared memory or
replay. The main thread moves finished unrolls into the replay's per-env
streams, samples prioritized sequences (overlapping by the burn-in), learns,
and writes the new priorities back. A few *evaluation* slots act with
``eval_epsilon`` and never write to replay; their return is what
``--stop-at-return`` tests (as SEED reports it). They are local envs (the
last ones) whenever the run has local workers, so that test does not hang on
actor hosts joining; the replay, its memory estimate and the replay ratio
count the acting envs only.

On CUDA nothing in an update waits for the device: the next batch is
sampled and decompressed while the current update runs and goes to the
device from pinned memory, and an update's priorities are read back (from
pinned memory) only after the next batch is ready.

The learner keeps to ``replay_ratio`` (trained rows per env step): while it
is behind it stops taking unrolls, so actors park on full buffers rather
than outrun it; while it is ahead it waits for data.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import queue
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from seedlocal import checkpoint
from seedlocal.algos.r2d2 import R2D2Params, learner_step, per_env_epsilons
from seedlocal.errors import ConfigError
from seedlocal.config import (BridgeConfig, EnvConfig, PipelineConfig, RunOptions, check_network_fits, fail,
                              num_groups, resolve_device, resume_line, short_of_memory, validate_bridge, validate_env,
                              validate_pipeline, validate_run_options)
from seedlocal.arithmetic import apply_precision, resolve_precision
from seedlocal.networks import RecurrentQNet, image_layout, obs_identity
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.policies.q_greedy import R2D2Policy
from seedlocal.monitor import RunMonitor, closing_line, nothing_stepped
from seedlocal.dtypes import torch_dtype
from seedlocal.pipeline.inference import InferenceThread, StallWatch
from seedlocal.replay import SequenceReplay
from seedlocal.shm.rollout import obs_key


@dataclass
class R2D2Run(RunOptions):
    env: EnvConfig = field(default_factory=EnvConfig)
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(
        num_workers=2, envs_per_worker=8, min_batch_envs=4, unroll_length=0))
    algo: R2D2Params = field(default_factory=R2D2Params)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    frame_stack: int = 0
    """frames stacked on the learner side for image observations (Atari preset: 4 over env.frame_stack 1)"""
    compress: bool = False
    """lz4-compress stored frames in replay"""
    checkpoint_replay: bool = False
    """also save the replay with checkpoints (otherwise a resumed run starts with an empty replay)"""

    @staticmethod
    def migrate(saved: dict) -> dict:
        """Runs saved before pipeline.unroll_length 0 hold the default they
        ignored (they ran at algo.unroll_length): resume them as they ran."""
        pipe, algo = saved.get("pipeline"), saved.get("algo")
        if isinstance(pipe, dict) and isinstance(algo, dict) and pipe.get("unroll_length") != algo.get("unroll_length"):
            saved = {**saved, "pipeline": {**pipe, "unroll_length": 0}}
        return saved


PRESETS: dict[str, R2D2Run] = {
    "cartpole": R2D2Run(),
    # SEED's Atari settings scaled to a workstation (docs/r2d2.md): batch 64 -> 16 and
    # burn-in/unroll 40/80 -> 20/40 (a CPU update on 64 x 121 frames takes seconds),
    # replay 100k -> 20k sequences; n = 5, gamma 0.997, eta 0.9, alpha 0.9, beta 0.6 as published.
    "atari": R2D2Run(
        env=EnvConfig(id="Pong-v5", frame_stack=1),
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, min_batch_envs=8, unroll_length=0),
        algo=R2D2Params(batch_size=16, burn_in=20, unroll_length=40, n_step=5, discount=0.997,
                        learning_rate=1e-4, adam_eps=1e-3, target_update_every=2500, replay_size=20_000,
                        min_replay=500, replay_ratio=1.0, eval_envs=2, reward_clip=1.0, encoder="nature",
                        lstm_size=512, max_grad_norm=40.0),
        frame_stack=4, compress=True, total_steps=5_000_000,
    ),
}


def identity(cfg: R2D2Run, spec) -> dict:
    a = cfg.algo
    return {"algo": "r2d2", "env_id": spec.env_id, "num_actions": spec.num_actions, "env_frame_stack": spec.frame_stack,
            **obs_identity(spec), "frame_stack": cfg.frame_stack,
            "encoder": a.encoder, "hidden": list(a.hidden), "lstm_size": a.lstm_size}


def net_spec(spec, frame_stack: int):
    """The spec the network sees: image observations stacked ``frame_stack`` deep."""
    single = spec.obs.get("")
    if frame_stack <= 1 or single is None:
        return spec
    shape = (frame_stack * single.shape[0],) + single.shape[1:]
    return dataclasses.replace(spec, obs={"": dataclasses.replace(single, shape=shape)})


def build_net(cfg: R2D2Run, spec) -> RecurrentQNet:
    a = cfg.algo
    net = RecurrentQNet(net_spec(spec, cfg.frame_stack), encoder=a.encoder, hidden=tuple(a.hidden),
                        lstm_size=a.lstm_size)
    net.precision = resolve_precision(a.precision, net.kind, resolve_device(cfg.pipeline.device))
    return net


def eval_env_ids(num_local: int, num_envs: int, eval_envs: int) -> np.ndarray:
    """The evaluation slots: the last local envs (actor hosts may come late,
    or never: --stop-at-return must not wait for them), and only where there
    are too few local ones, the last remote envs."""
    if eval_envs <= num_local:
        return np.arange(num_local - eval_envs, num_local)
    return np.arange(num_envs - eval_envs, num_envs)


def make_replay(cfg: R2D2Run, spec, num_envs: int, core_shape) -> SequenceReplay:
    a = cfg.algo
    fields = {obs_key(k): (s.shape, s.dtype) for k, s in spec.obs.items()}
    fields.update({"action": (spec.action.shape, spec.action.dtype), "reward": ((), "float32"),
                   "terminated": ((), "bool"), "truncated": ((), "bool"), "ignored": ((), "bool")})
    stack = cfg.frame_stack if "" in spec.obs and cfg.frame_stack > 1 else 1
    replay = SequenceReplay(num_envs=num_envs, sequences=a.replay_size, length=a.burn_in + a.unroll_length + 1,
                            stride=a.unroll_length, fields=fields, core_shape=core_shape, frame="obs", stack=stack,
                            alpha=a.priority_exponent, compress=cfg.compress, seed=cfg.env.seed)
    return replay


COMPRESSED_FRAME_SHARE = 1 / 8  # lz4 frames, estimated (Pong measured 1/21, docs/r2d2.md)


def replay_bytes_needed(cfg: R2D2Run, spec, num_envs: int) -> int:
    """What the replay will hold when full: frames at full size, or with
    ``compress`` at an eighth of it (lz4 on Atari frames measured 1/21)."""
    a = cfg.algo
    per_env = -(-a.replay_size // num_envs)
    steps = num_envs * (per_env * a.unroll_length + a.burn_in + a.unroll_length + 1 + max(1, cfg.frame_stack))
    obs = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in spec.obs.values())
    per_step = obs * (COMPRESSED_FRAME_SHARE if cfg.compress else 1) + 8 + 4 + 3 + 8
    return int(steps * per_step) + a.replay_size * (2 * a.lstm_size * 4 + 40)


def _to_checkpoint(obj):
    """numpy inside a replay state -> tensors and plain types (checkpoints load with weights_only=True)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:  # lz4-compressed frames: bytes (None where nothing is stored yet)
            return {"__objects__": list(obj.shape), "items": obj.ravel().tolist()}
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k if not isinstance(k, tuple) else "__key__" + ",".join(map(str, k)): _to_checkpoint(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_checkpoint(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_checkpoint(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        if "__objects__" in obj:
            arr = np.empty(len(obj["items"]), object)
            arr[:] = obj["items"]
            return arr.reshape(obj["__objects__"])
        return {(tuple(int(x) for x in k[7:].split(",")) if isinstance(k, str) and k.startswith("__key__") else k):
                _from_checkpoint(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_checkpoint(v) for v in obj]
    return obj


def validate(cfg: R2D2Run):
    validate_run_options(cfg)
    a, p = cfg.algo, cfg.pipeline
    validate_pipeline(p, remote_envs=cfg.bridge.remote_envs if cfg.bridge.listen else 0, learner_unroll=True)
    validate_bridge(cfg.bridge, p)
    spec = validate_env(cfg.env)
    if spec.num_actions is None:
        fail("env.id", cfg.env.id, "R2D2 needs a Discrete action space")
    if p.unroll_length and p.unroll_length != a.unroll_length:
        fail("pipeline.unroll_length", p.unroll_length, "R2D2's unrolls are its sequences' stride: leave it 0 "
             f"(= algo.unroll_length, {a.unroll_length}) and set --algo.unroll-length instead")
    for name in ("batch_size", "unroll_length", "n_step", "replay_size", "min_replay", "lstm_size",
                 "target_update_every"):
        if getattr(a, name) < 1:
            fail(f"algo.{name}", getattr(a, name), "must be positive")
    for name in ("burn_in", "eval_envs", "max_grad_norm", "reward_clip", "epsilon_alpha"):
        if getattr(a, name) < 0:  # max_grad_norm, reward_clip: 0 = off
            fail(f"algo.{name}", getattr(a, name), "must be >= 0")
    if a.n_step >= a.unroll_length:
        fail("algo.n_step", a.n_step, f"must be shorter than algo.unroll_length ({a.unroll_length})")
    for name in ("priority_exponent", "importance_exponent", "priority_eta", "epsilon_base", "eval_epsilon"):
        if not 0 <= getattr(a, name) <= 1:
            fail(f"algo.{name}", getattr(a, name), "must be in [0, 1]")
    if not 0 <= a.discount <= 1:
        fail("algo.discount", a.discount, "must be in [0, 1]")
    if a.replay_size < a.batch_size:
        fail("algo.replay_size", a.replay_size, f"smaller than a batch (algo.batch_size={a.batch_size})")
    if a.min_replay > a.replay_size:
        fail("algo.min_replay", a.min_replay, f"more than the replay holds (algo.replay_size={a.replay_size})")
    if a.adam_eps <= 0:
        fail("algo.adam_eps", a.adam_eps, "must be positive")
    if a.learning_rate <= 0 or a.replay_ratio <= 0:
        fail("algo.learning_rate" if a.learning_rate <= 0 else "algo.replay_ratio",
             min(a.learning_rate, a.replay_ratio), "must be positive")
    envs = p.num_workers * p.envs_per_worker + (cfg.bridge.remote_envs if cfg.bridge.listen else 0)
    if a.eval_envs >= envs:
        fail("algo.eval_envs", a.eval_envs, f"leaves no env to fill the replay (the run has {envs})")
    per_env = -(-a.replay_size // max(1, envs - a.eval_envs))
    if per_env * a.unroll_length < a.burn_in + a.unroll_length + 1:
        fail("algo.replay_size", a.replay_size, "too small to hold one burn-in + unroll sequence per env")
    if cfg.frame_stack < 0:
        fail("frame_stack", cfg.frame_stack, "must be >= 0")
    single = spec.obs.get("")
    if cfg.frame_stack > 1 and (single is None or image_layout(single) != "chw" or single.shape[0] != 1):
        seen = tuple(single.shape) if single is not None else dict(spec.obs)
        fail("frame_stack", cfg.frame_stack, "stacks single-channel (1, H, W) image frames, as envpool's Atari "
             f"sends with --env.frame-stack 1; {spec.env_id} observes {seen}")
    if cfg.total_steps < 0 or cfg.seconds < 0 or (cfg.total_steps == 0 and cfg.seconds == 0):
        fail("total_steps", cfg.total_steps, "set a step or time budget (both >= 0, not both 0)")
    try:
        check_network_fits(lambda: build_net(cfg, spec), 6, "algo.hidden, algo.lstm_size",
                           "the online and target networks, gradients, Adam state and the actors' copy")
    except ValueError as e:
        raise ConfigError(f"algo.{e}" if str(e).startswith(("encoder=", "hidden=")) else str(e)) from None
    need = replay_bytes_needed(cfg, spec, max(1, envs - a.eval_envs))
    if (have := short_of_memory(need)) is not None:
        fail("algo.replay_size", a.replay_size, f"the replay needs {need / 1e9:.1f} GB"
             f"{' (frames at 1/8 size, compressed)' if cfg.compress else ''}, {have / 1e9:.1f} GB are available: "
             f"lower --algo.replay-size{'' if cfg.compress else ' (or use --compress for image observations)'}")
    return spec


class BatchStager:
    """Replay samples to learner batches on the device.

    On a CPU the sampled arrays are the batch. On CUDA each is copied into
    pinned memory (two sets, used in turn: the copy out of one may still be
    in flight while the next batch is written into the other) and goes to
    the device asynchronously; ``ahead`` tells the learner to sample the
    next batch while the current update runs. An update's priorities come
    back through a pinned buffer too, read only after the next batch is
    staged (``priorities_to_host`` then ``read``)."""

    def __init__(self, device: torch.device, obs_keys: list[str]):
        self.device, self.obs_keys = device, obs_keys
        self.ahead = device.type == "cuda"
        self._pinned: list[dict[str, torch.Tensor]] = [{}, {}]
        self._copied: list = [None, None]  # CUDA events: the last copy out of each set
        self._turn = 0

    def _host(self, name: str, arr: np.ndarray) -> torch.Tensor:
        arr = np.ascontiguousarray(arr)
        if not self.ahead:
            return torch.from_numpy(arr)
        pinned = self._pinned[self._turn]
        t = pinned.get(name)
        if t is None or t.shape != arr.shape or t.dtype != torch_dtype(arr.dtype):
            t = pinned[name] = torch.empty(arr.shape, dtype=torch_dtype(arr.dtype), pin_memory=True)
        t.numpy()[...] = arr
        return t

    def stage(self, sampled) -> tuple[dict, np.ndarray, np.ndarray, torch.Tensor]:
        """(batch on the device, slots, generations, importance weights) of ``replay.sample`` output."""
        rows, slots, gens, weights = sampled
        if self.ahead and self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()  # this set's last copy has left it
        t = {k: self._host(k, v).to(self.device, non_blocking=True) for k, v in rows.items()}
        w = self._host("__weights__", weights).to(self.device, non_blocking=True)
        if self.ahead:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
            self._turn ^= 1
        obs = {}
        for k in self.obs_keys:
            x = t.pop(k)
            if k == "obs" and x.dtype == torch.uint8 and x.dim() == 6:
                x = x.flatten(2, 3)  # [L, B, stack, C, H, W] -> [L, B, stack*C, H, W]
            obs["" if k == "obs" else k[4:]] = x
        t["obs"] = obs
        t["core_state"] = t["core_state"].float()
        t["ignored_host"] = rows["ignored"]  # the learner's episode cuts, without asking the device
        return t, slots, gens, w

    def priorities_to_host(self, prio: torch.Tensor):
        if not self.ahead:
            return prio
        out = torch.empty(prio.shape, dtype=prio.dtype, pin_memory=True)
        out.copy_(prio, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return out, done

    def read(self, prio) -> np.ndarray:
        if not self.ahead:
            return prio.numpy()
        out, done = prio
        done.synchronize()
        return out.numpy()


def train(cfg: R2D2Run) -> dict:
    spec = validate(cfg)
    a = cfg.algo
    device = resolve_device(cfg.pipeline.device)
    torch.manual_seed(cfg.env.seed)
    if cfg.resume:
        saved = checkpoint.load(cfg.resume)
        run_dir = checkpoint.run_dir_of(saved["path"])
    else:
        saved = None
        name = cfg.run_name or (f"{spec.env_id.replace('/', '_').replace(':', '.')}__r2d2__{cfg.env.seed}__"
                                f"{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir = checkpoint.new_run_dir(cfg.log_dir, name)
    ident = identity(cfg, spec)
    online = build_net(cfg, spec).to(device)
    apply_precision(online.precision, device)
    target = copy.deepcopy(online)
    for prm in target.parameters():
        prm.requires_grad_(False)
    optimizer = torch.optim.Adam(online.parameters(), lr=a.learning_rate, eps=a.adam_eps)
    counters = {"steps": 0, "updates": 0, "episodes": 0}
    if saved is not None:
        print(resume_line(saved.get("config"), cfg, saved["path"]), flush=True)
        checkpoint.check_compatible(saved, ident, needs=("model", "target", "optimizer", "counters"))
        online.load_state_dict(saved["model"])
        target.load_state_dict(saved["target"])
        optimizer.load_state_dict(saved["optimizer"])
        counters.update(saved["counters"])
    checkpoint.make_run_dir(run_dir)
    monitor = RunMonitor(run_dir, purge_step=counters["steps"] + 1 if saved else None, progress=cfg.progress)
    monitor.text("config", "```\n" + json.dumps(dataclasses.asdict(cfg), indent=2) + "\n```", counters["steps"])

    pipe_cfg = dataclasses.replace(cfg.pipeline, unroll_length=a.unroll_length)
    G = num_groups(pipe_cfg, cfg.bridge)
    E = pipe_cfg.envs_per_worker // 2
    num_envs = G * E
    evaluating = np.zeros(num_envs, bool)
    evaluating[eval_env_ids(pipe_cfg.num_workers * pipe_cfg.envs_per_worker, num_envs, a.eval_envs)] = True
    # Replay stream of each acting env (-1: an evaluation slot, which has none).
    stream_of = np.full(num_envs, -1, np.int64)
    stream_of[~evaluating] = np.arange(num_envs - a.eval_envs)
    eps = torch.full((num_envs,), a.eval_epsilon)
    eps[torch.from_numpy(~evaluating)] = per_env_epsilons(num_envs - a.eval_envs, a.epsilon_base, a.epsilon_alpha)
    stack = cfg.frame_stack if cfg.frame_stack > 1 and "" in spec.obs else 1
    lock = WeightLock(device)
    policy = R2D2Policy(online, spec, eps, lock, device, stack, cfg.env.seed, cuda_graphs=cfg.pipeline.cuda_graphs)
    replay = make_replay(cfg, spec, num_envs - a.eval_envs, online.core_spec.shape)
    if saved is not None and "replay" in saved:
        try:
            replay.load_state_dict(_from_checkpoint(saved["replay"]))
        except ValueError as e:
            raise ConfigError(f"resume: {e}; resume with the saved run's pipeline and replay settings, or "
                              "without its replay (a checkpoint written without --checkpoint-replay)") from None
        print(f"seedlocal: replay restored with {replay.size:,d} sequences", flush=True)
    obs_keys = [obs_key(k) for k in spec.obs]
    if not pipe_cfg.num_buffers:
        pipe_cfg.num_buffers = 2 * G  # one unroll per group being filled, one waiting for the learner
    print(f"seedlocal: training R2D2 on {spec.env_id} ({online.kind} torso in {online.precision} + LSTM {a.lstm_size}, "
          f"{num_envs - a.eval_envs} acting + {a.eval_envs} evaluation envs, replay {a.replay_size:,d} sequences"
          f"{', lz4' if cfg.compress else ''}); TensorBoard: tensorboard --logdir {cfg.log_dir} (run {run_dir})",
          flush=True)

    recent_train: deque[float] = deque(maxlen=20)
    recent_eval: deque[float] = deque(maxlen=20)
    summary = {"status": "done", "run_dir": str(run_dir), "steps_to_target": None}
    state = {"saved": time.monotonic()}
    frames_per_step = spec.frames_per_step
    epochs = {}

    def save() -> None:
        blob = {"identity": ident, "config": dataclasses.asdict(cfg), "model": online.state_dict(),
                "target": target.state_dict(), "optimizer": optimizer.state_dict(), "counters": dict(counters)}
        if cfg.checkpoint_replay:
            blob["replay"] = _to_checkpoint(replay.state_dict())
        checkpoint.save(run_dir, blob, counters["steps"], counters["steps"] * frames_per_step,
                                        keep=cfg.keep_checkpoints)
        state["saved"] = time.monotonic()

    def ingest(store, b: int) -> int:
        """A finished unroll into the replay (acting envs) or the eval
        statistics; returns the acting steps it added."""
        g, epoch = int(store["unroll_group"][b]), int(store["unroll_epoch"][b])
        T = a.unroll_length
        fresh = epochs.get(g) != epoch
        epochs[g] = epoch
        done = store["terminated"][b, :T] | store["truncated"][b, :T]
        added = 0
        for e in range(E):
            env = g * E + e
            ends = np.flatnonzero(done[:, e])
            rets = store["ep_return"][b, ends, e].tolist()
            if evaluating[env]:
                recent_eval.extend(rets)
                continue
            recent_train.extend(rets)
            counters["episodes"] += len(rets)
            stream = int(stream_of[env])
            if fresh and replay.count[stream]:
                replay.cut(stream)
            rows = {k: store[k][b, :T, e] for k in obs_keys}
            rows.update({k: store[k][b, :T, e] for k in ("action", "reward", "terminated", "truncated", "ignored")})
            replay.set_core(stream, int(replay.count[stream]), store["core_state"][b, e])
            replay.append(stream, rows)
            added += T
        return added

    from seedlocal.pipeline.pipeline import Pipeline

    steps0 = counters["steps"]
    # A small MLP + LSTM update gains nothing from more threads, and OpenMP threads that wait on each
    # other while env workers hold the cores made CartPole updates ~50x slower on a loaded 2-core box.
    torch.set_num_threads(cfg.pipeline.learner_threads
                          or ((os.cpu_count() or 1) if online.kind in ("nature", "impala") else 1))
    with monitor, Pipeline(cfg.env, pipe_cfg, lambda s, d: policy, consume=True, spec=spec, bridge=cfg.bridge) as pipe:
        loop, store = pipe.loop, pipe.store
        runner = InferenceThread(loop)
        runner.start()
        t_start = t_log = time.monotonic()
        learned_rows, added_steps, log_steps = 0, 0, steps0
        acc: dict[str, torch.Tensor] = {}
        sampled_p: list[float] = []
        inserted0, log_updates, dropped = replay.added, counters["updates"], 0
        watch, waiting = StallWatch(loop), False
        stager, staged = BatchStager(device, obs_keys), []

        def log(now: float, last: bool = False) -> None:
            """Scalars and the progress line for the interval since the last
            call; ``last``: the run's final, partial interval (scalars only,
            and no rates from a fraction of an interval)."""
            nonlocal t_log, log_steps, acc, sampled_p, inserted0, log_updates
            step_now, dt = steps0 + loop.stats.env_steps, max(1e-9, now - t_log)
            n = max(1, acc.pop("n", 0))
            values = {f"losses/{k}": float(v) / n for k, v in acc.items()}  # device sums, read once
            values.update({
                "charts/episode_return": float(np.mean(recent_train)) if recent_train else None,
                "charts/eval_return": float(np.mean(recent_eval)) if recent_eval else None,
                "charts/episodes": counters["episodes"],
                "charts/replay_ratio": learned_rows / max(1, added_steps),
                "replay/size": replay.size,
                "replay/priority_mean": float(np.mean(sampled_p)) if sampled_p else None,
                "replay/priority_max": float(np.max(sampled_p)) if sampled_p else None,
                "replay/stale_updates_dropped": dropped,
            })
            if not last or dt >= cfg.log_every_s / 4:
                values.update({
                    "charts/steps_per_s": (step_now - log_steps) / dt,
                    "charts/frames_per_s": (step_now - log_steps) / dt * frames_per_step,
                    "replay/insert_per_s": (replay.added - inserted0) / dt,
                    "replay/sample_per_s": (counters["updates"] - log_updates) * a.batch_size / dt,
                    "perf/updates_per_s": (counters["updates"] - log_updates) / dt,
                })
            # Reset first: an interval is written once, whatever follows.
            t_log, log_steps, acc, sampled_p = now, step_now, {}, []
            inserted0, log_updates = replay.added, counters["updates"]
            monitor.scalars(step_now, values)
            if last:
                return
            ev = f"{np.mean(recent_eval):7.1f}" if recent_eval else "      -"
            # After the warm-up (algo.min_replay) the learner first catches up
            # on the replay ratio over every step so far, actors parked: say so.
            owed = int((a.replay_ratio * added_steps - learned_rows) // (a.batch_size * a.unroll_length))
            monitor.progress(f"steps {step_now:>10,d}  frames/s {values['charts/frames_per_s']:>8,.0f}  "
                             f"eval return(20) {ev}  updates {counters['updates']:,d}  "
                             f"replay {replay.size:,d}  td {values.get('losses/td_abs', 0):.3f}"
                             + (f"  (actors wait: {owed:,d} updates to replay ratio {a.replay_ratio:g})"
                                if owed > 1 else ""))

        failure = None
        try:
            while True:
                counters["steps"] = steps0 + loop.stats.env_steps
                if cfg.total_steps and counters["steps"] >= cfg.total_steps:
                    summary["stopped_by"] = "steps"
                    break
                if cfg.seconds and time.monotonic() - t_start >= cfg.seconds:
                    summary["stopped_by"] = "seconds"
                    break
                stop_on = recent_eval if a.eval_envs else recent_train
                if cfg.stop_at_return and len(stop_on) == stop_on.maxlen and np.mean(stop_on) >= cfg.stop_at_return:
                    summary["steps_to_target"] = counters["steps"]
                    summary["stopped_by"] = "target"
                    break
                runner.check()
                behind = replay.size >= max(a.min_replay, a.batch_size) and learned_rows < a.replay_ratio * added_steps
                if not behind:  # take data (blocking briefly); actors park while the learner is behind
                    try:
                        b = loop.completed.get(timeout=0.5)
                    except queue.Empty:
                        if waiting:
                            watch.poll()  # says so if the envs stopped stepping
                        else:  # time spent learning before this wait is no stall
                            watch.start()
                            waiting = True
                        continue
                    waiting = False
                    if not added_steps:  # rates from the first unroll on: the workers' start-up is no slow first point
                        t_log, log_steps = time.monotonic(), steps0 + loop.stats.env_steps
                    while True:
                        added_steps += ingest(store, b)
                        loop.release(b)
                        try:
                            b = loop.completed.get_nowait()
                        except queue.Empty:
                            break
                    continue
                sampled = staged.pop() if staged else stager.stage(replay.sample(a.batch_size, a.importance_exponent))
                batch, slots, gens, weights = sampled
                stats, prio = learner_step(online, target, optimizer, batch, weights, a, step_lock=lock)
                prio = stager.priorities_to_host(prio)
                if stager.ahead:  # the next batch, sampled and copied while this update runs on the device
                    staged.append(stager.stage(replay.sample(a.batch_size, a.importance_exponent)))
                applied = replay.update_priorities(slots, gens, stager.read(prio))
                dropped += len(slots) - applied
                sampled_p.extend(replay.tree.get(slots).tolist())
                counters["updates"] += 1
                learned_rows += a.batch_size * a.unroll_length
                if counters["updates"] % a.target_update_every == 0:
                    with torch.no_grad():
                        target.load_state_dict(online.state_dict())
                for k, v in stats.items():
                    acc[k] = acc.get(k, 0.0) + v
                acc["n"] = acc.get("n", 0) + 1

                now = time.monotonic()
                if now - t_log >= cfg.log_every_s:
                    watch.poll()  # names a worker stuck while the others keep the run going
                    log(now)
                if now - state["saved"] >= cfg.checkpoint_every_min * 60:
                    save()
        except BaseException as e:
            summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt | SystemExit) else "error"
            failure = e
            raise
        finally:
            runner.stop()
            counters["steps"] = steps0 + loop.stats.env_steps
            stop_on = recent_eval if a.eval_envs else recent_train
            checkpoint.finish_run(
                run_dir, summary, failure,
                last_log=(lambda: log(time.monotonic(), last=True)) if acc else None,  # the curve's last point
                save=save if counters["steps"] or saved is not None else None,
                results=lambda: {
                    "algo": "r2d2", "env": spec.env_id, "steps": counters["steps"],
                    "frames": counters["steps"] * frames_per_step, "updates": counters["updates"],
                    "episodes": counters["episodes"],
                    "mean_return_last20": float(np.mean(recent_train)) if recent_train else None,
                    "eval_return_last20": float(np.mean(recent_eval)) if recent_eval else None,
                    "frames_to_target": (summary["steps_to_target"] * frames_per_step
                                         if summary["steps_to_target"] is not None else None),
                    "seconds": round(time.monotonic() - t_start, 2), "checkpoint": checkpoint.newest(run_dir),
                    "target_return_source": "eval" if a.eval_envs and stop_on is recent_eval else "train",
                })
    ret = summary["eval_return_last20"] if a.eval_envs else summary["mean_return_last20"]
    print(closing_line(summary, f"{summary['steps']:,d} steps, {'evaluation' if a.eval_envs else 'training'} "
                                f"return (last 20) {'-' if ret is None else f'{ret:.1f}'}",
                       None if summary["steps"] else nothing_stepped(cfg)), flush=True)
    return summary
