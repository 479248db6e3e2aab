"""Eval's videos: what a person sees, the env's own colour frames.

The episode recorded is the one the policy plays: one env of the policy's
own backend, made to render as well (``make_group(..., render=True)``), so
the network gets its usual observations (Atari's 84 x 84 grey stacks) while
the video gets the game's 210 x 160 colour frames, MuJoCo's 480 x 480
camera, or a Gymnasium env's ``render()``.

MuJoCo draws with OpenGL. Without a display it needs a headless context:
EGL (the ``libegl1`` Debian/Ubuntu package, Mesa's software renderer is
enough) or OSMesa (``libosmesa6``), through the ``mujoco`` Python package
(``pip install mujoco``); ``MUJOCO_GL`` picks one (default here: egl). An env
that cannot render at all is no error: ``RenderUnavailable`` says why, and
eval still plays its episodes and reports their returns. An image env that
only lacks ``render()`` is recorded from its observations instead.
"""

from __future__ import annotations

import os

import numpy as np

from seedlocal.pipeline.envs import EnvSpec, make_group

_GL: list = []  # the headless OpenGL context, once made (kept alive for the process)


class RenderUnavailable(Exception):
    """This env cannot draw frames here; the message says why and what to install."""


def _headless_gl(width: int = 480, height: int = 480) -> None:
    """Make an OpenGL context current (MuJoCo through envpool draws into the caller's)."""
    if _GL:
        _GL[0].make_current()
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import mujoco

        ctx = mujoco.GLContext(width, height)
        ctx.make_current()
    except Exception as e:
        raise RenderUnavailable(f"no OpenGL context for MuJoCo ({type(e).__name__}: {e}); install the mujoco "
                                "package (pip install mujoco) and EGL (apt install libegl1) or OSMesa (apt install "
                                "libosmesa6, then MUJOCO_GL=osmesa)") from None
    _GL.append(ctx)


def draws_with_opengl(spec: EnvSpec) -> bool:
    """envpool's MuJoCo and dm_control envs draw into the caller's OpenGL
    context (MuJoCo exits the process if there is none: it must be made first)."""
    if spec.backend != "envpool":
        return False
    from envpool.registration import registry

    entry = registry.specs.get(spec.env_id)
    return bool(entry) and str(entry[0]).startswith("envpool.mujoco")


def _hint(spec: EnvSpec, e: BaseException) -> str:
    text = str(e).lower()
    if "pygame" in text:
        return "; for classic control install pygame (pip install pygame)"
    if "mujoco" in text or "opengl" in text or "egl" in text:
        return ("; MuJoCo renders through the mujoco package with EGL or OSMesa (pip install mujoco; apt install "
                "libegl1 or libosmesa6)")
    return "; the env must take render_mode='rgb_array' and return frames from render()"


def record(act, spec: EnvSpec, seed: int, max_steps: int, core=None) -> list[np.ndarray]:
    """Frames of one episode the policy ``act(obs, core) -> (actions, core)``
    plays, at most ``max_steps`` steps, or ``RenderUnavailable``."""
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # Gymnasium's MuJoCo envs would try a window (GLFW) otherwise
    image_obs = spec.obs.get("") is not None and len(spec.obs[""].shape) == 3
    try:
        env = make_group(spec, 1, 1, seed, render=True)
    except Exception as e:
        if not image_obs:
            raise RenderUnavailable(f"cannot render {spec.env_id} ({type(e).__name__}: {e}){_hint(spec, e)}") \
                from None
        env, draw = make_group(spec, 1, 1, seed), None  # an image env without render(): its observations
    else:
        draw = env.render
    try:
        env.reset()
        obs, *_ = env.recv()
        if draw is not None:
            try:
                if draws_with_opengl(spec):
                    _headless_gl()
                frames = [draw()]
            except RenderUnavailable:
                raise
            except Exception as e:
                raise RenderUnavailable(f"cannot render {spec.env_id} ({type(e).__name__}: {e}){_hint(spec, e)}") \
                    from None
        else:
            frames = [_observed(obs)]
        for _ in range(max_steps - 1):
            actions, core = act(obs, core)
            env.send(actions)
            obs, _, te, tr = env.recv()
            frames.append(draw() if draw is not None else _observed(obs))
            if te[0] or tr[0]:
                break
    finally:
        env.close()
    return [np.asarray(f, dtype=np.uint8) for f in frames]


def _observed(obs: dict) -> np.ndarray:
    """The newest frame of an image observation (channels first or last), as grey."""
    x = np.asarray(obs[""][0])
    return x[-1] if x.shape[0] <= 16 else x[..., -1]
