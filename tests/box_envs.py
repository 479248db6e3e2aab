"""Box-action Gymnasium envs for tests/test_continuous.py (``box_envs:Name-v0``)."""
import gymnasium as gym
import numpy as np


class EchoAction(gym.Env):
    """Observes the action it was last stepped with: what reached the env after clipping."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 0.5], np.float32))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.asarray(action, np.float32).copy(), 0.0, self.t >= 50, False, {}


gym.register("EchoAction-v0", entry_point=EchoAction)
