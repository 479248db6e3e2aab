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


class StepHangs(_Short):
    def step(self, action):
        if self.t >= 5:
            time.sleep(3600)
        return super().step(action)


class ImageHWC(_Short):
    """Gymnasium's usual image layout: height, width, channels."""

    observation_space = gym.spaces.Box(0, 255, (48, 48, 3), np.uint8)

    def _obs(self):
        img = np.zeros(self.observation_space.shape, np.uint8)
        img[: self.t * 2, :, 0] = 255
        return img


gym.register("ResetRaises-v0", entry_point=ResetRaises)
gym.register("StepHangs-v0", entry_point=StepHangs)
gym.register("ImageHWC-v0", entry_point=ImageHWC)
