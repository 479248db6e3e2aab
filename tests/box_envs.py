"""Box-action Gymnasium envs for tests/test_continuous.py and tests/test_box_actions.py (``box_envs:Name-v0``)."""
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


class WideTarget(gym.Env):
    """A Box far from [-1, 1], with bounds of different widths and centres: [0, 100] x [-20, 5]. Every step
    pays 1 minus the distance of the action from the target (90, -17.5), as a share of each range, averaged
    over the two: 1 at the target, 0.6 at the centre of the box (where a policy rescaled from [-1, 1]
    starts), 0.2 at (0, 0) (where one whose actions are only clipped starts). 20 steps an episode (a
    return of 20 at best); the observation is the share of the episode played."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(np.array([0.0, -20.0], np.float32), np.array([100.0, 5.0], np.float32))
    target = np.array([90.0, -17.5])
    steps = 20

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._played(), {}

    def _played(self) -> np.ndarray:
        return np.array([self.t / self.steps], np.float32)

    def step(self, action):
        self.t += 1
        width = self.action_space.high - self.action_space.low
        reward = 1.0 - float(np.mean(np.abs(np.asarray(action, np.float64) - self.target) / width))
        return self._played(), reward, self.t >= self.steps, False, {}


gym.register("WideTarget-v0", entry_point=WideTarget)
