"""Environment backends, all seen by a worker as one *group*: a batch of
environments with ``reset()``, ``send(actions)`` and ``recv()``.

``send`` starts stepping and may return at once (envpool steps in its own
threads); ``recv`` waits for the results. A worker with two groups sends one
and then receives the other, which is what keeps its CPU busy while the
inference loop computes the first group's next actions.

Every backend follows envpool's auto-reset convention: the step after an
episode ends resets that env, ignores its action and returns reward 0. The
worker marks such rows ``ignored`` in the unroll store.

Observations are always a dict (key ``""`` for a plain array observation).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from seedlocal.errors import ConfigError, EnvContractError
from seedlocal.spec import EnvSpec, TensorSpec

if TYPE_CHECKING:  # a worker imports this module, and no torch: config is only named here
    from seedlocal.config.schema import EnvConfig

BACKENDS = ("auto", "envpool", "gymnasium", "null")
# envpool's seed is a C++ int and env i of a group is seeded seed + i, so every
# env's seed must stay below this; Gymnasium's take any size >= 0.
SEED_END = 2**31


def wrap_seed(seed: int, span: int) -> int:
    """``seed`` taken into [0, room), room a whole number of ``span``-wide blocks with one spare below
    SEED_END: a block of ``span`` envs seeded ``seed + j`` then always fits envpool's int32, however far
    restarts or reconnections have counted a run's blocks up."""
    return seed % ((SEED_END // span - 1) * span)


def quiet_gymnasium() -> None:
    """Silence Gymnasium's per-env-creation warning that a float64 Box bound
    was cast to float32 (classic control): harmless, and printed by every
    worker at every start. Other warnings stay on."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*precision lowered by casting to float32.*")


@functools.lru_cache(maxsize=1)
def _envpool_ids() -> frozenset[str]:
    try:
        import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


def _gymnasium_ids() -> frozenset[str]:
    import gymnasium

    return frozenset(gymnasium.registry.keys())


def _unknown_id(env_id: str, why: str, otherwise: str = "") -> ValueError:
    """The error for an id nothing registered, with the ids it may have meant:
    the same name's latest version first (seedlocal wants the version
    spelled out: a run's checkpoints are for one version), then near spellings."""
    import difflib
    import re

    name = env_id.partition(":")[2] or env_id
    known = _envpool_ids() | _gymnasium_ids()
    versions = sorted((int(m.group(1)), i) for i in known if (m := re.fullmatch(re.escape(name) + r"-v(\d+)", i)))
    near = [i for _, i in reversed(versions)] or difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(near[:3])}?" if near else otherwise
    return ValueError(f"env.id={env_id!r}: {why}{hint}")


# Namespaces of Gymnasium ids that a package registers when asked, and what installs it.
NAMESPACE_PACKAGES = {"MinAtar": "minatar (pip install 'seedlocal[minatar]')"}
_registered: set[str] = set()  # namespaces this process has registered


def register_namespace(env_id: str) -> None:
    """Register the ids of ``env_id``'s namespace (``MinAtar/Breakout-v1``)
    through the package that declares it as a ``gymnasium.envs`` entry point
    (the plugin hook Gymnasium 0.x loaded by itself and 1.x no longer does),
    so no shim module is needed. Called wherever Gymnasium makes an env,
    worker processes included (they start fresh: spawn). Other ids: nothing."""
    namespace, slash, _ = env_id.partition("/")
    if not slash or ":" in env_id or namespace in _registered or env_id in _gymnasium_ids():
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group="gymnasium.envs"):
        if ep.name == namespace:
            try:
                register = ep.load()
                if callable(register):
                    register()
            except Exception as e:
                raise ValueError(f"env.id={env_id!r}: {ep.value} (which registers {namespace}/ ids) failed: "
                                 f"{type(e).__name__}: {e}") from None
            _registered.add(namespace)  # once per process: a misspelled id must not register it again
            return
    if namespace in NAMESPACE_PACKAGES and env_id not in _envpool_ids():
        raise ValueError(f"env.id={env_id!r}: {namespace}/ ids need the package {NAMESPACE_PACKAGES[namespace]}")


def import_env_module(env_id: str) -> str:
    """For Gymnasium's ``module.path:EnvId-v0`` form, import the module (whose
    import registers the id) and return the bare id; other ids pass through.

    ``gymnasium.make`` accepts the same form and imports the module itself,
    so worker processes and ``eval`` need nothing but the id string.
    """
    if ":" not in env_id:
        register_namespace(env_id)
        return env_id
    import importlib

    module, _, name = env_id.partition(":")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"env.id={env_id!r}: cannot import module {module!r} ({e}); "
                         "it must be importable (installed, or on PYTHONPATH)") from None
    except Exception as e:
        raise ValueError(f"env.id={env_id!r}: importing {module!r} failed: {type(e).__name__}: {e}") from None
    if name not in _gymnasium_ids():
        raise _unknown_id(env_id, f"importing {module!r} did not register {name!r} with Gymnasium",
                          " (the module should call gymnasium.register)")
    return name


def validate_env(env: EnvConfig, id_field: str = "env.id") -> EnvSpec:
    """Resolve a config's env id to a spec, or raise the ConfigError that names the field holding it."""
    try:
        return describe(env.id, env.backend, env.frame_stack)
    except ValueError as e:
        msg = str(e)
        if msg.startswith("env.id="):
            msg = id_field + msg[len("env.id"):]
        raise ConfigError(msg) from None


def resolve_backend(env_id: str, backend: str = "auto") -> str:
    """The backend that will run ``env_id``; ValueError if none can."""
    if backend not in BACKENDS:
        raise ValueError(f"env.backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    import_env_module(env_id)
    if ":" in env_id:  # a user's own Gymnasium env, registered by its module
        if backend in ("envpool",):
            raise ValueError(f"env.id={env_id!r}: a module:EnvId id is a Gymnasium env, not an envpool one")
        return "gymnasium" if backend == "auto" else backend
    in_envpool = env_id in _envpool_ids()
    if backend == "auto":
        if in_envpool:
            return "envpool"
        if env_id in _gymnasium_ids():
            return "gymnasium"
        raise _unknown_id(env_id, "not an envpool id nor a registered Gymnasium id "
                          "(see envpool.list_all_envs() and gymnasium.pprint_registry())")
    if backend == "envpool" and not in_envpool:
        raise ValueError(f"env.id={env_id!r}: not an envpool id (env.backend=envpool)")
    if backend == "gymnasium" and env_id not in _gymnasium_ids():
        raise ValueError(f"env.id={env_id!r}: not a registered Gymnasium id (env.backend=gymnasium)")
    if backend == "null" and not (in_envpool or env_id in _gymnasium_ids()):
        raise ValueError(f"env.id={env_id!r}: the null backend copies a real env's spaces; unknown id")
    return backend


def _leaf_spec(space) -> TensorSpec:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype).name
        # A uint8 Box of 0s and 1s (MinAtar's grids as its master declares them; 1.0.15 says bool) is a 0/1
        # grid: stored and read as bool, not as pixels the network divides by 255.
        if dtype == "uint8" and space.low.min() >= 0 and space.high.max() <= 1:
            dtype = "bool"
        return TensorSpec(tuple(space.shape), dtype)
    if isinstance(space, spaces.Discrete):
        return TensorSpec((), "int64")
    if isinstance(space, spaces.MultiBinary | spaces.MultiDiscrete):
        return TensorSpec(tuple(space.shape), "int64")
    raise ValueError(f"a {type(space).__name__} inside it")


def _space_spec(space) -> dict[str, TensorSpec]:
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: _leaf_spec(sub) for k, sub in space.spaces.items()}
    return {"": _leaf_spec(space)}


def _obs_classes(space) -> dict[str, tuple[int, int]]:
    from gymnasium import spaces

    leaves = space.spaces.items() if isinstance(space, spaces.Dict) else [("", space)]
    return {k: (int(sub.n), int(sub.start)) for k, sub in leaves if isinstance(sub, spaces.Discrete)}


def _action_spec(space) -> dict:
    """EnvSpec's action fields for a Discrete or Box space (a Box flattened: ``EnvSpec.action``)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return dict(action=TensorSpec((), "int64"), num_actions=int(space.n), action_low=None, action_high=None,
                    action_start=int(space.start))
    if isinstance(space, spaces.Box):
        low = tuple(float(x) for x in np.broadcast_to(space.low, space.shape).ravel())
        high = tuple(float(x) for x in np.broadcast_to(space.high, space.shape).ravel())
        return dict(action=TensorSpec((len(low),), "float32"), num_actions=None, action_low=low, action_high=high,
                    box_shape=tuple(int(n) for n in space.shape))
    raise ValueError(f"action space {space} is not supported: seedlocal's algorithms act in a Discrete space "
                     "(the pipeline also steps Box actions, for benchmarks)")


@functools.lru_cache(maxsize=32)
def describe(env_id: str, backend: str = "auto", frame_stack: int = 0) -> EnvSpec:
    """Read an env's spaces by building one instance of it (cached)."""
    quiet_gymnasium()
    backend = resolve_backend(env_id, backend)
    real = "envpool" if backend in ("envpool", "null") and env_id in _envpool_ids() else "gymnasium"
    if frame_stack < 0:
        raise ValueError(f"env.frame_stack={frame_stack}: must be >= 0")
    if frame_stack and real != "envpool":
        raise ValueError(f"env.frame_stack={frame_stack}: only envpool's Atari envs stack frames ({env_id} is not one)")
    if real == "envpool":
        import envpool

        try:
            env = envpool.make(env_id, env_type="gymnasium", num_envs=1, **_stack_kw(frame_stack))
        except (TypeError, ValueError, RuntimeError) as e:
            if frame_stack:
                raise ValueError(f"env.frame_stack={frame_stack}: {env_id} does not take it ({e})") from None
            raise ValueError(f"env.id={env_id!r}: envpool could not make it ({type(e).__name__}: {e})") from None
        obs_space, act_space = env.observation_space, env.action_space
        frames = int(getattr(env.spec.config, "frame_skip", 1))
        env.close() if hasattr(env, "close") else None
    else:
        import gymnasium

        try:
            env = gymnasium.make(env_id)
        except Exception as e:  # the user's own constructor: name it, in one line
            raise ValueError(f"env.id={env_id!r}: making the env raised {type(e).__name__}: {e}") from None
        obs_space, act_space = env.observation_space, env.action_space
        frames = 1
        _close_quietly(env)
    try:
        obs = _space_spec(obs_space)
    except ValueError as e:
        raise ValueError(f"env.id={env_id!r}: observation space {obs_space} is not supported ({e}): seedlocal "
                         "takes Box, Discrete, MultiBinary, MultiDiscrete or a flat Dict of those") from None
    try:
        action = _action_spec(act_space)
    except ValueError as e:
        raise ValueError(f"env.id={env_id!r}: {e}") from None
    return EnvSpec(env_id, backend, obs, frames_per_step=frames, frame_stack=frame_stack,
                   obs_classes=_obs_classes(obs_space), **action)


def _close_quietly(env, timeout_s: float = 5.0) -> None:
    """Close the env built only to read its spaces: the spaces are what was
    wanted, so a ``close()`` that raises or hangs must not stop the run."""
    import threading

    t = threading.Thread(target=lambda: _ignore_errors(env.close), daemon=True, name="env-close")
    t.start()
    t.join(timeout_s)


def _ignore_errors(fn) -> None:
    try:
        fn()
    except Exception:
        pass


def _stack_kw(frame_stack: int) -> dict:
    return {"stack_num": frame_stack} if frame_stack else {}


class ActionBounds:
    """What a Box action goes through on its way to the simulator: refused
    if it is NaN or infinite (a diverged network; the inference loop stops
    first, this is the last line), clipped to the space's bounds, and given
    the space's own shape (the pipeline's actions are flat vectors). The
    learner keeps the unclipped sample: its probability is what the policy
    gave."""

    def __init__(self, spec: EnvSpec):
        self.env_id, self.shape = spec.env_id, spec.box_shape
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self._out = None

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """``actions``: [n, prod(shape)]; returns [n, *shape], clipped."""
        if not np.isfinite(actions).all():
            raise EnvContractError(f"{self.env_id}: the policy sent a NaN or infinite action; not stepping the env "
                                   "with it (a diverged network?)")
        n = len(actions)
        if self._out is None or len(self._out) != n:
            self._out = np.empty((n, self.low.size), np.float32)
        np.clip(np.reshape(actions, self._out.shape), self.low, self.high, out=self._out)
        return self._out.reshape((n,) + self.shape)


def action_bounds(spec: EnvSpec) -> ActionBounds | None:
    return ActionBounds(spec) if spec.num_actions is None else None


class EnvpoolGroup:
    """``envs_per_group`` envpool environments stepped together in envpool's threads."""

    def __init__(self, env_id: str, envs_per_group: int, num_threads: int, seed: int, spec: EnvSpec,
                 render: bool = False):
        import envpool

        self._env = envpool.make(
            env_id, env_type="gymnasium", num_envs=envs_per_group, batch_size=envs_per_group,
            num_threads=num_threads, seed=seed, **_stack_kw(spec.frame_stack),
            **({"render_mode": "rgb_array"} if render else {}),
        )
        self._dict_obs = len(spec.obs) > 1 or "" not in spec.obs
        self._bounds = action_bounds(spec)

    def reset(self) -> None:
        self._env.async_reset()

    def send(self, actions: np.ndarray) -> None:
        # envpool converts the dtype itself; int64 → int32 is one small copy.
        self._env.send(actions if self._bounds is None else self._bounds(actions))

    def recv(self):
        obs, reward, terminated, truncated, _ = self._env.recv()
        if not self._dict_obs:
            obs = {"": obs}
        return obs, reward, terminated, truncated

    def render(self) -> np.ndarray:
        """Env 0's frame as a person sees it ([H, W, 3] uint8; made with ``render=True``)."""
        return np.asarray(self._env.render())[0]

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()


class GymnasiumGroup:
    """Fallback for Gymnasium ids that envpool lacks: plain envs stepped in turn
    by the worker itself, with envpool's next-step auto-reset."""

    def __init__(self, env_id: str, envs_per_group: int, num_threads: int, seed: int, spec: EnvSpec,
                 render: bool = False):
        import gymnasium

        register_namespace(env_id)
        self._envs = [gymnasium.make(env_id, **({"render_mode": "rgb_array"} if render else {}))
                      for _ in range(envs_per_group)]
        self._id, self._seed, self._start = env_id, seed, spec.action_start
        self._bounds = action_bounds(spec)
        self._keys = list(spec.obs)
        self._float_keys = [k for k, s in spec.obs.items() if np.dtype(s.dtype).kind == "f"]
        self._obs = {k: np.zeros((envs_per_group,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self._reward = np.zeros(envs_per_group, np.float32)
        self._terminated = np.zeros(envs_per_group, bool)
        self._truncated = np.zeros(envs_per_group, bool)
        self._needs_reset = np.ones(envs_per_group, bool)
        self._first = True

    def _put_obs(self, i: int, obs) -> None:
        for k in self._keys:
            v, out = obs[k] if isinstance(obs, dict) else obs, self._obs[k]
            if getattr(v, "shape", None) != out.shape[1:]:  # lists, scalars, other shapes
                v = np.asarray(v)
                if v.size != out[i].size:  # numpy would repeat a smaller one silently
                    raise EnvContractError(f"{self._id}: observation{f' {k!r}' if k else ''} has shape "
                                           f"{v.shape}, its space says {out.shape[1:]}")
                v = v.reshape(out.shape[1:])
            out[i] = v

    def reset(self) -> None:
        self._needs_reset[:] = True
        self.send(None)

    def send(self, actions: np.ndarray | None) -> None:
        if actions is not None and self._bounds is not None:
            actions = self._bounds(actions)
        for i, env in enumerate(self._envs):
            if self._needs_reset[i]:
                seed = self._seed + i if self._first else None
                out = env.reset(seed=seed)
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise EnvContractError(f"{self._id}: reset() returned {_what(out)}; Gymnasium envs return "
                                           "(observation, info) (an old Gym env needs porting to that API)")
                obs = out[0]
                self._reward[i], self._terminated[i], self._truncated[i] = 0.0, False, False
            else:
                try:
                    out = None
                    out = env.step(actions[i] + self._start if self._start else actions[i])
                    obs, r, te, tr, _ = out
                except (TypeError, ValueError) as e:
                    # Unpacked here, or by a Gymnasium wrapper (TimeLimit) inside step().
                    if out is None and "(expected 5, got 4)" not in str(e):
                        raise  # the env's own error
                    what = _what(out) if out is not None else "a tuple of 4"
                    raise EnvContractError(
                        f"{self._id}: step() returned {what}; Gymnasium envs return (observation, reward, "
                        "terminated, truncated, info) (an old Gym env needs porting to that API)") from None
                self._reward[i], self._terminated[i], self._truncated[i] = _finite_reward(self._id, r), te, tr
            self._needs_reset[i] = self._terminated[i] or self._truncated[i]
            self._put_obs(i, obs)
        self._first = False

    def recv(self):
        for k in self._float_keys:
            bad = ~np.isfinite(self._obs[k]).reshape(len(self._envs), -1).all(1)
            if bad.any():
                raise EnvContractError(f"{self._id}: env {int(np.argmax(bad))} returned an observation"
                                 f"{f' {k!r}' if k else ''} with NaN or inf; observations must be finite")
        return self._obs, self._reward, self._terminated, self._truncated

    def render(self) -> np.ndarray:
        return np.asarray(self._envs[0].render())

    def close(self) -> None:
        for env in self._envs:
            env.close()


def _what(out) -> str:
    return f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {type(out).__name__}"


def _finite_reward(env_id: str, r) -> float:
    if type(r) is float or type(r) is int:  # the usual case, in ~100 ns
        value = float(r)
    else:
        try:  # numpy scalars, 0-d or 1-element arrays; None becomes NaN
            value = float(np.asarray(r, np.float64).reshape(()))
        except (TypeError, ValueError):
            value = math.nan
    if not math.isfinite(value):
        raise EnvContractError(f"{env_id}: step() returned the reward {r!r}; rewards must be finite numbers")
    return value


class NullGroup:
    """No environment at all: returns the previous arrays at once. Measures
    the ceiling of the transport (slots, notification, gather, write-back)."""

    def __init__(self, env_id: str, envs_per_group: int, num_threads: int, seed: int, spec: EnvSpec):
        self._obs = {k: np.zeros((envs_per_group,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self._reward = np.zeros(envs_per_group, np.float32)
        self._false = np.zeros(envs_per_group, bool)

    def reset(self) -> None:
        pass

    def send(self, actions) -> None:
        pass

    def recv(self):
        return self._obs, self._reward, self._false, self._false

    def close(self) -> None:
        pass


def make_group(spec: EnvSpec, envs_per_group: int, num_threads: int, seed: int, render: bool = False):
    """``render``: the envs also draw frames for a person (``group.render()``: eval's videos)."""
    quiet_gymnasium()
    cls = {"envpool": EnvpoolGroup, "gymnasium": GymnasiumGroup, "null": NullGroup}[spec.backend]
    return cls(spec.env_id, envs_per_group, num_threads, seed, spec, **({"render": True} if render else {}))
