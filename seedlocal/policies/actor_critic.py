"""Acting with an actor-critic (V-trace): actions sampled from its policy (a categorical, or a diagonal Gaussian for
Box actions), the policy's parameters and the value stored for the learner."""

from __future__ import annotations

import numpy as np
import torch

from seedlocal.algos.distributions import for_actions
from seedlocal.algos.frames import FrameHistory
from seedlocal.arithmetic import autocast
from seedlocal.networks import ActorCritic
from seedlocal.pipeline.cuda import GraphedStep, WeightLock
from seedlocal.pipeline.policy import Policy
from seedlocal.policies import policy_outputs
from seedlocal.spec import EnvSpec


class ModelPolicy(Policy):
    """Samples actions from an ``ActorCritic`` without tracking gradients.

    ``lock`` (a ``WeightLock`` shared with the learner's optimiser step) keeps a forward pass from reading
    parameters halfway through an update. ``cuda_graphs`` replays the forward from CUDA graphs (``GraphedStep``).
    ``greedy`` takes the distribution's mode (a categorical's argmax, a Gaussian's mean) instead of a sample:
    ``seedlocal eval --policy argmax``. ``stack`` > 1: the env sends single frames, stacked here per env slot
    (``algos/frames.py``), as the learner stacks its unrolls.
    """

    def __init__(self, model: ActorCritic, spec: EnvSpec, lock: WeightLock | None = None,
                 precision: str = "fp32", cuda_graphs: bool = False, greedy: bool = False, stack: int = 1):
        self.model, self.spec, self.greedy = model, spec, greedy
        self.acting = ("mean" if spec.num_actions is None else "argmax") if greedy else "sampled"
        self.outputs = policy_outputs(spec)
        self.dist = for_actions(spec.num_actions)
        self.core_state = model.core_spec
        self.device = next(model.parameters()).device
        self.lock = lock if lock is not None else WeightLock(self.device)
        self.precision = precision
        self._step = GraphedStep(self._autocast_step, self.device) if cuda_graphs else self._autocast_step
        self.frames = FrameHistory(spec.obs[""], stack, self.device) if stack > 1 else None

    def prepare(self, sizes, obs):
        if isinstance(self._step, GraphedStep):
            if self.frames is not None:  # the network sees stacked frames
                single = obs[""]
                obs = {**obs, "": single.expand((single.shape[0], self.frames.stack) + tuple(single.shape[2:]))}
            core = None if self.core_state is None else torch.zeros((1,) + self.core_state.shape, device=self.device)
            self._step.capture(sizes, obs, core)

    def _autocast_step(self, obs, core):
        with autocast(self.device, self.precision, cache=False):
            return self.model.step(obs, core)

    @torch.inference_mode()
    def act(self, obs, core=None, env_ids=None, first=None):
        env_ids = env_ids if env_ids is not None else np.arange(next(iter(obs.values())).shape[0])
        if self.frames is not None:
            starts = torch.from_numpy(first if first is not None else np.zeros(len(env_ids), bool)).to(self.device)
            obs = {**obs, "": self.frames(obs[""], torch.from_numpy(env_ids).to(self.device), starts,
                                          int(env_ids.max()) + 1)}
        with self.lock.reading():
            params, value, core = self._forward(obs, core, env_ids)
        params, value, core = params.float(), value.float(), None if core is None else core.float()
        return self._actions(params, env_ids), {self.dist.field: params, "value": value}, core

    def _forward(self, obs, core, env_ids: np.ndarray):
        """(policy parameters, values, new core) for the rows (``env_ids``: their env slots)."""
        return self._step(obs, core)

    def _actions(self, params, env_ids: np.ndarray):
        return self.dist.mode(params) if self.greedy else self.dist.sample(params, self.generator)
