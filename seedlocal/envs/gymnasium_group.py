"""The Gymnasium fallback: ids envpool lacks, stepped in turn by the worker itself, with envpool's auto-reset, and
refused in one line where they break the Gymnasium contract (old Gym returns, non-finite rewards or observations,
observations of another shape than their space's)."""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np

from seedlocal.envs.bounds import action_bounds
from seedlocal.envs.ids import register_namespace
from seedlocal.errors import EnvContractError
from seedlocal.spec import MASK_KEY, EnvSpec


_unseen_mask_said = False  # whether this process said that an env's info gives a mask describe() did not see


def quiet_gymnasium() -> None:
    """Silence Gymnasium's per-env-creation warning that a float64 Box bound was cast to float32 (classic control):
    harmless, and printed by every worker at every start. Other warnings stay on."""
    warnings.filterwarnings("ignore", message=r".*precision lowered by casting to float32.*")


class GymnasiumGroup:
    def __init__(self, spec: EnvSpec, envs_per_group: int, num_threads: int, seed: int, render: bool = False):
        import gymnasium

        register_namespace(spec.env_id)
        # Gymnasium's passive checker off: its first reset and step raised a bare AssertionError, which restarted
        # the worker, where this group's own checks (every step, not only the first) name the env in one line.
        self._envs = [gymnasium.make(spec.env_id, disable_env_checker=True,
                                     **({"render_mode": "rgb_array"} if render else {})) for _ in range(envs_per_group)]
        self._id, self._seed, self._start = spec.env_id, seed, spec.action_start
        self._bounds = action_bounds(spec)
        self._plain = "" in spec.obs  # not a Dict space (an info mask may sit beside it)
        self._classes = {k: (start, start + n) for k, (n, start) in spec.obs_classes.items()}  # [low, high)
        self._float_keys = [k for k, s in spec.obs.items() if np.dtype(s.dtype).kind == "f"]
        self._obs = {k: np.zeros((envs_per_group,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self._reward = np.zeros(envs_per_group, np.float32)
        self._terminated, self._truncated = np.zeros(envs_per_group, bool), np.zeros(envs_per_group, bool)
        self._needs_reset = np.ones(envs_per_group, bool)
        self._first, self._masked = True, MASK_KEY in spec.obs
        self._t = np.zeros(envs_per_group, np.int64)  # steps into each env's episode, for a mask's error

    def _put_obs(self, i: int, obs, info) -> None:
        for k, out in self._obs.items():
            if k == MASK_KEY and not (isinstance(obs, dict) and k in obs):
                v = info.get(MASK_KEY) if isinstance(info, dict) else None
                if v is None:
                    raise EnvContractError(f"{self._id}: its info has no {MASK_KEY!r} at this step; it had one at "
                                           "reset, and every step must give it")
            elif isinstance(obs, dict) != self._plain and (self._plain or k in obs):
                v = obs[k] if isinstance(obs, dict) else obs
            else:  # Gymnasium's passive checker looks at the first reset and step only
                raise EnvContractError(self._not_its_space(obs))
            if getattr(v, "shape", None) != out.shape[1:]:  # lists, scalars, other shapes
                v = np.asarray(v)
                if v.size != out[i].size:  # numpy would repeat a smaller one silently
                    raise EnvContractError(f"{self._id}: observation{f' {k!r}' if k else ''} has shape "
                                           f"{v.shape}, its space says {out.shape[1:]}")
                v = v.reshape(out.shape[1:])
            out[i] = v
            if k in self._classes and not self._classes[k][0] <= out[i] < self._classes[k][1]:
                raise EnvContractError(f"{self._id}: observation{f' {k!r}' if k else ''} is {out[i]}, outside its "
                                       f"Discrete space's {self._classes[k][0]}..{self._classes[k][1] - 1}")
        global _unseen_mask_said
        if not self._masked and not _unseen_mask_said and isinstance(info, dict) and MASK_KEY in info:
            # describe() resets an env for its info only where its code names the mask; one built elsewhere
            # would otherwise act unmasked in silence. Said once per worker process.
            _unseen_mask_said = True
            print(f"seedlocal: {self._id}: its info gives {MASK_KEY!r}, which was not seen when the run read the "
                  f"env's spaces (only an env whose own module names {MASK_KEY!r} is reset for that), so actions "
                  "are not masked: put the mask in a Dict observation under that key", file=sys.stderr, flush=True)
        if self._masked and not self._terminated[i] and not self._obs[MASK_KEY][i].any():
            raise EnvContractError(f"{self._id}: env {i} of a group gave an {MASK_KEY} that allows no action at step "
                                   f"{self._t[i]} of its episode; only an episode's terminal step may")

    def _not_its_space(self, obs) -> str:
        keys = [k for k in self._obs if k != MASK_KEY]
        space = "a Dict with keys " + ", ".join(map(repr, keys)) if not self._plain else "not a Dict"
        what = (f"a dict with keys {', '.join(map(repr, obs))}" if isinstance(obs, dict)
                else f"of type {type(obs).__name__}")
        return f"{self._id}: observation is {what}; its space is {space}"

    def reset(self) -> None:
        self._needs_reset[:] = True
        self.send(None)

    def send(self, actions: np.ndarray | None) -> None:
        # A copy of their own: an env may keep its action past the step (an action-rate penalty), and the buffers
        # the actions arrive in hold the next step's by then.
        if actions is not None:
            actions = np.array(actions if self._bounds is None else self._bounds(actions))
        for i, env in enumerate(self._envs):
            if self._needs_reset[i]:
                out = env.reset(seed=self._seed + i if self._first else None)
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise EnvContractError(f"{self._id}: reset() returned {_what(out)}; Gymnasium envs return "
                                           "(observation, info) (an old Gym env needs porting to that API)")
                obs, info = out
                self._reward[i], self._terminated[i], self._truncated[i], self._t[i] = 0.0, False, False, 0
            else:
                try:
                    out = None
                    out = env.step(actions[i] + self._start if self._start else actions[i])
                    obs, r, te, tr, info = out
                except (TypeError, ValueError) as e:
                    # Unpacked here, or by a Gymnasium wrapper (TimeLimit) inside step().
                    if out is None and "(expected 5, got 4)" not in str(e):
                        raise  # the env's own error
                    what = _what(out) if out is not None else "a tuple of 4"
                    raise EnvContractError(
                        f"{self._id}: step() returned {what}; Gymnasium envs return (observation, reward, "
                        "terminated, truncated, info) (an old Gym env needs porting to that API)") from None
                self._reward[i], self._terminated[i], self._truncated[i] = _finite_reward(self._id, r), te, tr
                self._t[i] += 1
            self._needs_reset[i] = self._terminated[i] or self._truncated[i]
            self._put_obs(i, obs, info)
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
        """Close every env; one whose close() raises is named in one line, and the others are still closed."""
        errors = []
        for env in self._envs:
            try:
                env.close()
            except Exception as e:
                errors.append(e)
        if errors:
            print(f"seedlocal: {self._id}: close() raised in {len(errors)} of {len(self._envs)} envs "
                  f"({type(errors[0]).__name__}: {errors[0]}); ignored", file=sys.stderr, flush=True)


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
    if abs(value) > _FLOAT32_MAX:  # finite here, inf once stored
        raise EnvContractError(f"{env_id}: step() returned the reward {r!r}, beyond float32's range (about "
                               "3.4e38), in which rewards are stored; scale it down")
    return value


_FLOAT32_MAX = float(np.finfo(np.float32).max)
