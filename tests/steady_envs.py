"""A Gymnasium env whose every episode is the same for the same actions (no randomness in reset or step), with
returns that grade every policy (``steady_envs:Slope-v0``): tests/test_distributed.py compares a split
population's fitness with one process's, which needs each member's score to depend on the member alone."""
import gymnasium as gym
import numpy as np

LENGTH, TARGET = 20, 7


class Slope(gym.Env):
    """Walk along a line (left, stay, right) for 20 steps, rewarded each step by how near position 7 it is."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos / 10, self.t / LENGTH], np.float32)

    def step(self, action):
        self.pos += int(action) - 1
        self.t += 1
        return self._obs(), 1.0 - abs(self.pos - TARGET) / 10, False, self.t >= LENGTH, {}


gym.register("Slope-v0", entry_point=Slope)
