"""A Discrete env that gives Gymnasium's legal-action flags in ``info`` under a
key this module only spells in two parts, so describe() (which resets an env
for its info only where the env's module names that key) does not see it:
the worker must say so (tests/test_masks.py). Id ``hidden_mask_env:Hidden-v0``."""

import gymnasium as gym
import numpy as np

KEY = "action" + "_mask"


class Hidden(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {KEY: np.array([1, 0], np.int8)}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, self.t >= 5, False, {KEY: np.array([1, 0], np.int8)}


gym.register("Hidden-v0", entry_point=Hidden)
