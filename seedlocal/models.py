"""Networks and the policies the inference loop runs.

A *policy* turns a batch of observations (a dict of tensors, one row per env)
into actions plus named outputs that are stored beside each step (behaviour
logits and values for V-trace). ``RandomPolicy`` and ``ModelPolicy`` write the
same outputs, so the benchmark compares like with like.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from seedlocal.pipeline.envs import EnvSpec
from seedlocal.shm.rollout import TensorSpec

ENCODERS = ("auto", "mlp", "nature")


def is_image(spec: TensorSpec) -> bool:
    return len(spec.shape) == 3 and min(spec.shape[1:]) >= 36


class MLPEncoder(nn.Module):
    def __init__(self, in_dim: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        layers, d = [], in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.Tanh()]
            d = h
        self.net = nn.Sequential(*layers)
        self.out_dim = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class NatureCNN(nn.Module):
    """The DQN torso (Mnih et al. 2015) for stacked 84x84 frames."""

    def __init__(self, in_shape: tuple[int, int, int], out_dim: int = 512):
        super().__init__()
        c, h, w = in_shape
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


class ActorCritic(nn.Module):
    """Encoder → (policy logits, state value) for a discrete action space."""

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        if spec.num_actions is None:
            raise ValueError(f"env.id={spec.env_id!r}: network policies need a Discrete action space")
        if encoder not in ENCODERS:
            raise ValueError(f"encoder={encoder!r}: expected one of {', '.join(ENCODERS)}")
        self.obs_keys = list(spec.obs)
        single = spec.obs.get("")
        if encoder == "auto":
            encoder = "nature" if single is not None and is_image(single) else "mlp"
        if encoder == "nature":
            if single is None or len(single.shape) != 3:
                raise ValueError(f"encoder=nature needs one image observation (C, H, W); {spec.env_id} has {spec.obs}")
            self.encoder = NatureCNN(single.shape)
        else:
            in_dim = sum(max(1, math.prod(s.shape)) for s in spec.obs.values())
            self.encoder = MLPEncoder(in_dim, hidden)
        self.kind = encoder
        self.policy = nn.Linear(self.encoder.out_dim, spec.num_actions)
        self.value = nn.Linear(self.encoder.out_dim, 1)

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.kind == "nature":
            return self.encoder(_as_float(obs[""]))
        flat = [_as_float(obs[k]).reshape(obs[k].shape[0], -1) for k in self.obs_keys]
        return self.encoder(torch.cat(flat, dim=1) if len(flat) > 1 else flat[0])

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encode(obs)
        return self.policy(h), self.value(h).squeeze(-1)


def policy_outputs(spec: EnvSpec) -> dict[str, TensorSpec]:
    if spec.num_actions is None:
        return {}
    return {"logits": TensorSpec((spec.num_actions,), "float32"), "value": TensorSpec((), "float32")}


class RandomPolicy:
    """Uniform random actions; stores uniform logits and zero values."""

    core_state = None

    def __init__(self, spec: EnvSpec, device: torch.device):
        self.spec, self.device = spec, device
        self.outputs = policy_outputs(spec)
        if spec.num_actions is None:
            self._low = torch.tensor(spec.action_low, device=device).reshape(spec.action.shape)
            self._high = torch.tensor(spec.action_high, device=device).reshape(spec.action.shape)

    def act(self, obs: dict[str, torch.Tensor], core=None):
        n = next(iter(obs.values())).shape[0]
        if self.spec.num_actions is None:
            u = torch.rand((n,) + self.spec.action.shape, device=self.device)
            return self._low + u * (self._high - self._low), {}, None
        actions = torch.randint(self.spec.num_actions, (n,), device=self.device)
        logits = torch.zeros(n, self.spec.num_actions, device=self.device)
        return actions, {"logits": logits, "value": torch.zeros(n, device=self.device)}, None


class ModelPolicy:
    """Samples actions from an ``ActorCritic`` without tracking gradients."""

    core_state = None

    def __init__(self, model: ActorCritic, spec: EnvSpec):
        self.model = model
        self.outputs = policy_outputs(spec)

    @torch.inference_mode()
    def act(self, obs: dict[str, torch.Tensor], core=None):
        logits, value = self.model(obs)
        actions = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
        return actions, {"logits": logits, "value": value}, None
