"""Acting with an actor-critic (V-trace): actions sampled from its policy (a categorical, or a diagonal Gaussian for
Box actions), the policy's parameters and the value stored for the learner."""

from __future__ import annotations

import numpy as np
import torch

from seedlocal.algos.distributions import for_actions
from seedlocal.arithmetic import autocast
from seedlocal.networks import ActorCritic
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.policy import StepPolicy
from seedlocal.policies import policy_outputs
from seedlocal.spec import EnvSpec


class ModelPolicy(StepPolicy):
    """Samples actions from an ``ActorCritic`` without tracking gradients (``lock``, ``cuda_graphs``, ``stack``:
    ``StepPolicy``'s; no lock: one of its own). ``greedy`` takes the distribution's mode (a categorical's argmax, a
    Gaussian's mean) instead of a sample: ``seedlocal eval --policy argmax``."""

    def __init__(self, model: ActorCritic, spec: EnvSpec, lock: WeightLock | None = None,
                 precision: str = "fp32", cuda_graphs: bool = False, greedy: bool = False, stack: int = 1):
        device = next(model.parameters()).device
        super().__init__(self._autocast_step, spec, lock if lock is not None else WeightLock(device), device,
                         cuda_graphs, stack)
        self.model, self.greedy = model, greedy
        self.acting = ("mean" if spec.num_actions is None else "argmax") if greedy else "sampled"
        self.outputs = policy_outputs(spec)
        self.dist = for_actions(spec.num_actions)
        self.core_state = model.core_spec
        self.precision = precision

    def _autocast_step(self, obs, core):
        with autocast(self.device, self.precision, cache=False):
            return self.model.step(obs, core)

    @torch.inference_mode()
    def act(self, obs, core=None, env_ids=None, first=None):
        env_ids = env_ids if env_ids is not None else np.arange(next(iter(obs.values())).shape[0])
        obs = self._stacked(obs, env_ids, first)
        with self.lock.reading():
            params, value, core = self._forward(obs, core, env_ids)
        params, value, core = params.float(), value.float(), None if core is None else core.float()
        return self._actions(params, env_ids), {self.dist.field: params, "value": value}, core

    def _forward(self, obs, core, env_ids: np.ndarray):
        """(policy parameters, values, new core) for the rows (``env_ids``: their env slots)."""
        return self._step(obs, core)

    def _actions(self, params, env_ids: np.ndarray):
        return self.dist.mode(params) if self.greedy else self.dist.sample(params, self.generator)
