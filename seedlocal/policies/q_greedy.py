"""Acting with R2D2's recurrent Q-network: epsilon-greedy on the online network's Q-values, one epsilon per env slot
(Ape-X's schedule), with each env's frame stack kept on the device when the env sends single frames. Where the env
has an action mask, the greedy choice (the network gives illegal actions ``ILLEGAL`` Q-values) and the random one
are both legal."""

from __future__ import annotations

import numpy as np
import torch

from seedlocal.networks import RecurrentQNet
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.policy import StepPolicy
from seedlocal.spec import MASK_KEY


class R2D2Policy(StepPolicy):
    """``epsilons``: one per env slot (training's schedule), or one number for every env (seedlocal eval). The
    random draws come from a generator seeded with ``seed`` on ``draws_on`` (default: the policy's device; eval
    draws on the host, so that it explores alike on every device)."""

    def __init__(self, net: RecurrentQNet, spec, epsilons: torch.Tensor | float, lock: WeightLock, device,
                 stack: int, seed: int, cuda_graphs: bool = False, draws_on: str | None = None):
        eps = torch.as_tensor(epsilons, dtype=torch.float32)
        super().__init__(net.step, spec, lock, device, cuda_graphs, stack, len(eps) if eps.ndim else 0)
        self.net = net
        self.core_state = net.core_spec
        self.acting = ("epsilon-greedy, an epsilon per env slot" if eps.ndim else
                       f"epsilon-greedy, epsilon {float(eps):g}" if float(eps) else "argmax")
        self.eps = eps.to(device)
        self.generator = torch.Generator(device=draws_on or device).manual_seed(seed)

    def _draws(self, n: int, actions: int, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform [0, 1) numbers and random actions for ``n`` rows, from this policy's generator; with an action
        ``mask`` [n, actions], each row's random action uniform over its legal ones (the largest of a uniform
        draw per legal action)."""
        on = self.generator.device
        u = torch.rand(n, generator=self.generator, device=on)
        if mask is None:
            random = torch.randint(actions, (n,), generator=self.generator, device=on).to(self.device)
        else:
            w = torch.rand((n, actions), generator=self.generator, device=on).to(self.device)
            random = torch.where(mask, w, -1.0).argmax(-1)
        return u.to(self.device), random

    @torch.inference_mode()
    def act(self, obs, core=None, env_ids=None, first=None):
        env_ids = env_ids if env_ids is not None else np.arange(next(iter(obs.values())).shape[0])
        ids = torch.from_numpy(env_ids).to(self.device)
        obs = self._stacked(obs, env_ids, first, ids)
        with self.lock.reading():
            q, core = self._step(obs, core)
        u, random = self._draws(q.shape[0], q.shape[1], obs.get(MASK_KEY))
        explore = u < (self.eps[ids] if self.eps.ndim else self.eps)
        return torch.where(explore, random, q.argmax(-1)), {}, core.float()
