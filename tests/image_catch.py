"""A small Atari-shaped task for fast learning tests: Catch on 84x84 frames.

A ball falls one cell per step down a 7x7 grid from a random column; the
agent moves a paddle on the bottom row and scores +1 for a catch, -1 for a
miss. Observations are the last 4 frames, uint8 (4, 84, 84), as envpool's
Atari v5 envs give them (``ImageCatch1-v0``: the last frame alone, (1, 84, 84),
as envpool's with ``stack_num=1``, for the frames stacked beside the network),
and there are 6 actions as in Pong (0 and 1 stay,
2 and 4 move right, 3 and 5 move left). One episode is ``drops`` balls.

The reward comes 6 steps after the decision that earns it, so a learner must
assign credit through time, and the policy must read the ball's position
from pixels: the Nature CNN, the loss and the optimiser all have to work.
A random policy scores about -0.55 per ball; a perfect one +1.

``CatchDict-v0`` is the game in a Dict observation, paid as the paddle follows
the ball: the ball on a small image, the paddle in a vector beside it
(``CatchDictPixels-v0``: a 42 x 42 image).

Importing this module registers ``ImageCatch-v0`` with Gymnasium, so
``image_catch:ImageCatch-v0`` is a valid env id for seedlocal.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

GRID = 7
CELL = 12  # 7 cells x 12 px = 84 px
MOVES = np.array([0, 0, 1, -1, 1, -1])


class ImageCatch(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, drops: int = 5, stack: int = 4):
        self.drops = drops
        self.observation_space = spaces.Box(0, 255, (stack, GRID * CELL, GRID * CELL), np.uint8)
        self.action_space = spaces.Discrete(len(MOVES))
        self._frames = np.zeros((stack, GRID * CELL, GRID * CELL), np.uint8)

    def _new_ball(self) -> None:
        self._ball_col = int(self.np_random.integers(GRID))
        self._ball_row = 0

    def _render(self) -> np.ndarray:
        self._frames[:-1] = self._frames[1:]
        f = self._frames[-1]
        f.fill(0)
        r, c = self._ball_row * CELL, self._ball_col * CELL
        f[r:r + CELL, c:c + CELL] = 255
        p = self._paddle * CELL
        f[(GRID - 1) * CELL:, p:p + CELL] = 128
        return self._frames.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._paddle = GRID // 2
        self._left = self.drops
        self._frames.fill(0)
        self._new_ball()
        return self._render(), {}

    def step(self, action):
        self._paddle = int(np.clip(self._paddle + MOVES[int(action)], 0, GRID - 1))
        self._ball_row += 1
        reward, terminated = 0.0, False
        if self._ball_row == GRID - 1:
            reward = 1.0 if self._ball_col == self._paddle else -1.0
            self._left -= 1
            terminated = self._left == 0
            if not terminated:
                self._new_ball()
        return self._render(), reward, terminated, False, {}


class CatchDict(ImageCatch):
    """Catch with a Dict observation, as a robot with a camera beside its joint state sees the world: the
    ``image`` shows the ball alone, channels last ((H, W, 1) uint8, ``cell`` pixels a cell: 7 x 7 by
    default, MiniGrid's size; 42 x 42 for the Nature CNN with ``cell`` 6), and ``paddle`` holds the
    paddle's column, one-hot (float32). Neither field alone says where to move. The paddle is paid as it
    follows the ball, at once: 1 for every step it ends under the ball's column, no catch or miss at the
    bottom. One ball an episode by default, 6 steps from the paddle in the middle: a random policy earns
    about 0.9, one that moves to the ball's column and stays 36 / 7 = 5.14 (6 where the ball starts at most
    a column away, 5 and 4 two and three away)."""

    def __init__(self, drops: int = 1, cell: int = 1):
        super().__init__(drops, stack=1)
        self.cell = cell
        self.observation_space = spaces.Dict(
            image=spaces.Box(0, 255, (GRID * cell, GRID * cell, 1), np.uint8),
            paddle=spaces.Box(0.0, 1.0, (GRID,), np.float32))
        self._image = np.zeros((GRID * cell, GRID * cell, 1), np.uint8)

    def step(self, action):
        followed = self._ball_col  # a ball that reaches the bottom is replaced within the step
        obs, _, terminated, truncated, info = super().step(action)
        return obs, float(self._paddle == followed), terminated, truncated, info

    def _render(self) -> dict:
        c = self.cell
        self._image.fill(0)
        self._image[self._ball_row * c:(self._ball_row + 1) * c, self._ball_col * c:(self._ball_col + 1) * c] = 255
        paddle = np.zeros(GRID, np.float32)
        paddle[self._paddle] = 1.0
        return {"image": self._image.copy(), "paddle": paddle}


if "ImageCatch-v0" not in gymnasium.registry:
    gymnasium.register("ImageCatch-v0", entry_point=ImageCatch)
    gymnasium.register("ImageCatch1-v0", entry_point=ImageCatch, kwargs={"stack": 1})
    gymnasium.register("CatchDict-v0", entry_point=CatchDict)
    gymnasium.register("CatchDictPixels-v0", entry_point=CatchDict, kwargs={"cell": 6})
