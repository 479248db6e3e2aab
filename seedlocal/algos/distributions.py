"""The action distributions a policy head parameterises, as pure functions.

A policy network's head outputs one tensor of *parameters* per row: the logits [..., A] of a categorical over A actions,
or the mean and the log standard deviation [..., 2A] (concatenated, mean first) of a diagonal Gaussian over an
A-dimensional Box. Those parameters are what the acting side stores beside each step (``out.logits``, ``out.gaussian``),
so the learner can recompute the behaviour policy's probability of the action taken, whichever kind it is. The
Gaussian's sample is unbounded: envs get it mapped from [-1, 1] onto their bounds and clipped (``envs/bounds.py``),
learners keep the sample.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Categorical:
    field = "logits"  # the store output (out.<field>) and batch key (behaviour_<field>) of its parameters
    width = 1  # parameters per action: its logit

    @staticmethod
    def log_prob(params: Tensor, actions: Tensor) -> Tensor:
        """log pi(a|x) [...] for integer ``actions`` [...]."""
        return F.log_softmax(params, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def entropy(params: Tensor) -> Tensor:
        log_p = F.log_softmax(params, dim=-1)
        return -(log_p.exp() * log_p).sum(-1)

    @staticmethod
    def sample(params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One action per row, by the Gumbel-max trick: the argmax of the logits plus Gumbel noise is
        distributed as softmax(logits). Unlike ``torch.multinomial`` it neither validates its input on the
        host nor makes a probability tensor: on a GPU the inference loop's sampling never waits for the
        device, and a CUDA graph can hold it. Uniforms are clamped away from 0 so the noise stays finite
        (at most about 16.6 in float32, so a logit ``ILLEGAL``-far below the others is never chosen). The noise
        comes from ``generator`` (torch's global one if None)."""
        u = torch.rand(params.shape, device=params.device, generator=generator)
        u = u.clamp_(min=torch.finfo(torch.float32).tiny)
        return (params.float() - torch.log(-torch.log(u))).argmax(-1)

    @staticmethod
    def mode(params: Tensor) -> Tensor:
        return params.argmax(-1)


class DiagGaussian:
    field = "gaussian"
    width = 2  # parameters per action dimension: a mean and a log-std

    @staticmethod
    def log_prob(params: Tensor, actions: Tensor) -> Tensor:
        """log pi(a|x) [...]: the sum over the action's dimensions of
        -((a - mu) / sigma)^2 / 2 - log sigma - log sqrt(2 pi)."""
        mean, log_std = params.chunk(2, dim=-1)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - LOG_SQRT_2PI).sum(-1)

    @staticmethod
    def entropy(params: Tensor) -> Tensor:
        _, log_std = params.chunk(2, dim=-1)
        return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1)

    @staticmethod
    def sample(params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        mean, log_std = params.chunk(2, dim=-1)
        noise = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        return mean + torch.exp(log_std) * noise

    @staticmethod
    def mode(params: Tensor) -> Tensor:
        return params.chunk(2, dim=-1)[0]


def for_actions(num_actions: int | None):
    """The distribution of an env's action space: categorical for Discrete (``num_actions``), Gaussian for Box."""
    return Categorical if num_actions is not None else DiagGaussian
