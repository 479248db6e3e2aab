"""Videos of an episode (eval's, and training's ``--video-every-min``): the env's own colour frames (the README's
"Videos" says what each kind of env needs to draw them), from one env of the policy's own backend made to render as
well (``make_group(..., render=True)``), so that the network gets its usual observations. An env that cannot render
raises ``RenderUnavailable`` (why, and what to install: eval still plays its episodes); an image env that only lacks
``render()`` is recorded from its observations.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import io
import math
import os

import numpy as np

from seedlocal import checkpoint
from seedlocal.envs.envpool_group import EnvpoolGroup
from seedlocal.envs.make import make_group
from seedlocal.spec import EnvSpec

MAX_FPS = 50.0  # a GIF's shortest reliable frame delay is 20 ms (browsers slow shorter ones)
DEFAULT_FPS = 30.0  # an env that says nothing of its speed
MIN_SIDE = 32  # frames smaller than this (on their shorter side) are enlarged, each cell a square block ...
ENLARGED_SIDE = 160  # ... to at least this many pixels (Atari's width)


class Clip(list):
    """An episode's frames ([H, W, 3] uint8) and the frames per second that play them in real time."""

    def __init__(self, frames=(), fps: float = DEFAULT_FPS):
        super().__init__(frames)
        self.fps = fps


class RenderUnavailable(Exception):
    """This env cannot draw frames here; the message says why and what to install."""


@functools.cache
def _headless_gl():
    """A 480 x 480 OpenGL context for MuJoCo through envpool, which draws into the caller's current one; made once."""
    backend = os.environ.setdefault("MUJOCO_GL", "egl").lower()
    try:
        # The backend's own module: mujoco.GLContext was fixed by MUJOCO_GL when mujoco was first imported.
        module = importlib.import_module(f"mujoco.{backend}" if backend in ("egl", "osmesa", "glfw") else "mujoco")
        ctx = module.GLContext(480, 480)
        ctx.make_current()
    except Exception as e:
        raise RenderUnavailable(f"no OpenGL context for MuJoCo ({type(e).__name__}: {e}); install the mujoco "
                                "package (pip install mujoco) and EGL (apt install libegl1) or OSMesa (apt install "
                                "libosmesa6, then MUJOCO_GL=osmesa)") from None
    atexit.register(ctx.free)  # while the modules it calls still exist (OSMesa's __del__ at exit would complain)
    return ctx


def _envpool_family(spec: EnvSpec) -> str:
    """Where envpool registers the env's spec ("envpool.atari...", "envpool.mujoco..."), or "" for other envs."""
    if spec.backend != "envpool":
        return ""
    from envpool.registration import registry

    entry = registry.specs.get(spec.env_id)
    return str(entry[0]) if entry else ""


def steps_per_second(spec: EnvSpec) -> float:
    """Env steps in one second of the real thing: an Atari console's 60 frames over the frame skip, else the
    Gymnasium twin's ``render_fps`` (MuJoCo: 1 / dt), else ``DEFAULT_FPS``."""
    if _envpool_family(spec).startswith("envpool.atari"):
        return 60.0 / max(1, spec.frames_per_step)
    try:
        import gymnasium
        from gymnasium.envs.registration import load_env_creator

        entry = gymnasium.spec(spec.env_id).entry_point
        fps = getattr(load_env_creator(entry) if isinstance(entry, str) else entry, "metadata", {}).get("render_fps")
        if not fps:  # MuJoCo sets it per instance, from its dt
            with contextlib.closing(gymnasium.make(spec.env_id)) as env:
                fps = env.metadata.get("render_fps") or 1.0 / env.unwrapped.dt
        return float(fps) if float(fps) > 0 else DEFAULT_FPS
    except Exception:  # not a Gymnasium id (dm_control, MiniGrid ...), or it says nothing
        return DEFAULT_FPS


def _cannot_render(spec: EnvSpec, e: BaseException) -> RenderUnavailable:
    """Why ``spec``'s env cannot draw (``e``), with what to install or change."""
    text, why = str(e).lower(), f"cannot render {spec.env_id} ({type(e).__name__}: {e}); "
    if "pygame" in text:
        return RenderUnavailable(why + "for classic control install pygame (pip install pygame)")
    if "mujoco" in text or "opengl" in text or "egl" in text:
        return RenderUnavailable(why + "MuJoCo renders through the mujoco package with EGL or OSMesa (pip install "
                                 "mujoco; apt install libegl1 or libosmesa6)")
    if spec.backend == "envpool":
        return RenderUnavailable(why + "envpool draws its Atari, MuJoCo, dm_control and classic control envs, not "
                                 "this one")
    return RenderUnavailable(why + "the env must take render_mode='rgb_array' and return frames from render()")


def step(env, actions=None) -> tuple:
    """``env.send(actions)`` (``reset()`` for None), then its ``recv()``, as eval steps: on envpool, which closed
    with a step in flight can abort the process (and waits for ever in a ``recv()`` with none), Ctrl-C, SIGTERM and
    SIGHUP wait until both are done where Python handles them (a signal left to its default action still ends the
    process at once, as ``kill`` should a hung eval). A Gymnasium group steps inside ``send``, which stays
    interruptible."""
    with checkpoint.signals_held(handled_only=True) if isinstance(env, EnvpoolGroup) else contextlib.nullcontext():
        if actions is None:
            env.reset()
        else:
            env.send(actions)
        return env.recv()


def record(act, spec: EnvSpec, seed: int, max_steps: int) -> Clip:
    """Frames of one episode the policy ``act(obs) -> actions`` (keeping its own state, e.g.
    ``pipeline.policy.Acting``) plays, at most ``max_steps`` steps, drawn every k-th step so that they
    play in real time at no more than ``MAX_FPS``; or ``RenderUnavailable``."""
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # Gymnasium's MuJoCo envs would try a window (GLFW) otherwise
    fps = steps_per_second(spec)
    every = max(1, math.ceil(fps / MAX_FPS - 1e-9))
    try:
        env = make_group(spec, 1, 1, seed, render=True)
        draw = env.render
    except Exception as e:
        if spec.obs.get("") is None or len(spec.obs[""].shape) != 3:  # not an image env
            raise _cannot_render(spec, e) from None
        env, draw = make_group(spec, 1, 1, seed), None  # an image env without render(): its observations
    try:
        obs, *_ = step(env)
        if draw is not None:
            try:
                if _envpool_family(spec).startswith("envpool.mujoco"):  # MuJoCo, dm_control: into the caller's
                    _headless_gl().make_current()  # OpenGL context, and MuJoCo exits the process if there is none
                first = _frame(draw())
            except RenderUnavailable:
                raise
            except Exception as e:
                raise _cannot_render(spec, e) from None
        else:
            first = _observed(obs)
        frames = Clip([first], fps / every)
        for t in range(1, max_steps):
            obs, _, te, tr = step(env, act(obs))
            end = bool(te[0] or tr[0])
            if t % every == 0 or end or t == max_steps - 1:  # the episode's last frame too
                frames.append(_frame(draw()) if draw is not None else _observed(obs))
            if end:
                break
    finally:
        env.close()
    return frames


def _frame(x) -> np.ndarray:
    """A rendered frame as [H, W, 3] uint8 (grey [H, W] widened), or RenderUnavailable for anything else."""
    f = np.asarray(x)
    if f.ndim == 3 and f.shape[-1] == 4:
        f = f[..., :3]
    if f.ndim == 2:
        f = np.repeat(f[..., None], 3, axis=-1)
    if f.ndim != 3 or f.shape[-1] != 3 or not f.size or not np.issubdtype(f.dtype, np.number):
        what = "None" if f.ndim == 0 and f.item() is None else f"an array of shape {f.shape}"
        raise RenderUnavailable(f"render() returned {what}, not an [H, W, 3] image; the env must take "
                                "render_mode='rgb_array' and return frames from render()")
    if np.issubdtype(f.dtype, np.floating):  # colours in [0, 1] as matplotlib takes them (MinAtar draws so),
        f = np.nan_to_num(f)  # or already in 0..255
        f = np.clip(f * (255.0 if f.max() <= 1.0 else 1.0) + 0.5, 0, 255)
    f = f.astype(np.uint8, copy=False)
    if min(f.shape[:2]) < MIN_SIDE:  # a grid (MinAtar's 10 x 10 cells), not a picture: cells a person can see
        k = -(-ENLARGED_SIDE // min(f.shape[:2]))
        f = np.repeat(np.repeat(f, k, axis=0), k, axis=1)
    return f


def _observed(obs: dict) -> np.ndarray:
    """The newest frame of an image observation (channels first or last), as grey."""
    x = np.asarray(obs[""][0])
    return np.asarray(x[-1] if x.shape[0] <= 16 else x[..., -1], dtype=np.uint8)


def encode_gif(frames: list[np.ndarray]) -> tuple[bytes, int, int]:
    """An animated GIF playing ``frames`` at their real-time rate (a ``Clip``'s; else ``DEFAULT_FPS``); frame delays
    are rounded to the GIF's 10 ms so that their sum keeps to the clock."""
    from PIL import Image

    fps = float(getattr(frames, "fps", DEFAULT_FPS))
    ends = np.maximum(np.round(np.arange(1, len(frames) + 1) * 100.0 / fps), 2 * np.arange(1, len(frames) + 1))
    durations = (np.diff(ends, prepend=0.0) * 10).astype(int).tolist()  # centiseconds -> ms, each >= 20
    imgs = (Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames)  # one at a time: frames can be large
    first = next(imgs)
    buf = io.BytesIO()
    first.save(buf, format="GIF", save_all=True, append_images=imgs, duration=durations, loop=0)
    return buf.getvalue(), first.height, first.width
