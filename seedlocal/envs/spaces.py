"""An env's spaces read into an ``EnvSpec`` by building one instance of it (``describe``, cached), and a config's
env checked that way (``validate_env``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import threading
from typing import TYPE_CHECKING

import numpy as np

from seedlocal.envs.bounds import BOX_ACTIONS
from seedlocal.envs.envpool_group import stack_kw
from seedlocal.envs.gymnasium_group import quiet_gymnasium
from seedlocal.envs.ids import envpool_ids, resolve_backend
from seedlocal.errors import ConfigError
from seedlocal.spec import MASK_KEY, EnvSpec, TensorSpec

if TYPE_CHECKING:  # a worker imports this module, and no torch: config is only named here
    from seedlocal.config.schema import EnvConfig


def validate_env(env: EnvConfig, id_field: str = "env.id") -> EnvSpec:
    """Resolve a config's env id to a spec, or raise the ConfigError that names the field holding it."""
    try:
        spec = describe(env.id, env.backend, env.frame_stack)
    except ValueError as e:  # its own words, naming the field the id came from
        raise ConfigError(re.sub(r"^env\.id=", f"{id_field}=", str(e))) from None
    return with_box_actions(spec, env.box_actions)


def with_box_actions(spec: EnvSpec, box_actions: str) -> EnvSpec:
    """``spec`` whose Box actions meet their bounds by ``box_actions`` (``envs/bounds.py``); a Discrete one as is."""
    if box_actions not in BOX_ACTIONS:
        raise ConfigError(f"env.box_actions={box_actions!r}: expected one of {', '.join(BOX_ACTIONS)}")
    if spec.num_actions is not None or spec.box_actions == box_actions:
        return spec
    return dataclasses.replace(spec, box_actions=box_actions)


def _leaf_spec(space) -> TensorSpec:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        if 0 in space.shape:
            raise ValueError(f"a Box of shape {space.shape}, which holds nothing")
        dtype = np.dtype(space.dtype).name
        # A uint8 Box of 0s and 1s (MinAtar's grids as its master declares them; 1.0.15 says bool) is a 0/1
        # grid: stored and read as bool, not as pixels the network divides by 255.
        if dtype == "uint8" and space.low.min() >= 0 and space.high.max() <= 1:
            dtype = "bool"
        return TensorSpec(tuple(space.shape), dtype)
    if isinstance(space, spaces.Discrete | spaces.MultiBinary | spaces.MultiDiscrete):  # a Discrete's shape is ()
        return TensorSpec(tuple(space.shape), "int64")
    raise ValueError(f"a {type(space).__name__} inside it")


def _obs_spec(space) -> tuple[dict[str, TensorSpec], dict[str, tuple[int, int]]]:
    """EnvSpec's ``obs`` and ``obs_classes`` of an observation space, with a field for each of a Dict's, or ``""``
    for a plain one."""
    from gymnasium import spaces

    leaves = list(space.spaces.items()) if isinstance(space, spaces.Dict) else [("", space)]
    classes = {k: (int(sub.n), int(sub.start)) for k, sub in leaves if isinstance(sub, spaces.Discrete)}
    return {k: _leaf_spec(sub) for k, sub in leaves}, classes


def _action_spec(space) -> dict:
    """EnvSpec's action fields for a Discrete or Box space (a Box flattened: ``EnvSpec.action``)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return dict(action=TensorSpec((), "int64"), num_actions=int(space.n), action_low=None, action_high=None,
                    action_start=int(space.start))
    if isinstance(space, spaces.Box):
        low, high = (tuple(map(float, np.broadcast_to(b, space.shape).ravel())) for b in (space.low, space.high))
        return dict(action=TensorSpec((len(low),), "float32"), num_actions=None, action_low=low, action_high=high,
                    box_shape=tuple(int(n) for n in space.shape), box_dtype=np.dtype(space.dtype).name)
    raise ValueError(f"action space {space} is not supported: seedlocal's algorithms act in a Discrete or a Box "
                     "space (R2D2 in a Discrete one only)")


@functools.lru_cache(maxsize=32)
def describe(env_id: str, backend: str = "auto", frame_stack: int = 0) -> EnvSpec:
    """Read an env's spaces by building one instance of it (cached)."""
    quiet_gymnasium()
    backend = resolve_backend(env_id, backend)
    real = "envpool" if backend in ("envpool", "null") and env_id in envpool_ids() else "gymnasium"
    if frame_stack < 0:
        raise ValueError(f"env.frame_stack={frame_stack}: must be >= 0")
    if frame_stack and real != "envpool":
        raise ValueError(f"env.frame_stack={frame_stack}: only envpool's Atari envs stack frames ({env_id} is not one)")
    if real == "envpool":
        import envpool

        try:
            env = envpool.make(env_id, env_type="gymnasium", num_envs=1, **stack_kw(frame_stack))
        except (TypeError, ValueError, RuntimeError) as e:
            if frame_stack:
                raise ValueError(f"env.frame_stack={frame_stack}: {env_id} does not take it ({e})") from None
            raise ValueError(f"env.id={env_id!r}: envpool could not make it ({type(e).__name__}: {e})") from None
        obs_space, act_space = env.observation_space, env.action_space
        frames, info_mask = int(getattr(env.spec.config, "frame_skip", 1)), None  # envpool's have no action masks
        env.close()
    else:
        import gymnasium

        try:
            env = gymnasium.make(env_id)
        except Exception as e:  # the user's own constructor: name it, in one line
            raise ValueError(f"env.id={env_id!r}: making the env raised {type(e).__name__}: {e}") from None
        obs_space, act_space = env.observation_space, env.action_space
        frames, info_mask = 1, _info_mask(env, obs_space, act_space)
        _close_quietly(env)
    try:
        obs, classes = _obs_spec(obs_space)
    except ValueError as e:
        raise ValueError(f"env.id={env_id!r}: observation space {obs_space} is not supported ({e}): seedlocal "
                         "takes Box, Discrete, MultiBinary, MultiDiscrete or a flat Dict of those") from None
    try:
        action = _action_spec(act_space)
        obs = _with_mask(obs, action["num_actions"], info_mask)
    except ValueError as e:
        raise ValueError(f"env.id={env_id!r}: {e}") from None
    return EnvSpec(env_id, backend, obs, frames_per_step=frames, frame_stack=frame_stack, obs_classes=classes, **action)


def _info_mask(env, obs_space, act_space) -> tuple[int, ...] | None:
    """The shape of Gymnasium's ``info["action_mask"]`` where a Discrete env without one in its Dict observation
    gives it, read from one ``reset``; None otherwise. Only an env whose code names the mask is reset here
    (``_names_the_mask``): a reset that hangs or crashes natively in this process would take the run with it, where
    a worker's is reported in one line. A reset that raises is the worker's to report, not this one's."""
    from gymnasium import spaces

    in_obs = isinstance(obs_space, spaces.Dict) and MASK_KEY in obs_space.spaces
    if not isinstance(act_space, spaces.Discrete) or in_obs or not _names_the_mask(env):
        return None
    try:
        out = env.reset(seed=0)
        info = out[1] if isinstance(out, tuple) and len(out) == 2 else {}
    except Exception:
        return None
    mask = info.get(MASK_KEY) if isinstance(info, dict) else None
    return None if mask is None else tuple(np.shape(mask))


def _names_the_mask(env) -> bool:
    """Whether the module of the env's class, or of one of its wrappers', names ``action_mask`` in its source
    (Gymnasium's own wrappers do not)."""
    while env is not None:
        with contextlib.suppress(TypeError, OSError):  # no source: a compiled module
            if MASK_KEY in inspect.getsource(inspect.getmodule(type(env))):
                return True
        env = getattr(env, "env", None)
    return False


def _with_mask(obs: dict[str, TensorSpec], num_actions: int | None,
               info_mask: tuple[int, ...] | None) -> dict[str, TensorSpec]:
    """``obs`` with the action mask as a bool field of one flag per Discrete action (``spec.MASK_KEY``), where the
    env gives one in its observation or in ``info``."""
    if MASK_KEY not in obs and info_mask is None:
        return obs
    shape = obs[MASK_KEY].shape if MASK_KEY in obs else info_mask
    if num_actions is None:
        raise ValueError(f"it gives an {MASK_KEY}, which masks Discrete actions; its action space is a Box")
    if tuple(shape) != (num_actions,):
        raise ValueError(f"its {MASK_KEY} has shape {tuple(shape)}; it must hold one flag per action ({num_actions},)")
    return {**obs, MASK_KEY: TensorSpec((num_actions,), "bool")}


def _close_quietly(env, timeout_s: float = 5.0) -> None:
    """Close the env built only to read its spaces: the spaces are what was wanted, so a ``close()`` that raises
    or hangs must not stop the run."""
    def close() -> None:
        with contextlib.suppress(Exception):
            env.close()

    t = threading.Thread(target=close, daemon=True, name="env-close")
    t.start()
    t.join(timeout_s)
