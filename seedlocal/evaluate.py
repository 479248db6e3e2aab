"""``seedlocal eval``: play a checkpoint, report its return, record an episode.

The family that wrote the checkpoint makes the policy its training's inference runs (``from_checkpoint``),
and eval calls its ``act`` as the inference loop does, stepping the env backend directly, one env per episode,
no pipeline. From Python: ``seedlocal.evaluate(checkpoint, episodes=10, **options)`` (this module is that call:
``evaluate`` below) returns an ``Evaluation``.
"""

from __future__ import annotations

import os
import signal
import sys
import types
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch

from seedlocal import checkpoint, families, video
from seedlocal.config.checks import check_writable, resolve_device
from seedlocal.config.overrides import apply, flatten
from seedlocal.errors import fail, fail_if
from seedlocal.envs.make import make_group
from seedlocal.pipeline.policy import Acting, Policy


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
    out: str = ""
    """write the returns and their summary here as JSON (e.g. returns.json); on Ctrl-C, those of the episodes
    that had ended"""
    member: int = -1
    """a population's checkpoint (--population.size > 1): the member to play, by index (-1: the best at the save,
    by its last 20 training episodes)"""
    device: str = "auto"
    """where the network runs: auto (cuda if present, else cpu), cpu, cuda, cuda:N (as train's
    --pipeline.device)"""


def policy_of(state: dict, device: torch.device, greedy: bool | None = None, epsilon: float = 0.0) -> Policy:
    """A checkpoint's policy, made by the family that wrote it (``families.py``) as its training's inference
    runs it (``greedy`` None: acting as trained)."""
    return families.of_checkpoint(state).from_checkpoint(state, device, greedy, epsilon)


def play(policy: Policy, episodes: int, seed: int, max_steps: int,
         ended: Callable[[float], None] | None = None) -> tuple[np.ndarray, int]:
    """One raw return per episode (each env plays its first episode), and how many of them ``max_steps`` cut
    short. ``ended`` hears each return as its episode ends: what an interrupted eval still has."""
    env = make_group(policy.spec, episodes, 1, seed)
    try:
        act = Acting(policy, episodes)
        obs, *_ = video.step(env)
        returns, finished = np.zeros(episodes), np.zeros(episodes, bool)
        for _ in range(max_steps):
            obs, reward, terminated, truncated = video.step(env, act(obs))
            returns += np.where(finished, 0.0, reward)
            now = (terminated | truncated) & ~finished
            finished |= now
            for i in np.flatnonzero(now) if ended is not None else ():
                ended(float(returns[i]))
            if finished.all():
                break
    finally:
        env.close()
    return returns, int((~finished).sum())


def main(cfg: EvalConfig) -> dict:
    fail_if(lambda v: v < 1, cfg, ("episodes", "max_steps", "video_max_steps"), "must be positive")
    if cfg.video and not cfg.video.lower().endswith(".gif"):
        fail("video", cfg.video, "only .gif output is supported")
    for name in ("video", "out"):  # before the episodes are played, not after
        if getattr(cfg, name):
            check_writable(name, getattr(cfg, name), folder=False)
    fail_if(lambda v: not 0 <= v <= 1, cfg, ("epsilon",), "must be in [0, 1]")
    state = checkpoint.member_of(checkpoint.load(cfg.checkpoint), cfg.member)
    trained, device = cfg.policy == "trained", resolve_device(cfg.device)
    acting = (state, device, None if trained else cfg.policy == "argmax", cfg.epsilon if trained else 0.0)
    policy = policy_of(*acting)
    # The video first (its episode is separate from the scored ones, played by a policy of its own, so that the
    # scores do not depend on it): an env that cannot render costs the video only, said in one line.
    frames, no_video = None, None
    if cfg.video:
        try:
            frames = video.record(Acting(policy_of(*acting), 1), policy.spec, cfg.seed, cfg.video_max_steps)
        except video.RenderUnavailable as e:
            no_video = str(e)
    returns, cut = _play_or_report(cfg, state, policy)
    out = _report(cfg, state, policy, returns, cut)
    if cut:
        print(f"note: {cut} of the {cfg.episodes} episodes had not ended after --max-steps {cfg.max_steps:,d}; "
              "their returns are partial", flush=True)
    if no_video is not None:
        print(f"no video: {no_video}", flush=True)
    if frames is not None:
        gif, h, w = video.encode_gif(frames)
        Path(cfg.video).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.video).write_bytes(gif)
        run_dir = checkpoint.run_dir_of(state["path"])
        print(f"video: {cfg.video} ({len(frames)} frames); {_to_tensorboard(run_dir, gif, h, w, _trained(state)[0])}")
        out["video"] = cfg.video
    return out


def _play_or_report(cfg: EvalConfig, state: dict, policy: Policy) -> tuple[np.ndarray, int]:
    """The episodes played, each return said as its episode ends. Stopped by Ctrl-C (or SIGTERM, SIGHUP), the
    returns of those that had ended are reported, marked as stopped, before the stop goes on up to the command."""
    so_far: list[float] = []

    def ended(ret: float) -> None:
        so_far.append(ret)
        print(f"episode {len(so_far)} of {cfg.episodes}: return {ret:.2f}", flush=True)

    try:
        return play(policy, cfg.episodes, cfg.seed, cfg.max_steps, ended)
    except (KeyboardInterrupt, SystemExit) as e:
        signum = getattr(e, "signum", None)  # the CLI's SIGTERM / SIGHUP
        if not isinstance(e, KeyboardInterrupt) and signum is None:
            raise
        how = "interrupted" if signum is None else f"stopped by {signal.Signals(signum).name}"
        _report(cfg, state, policy, np.array(so_far), 0, stopped=how)
        e.seedlocal_kept = f"the returns of {len(so_far)} episodes" + (f" in {cfg.out}" if cfg.out else " above")
        raise


def _trained(state: dict) -> tuple[int, str]:
    """How far the checkpoint's run had trained: its steps, or its generations (neuroevolution)."""
    counters = state.get("counters", {})
    return (counters["steps"], "steps") if "steps" in counters else (counters.get("generation", 0), "generations")


def _report(cfg: EvalConfig, state: dict, policy: Policy, returns: np.ndarray, cut: int, stopped: str = "") -> dict:
    """The summary line of ``returns``, and the same in ``--out``'s file: every episode, or those that ended
    before the eval was ``stopped`` (e.g. "interrupted")."""
    at, unit = _trained(state)
    n = len(returns)
    played = f"{stopped} after {n} of {cfg.episodes} episodes" if stopped else f"{n} episodes"
    stats = (f"return mean {returns.mean():.2f} std {returns.std():.2f} (min {returns.min():.1f}, "
             f"max {returns.max():.1f})") if n else "no episode had ended"
    member = f" (member {state['member']})" if "member" in state else ""
    print(f"{policy.spec.env_id}: {played} ({policy.acting} actions), {stats}; checkpoint {state['path']}{member} at "
          f"{at:,d} {unit}", flush=True)
    out = {"mean": float(returns.mean()) if n else None, "std": float(returns.std()) if n else None,
           "returns": returns.tolist(), "policy": policy.acting, "cut_short": cut,
           **({"member": state["member"]} if "member" in state else {})}
    if cfg.out:
        checkpoint.write_json(cfg.out, {"env": policy.spec.env_id, "checkpoint": str(state["path"]), unit: at,
                                        "episodes": n, "episodes_asked": cfg.episodes, "interrupted": bool(stopped),
                                        **out})
        print(f"returns: {cfg.out}", flush=True)
    return out


def _to_tensorboard(run_dir: Path, gif: bytes, h: int, w: int, steps: int) -> str:
    """Add the video to the run's TensorBoard where its folder can be written (an archived run may be read-only,
    and its writer would fail in a thread); says which."""
    from seedlocal.monitor import RunMonitor

    if not os.access(run_dir, os.W_OK):
        return f"not added to the run's TensorBoard: {run_dir} cannot be written here"
    mon = RunMonitor(run_dir, progress=False, lock=False)
    mon.image_summary("eval/episode", gif, h, w, steps)
    mon.close()
    return f"also in TensorBoard under eval/episode of {run_dir}"


@dataclass(frozen=True)
class Evaluation:
    """What ``seedlocal.evaluate`` returns."""

    returns: list[float]
    """each episode's raw return"""
    mean: float
    std: float
    policy: str
    """how it acted (e.g. sampled, argmax)"""
    cut_short: int
    """episodes that had not ended after max_steps (their returns are partial)"""
    video: str | None
    """the GIF written, if one was asked for and the env could draw it"""


def evaluate(checkpoint: str | Path, episodes: int = 10, **options) -> Evaluation:
    """``seedlocal eval`` from Python: play ``checkpoint`` (a checkpoint file, or a run folder: its newest) for
    ``episodes``. ``options`` are eval's other options by name (``policy``, ``video``, ``device``, ``seed``,
    ``max_steps``, ``epsilon``, ``video_max_steps``, ``out``, ``member``); what the command line refuses in one line is
    raised as a ``SeedlocalError`` with that line."""
    out = main(apply(EvalConfig(checkpoint=str(checkpoint)), flatten(EvalConfig, {"episodes": episodes, **options})))
    return Evaluation(**{f.name: out.get(f.name) for f in fields(Evaluation)})  # main's dict, less the member


class _CallableModule(types.ModuleType):
    """``seedlocal.evaluate`` names this module once it is imported (a package's attribute cannot be both the
    submodule and a function), so the module itself is the call: ``seedlocal.evaluate(checkpoint, ...)``."""

    __call__ = staticmethod(evaluate)


sys.modules[__name__].__class__ = _CallableModule
