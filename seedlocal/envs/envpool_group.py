"""envpool's environments as a group: stepped together in envpool's own threads."""

from __future__ import annotations

import numpy as np

from seedlocal.envs.bounds import action_bounds
from seedlocal.spec import EnvSpec


def stack_kw(frame_stack: int) -> dict:
    """envpool.make's frames-to-stack keyword; none for the env's own default."""
    return {"stack_num": frame_stack} if frame_stack else {}


class EnvpoolGroup:
    def __init__(self, spec: EnvSpec, envs_per_group: int, num_threads: int, seed: int, render: bool = False):
        import envpool

        self._env = envpool.make(spec.env_id, env_type="gymnasium", num_envs=envs_per_group, batch_size=envs_per_group,
                                 num_threads=num_threads, seed=seed, **stack_kw(spec.frame_stack),
                                 **({"render_mode": "rgb_array"} if render else {}))
        self._dict_obs = len(spec.obs) > 1 or "" not in spec.obs
        self._bounds = action_bounds(spec)

    def reset(self) -> None:
        self._env.async_reset()

    def send(self, actions: np.ndarray) -> None:
        # envpool converts the dtype itself; int64 → int32 is one small copy.
        self._env.send(actions if self._bounds is None else self._bounds(actions))

    def recv(self):
        obs, reward, terminated, truncated, _ = self._env.recv()
        if not self._dict_obs:
            obs = {"": obs}
        return obs, reward, terminated, truncated

    def render(self) -> np.ndarray:
        """Env 0's frame as a person sees it ([H, W, 3] uint8; made with ``render=True``)."""
        return np.asarray(self._env.render())[0]

    def close(self) -> None:
        self._env.close()
