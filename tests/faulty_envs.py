"""Users' envs that go wrong, or that seedlocal must adapt to, for
tests/test_custom_env.py (imported by module id: ``faulty_envs:Name-v0``)."""
import time

import gymnasium as gym
import numpy as np


class _Short(gym.Env):
    """20-step episodes; reward 1 for action 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.full(self.observation_space.shape, self.t / 20, self.observation_space.dtype)

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), self.t >= 20, False, {}


class ResetRaises(_Short):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("boom in reset")


class ResetAborts(_Short):
    """Native code failing hard while an env starts (an abort, as a C++
    assertion would): the worker dies by SIGABRT, not by an exception."""

    def reset(self, *, seed=None, options=None):
        import os

        os.abort()


class StepHangs(_Short):
    def step(self, action):
        if self.t >= 5:
            time.sleep(3600)
        return super().step(action)


class OneHangs(_Short):
    """Only the env seeded 1 (worker 0's first env, with env.seed 1) hangs in
    step(); every other env plays on."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.hangs = seed == 1
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if getattr(self, "hangs", False) and self.t >= 3:
            time.sleep(3600)
        return super().step(action)


class ImageHWC(_Short):
    """Gymnasium's usual image layout: height, width, channels."""

    observation_space = gym.spaces.Box(0, 255, (48, 48, 3), np.uint8)

    def _obs(self):
        img = np.zeros(self.observation_space.shape, np.uint8)
        img[: self.t * 2, :, 0] = 255
        return img


class ActionStart(_Short):
    """Actions 1 and 2 (``Discrete(2, start=1)``); reward 1 for action 2. Any
    other action is a bug of the caller: it raises."""

    action_space = gym.spaces.Discrete(2, start=1)
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)

    def step(self, action):
        if not self.action_space.contains(action):
            raise AssertionError(f"invalid action {action!r} for {self.action_space}")
        return super().step(int(action) - 1)


class NaNReward(_Short):
    def step(self, action):
        obs, _, te, tr, info = super().step(action)
        return obs, float("nan") if self.t == 3 else 0.0, te, tr, info


class BroadcastObs(_Short):
    """Observes shape (1,) under a (3,) space: numpy would broadcast it."""

    def _obs(self):
        return np.full((1,), self.t / 20, np.float32)


class DictBare(_Short):
    """A Dict space whose step() returns the bare array from its first step on (its reset is right)."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})

    def _obs(self):
        return np.full((3,), self.t / 20, np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return {"pos": obs}, info


class InitRaises(_Short):
    def __init__(self):
        raise FileNotFoundError("level file missing")


class Endless(_Short):
    """Episodes that never end (no time limit registered)."""

    def step(self, action):
        obs, r, _, _, info = super().step(action)
        return obs, r, False, False, info


class EvenSeedsEnd(_Short):
    """Reward 1 a step. An env reset with an even seed ends its episode after 5 steps (return 5); one reset with
    an odd seed never ends it: an eval of its envs has some returns in, then runs until it is stopped."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.ends = seed % 2 == 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, _, _, _, info = super().step(action)
        return obs, 1.0, getattr(self, "ends", True) and self.t >= 5, False, info


class StepRaises(_Short):
    """A user's env with a bug: step() raises ValueError once an env has stepped 40 times (over its episodes)."""

    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps > 40:
            raise ValueError(f"bad state after {self.steps - 1} steps")
        return super().step(action)


class OldGymStep(_Short):
    """The pre-Gymnasium API: step returns (obs, reward, done, info)."""

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        return obs, r, te or tr, info


gym.register("ResetRaises-v0", entry_point=ResetRaises)
gym.register("OldGymStep-v0", entry_point=OldGymStep)
gym.register("ActionStart-v0", entry_point=ActionStart)
gym.register("NaNReward-v0", entry_point=NaNReward)
gym.register("BroadcastObs-v0", entry_point=BroadcastObs)
gym.register("DictBare-v0", entry_point=DictBare)
gym.register("InitRaises-v0", entry_point=InitRaises)
gym.register("Endless-v0", entry_point=Endless)
gym.register("EvenSeedsEnd-v0", entry_point=EvenSeedsEnd)
gym.register("StepRaises-v0", entry_point=StepRaises)
gym.register("StepHangs-v0", entry_point=StepHangs)
gym.register("OneHangs-v0", entry_point=OneHangs)
gym.register("ResetAborts-v0", entry_point=ResetAborts)
gym.register("ImageHWC-v0", entry_point=ImageHWC)


class BoxShaped(gym.Env):
    """A Box action space of shape ``(2, 3)``: the env checks it receives its
    own shape, and rewards actions near a fixed target (so learning is seen)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        action = np.asarray(action)
        if action.shape != self.action_space.shape:
            raise AssertionError(f"action of shape {action.shape} for {self.action_space}")
        self.t += 1
        target = np.linspace(-0.5, 0.5, action.size).reshape(action.shape)
        return np.full(3, self.t / 20, np.float32), float(-np.abs(action - target).mean()), self.t >= 20, False, {}


class BoxScalar(BoxShaped):
    """A scalar Box action, ``Box(-1, 1, ())``."""

    action_space = gym.spaces.Box(-1.0, 1.0, (), np.float32)


gym.register("BoxShaped-v0", entry_point=BoxShaped)
gym.register("BoxScalar-v0", entry_point=BoxScalar)


class IntBoxAction(_Short):
    """An integer Box action space, whose env checks every action is in it (dtype included)."""

    action_space = gym.spaces.Box(0, 10, (2,), np.int64)

    def step(self, action):
        if not self.action_space.contains(np.asarray(action)):
            raise AssertionError(f"action {action!r} is not in {self.action_space}")
        self.last_action = np.asarray(action)
        return super().step(1)


class KeepsAction(_Short):
    """A float Box action that the env keeps past its step, as an action-rate penalty does (by reference, as
    Gymnasium allows: the action is the env's once passed)."""

    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def step(self, action):
        self.kept = getattr(self, "kept", []) + [action]
        return super().step(1)


class LaterBareArray(_Short):
    """A Dict space whose env returns a bare array from its second step on, past Gymnasium's first-step check."""

    observation_space = gym.spaces.Dict(a=gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                        b=gym.spaces.Box(-1.0, 1.0, (3,), np.float32))

    def _obs(self):
        v = np.full(3, self.t / 20, np.float32)
        return v if self.t >= 2 else {"a": v, "b": v}


class DiscreteObsOutOfRange(_Short):
    """A Discrete(4) observation that is 7 from the second step on."""

    observation_space = gym.spaces.Discrete(4)

    def _obs(self):
        return 7 if self.t >= 2 else self.t


class HugeReward(_Short):
    """A finite float64 reward beyond float32's range."""

    def step(self, action):
        obs, _, te, tr, info = super().step(action)
        return obs, 1e39 if self.t == 2 else 0.0, te, tr, info


class CloseRaises(_Short):
    closed = 0

    def close(self):
        CloseRaises.closed += 1
        raise RuntimeError("close failed")


class EmptyField(_Short):
    observation_space = gym.spaces.Dict(pos=gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                        empty=gym.spaces.Box(-1.0, 1.0, (0,), np.float32))


class ImageInDict(_Short):
    observation_space = gym.spaces.Dict(img=gym.spaces.Box(0, 255, (40, 40, 3), np.uint8),
                                        vec=gym.spaces.Box(-1.0, 1.0, (3,), np.float32))

    def _obs(self):
        return {"img": np.zeros((40, 40, 3), np.uint8), "vec": np.full(3, self.t / 20, np.float32)}


for _env in (IntBoxAction, KeepsAction, LaterBareArray, DiscreteObsOutOfRange, HugeReward, CloseRaises, EmptyField, ImageInDict):
    gym.register(f"{_env.__name__}-v0", entry_point=_env)
