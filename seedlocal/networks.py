"""The networks: torsos for each kind of observation, and the three heads seedlocal trains (a policy for neuroevolution,
an actor-critic for V-trace, a recurrent dueling Q-network for R2D2).

Every network reads a dict of observation tensors (one entry per field of the env's observation; ``""`` for a single
one) and is built from an ``EnvSpec`` alone, so a checkpoint's identity rebuilds it. Acting with a network is a policy's
job (``seedlocal/policies``).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from seedlocal.arithmetic import Tanh, autocast
from seedlocal.config.schema import NetworkConfig
from seedlocal.normalize import RunningNorm
from seedlocal.spec import MASK_KEY, EnvSpec, TensorSpec


CONV_ENCODERS = ("minatar", "nature", "impala")
MULTI = "multi"  # the torso of a Dict observation with image fields: a CNN each, an MLP for the rest
IMAGE_DTYPES = ("uint8", "bool")  # a Dict's field is an image only in these: pixels, or 0/1 grids
MIN_LOG_STD = math.log(1e-3)  # a Gaussian policy's smallest standard deviation
NATURE_MIN_SIDE = 36  # the Nature CNN's smallest input: 8x8/4, 4x4/2 and 3x3/1 convolutions leave 1 x 1
GRID_MIN_SIDE = 5  # a smaller 3-D observation reads better as a vector than as a grid under a 3x3 convolution
MAX_CHANNELS = 16  # channels of a (H, W, C) image, or of a small (C, H, W) grid


def image_layout(spec: TensorSpec) -> str | None:
    """``chw`` or ``hwc`` for an observation a convolutional torso reads, else None: envpool's Atari frames
    are (C, H, W), Gymnasium's images and MinAtar's grids (H, W, C), tried first for a small grid, so that a
    cube such as MinAtar Seaquest's (10, 10, 10) is read channels last."""
    shape = spec.shape
    if len(shape) != 3:
        return None
    if min(shape[1:]) >= NATURE_MIN_SIDE:
        return "chw"
    if min(shape[:2]) >= GRID_MIN_SIDE and shape[2] <= MAX_CHANNELS:
        return "hwc"
    if min(shape[1:]) >= GRID_MIN_SIDE and shape[0] <= MAX_CHANNELS:
        return "chw"
    return None


def image_shape(spec: TensorSpec) -> tuple[int, int, int] | None:
    """(C, H, W) of an observation ``image_layout`` reads as an image, else None."""
    layout = image_layout(spec)
    return (spec.shape[2], *spec.shape[:2]) if layout == "hwc" else tuple(spec.shape) if layout == "chw" else None


def is_image(spec: TensorSpec) -> bool:
    """An image of at least 36 x 36 pixels: what the Nature CNN and the Atari-sized presets take (not a grid)."""
    return conv_kind(spec) == "nature"


def is_grid(spec: TensorSpec) -> bool:
    """A small image (MinAtar's 10 x 10 x C): at least 5 x 5 cells, below 36 x 36."""
    return conv_kind(spec) == "minatar"


def image_fields(spec: EnvSpec) -> list[str]:
    """The fields of a Dict observation that get a convolutional torso each (SB3's ``MultiInputPolicy``
    convention, 0/1 grids included): uint8 or bool, in a shape ``image_layout`` reads. The rest enter the MLP."""
    if "" in spec.obs:  # a single observation (an action mask may sit beside it)
        return []
    return [k for k, s in net_obs(spec).items() if s.dtype in IMAGE_DTYPES and image_layout(s) is not None]


def auto_encoder(spec: EnvSpec) -> str:
    """The torso ``auto`` picks: ``conv_kind``'s for one image, ``MULTI`` for a Dict with image fields, else mlp."""
    single = spec.obs.get("")  # the key of a single (not Dict) observation
    if single is None:
        return MULTI if image_fields(spec) else "mlp"
    return conv_kind(single) or "mlp"


def conv_kind(field: TensorSpec) -> str | None:
    """The torso ``auto`` gives an image: the Nature CNN from 36 x 36 pixels up, MinAtar's below; else None."""
    chw = image_shape(field)
    return None if chw is None else "nature" if min(chw[1:]) >= NATURE_MIN_SIDE else "minatar"


class MLPEncoder(nn.Module):
    def __init__(self, in_dim: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.in_dim = in_dim
        dims = (in_dim, *hidden)
        self.net = nn.Sequential(*(m for d, h in zip(dims, dims[1:]) for m in (nn.Linear(d, h), Tanh())))
        self.out_dim = dims[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _ConvTorso(nn.Module):
    """A flattening convolution stack ``conv`` over (C, H, W) images, then ``out_dim`` ReLU units."""

    def __init__(self, conv: nn.Sequential, in_shape: tuple[int, int, int], out_dim: int):
        super().__init__()
        self.conv = conv
        with torch.no_grad():
            n = self.conv(torch.zeros(1, *in_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


class MinAtarCNN(_ConvTorso):
    """The torso of MinAtar's DQN and actor-critic agents (Young & Tian 2019, arXiv 1903.03176), for 10 x 10 grids."""

    def __init__(self, in_shape: tuple[int, int, int]):
        super().__init__(nn.Sequential(nn.Conv2d(in_shape[0], 16, 3), nn.ReLU(), nn.Flatten()), in_shape, 128)


class NatureCNN(_ConvTorso):
    """The DQN torso (Mnih et al. 2015) for stacked 84x84 frames."""

    def __init__(self, in_shape: tuple[int, int, int]):
        super().__init__(nn.Sequential(
            nn.Conv2d(in_shape[0], 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        ), in_shape, 512)


class _ResidualBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv0 = nn.Conv2d(c, c, 3, padding=1)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(_ConvTorso):
    """The deep IMPALA torso (Espeholt et al. 2018, fig. 3): three stages of conv, max-pool and two residual blocks."""

    def __init__(self, in_shape: tuple[int, int, int]):
        chans = (in_shape[0], 16, 32, 32)
        stages = [m for c, out_c in zip(chans, chans[1:]) for m in (nn.Conv2d(c, out_c, 3, padding=1),
                  nn.MaxPool2d(3, stride=2, padding=1), _ResidualBlock(out_c), _ResidualBlock(out_c))]
        super().__init__(nn.Sequential(*stages, nn.ReLU(), nn.Flatten()), in_shape, 256)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """An observation as a torso reads it: uint8 pixels scaled to [0, 1], anything else (0/1 grids too) unscaled."""
    if x.dtype not in (torch.uint8, torch.bool):
        return x.float()
    # Under autocast straight to its dtype: a float32 batch would be written here and again by autocast's cast.
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else torch.float32
    y = x.to(dtype)
    return y.div_(255.0) if x.dtype == torch.uint8 else y


def build_encoder(spec: EnvSpec, encoder: str, hidden: tuple[int, ...]) -> tuple[str, nn.Module]:
    """(kind, torso) for an env (``auto``: ``auto_encoder``'s). A convolutional encoder named for a Dict
    observation is its image fields' torso (``MultiInputEncoder``); an MLP with ``hidden`` empty is linear."""
    single = spec.obs.get("")
    if encoder == "auto":
        encoder = auto_encoder(spec)
    if encoder == MULTI or (encoder in CONV_ENCODERS and single is None and image_fields(spec)):
        return MULTI, MultiInputEncoder(spec, "auto" if encoder == MULTI else encoder, hidden)
    if encoder in CONV_ENCODERS:
        seen = tuple(single.shape) if single is not None else dict(spec.obs)
        if single is None or image_shape(single) is None:
            raise ValueError(f"encoder={encoder} needs an image observation (one, or fields of a Dict), (C, H, W) "
                             f"or (H, W, C), of at least {GRID_MIN_SIDE} x {GRID_MIN_SIDE} cells with at most "
                             f"{MAX_CHANNELS} channels ({NATURE_MIN_SIDE} x {NATURE_MIN_SIDE} pixels for nature); "
                             f"{spec.env_id} has {seen}")
        return encoder, conv_torso(encoder, single, spec.env_id)
    return encoder, vector_mlp(spec, list(net_obs(spec)), hidden)


def conv_torso(encoder: str, field: TensorSpec, env_id: str) -> nn.Module:
    """The convolutional torso ``encoder`` for an image ``field`` (``image_shape`` reads it as one)."""
    chw = image_shape(field)
    if encoder == "nature" and min(chw[1:]) < NATURE_MIN_SIDE:
        raise ValueError(f"encoder=nature needs images of at least {NATURE_MIN_SIDE} x {NATURE_MIN_SIDE} pixels; "
                         f"{env_id} has {tuple(field.shape)}, a small grid: use encoder minatar (what auto picks) "
                         "or impala")
    torso = {"minatar": MinAtarCNN, "nature": NatureCNN, "impala": ImpalaResNet}[encoder](chw)
    torso.hwc = image_layout(field) == "hwc"  # conv_features moves the channels first (a view)
    return torso


def vector_mlp(spec: EnvSpec, keys: list[str], hidden: tuple[int, ...]) -> MLPEncoder:
    """An MLP over the observation fields ``keys``, flat and side by side (``flatten_obs``; Discrete fields
    one-hot): ``vector_keys`` and ``classes`` say what it reads, ``in_dim`` how much of it."""
    if any(int(h) < 1 for h in hidden):
        raise ValueError(f"hidden={tuple(hidden)}: MLP hidden sizes must be positive (none at all: a linear policy)")
    classes = {k: c for k, c in getattr(spec, "obs_classes", {}).items() if k in keys}
    in_dim = sum(classes[k][0] if k in classes else max(1, math.prod(spec.obs[k].shape)) for k in keys)
    torso = MLPEncoder(in_dim, hidden)
    torso.classes, torso.vector_keys = classes, list(keys)
    return torso


class MultiInputEncoder(nn.Module):
    """A Dict observation with image fields, read as SB3's ``MultiInputPolicy`` reads one: each image field
    through a convolutional torso of its own (``conv``: one kind for all, or ``auto``: ``conv_kind``'s), the
    other fields flat through one MLP (``vector_keys``, ``classes``, ``in_dim``: what ``obs_norm`` normalises;
    ``in_dim`` 0 for images alone), their features side by side."""

    def __init__(self, spec: EnvSpec, conv: str, hidden: tuple[int, ...]):
        super().__init__()
        self.image_keys = image_fields(spec)
        self.convs = nn.ModuleList(conv_torso(conv if conv != "auto" else conv_kind(spec.obs[k]), spec.obs[k],
                                              spec.env_id) for k in self.image_keys)
        self.vector_keys = [k for k in net_obs(spec) if k not in self.image_keys]
        self.mlp = vector_mlp(spec, self.vector_keys, hidden) if self.vector_keys else None
        self.classes, self.in_dim = (self.mlp.classes, self.mlp.in_dim) if self.mlp is not None else ({}, 0)
        self.out_dim = sum(t.out_dim for t in self.convs) + (self.mlp.out_dim if self.mlp is not None else 0)

    def forward(self, obs: dict[str, torch.Tensor], vector: torch.Tensor | None = None) -> torch.Tensor:
        """``vector``: the MLP's input where the caller made it (normalised); else the fields flat."""
        out = [conv_features(t, obs[k]) for k, t in zip(self.image_keys, self.convs)]
        if self.mlp is not None:
            out.append(self.mlp(flatten_obs(self.vector_keys, obs, self.classes) if vector is None else vector))
        return torch.cat(out, dim=-1) if len(out) > 1 else out[0]


# The output of an illegal action (its logit, its Q-value): far below any a network gives, and finite, so that softmax,
# log-probabilities and entropy stay finite (an illegal action's probability is exactly 0) and h^-1 of it times a zero
# discount is still 0.
ILLEGAL = -1e9


def net_obs(spec: EnvSpec) -> dict[str, TensorSpec]:
    """The observation fields a network reads: all but the action mask (what it may do, not what it sees)."""
    return {k: s for k, s in spec.obs.items() if k != MASK_KEY}


def legal_only(out: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-action outputs ``out`` [..., A] (logits or Q-values, float32 from here) with ``ILLEGAL`` where ``obs``'
    action mask [..., A] forbids the action; ``out`` itself where the env has no mask."""
    mask = obs.get(MASK_KEY)
    return out if mask is None else torch.where(mask.reshape(out.shape), out.float(), ILLEGAL)


# What ``auto`` picks that it once did not: before MinAtar's torso auto gave small grids an MLP, and before
# ``MultiInputEncoder`` it gave every Dict observation one.
AUTO_SINCE = ("minatar", MULTI)


def encoder_identity(spec: EnvSpec, encoder: str) -> dict:
    """A checkpoint's record of its torso: the encoder as configured, and ``torso`` where ``auto`` picks one of
    ``AUTO_SINCE``. A checkpoint from before, whose auto gave the MLP, is then refused by name (``check_compatible``)
    rather than by a shape error, and ``seedlocal eval`` still rebuilds its MLP (``checkpoint_encoder``). Nothing
    changes for the choices auto made before (Nature CNN, MLP)."""
    if encoder == "auto" and auto_encoder(spec) in AUTO_SINCE:
        return {"encoder": encoder, "torso": auto_encoder(spec)}
    return {"encoder": encoder}


def checkpoint_encoder(identity: dict, spec: EnvSpec) -> str:
    """The encoder that rebuilds a checkpoint's network (see ``encoder_identity``)."""
    encoder = identity["encoder"]
    if encoder != "auto":
        return encoder
    if "torso" in identity:
        return "auto" if identity["torso"] == MULTI else identity["torso"]  # auto is how MULTI is asked for
    return "mlp" if auto_encoder(spec) in AUTO_SINCE else "auto"  # written when auto gave these an MLP


def checkpoint_network(identity: dict, spec: EnvSpec) -> NetworkConfig:
    """The network options that rebuild a checkpoint's network (``spec``: what it sees, e.g. R2D2's stacked frames):
    the sizes it was saved with, whatever today's defaults are."""
    return NetworkConfig(encoder=checkpoint_encoder(identity, spec), hidden=tuple(identity["hidden"]),
                         lstm_size=int(identity.get("lstm_size", 0)), obs_norm=bool(identity.get("obs_norm", False)))


def action_identity(spec: EnvSpec) -> dict:
    """A Box action space's part of a checkpoint's identity (Discrete ones are named by num_actions): its
    shape, and how its actions meet its bounds (the same network acts otherwise under the other way)."""
    box = spec.num_actions is None
    return {"action_shape": list(spec.box_shape), "box_actions": spec.box_actions} if box else {}


def obs_identity(spec: EnvSpec) -> dict:
    """The observation part of a checkpoint's identity. Discrete fields enter networks one-hot, so their sizes are part
    of it (a checkpoint from before one-hot inputs is refused by name, not by a shape error)."""
    out = {"obs": {k: list(s.shape) for k, s in spec.obs.items()}}
    if getattr(spec, "obs_classes", None):
        out["obs_one_hot"] = {k: list(c) for k, c in spec.obs_classes.items()}
    return out


def flatten_obs(obs_keys: list[str], obs: dict[str, torch.Tensor], classes: dict[str, tuple[int, int]]) -> torch.Tensor:
    """Every observation field as floats, flattened and side by side: an MLP's input. Fields in ``classes`` (Discrete
    spaces: key -> (n, start)) enter one-hot: a state index is a category, not a magnitude."""
    flat = [_one_hot(obs[k], *classes[k]) if k in classes
            else as_float(obs[k]).reshape(obs[k].shape[0], -1) for k in obs_keys]
    return torch.cat(flat, dim=1) if len(flat) > 1 else flat[0]


def _one_hot(x: torch.Tensor, n: int, start: int) -> torch.Tensor:
    """[N] indices from ``start`` as [N, n] one-hot floats, by a comparison (F.one_hot reads the max: vmap cannot)."""
    return (x.reshape(-1, 1).long() - start == torch.arange(n, device=x.device)).float()


def conv_features(torso: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A convolutional torso's features of images ``x`` as the env gives them (uint8 or bool)."""
    if getattr(torso, "hwc", False):  # (N, H, W, C) seen as (N, C, H, W): already channels last, no copy below
        x = x.permute(0, 3, 1, 2)
    if getattr(torso, "channels_last", False):  # reorder the uint8/bool frames (a quarter of the bytes), then convert
        x = x.contiguous(memory_format=torch.channels_last)
    return torso(as_float(x))


def use_channels_last(kind: str, encoder: nn.Module) -> None:
    """NHWC weights and inputs for a CNN torso (each of a ``MultiInputEncoder``'s; nothing for an MLP): oneDNN's fast
    layout on CPUs (Nature CNN update: 93 vs 133 ms fp32, 48 vs 60 ms bf16 per 168 rows on 2 cores) and cuDNN's for
    tensor cores. MinAtar's (H, W, C) grids arrive in this layout, so its torso reads them without a reorder."""
    if kind not in CONV_ENCODERS and kind != MULTI:
        return
    encoder.to(memory_format=torch.channels_last)  # 4-D weights only: an MLP beside the convolutions keeps its own
    for torso in getattr(encoder, "convs", [encoder]):
        torso.channels_last = True


class _Encoded(nn.Module):
    """What the three networks share: the torso ``build_encoder`` gives (``kind``, ``encoder``, ``encode``) and, with
    ``obs_norm``, running statistics of its MLP input (buffers: no parameter moves, no random draw)."""

    def __init__(self, spec: EnvSpec, encoder: str, hidden: tuple[int, ...], obs_norm: bool):
        super().__init__()
        self.obs_keys = list(net_obs(spec))
        self.kind, self.encoder = build_encoder(spec, encoder, hidden)
        self.continuous = spec.num_actions is None
        if obs_norm and (self.kind not in ("mlp", MULTI) or not self.encoder.in_dim):
            raise ValueError(f"obs_norm: normalises vector observations; a {self.kind} torso reads images only")
        self.obs_norm = RunningNorm(self.encoder.in_dim) if obs_norm else None

    @property
    def core_spec(self) -> TensorSpec | None:
        """The recurrent state [2, H] (h and c) of an LSTM core; None without one."""
        lstm = getattr(self, "lstm", None)
        return None if lstm is None else TensorSpec((2, lstm.hidden_size), "float32")


class PolicyNet(_Encoded):
    """Encoder → action logits (Discrete) or the action itself (Box, a deterministic policy): the network a
    neuroevolution genome encodes. ``obs_norm``: its MLP input goes through running statistics (buffers, not genome
    parameters; the population shares them)."""

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64),
                 obs_norm: bool = False):
        super().__init__(spec, encoder, hidden, obs_norm)
        self.policy = nn.Linear(self.encoder.out_dim, action_size(spec))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return legal_only(self.policy(encode(self, obs)), obs)


def action_size(spec: EnvSpec) -> int:
    """Discrete actions, or the dimensions of a Box action."""
    return spec.num_actions if spec.num_actions is not None else max(1, math.prod(spec.action.shape))


def mlp_input(net: nn.Module, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A network's MLP input: its vector fields flat, side by side, normalised where it has ``obs_norm``."""
    x = flatten_obs(net.encoder.vector_keys, obs, net.encoder.classes)
    return x if net.obs_norm is None else net.obs_norm(x)


def encode(net: nn.Module, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    if net.kind in CONV_ENCODERS:
        return conv_features(net.encoder, obs[""])
    if net.kind == MULTI:
        return net.encoder(obs, None if net.obs_norm is None else mlp_input(net, obs))
    return net.encoder(mlp_input(net, obs))


class ActorCritic(_Encoded):
    """Encoder → optional LSTM core → (policy parameters, state value).

    The policy parameters are a categorical's logits (Discrete actions) or a diagonal Gaussian's mean and log-std (Box,
    ``algos/distributions.py``), the log-std one learned vector starting at ``log(init_std)``: SEED's MuJoCo agents'
    form, with "What Matters in On-Policy RL"'s std of 0.5.

    ``forward`` serves feed-forward batches; ``step`` one time step with a recurrent state ``core`` [B, 2, H] (h and c);
    ``unroll`` a time-major unroll for the learner, zeroing the state where ``first``.
    """

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64),
                 lstm_size: int = 0, separate_critic: bool = False, init: str = "torch", obs_norm: bool = False,
                 init_std: float = 0.5):
        super().__init__(spec, encoder, hidden, obs_norm)
        # A critic with its own MLP: value regression then cannot steer the policy's features (CartPole: 450 in ~90-150k
        # steps instead of >300k). Image torsos and LSTM cores stay shared, as in IMPALA.
        separate = separate_critic and self.kind == "mlp" and not lstm_size
        self.critic = MLPEncoder(self.encoder.in_dim, hidden) if separate else None
        self.lstm = nn.LSTMCell(self.encoder.out_dim, lstm_size) if lstm_size else None
        d = lstm_size or self.encoder.out_dim
        self.policy = nn.Linear(d, action_size(spec))
        self.log_std = nn.Parameter(torch.full((action_size(spec),), math.log(init_std))) if self.continuous else None
        self.value = nn.Linear(d, 1)
        if init == "orthogonal":  # else torch's (the config's choices are checked before a network is built)
            orthogonal_init(self)
        use_channels_last(self.kind, self.encoder)  # after init: orthogonal_ needs contiguous weights

    def _heads(self, h: torch.Tensor, obs: dict[str, torch.Tensor],
               hv: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        params = legal_only(self.policy(h), obs)
        if self.log_std is not None:  # a Gaussian: [mean, log std], the std at least 1e-3
            log_std = self.log_std.clamp(min=MIN_LOG_STD).to(params.dtype)
            params = torch.cat([params, log_std.expand_as(params)], dim=-1)
        return params, self.value(h if hv is None else hv).squeeze(-1)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.critic is not None:
            x = mlp_input(self, obs)
            return self._heads(self.encoder(x), obs, self.critic(x))
        return self._heads(encode(self, obs), obs)

    def step(self, obs: dict[str, torch.Tensor], core: torch.Tensor | None):
        if self.lstm is None:  # a separate critic has none
            return (*self.forward(obs), None)
        hx, cx = self.lstm(encode(self, obs), _state_pair(core))
        return (*self._heads(hx, obs), torch.stack([hx, cx], dim=1))

    @torch.no_grad()
    def update_obs_norm(self, obs: dict[str, torch.Tensor], pool=None) -> None:
        """Fold time-major observations [T, B, ...] into ``obs_norm``'s statistics (with ``pool``, every
        data-parallel rank's: ``RunningNorm.update``)."""
        flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in obs.items()}
        self.obs_norm.update(flatten_obs(self.encoder.vector_keys, flat, self.encoder.classes), pool=pool)

    def unroll(self, obs: dict[str, torch.Tensor], core: torch.Tensor | None, first: torch.Tensor):
        """obs [L, B, ...] → policy parameters [L, B, P], values [L, B]. ``core``
        is the state before row 0 (already reset if row 0 starts an episode)."""
        L, B = first.shape
        flat_obs = {k: v.reshape((L * B,) + v.shape[2:]) for k, v in obs.items()}
        if self.lstm is None:
            logits, values = self.forward(flat_obs)
            return logits.reshape(L, B, -1), values.reshape(L, B)
        h = encode(self, flat_obs).reshape(L, B, -1)
        hx, cx = _state_pair(core)
        keep = (~first).float().unsqueeze(-1)
        outs = []
        for t in range(L):
            if t > 0:  # row 0's reset is already in ``core``
                hx, cx = hx * keep[t], cx * keep[t]
            hx, cx = self.lstm(h[t], (hx, cx))
            outs.append(hx)
        return self._heads(torch.stack(outs), obs)


def _state_pair(core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, c) of a recurrent state [B, 2, H] as two contiguous [B, H] tensors. ``core[:, 0]`` is a strided view, and
    cuDNN's RNN entry point refuses a non-contiguous state (the CPU kernels do not check, so only a GPU shows it)."""
    return core[:, 0].contiguous(), core[:, 1].contiguous()


def orthogonal_init(model: "ActorCritic") -> None:
    """Orthogonal weights, zero biases; gain sqrt(2) in the ReLU torso, 0.01 on the policy head (the first policy is
    uniform and every action's logit can move), 1 on the value head (Saxe et al. 2014; as in OpenAI Baselines' Atari
    agents). The LSTM core keeps torch's init."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            nn.init.zeros_(m.bias)
    nn.init.orthogonal_(model.policy.weight, gain=0.01)
    nn.init.orthogonal_(model.value.weight, gain=1.0)


class RecurrentQNet(_Encoded):
    """R2D2's network: encoder → LSTM → dueling head Q = V + A - mean(A) (Wang et al. 2016). ``step`` serves one time
    step with state ``core`` [B, 2, H]; ``unroll`` a time-major sequence from the state before its row 0 (already reset
    if row 0 starts an episode), zeroing it where ``first`` marks later episode starts. Both return (Q, final core).

    The core is an ``nn.LSTM``: on CUDA its weights live in the one flat buffer cuDNN's RNN kernel reads
    (``flatten_parameters``, redone by every ``.to()``); ``step`` runs them through the fused single-step cell kernel,
    which CUDA graphs capture.
    """

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64), lstm_size: int = 64):
        super().__init__(spec, encoder, hidden, obs_norm=False)
        self.lstm = nn.LSTM(self.encoder.out_dim, lstm_size)
        h = lstm_size  # each head's hidden layer, as wide as the core
        self.value = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.advantage = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, spec.num_actions))
        use_channels_last(self.kind, self.encoder)
        self.precision = "fp32"  # the torso's arithmetic (resolve_precision); the rest is fp32
        self._register_load_state_dict_pre_hook(_lstm_cell_names)

    def _encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        with autocast(next(iter(obs.values())).device, self.precision, cache=False):  # each weight used once: graphable
            return encode(self, obs).float()

    def _q(self, h: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Q [..., A]; an illegal action's is ``ILLEGAL``, so argmax, max and epsilon's greedy choice see only
        legal ones. The dueling mean is over every action: the mask moves no legal action's value."""
        a = self.advantage(h)
        return legal_only(self.value(h) + a - a.mean(-1, keepdim=True), obs)

    def step(self, obs: dict[str, torch.Tensor], core: torch.Tensor):
        x = self._encode(obs)
        m = self.lstm
        hx, cx = torch.lstm_cell(x, _state_pair(core), m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
        return self._q(hx, obs), torch.stack([hx, cx], dim=1)

    def frozen_copy(self) -> RecurrentQNet:
        """A copy without gradients (R2D2's target network). ``deepcopy`` gives each LSTM weight its own storage, which
        cuDNN repacks on every call (its "not part of single contiguous chunk" warning, seen on the H200): the copy's
        weights go back into one flat buffer."""
        twin = copy.deepcopy(self).requires_grad_(False)
        twin.lstm.flatten_parameters()  # a no-op off cuDNN
        return twin

    def unroll(self, obs: dict[str, torch.Tensor], core: torch.Tensor, first: torch.Tensor, starts: list[int]):
        """``starts``: the rows t > 0 where some env starts an episode (``cut_rows`` of the host's copy of ``first``:
        reading ``first`` on a GPU would wait for the device)."""
        L, B = first.shape
        flat = {k: v.reshape((L * B,) + v.shape[2:]) for k, v in obs.items()}
        x = self._encode(flat).reshape(L, B, -1)
        hx, cx = _state_pair(core)
        keep = (~first).to(hx.dtype).unsqueeze(-1)
        # Run the fused LSTM kernel over each stretch of rows in which no env starts an episode, zeroing the state only
        # where one does: a handful of kernel calls per sequence instead of one cell call per row (3-5x faster learner
        # steps on a CPU), the same arithmetic.
        cuts = [0, *starts, L]
        outs = []
        for t0, t1 in zip(cuts[:-1], cuts[1:]):
            if t0 > 0:
                hx, cx = hx * keep[t0], cx * keep[t0]
            out, (h1, c1) = self.lstm(x[t0:t1], (hx.unsqueeze(0), cx.unsqueeze(0)))
            hx, cx = h1[0], c1[0]
            outs.append(out)
        return self._q(torch.cat(outs), obs), torch.stack([hx, cx], dim=1)


def cut_rows(first) -> list[int]:
    """The rows t > 0 of host-side ``first`` flags [L, B] where some env starts an episode."""
    return (np.flatnonzero(np.asarray(first)[1:].any(axis=1)) + 1).tolist()


def _lstm_cell_names(state_dict, prefix, *args) -> None:
    """Checkpoints from when the core was an ``nn.LSTMCell`` name the same weights without the layer suffix."""
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        old = f"{prefix}lstm.{name}"
        if old in state_dict:
            state_dict[f"{old}_l0"] = state_dict.pop(old)
