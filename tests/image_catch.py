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


if "ImageCatch-v0" not in gymnasium.registry:
    gymnasium.register("ImageCatch-v0", entry_point=ImageCatch)
    gymnasium.register("ImageCatch1-v0", entry_point=ImageCatch, kwargs={"stack": 1})
