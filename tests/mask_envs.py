"""Envs that say which actions are legal (Gymnasium's ``action_mask``), for
tests/test_masks.py and the masked curve in docs/masks.md (ids
``mask_envs:Name-v0``).

Pick: each step a random subset of 8 actions is legal (at least one); the
observation shows which. The lowest-numbered legal action earns 1, another
legal one 0; an illegal action ends the episode with -1. 20 steps a game.

* ``Pick-v0``: the mask in a Dict observation, {"observation", "action_mask"}
* ``PickInfo-v0``: the mask in ``info["action_mask"]``, the observation a Box
* ``PickNoMask-v0``: the same game without a mask (the unmasked curve)
* ``NoLegal-v0``: at step 3 a mask that allows no action, mid-episode
* ``BadMask-v0``: a mask of 9 flags over 8 actions

Where ``MASK_ENVS_ILLEGAL_LOG`` names a file, each illegal action appends a
line to it (from whichever worker process stepped it).
"""

import os

import gymnasium as gym
import numpy as np

N, STEPS = 8, 20


class Pick(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, mask: str = "obs", render_mode=None, empty_at: int = -1):
        self.mask, self.render_mode, self.empty_at = mask, render_mode, empty_at
        board = gym.spaces.Box(0.0, 1.0, (N,), np.float32)
        self.observation_space = (gym.spaces.Dict({"observation": board, "action_mask": gym.spaces.MultiBinary(N)})
                                  if mask == "obs" else board)
        self.action_space = gym.spaces.Discrete(N)

    def _draw(self) -> None:
        self.legal = self.np_random.random(N) < 0.5
        if not self.legal.any():
            self.legal[self.np_random.integers(N)] = True
        if self.t == self.empty_at:
            self.legal[:] = False

    def _out(self):
        board, info = self.legal.astype(np.float32), {}
        if self.mask == "info":
            info["action_mask"] = self.legal.astype(np.int8)
        if self.mask == "obs":
            return {"observation": board, "action_mask": self.legal.astype(np.int8)}, info
        return board, info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._out()

    def step(self, action):
        a = int(action)
        if not self.legal[a]:
            log = os.environ.get("MASK_ENVS_ILLEGAL_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(f"{a} {self.legal.astype(int).tolist()}\n")
            obs, info = self._out()
            return obs, -1.0, True, False, info
        reward = 1.0 if a == int(np.argmax(self.legal)) else 0.0
        self.t += 1
        self._draw()
        obs, info = self._out()
        return obs, reward, False, self.t >= STEPS, info

    def render(self):
        """The legal actions as a row of cells (green legal, grey not), 8 pixels each."""
        row = np.where(self.legal[:, None], [[40, 200, 40]], [[90, 90, 90]]).astype(np.uint8)
        return np.repeat(np.repeat(row[None], 8, 0), 8, 1)


class BadMask(Pick):
    """A mask of 9 flags over 8 actions."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"observation": self.observation_space["observation"],
                                                  "action_mask": gym.spaces.MultiBinary(N + 1)})


gym.register("Pick-v0", entry_point=Pick)
gym.register("PickInfo-v0", entry_point=Pick, kwargs={"mask": "info"})
gym.register("PickNoMask-v0", entry_point=Pick, kwargs={"mask": "none"})
gym.register("NoLegal-v0", entry_point=Pick, kwargs={"empty_at": 3})
gym.register("BadMask-v0", entry_point=BadMask)
