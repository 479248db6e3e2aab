"""``seedlocal eval``: play a checkpoint, report its return, record an episode.

A plain function of (checkpoint, episodes, video), independent of training:
it builds the network from the checkpoint's identity and steps the env
backend directly, one env per episode, no pipeline.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from seedlocal import checkpoint, video
from seedlocal.algos.distributions import for_actions
from seedlocal.config.checks import check_writable, resolve_device
from seedlocal.errors import fail
from seedlocal.networks import ActorCritic, PolicyNet, action_identity, checkpoint_encoder, obs_identity
from seedlocal.envs.spaces import describe
from seedlocal.envs.make import make_group


@dataclass
class EvalConfig:
    checkpoint: str
    """checkpoint file, or a run directory (its newest checkpoint)"""
    episodes: int = 10
    """episodes to play (in parallel, one env each)"""
    policy: Literal["trained", "sample", "argmax"] = "trained"
    """how to act: trained = as the run acted in training (V-trace samples; GA/ES/random search take the
    argmax unless trained with --no-greedy); sample; argmax"""
    video: str = ""
    """write one episode as an animated GIF here (e.g. pong.gif); also logged to the run's TensorBoard"""
    video_max_steps: int = 2000
    """stop recording after this many steps"""
    max_steps: int = 100_000
    """give up on an episode after this many steps"""
    epsilon: float = 0.001
    """R2D2 checkpoints: chance of a random action when acting as trained (greedy otherwise)"""
    seed: int = 12345
    """env seed (different from training's by default)"""
    device: str = "cpu"
    """where the network runs"""


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _policy(model: ActorCritic, greedy: bool, epsilon: float = 0.0):
    """``act(obs, core) -> (actions, core)`` as a run's acting does: a
    categorical's argmax or sample, a Gaussian's mean or sample, or (a
    neuroevolution network over a Box) the network's output itself.

    Observations go to the model's device and the core stays there; the
    actions come back to the host. Epsilon's draws are made on the host from
    a seeded generator, so an eval explores alike on every device."""
    device = _device(model)
    gen = torch.Generator().manual_seed(0)
    dist = None if isinstance(model, PolicyNet) and model.continuous else for_actions(
        None if getattr(model, "continuous", False) else 0)

    @torch.inference_mode()
    def act(obs: dict[str, np.ndarray], core):
        x = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in obs.items()}
        params, _, core = model.step(x, core)
        if dist is None:
            return params.cpu().numpy(), core
        a = (dist.mode(params) if greedy else dist.sample(params)).cpu()
        if epsilon > 0:
            explore = torch.rand(a.shape, generator=gen) < epsilon
            a = torch.where(explore, torch.randint(params.shape[-1], a.shape, generator=gen), a)
        return a.numpy(), core

    return act


def _initial_core(model: torch.nn.Module, n: int):
    return None if model.core_spec is None else torch.zeros((n,) + model.core_spec.shape, device=_device(model))


class _R2D2Player(torch.nn.Module):
    """An R2D2 network as eval plays it: Q-values as the logits to take the
    argmax of, and the frame stack it was trained on kept per env (each env
    plays one episode from its reset, whose first frame fills the stack)."""

    def __init__(self, net, stack: int):
        super().__init__()
        self.net, self.stack, self.hist = net, stack, None
        self.core_spec = net.core_spec

    def step(self, obs, core):
        if self.stack > 1:
            x = obs[""]
            self.hist = (x.expand(-1, self.stack, -1, -1) if self.hist is None
                         else torch.cat([self.hist[:, 1:], x], dim=1))
            obs = {"": self.hist}
        q, core = self.net.step(obs, core)
        return q, None, core

    def new_episodes(self) -> None:
        self.hist = None


def load_model(path: str, device: torch.device) -> tuple[torch.nn.Module, dict, object]:
    state = checkpoint.load(path)
    ident = state.get("identity", {})
    try:
        spec = describe(ident["env_id"], "auto", int(ident.get("env_frame_stack", 0)))
        # The env as it is now must still be the one the network was trained
        # on (a user's own env may have changed since).
        checkpoint.check_compatible(state, {"num_actions": spec.num_actions, **obs_identity(spec),
                                            **action_identity(spec)})
        if ident.get("algo") == "r2d2":
            from seedlocal.networks import RecurrentQNet
            from seedlocal.trainers.r2d2 import net_spec

            seen = net_spec(spec, ident["frame_stack"])
            net = RecurrentQNet(seen, encoder=checkpoint_encoder(ident, seen),
                                hidden=tuple(ident["hidden"]), lstm_size=ident["lstm_size"])
            net.load_state_dict(state["model"])
            model = _R2D2Player(net, ident["frame_stack"] if "" in spec.obs else 1)
        elif ident.get("network") == "policy":  # neuroevolution: the best member's flat parameters
            model = PolicyNet(spec, checkpoint_encoder(ident, spec), tuple(ident["hidden"]),
                              obs_norm=ident.get("obs_norm", False))
            torch.nn.utils.vector_to_parameters(state["best_params"].float(), model.parameters())
            if model.obs_norm is not None:  # the population's shared statistics, saved beside the genomes
                model.obs_norm.load_state_dict(state["obs_norm"])
        else:
            model = ActorCritic(spec, encoder=checkpoint_encoder(ident, spec), hidden=tuple(ident["hidden"]),
                                lstm_size=ident["lstm_size"], separate_critic=ident.get("separate_critic", False),
                                obs_norm=ident.get("obs_norm", False))
            model.load_state_dict(state["model"])
    except checkpoint.CheckpointError:
        raise
    except (KeyError, RuntimeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{state['path']}: cannot rebuild its network ({e})") from None
    return model.to(device).eval(), state, spec


def play(model: ActorCritic, spec, episodes: int, greedy: bool, seed: int, max_steps: int,
         epsilon: float = 0.0) -> tuple[np.ndarray, int]:
    """One raw return per episode (each env plays its first episode), and how
    many of them ``max_steps`` cut short."""
    env = make_group(spec, episodes, 1, seed)
    getattr(model, "new_episodes", lambda: None)()
    act = _policy(model, greedy, epsilon)
    core = _initial_core(model, episodes)
    env.reset()
    obs, _, _, _ = env.recv()
    returns, finished = np.zeros(episodes), np.zeros(episodes, bool)
    for _ in range(max_steps):
        actions, core = act(obs, core)
        env.send(actions)
        obs, reward, terminated, truncated = env.recv()
        returns += np.where(finished, 0.0, reward)
        finished |= terminated | truncated
        if finished.all():
            break
    env.close()
    return returns, int((~finished).sum())


def record(model: ActorCritic, spec, greedy: bool, seed: int, max_steps: int) -> list[np.ndarray]:
    """Frames of one episode as a person sees it, drawn by the env that plays it and timed to play in real
    time (``seedlocal/video.py``), or RenderUnavailable."""
    getattr(model, "new_episodes", lambda: None)()
    return video.record(_policy(model, greedy), spec, seed, max_steps, _initial_core(model, 1))


def encode_gif(frames: list[np.ndarray], fps: float | None = None) -> tuple[bytes, int, int]:
    """An animated GIF playing ``frames`` at ``fps`` (default: the clip's own real-time rate, ``video.Clip``;
    else 30); frame delays are rounded to the GIF's 10 ms so that their sum keeps to the clock."""
    from PIL import Image

    fps = float(fps or getattr(frames, "fps", 30.0))
    ends = np.maximum(np.round(np.arange(1, len(frames) + 1) * 100.0 / fps), 2 * np.arange(1, len(frames) + 1))
    durations = (np.diff(ends, prepend=0.0) * 10).astype(int).tolist()  # centiseconds -> ms, each >= 20
    imgs = (Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames)  # one at a time: frames can be large
    first = next(imgs)
    buf = io.BytesIO()
    first.save(buf, format="GIF", save_all=True, append_images=imgs, duration=durations, loop=0)
    return buf.getvalue(), first.height, first.width


def trained_greedy(state: dict) -> bool:
    """Whether the checkpoint's run acted by argmax in training: neuroevolution
    does by default (its ``greedy`` option) and R2D2 (epsilon-greedy), V-trace samples."""
    if state.get("identity", {}).get("algo") == "r2d2":
        return True
    if state.get("identity", {}).get("network") == "policy":
        return bool(state.get("config", {}).get("greedy", True))
    return False


def main(cfg: EvalConfig) -> dict:
    if cfg.episodes < 1:
        fail("episodes", cfg.episodes, "must be positive")
    for name in ("max_steps", "video_max_steps"):
        if getattr(cfg, name) < 1:
            fail(name, getattr(cfg, name), "must be positive")
    if cfg.video and not cfg.video.lower().endswith(".gif"):
        fail("video", cfg.video, "only .gif output is supported")
    if cfg.video:  # before the episodes are played, not after
        check_writable("video", cfg.video, folder=False)
    device = resolve_device(cfg.device)
    model, state, spec = load_model(cfg.checkpoint, device)
    greedy = trained_greedy(state) if cfg.policy == "trained" else cfg.policy == "argmax"
    r2d2 = state.get("identity", {}).get("algo") == "r2d2"
    epsilon = cfg.epsilon if r2d2 and cfg.policy == "trained" else 0.0
    if not 0 <= cfg.epsilon <= 1:
        fail("epsilon", cfg.epsilon, "must be in [0, 1]")
    # The video first (its episode is separate from the scored ones): an env
    # that cannot render costs the video only, said in one line.
    frames, no_video = None, None
    if cfg.video:
        try:
            frames = record(model, spec, greedy, cfg.seed, cfg.video_max_steps)
        except video.RenderUnavailable as e:
            no_video = str(e)
    returns, cut = play(model, spec, cfg.episodes, greedy, cfg.seed, cfg.max_steps, epsilon)
    counters = state.get("counters", {})
    steps = counters.get("steps", counters.get("generation", 0))
    mode = "mean" if getattr(model, "continuous", False) else "argmax"
    how = (f"epsilon-greedy, epsilon {epsilon:g}" if epsilon else mode) if greedy else "sampled"
    print(f"{spec.env_id}: {cfg.episodes} episodes ({how} actions), return mean {returns.mean():.2f} "
          f"std {returns.std():.2f} (min {returns.min():.1f}, max {returns.max():.1f}); "
          f"checkpoint {state['path']} at {steps:,d} {'steps' if 'steps' in counters else 'generations'}")
    if cut:
        print(f"note: {cut} of the {cfg.episodes} episodes had not ended after --max-steps {cfg.max_steps:,d}; "
              "their returns are partial", flush=True)
    out = {"mean": float(returns.mean()), "std": float(returns.std()), "returns": returns.tolist(),
           "policy": how, "cut_short": cut}
    if no_video is not None:
        print(f"no video: {no_video}", flush=True)
    if frames is not None:
        gif, h, w = encode_gif(frames)
        Path(cfg.video).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.video).write_bytes(gif)
        run_dir = checkpoint.run_dir_of(state["path"])
        from seedlocal.monitor import RunMonitor

        mon = RunMonitor(run_dir, progress=False, lock=False)
        mon.image_summary("eval/episode", gif, h, w, steps)
        mon.close()
        print(f"video: {cfg.video} ({len(frames)} frames); also in TensorBoard under eval/episode of {run_dir}")
        out["video"] = cfg.video
    return out
