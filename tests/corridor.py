"""The README's example of a user's own Gymnasium environment (kept in sync
with it by tests/test_custom_env.py): walk right along a corridor."""
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos == 10
        return np.array([self.pos / 10], np.float32), float(done), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=100)
