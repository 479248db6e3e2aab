"""Acting with R2D2's recurrent Q-network: epsilon-greedy on the online
network's Q-values, one epsilon per env slot (Ape-X's schedule), with each
env's frame stack kept on the device when the env sends single frames."""

from __future__ import annotations

import numpy as np
import torch

from seedlocal.dtypes import torch_dtype
from seedlocal.networks import RecurrentQNet
from seedlocal.pipeline.cuda import GraphedStep, WeightLock
from seedlocal.pipeline.policy import Policy


class R2D2Policy(Policy):
    """Epsilon-greedy on the online network's Q-values, one epsilon per env slot;
    stacks each env's frames itself when ``stack`` > 1."""

    def __init__(self, net: RecurrentQNet, spec, epsilons: torch.Tensor, lock: WeightLock, device, stack: int,
                 seed: int, cuda_graphs: bool = False):
        self.net, self.spec, self.lock, self.device = net, spec, lock, device
        self._step = GraphedStep(net.step, device) if cuda_graphs else net.step
        self.outputs = {}
        self.core_state = net.core_spec
        self.eps = epsilons.to(device)
        self.stack = stack
        self.hist = None
        if stack > 1:
            single = spec.obs[""]  # the frames' own dtype: a bool grid stored as uint8 would be scaled by 1/255
            self.hist = torch.zeros((len(epsilons), stack) + tuple(single.shape[1:]), dtype=torch_dtype(single.dtype),
                                    device=device)
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def prepare(self, sizes, obs):
        if isinstance(self._step, GraphedStep):
            if self.hist is not None:  # the network sees stacked frames
                obs = {"": torch.zeros((1, self.stack) + tuple(obs[""].shape[2:]), dtype=obs[""].dtype,
                                       device=self.device)}
            self._step.capture(sizes, obs, torch.zeros((1,) + self.core_state.shape, device=self.device))

    def stacked(self, frames: torch.Tensor, ids: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """[n, 1, H, W] new frames -> [n, stack, H, W], an episode's first frame repeated at its start."""
        prev = self.hist[ids]
        rolled = torch.cat([prev[:, 1:], frames], dim=1)
        fresh = frames.expand(-1, self.stack, -1, -1)
        out = torch.where(first.view(-1, 1, 1, 1), fresh, rolled)
        self.hist[ids] = out
        return out

    @torch.inference_mode()
    def act(self, obs, core=None, env_ids=None, first=None):
        n = next(iter(obs.values())).shape[0]
        ids = torch.from_numpy(env_ids if env_ids is not None else np.arange(n)).to(self.device)
        if self.hist is not None:
            starts = first if first is not None else np.zeros(n, bool)
            obs = {"": self.stacked(obs[""], ids, torch.from_numpy(starts).to(self.device))}
        with self.lock.reading():
            q, core = self._step(obs, core)
        n = q.shape[0]
        explore = torch.rand(n, generator=self.gen, device=self.device) < self.eps[ids]
        random = torch.randint(q.shape[1], (n,), generator=self.gen, device=self.device)
        return torch.where(explore, random, q.argmax(-1)), {}, core.float()
