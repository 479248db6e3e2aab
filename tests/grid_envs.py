"""Small-grid Gymnasium envs shaped like MinAtar's, for tests/test_small_grid.py
(``grid_envs:BoolGrid-v0``), so those tests need no ``minatar`` package.

``BoolGrid-v0`` observes a (10, 10, 4) bool grid, as MinAtar 1.0.15 declares
its Box, with one lit cell in channel 0 whose column the agent names with
one of 3 actions (column // 4 is rewarded 1). Episodes last 16 steps.
``Uint8Grid-v0`` is the same game declared as a uint8 Box of 0s and 1s.
"""

import gymnasium as gym
import numpy as np


class BoolGrid(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (10, 10, 4), bool)
    action_space = gym.spaces.Discrete(3)

    def _observe(self) -> np.ndarray:
        self.col = int(self.np_random.integers(10))
        grid = np.zeros((10, 10, 4), bool)
        grid[int(self.np_random.integers(10)), self.col, 0] = True
        return grid

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        self.t += 1
        reward = float(int(action) == min(self.col // 4, 2))
        return self._observe(), reward, self.t >= 16, False, {}


class Uint8Grid(BoolGrid):
    """The same game with its grid declared as MinAtar's master does: a uint8 Box of 0s and 1s."""

    observation_space = gym.spaces.Box(0, 1, (10, 10, 4), np.uint8)

    def _observe(self) -> np.ndarray:
        return super()._observe().astype(np.uint8)


gym.register("BoolGrid-v0", entry_point=BoolGrid)
gym.register("Uint8Grid-v0", entry_point=Uint8Grid)
