"""Policies: what the inference loop runs on each batch of env rows, each one class behind the loop's ``Policy``
protocol (``pipeline/policy.py``, which says what a policy reads and writes); docs/architecture.md lists them.
"""

from __future__ import annotations

import torch

from seedlocal.algos.distributions import Categorical, for_actions
from seedlocal.envs.bounds import policy_range
from seedlocal.networks import action_size, legal_only
from seedlocal.pipeline.policy import Policy
from seedlocal.spec import MASK_KEY, EnvSpec, TensorSpec


def policy_outputs(spec: EnvSpec) -> dict[str, TensorSpec]:
    """What an actor-critic's acting stores per step for V-trace: its policy's
    parameters (the logits of a categorical, a Gaussian's mean and log-std:
    enough to recompute the probability of the action taken) and its value."""
    dist = for_actions(spec.num_actions)
    return {dist.field: TensorSpec((dist.width * action_size(spec),), "float32"), "value": TensorSpec((), "float32")}


class RandomPolicy(Policy):
    """Uniform random actions; stores uniform logits and zero values (the
    benchmark's reference: the same outputs as ``ModelPolicy`` at no cost)."""

    def __init__(self, spec: EnvSpec, device: torch.device):
        self.spec, self.device = spec, device
        self.outputs = policy_outputs(spec)
        if spec.num_actions is None:  # uniform over the env's bounds: over the policy's range that maps onto them
            self._low, self._high = (torch.from_numpy(b).to(device).reshape(spec.action.shape)
                                     for b in policy_range(spec))

    def act(self, obs, core=None, env_ids=None, first=None):
        n = next(iter(obs.values())).shape[0]
        value = torch.zeros(n, device=self.device)
        if self.spec.num_actions is None:
            u = torch.rand((n,) + self.spec.action.shape, device=self.device)
            params = torch.zeros((n,) + self.outputs["gaussian"].shape, device=self.device)
            return self._low + u * (self._high - self._low), {"gaussian": params, "value": value}, None
        logits = torch.zeros(n, self.spec.num_actions, device=self.device)
        if MASK_KEY in obs:  # uniform over the legal actions, by the sampling every policy uses; logits to match
            logits = legal_only(logits, obs)
            actions = Categorical.sample(logits)
        else:
            actions = torch.randint(self.spec.num_actions, (n,), device=self.device)
        return actions, {"logits": logits, "value": value}, None
