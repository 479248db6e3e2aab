"""The contract between the inference loop and what it runs on each batch.

Every policy implements ``Policy``, which the loop calls the same way whatever the algorithm: a new kind of acting
(a Gaussian, a population of networks) is one more class in ``seedlocal/policies/``, no branch in the loop. It lives
beside the loop, so that the policies depend on the pipeline and not both ways. What a policy reads and writes:

* it **reads** a batch: the observations of ``n`` env rows (a dict of tensors on its device), their recurrent state
  (``core``, zeroed by the loop where an episode starts; None when ``core_state`` is None), each row's env slot
  (``env_ids``: group g's envs are g*E .. g*E + E - 1) and whether its observation starts an episode (``first``);
* it **writes** the actions, the ``outputs`` it declares (stored beside each step as ``out.<name>``: what a learner
  needs, e.g. behaviour logits and values for V-trace) and the new recurrent state of shape ``core_state``, which
  the loop keeps per env and stores at the start of each unroll;
* a policy that ``plans`` may hold a ready group (its worker sleeps) or restart it on fresh episodes
  (neuroevolution's work queue), and calls its ``unhold`` to have held groups served again.
"""

from __future__ import annotations

import abc
import threading
from typing import Callable

import numpy as np
import torch

from seedlocal.algos.frames import FrameHistory
from seedlocal.pipeline.cuda import GraphedStep, WeightLock
from seedlocal.spec import EnvSpec, TensorSpec

SERVE, HOLD, RESTART = 0, 1, 2  # what a planning policy may ask for each ready group


class Unhold:
    """A planning policy's request, from any thread, that the loop serve its held groups again. The policy makes it;
    the loop built around the policy connects its wake-up to it, so the policy holds no reference to the loop."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._wake: Callable[[], None] = lambda: None

    def __call__(self) -> None:
        self._asked.set()
        self._wake()

    def connect(self, wake: Callable[[], None]) -> None:
        """The loop's wake-up, called after each request."""
        self._wake = wake

    def take(self) -> bool:
        """Whether a request came since the last ``take`` (the loop's)."""
        if not self._asked.is_set():
            return False
        self._asked.clear()
        return True


class Policy(abc.ABC):
    device: torch.device
    """where it acts: the loop (and seedlocal eval) hands it observations there"""
    spec: EnvSpec
    """the env it acts in"""
    acting: str = ""
    """how it picks actions, in words (seedlocal eval's report: "sampled", "argmax", ...)"""
    outputs: dict[str, TensorSpec] = {}
    """per-step outputs written to the store (``out.<name>``) beside the action"""
    core_state: TensorSpec | None = None
    """shape of the per-env recurrent state the loop keeps for this policy (None: none)"""
    plans: bool = False
    """whether ``plan`` is offered each ready group before it is served"""
    unhold: Unhold | None = None
    """a planning policy's ``Unhold``: calling it has the groups it held served again"""
    generator: torch.Generator | None = None
    """where its random draws come from (None: torch's global generator, training's acting's; the videos during
    training give each policy they play one of its own, so that its draws do not move that stream)"""

    def prepare(self, sizes: list[int], obs: dict[str, torch.Tensor]) -> None:
        """Before the run: ``sizes``, every batch size (env rows) the loop will serve; ``obs``, one zero row of each."""

    def plan(self, groups: np.ndarray, first: np.ndarray, done: np.ndarray, ep_return: np.ndarray,
             ep_length: np.ndarray | None = None) -> np.ndarray:
        """SERVE, HOLD or RESTART for each ready group (only if ``plans``). ``first``, ``done``, ``ep_return`` and
        ``ep_length`` [groups, E]: its envs' episode starts; episode ends, returns and lengths of the last step."""
        return np.full(len(groups), SERVE, np.int8)

    @abc.abstractmethod
    def act(self, obs: dict[str, torch.Tensor], core: torch.Tensor | None = None, env_ids: np.ndarray | None = None,
            first: np.ndarray | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
        """(actions [n, ...], ``outputs`` [n, ...] each, new core [n, ...] or None) for a batch of ``n`` rows.
        Called without ``env_ids``/``first``: rows 0..n-1, mid-episode."""


class StepPolicy(Policy):
    """A policy around a network's one-step forward ``step(obs, core)``, run under ``lock`` (a ``WeightLock`` shared
    with the learner's optimiser step: no forward reads parameters halfway through an update); replayed from CUDA
    graphs with ``cuda_graphs`` (``GraphedStep``); with ``stack`` > 1 fed frames stacked per env slot (the env sends
    single ones; ``algos/frames.py``, stacks for ``slots`` made at once), as the learner stacks its unrolls."""

    def __init__(self, step, spec: EnvSpec, lock: WeightLock, device, cuda_graphs: bool, stack: int, slots: int = 0):
        self.spec, self.lock, self.device = spec, lock, device
        self._step = GraphedStep(step, device) if cuda_graphs else step
        self.frames = FrameHistory(spec.obs[""], stack, device, slots) if stack > 1 else None

    def prepare(self, sizes, obs):
        if isinstance(self._step, GraphedStep):
            if self.frames is not None:  # the network sees stacked frames
                obs = {**obs, "": obs[""].expand(-1, self.frames.stack, -1, -1)}
            core = None if self.core_state is None else torch.zeros((1,) + self.core_state.shape, device=self.device)
            self._step.capture(sizes, obs, core)

    def _stacked(self, obs, env_ids: np.ndarray, first, ids=None):
        """``act``'s ``obs`` with its frames stacked (``ids``: ``env_ids`` on the device, where the caller has them)."""
        if self.frames is None:
            return obs
        ids = torch.from_numpy(env_ids).to(self.device) if ids is None else ids
        starts = torch.from_numpy(first if first is not None else np.zeros(len(env_ids), bool)).to(self.device)
        return {**obs, "": self.frames(obs[""], ids, starts, int(env_ids.max()) + 1)}


class Acting:
    """``policy.act`` called as the inference loop calls it, for ``n`` envs that each play from their reset:
    observations to the policy's device as tensors, each env's slot id, its first step marked (an episode
    start: frame stacks refill), the recurrent core kept per env from zeros; actions back to the host."""

    def __init__(self, policy: Policy, n: int):
        self.policy, self.ids = policy, np.arange(n)
        self.first, self._later = np.ones(n, bool), np.zeros(n, bool)  # the first step, then every other
        spec = policy.core_state
        self.core = None if spec is None else torch.zeros((n,) + spec.shape, device=policy.device)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        x = {k: torch.from_numpy(np.asarray(v)).to(self.policy.device) for k, v in obs.items()}
        actions, _, self.core = self.policy.act(x, self.core, self.ids, self.first)
        self.first = self._later
        return actions.cpu().numpy()
