"""Networks and the policies the inference loop runs.

A *policy* turns a batch of observations (a dict of tensors, one row per env)
into actions plus named outputs that are stored beside each step (behaviour
logits and values for V-trace). ``RandomPolicy`` and ``ModelPolicy`` write the
same outputs, so the benchmark compares like with like.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
from torch import nn

from seedlocal.pipeline.envs import EnvSpec
from seedlocal.shm.rollout import TensorSpec

ENCODERS = ("auto", "mlp", "nature", "impala")
PRECISIONS = ("auto", "fp32", "tf32", "bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_bf16_matmul() -> bool:
    """AMX or AVX-512 BF16 on this CPU: oneDNN then runs bf16 convolutions natively."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_precision(precision: str, kind: str, device: torch.device) -> str:
    """``auto`` is bf16 on a CPU only where it measured faster: a CNN torso on
    a CPU with native bf16 (Nature CNN update 2.6x faster here, see
    docs/tuning.md); MLPs stay fp32 there (nothing to gain at their size). On
    CUDA ``auto`` is tf32: torch already runs cuDNN's convolutions in TF32 by
    default, so an "fp32" CNN was TF32 in its convolutions and fp32 only in
    its matmuls; tf32 makes them one arithmetic (not yet timed on a GPU:
    scripts/gpu_suite measures fp32, tf32 and bf16 updates). ``tf32`` on a
    CPU is plain fp32 (no such arithmetic there)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda":
            return "tf32"
        return "bf16" if kind in ("nature", "impala") and cpu_has_bf16_matmul() else "fp32"
    if precision == "tf32" and device.type != "cuda":
        return "fp32"
    return precision


def apply_precision(precision: str, device: torch.device) -> None:
    """Set what ``precision`` means for the float32 arithmetic outside
    autocast on ``device``: TF32 tensor-core matmuls and convolutions for
    tf32 and bf16 (whose LSTM, heads and targets stay float32), none for
    fp32, which is then fp32 in its convolutions too. Process-wide flags:
    one run per process."""
    if device.type == "cuda":
        tf32 = precision in ("tf32", "bf16")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def autocast(device: torch.device, precision: str, cache: bool = True):
    """Mixed precision for a forward pass: weights and their gradients stay
    fp32; convolutions and matmuls run in bf16; callers cast outputs back.
    ``cache=False`` for anything a CUDA graph captures: a graph must cast the
    weights itself, not read casts cached before (and freed after) capture."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()  # fp32 and tf32 (apply_precision)


def image_layout(spec: TensorSpec) -> str | None:
    """``chw`` or ``hwc`` for an observation the CNN torsos take (at least
    36 x 36 pixels: the Nature CNN's smallest input), else None. Gymnasium's
    own image envs are usually (H, W, C); envpool's Atari frames (C, H, W)."""
    shape = spec.shape
    if len(shape) != 3:
        return None
    if min(shape[1:]) >= 36:
        return "chw"
    if min(shape[:2]) >= 36 and shape[2] <= 16:
        return "hwc"
    return None


def is_image(spec: TensorSpec) -> bool:
    return image_layout(spec) is not None


@functools.lru_cache(maxsize=1)
def _cpu_tanh_is_slow() -> bool:
    """Whether this torch build's CPU tanh is slower than 2 sigmoid(2x) - 1.
    torch 2.13's x86 wheels run tanh at scalar speed (512 x 64 floats: 85 us
    against 14 us for sigmoid on the 2-core development machine), so the
    identity is about 3x faster there; a build with a vectorised tanh keeps it."""
    import time

    x = torch.randn(256, 64)
    best = {}
    for name, fn in (("tanh", torch.tanh), ("sigmoid", _tanh_from_sigmoid)):
        with torch.inference_mode():
            fn(x)
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
        best[name] = sorted(times)[len(times) // 2]
    return best["sigmoid"] < 0.8 * best["tanh"]


def _tanh_from_sigmoid(x: torch.Tensor) -> torch.Tensor:
    y = torch.sigmoid(x * 2)
    if y.requires_grad:
        return y * 2 - 1
    return y.mul_(2).sub_(1)  # no graph to keep: reuse the buffer


class Tanh(nn.Tanh):
    """tanh, computed as 2 sigmoid(2x) - 1 on a CPU whose torch tanh measures
    slower (see ``_cpu_tanh_is_slow``): within 2e-7 of torch.tanh. Only from
    8,192 elements (a batch of 128 rows of 64 units) up: below about 4,096
    the three kernel launches cost more than tanh itself (1 thread here:
    1,024 elements 8.8 vs 3.6 us; 8,192: 12.9 vs 21.8; 32,768: 28 vs 85).
    The MLP torsos' activation, so CartPole-sized policies, their learner and
    population evaluation all get it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() >= 8192 and x.device.type == "cpu" and x.dtype == torch.float32 and _cpu_tanh_is_slow():
            return _tanh_from_sigmoid(x)
        return torch.tanh(x)


class MLPEncoder(nn.Module):
    def __init__(self, in_dim: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        layers, d = [], in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), Tanh()]
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


class _ResidualBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv0 = nn.Conv2d(c, c, 3, padding=1)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(nn.Module):
    """The deep IMPALA torso (Espeholt et al. 2018, fig. 3): three stages of
    conv + max-pool + two residual blocks, 16/32/32 channels, then 256 units."""

    def __init__(self, in_shape: tuple[int, int, int], channels=(16, 32, 32), out_dim: int = 256):
        super().__init__()
        c, h, w = in_shape
        stages = []
        for out_c in channels:
            stages += [nn.Conv2d(c, out_c, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_c), _ResidualBlock(out_c)]
            c = out_c
        self.conv = nn.Sequential(*stages, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, *in_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


def _as_float(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.uint8:
        return x.float()
    # Under autocast, go straight to its dtype: a float32 frame batch would be
    # written once here and once more by autocast's cast before the first conv.
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else torch.float32
    return x.to(dtype).div_(255.0)


def build_encoder(spec: EnvSpec, encoder: str, hidden: tuple[int, ...]) -> tuple[str, nn.Module]:
    """(kind, torso) for an env: ``auto`` picks the Nature CNN for images, else an MLP."""
    if spec.num_actions is None:
        raise ValueError(f"env.id={spec.env_id!r}: network policies need a Discrete action space")
    if encoder not in ENCODERS:
        raise ValueError(f"encoder={encoder!r}: expected one of {', '.join(ENCODERS)}")
    single = spec.obs.get("")
    if encoder == "auto":
        encoder = "nature" if single is not None and is_image(single) else "mlp"
    if encoder in ("nature", "impala"):
        layout = image_layout(single) if single is not None else None
        if layout is None:
            raise ValueError(f"encoder={encoder} needs one image observation, (C, H, W) or (H, W, C) of at least "
                             f"36 x 36 pixels; {spec.env_id} has "
                             f"{tuple(single.shape) if single is not None else dict(spec.obs)}")
        c, h, w = single.shape if layout == "chw" else (single.shape[2], *single.shape[:2])
        torso = NatureCNN((c, h, w)) if encoder == "nature" else ImpalaResNet((c, h, w))
        torso.hwc = layout == "hwc"  # encode_obs moves the channels first (a view)
        return encoder, torso
    if not hidden or any(int(h) < 1 for h in hidden):
        raise ValueError(f"hidden={tuple(hidden)}: MLP hidden sizes must be positive, at least one layer")
    classes = {k: c for k, c in getattr(spec, "obs_classes", {}).items() if k in spec.obs}
    in_dim = sum(classes[k][0] if k in classes else max(1, math.prod(s.shape)) for k, s in spec.obs.items())
    torso = MLPEncoder(in_dim, hidden)
    torso.classes = classes  # Discrete fields enter one-hot (flatten_obs)
    return encoder, torso


def obs_identity(spec: EnvSpec) -> dict:
    """The observation part of a checkpoint's identity. Discrete fields enter
    networks one-hot, so their sizes are part of it (a checkpoint from before
    one-hot inputs is refused by name, not by a shape error)."""
    out = {"obs": {k: list(s.shape) for k, s in spec.obs.items()}}
    if getattr(spec, "obs_classes", None):
        out["obs_one_hot"] = {k: list(c) for k, c in spec.obs_classes.items()}
    return out


def flatten_obs(obs_keys: list[str], obs: dict[str, torch.Tensor],
                classes: dict[str, tuple[int, int]] | None = None) -> torch.Tensor:
    """Every observation field as floats, flattened and side by side: an MLP's
    input. Fields in ``classes`` (Discrete spaces: key -> (n, start)) enter
    one-hot: a state index is a category, not a magnitude."""
    flat = []
    for k in obs_keys:
        x = obs[k]
        if classes and k in classes:
            n, start = classes[k]
            # A comparison, not F.one_hot: that one reads the max value, which vmap cannot.
            idx = x.reshape(-1, 1).long() - start
            flat.append((idx == torch.arange(n, device=x.device)).float())
        else:
            flat.append(_as_float(x).reshape(x.shape[0], -1))
    return torch.cat(flat, dim=1) if len(flat) > 1 else flat[0]


def encode_obs(kind: str, encoder: nn.Module, obs_keys: list[str], obs: dict[str, torch.Tensor]) -> torch.Tensor:
    if kind in ("nature", "impala"):
        x = obs[""]
        if getattr(encoder, "hwc", False):
            # (N, H, W, C) frames seen as (N, C, H, W): already the
            # channels-last memory layout, so the reorder below copies nothing.
            x = x.permute(0, 3, 1, 2)
        if getattr(encoder, "channels_last", False):
            # Reorder the uint8 frames (a quarter of the bytes), then convert.
            x = x.contiguous(memory_format=torch.channels_last)
        return encoder(_as_float(x))
    return encoder(flatten_obs(obs_keys, obs, getattr(encoder, "classes", None)))


def use_channels_last(encoder: nn.Module) -> None:
    """NHWC weights and inputs for a CNN torso: oneDNN's fast layout on CPUs
    (Nature CNN update: 93 vs 133 ms fp32, 48 vs 60 ms bf16 per 168 rows on
    2 cores) and cuDNN's for tensor cores."""
    encoder.to(memory_format=torch.channels_last)
    encoder.channels_last = True


class PolicyNet(nn.Module):
    """Encoder → action logits: the network a neuroevolution genome encodes."""

    core_spec = None

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.obs_keys = list(spec.obs)
        self.kind, self.encoder = build_encoder(spec, encoder, hidden)
        self.policy = nn.Linear(self.encoder.out_dim, spec.num_actions)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.policy(encode_obs(self.kind, self.encoder, self.obs_keys, obs))

    def step(self, obs: dict[str, torch.Tensor], core=None):
        return self.forward(obs), None, None


class ActorCritic(nn.Module):
    """Encoder → optional LSTM core → (policy logits, state value).

    ``forward`` serves feed-forward batches; ``step`` one time step with a
    recurrent state ``core`` of shape [B, 2, H] (h and c); ``unroll`` a whole
    time-major unroll for the learner, zeroing the state where ``first``.
    """

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64),
                 lstm_size: int = 0, separate_critic: bool = False, init: str = "torch"):
        super().__init__()
        self.obs_keys = list(spec.obs)
        self.kind, self.encoder = build_encoder(spec, encoder, hidden)
        encoder = self.kind
        # A critic with its own MLP: value regression then cannot steer the
        # policy's features (CartPole: 450 in ~90-150k steps instead of >300k).
        # Image torsos and LSTM cores stay shared, as in IMPALA.
        separate = separate_critic and encoder == "mlp" and not lstm_size
        self.critic = MLPEncoder(self.encoder.net[0].in_features, hidden) if separate else None
        d = self.encoder.out_dim
        self.lstm = nn.LSTMCell(d, lstm_size) if lstm_size else None
        if self.lstm is not None:
            d = lstm_size
        self.policy = nn.Linear(d, spec.num_actions)
        self.value = nn.Linear(d, 1)
        if init == "orthogonal":
            orthogonal_init(self)
        elif init != "torch":
            raise ValueError(f"init={init!r}: expected orthogonal or torch")
        if encoder in ("nature", "impala"):
            use_channels_last(self.encoder)  # after init: orthogonal_ needs contiguous weights

    @property
    def core_spec(self) -> TensorSpec | None:
        return None if self.lstm is None else TensorSpec((2, self.lstm.hidden_size), "float32")

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return encode_obs(self.kind, self.encoder, self.obs_keys, obs)

    def _heads(self, h: torch.Tensor, hv: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(h), self.value(h if hv is None else hv).squeeze(-1)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.critic is not None:
            x = flatten_obs(self.obs_keys, obs, self.encoder.classes)
            return self._heads(self.encoder(x), self.critic(x))
        return self._heads(self.encode(obs))

    def step(self, obs: dict[str, torch.Tensor], core: torch.Tensor | None):
        if self.critic is not None:
            return (*self.forward(obs), None)
        h = self.encode(obs)
        if self.lstm is None:
            return (*self._heads(h), None)
        hx, cx = self.lstm(h, _state_pair(core))
        return (*self._heads(hx), torch.stack([hx, cx], dim=1))

    def unroll(self, obs: dict[str, torch.Tensor], core: torch.Tensor | None, first: torch.Tensor):
        """obs [L, B, ...] → logits [L, B, A], values [L, B]. ``core`` is the
        state before row 0 (already reset if row 0 starts an episode)."""
        L, B = first.shape
        flat_obs = {k: v.reshape((L * B,) + v.shape[2:]) for k, v in obs.items()}
        if self.lstm is None:
            logits, values = self.forward(flat_obs)
            return logits.reshape(L, B, -1), values.reshape(L, B)
        h = self.encode(flat_obs)
        h = h.reshape(L, B, -1)
        hx, cx = _state_pair(core)
        keep = (~first).float().unsqueeze(-1)
        outs = []
        for t in range(L):
            if t > 0:  # row 0's reset is already in ``core``
                hx, cx = hx * keep[t], cx * keep[t]
            hx, cx = self.lstm(h[t], (hx, cx))
            outs.append(hx)
        logits, values = self._heads(torch.stack(outs))
        return logits, values


def _state_pair(core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, c) of a recurrent state [B, 2, H] as two contiguous [B, H] tensors.
    ``core[:, 0]`` is a strided view, and cuDNN's RNN entry point refuses a
    non-contiguous state (the CPU kernels do not check, so only a GPU shows it)."""
    return core[:, 0].contiguous(), core[:, 1].contiguous()


def orthogonal_init(model: "ActorCritic") -> None:
    """Orthogonal weights, zero biases; gain sqrt(2) in the ReLU torso, 0.01
    on the policy head (the first policy is uniform and every action's logit
    can move), 1 on the value head (Saxe et al. 2014; as in OpenAI Baselines'
    Atari agents). The LSTM core keeps torch's init.
    """
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            nn.init.zeros_(m.bias)
    nn.init.orthogonal_(model.policy.weight, gain=0.01)
    nn.init.orthogonal_(model.value.weight, gain=1.0)


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


class WeightFence:
    """Orders the inference thread's reads of the learner's weights against
    the optimiser's writes: inference reads the learner's own weights, as in
    SEED, with no copy (DESIGN decision 4).

    The learner wraps each ``optimizer.step()`` in ``with fence:``; the
    inference thread wraps each forward in ``with fence.reading():``. The two
    exclude each other in Python, which is all a CPU needs. On CUDA the
    inference thread enqueues on a stream of its own (``InferenceLoop``), so
    Python order is not GPU order: a read first waits for the event recorded
    after the last write, and a write for the event recorded after the last
    read. A forward then never sees a step half applied and a step never
    overwrites weights a queued forward still reads, while the learner's
    forward and backward passes (which only read) overlap inference.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._lock = threading.Lock()
        self._wrote = self._read = None  # CUDA events

    def _after(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def _record(self):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # this thread's current stream
        return event

    def __enter__(self) -> WeightFence:
        self._lock.acquire()
        if self.cuda:
            self._after(self._read)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.cuda:
                self._wrote = self._record()
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def reading(self):
        with self._lock:
            if self.cuda:
                self._after(self._wrote)
            yield
            if self.cuda:
                self._read = self._record()


class GraphedStep:
    """``step(obs, core)`` (a network's one-step forward) replayed from CUDA
    graphs: one per batch size rounded up to a power of two, into one shared
    memory pool. ``capture`` takes every size a run will serve at start-up,
    before the learner starts: capturing synchronises the device and empties
    the allocator's cache, which in the middle of a run would stall the
    learner and throw away its cached blocks. A size that still comes
    unannounced is captured when it comes. Inputs are
    copied into the graph's static buffers (pad rows keep stale data; their
    outputs are dropped) and outputs are cloned out, so the caller may hold
    them past the next call. Parameters are read where they live, so an
    optimiser step that updates them in place is seen by the next replay.

    A graph saves the per-kernel launch cost of a small forward, which is
    what a batch of a few dozen env rows spends most of its time on.
    """

    def __init__(self, step, device: torch.device):
        self.step, self.device = step, torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.graphs: dict[int, tuple] = {}
        self.pool = None

    @staticmethod
    def bucket(n: int) -> int:
        return 1 << max(0, n - 1).bit_length()

    def capture(self, sizes, obs: dict[str, torch.Tensor], core: torch.Tensor | None = None) -> None:
        """Capture the graph of every bucket that batches of ``sizes`` rows
        fall in; ``obs`` and ``core`` give each input's row shape and dtype."""
        for size in sorted({self.bucket(int(n)) for n in sizes}):
            if size not in self.graphs:
                self._capture(size, obs, core)

    def _capture(self, size: int, obs: dict[str, torch.Tensor], core):
        # Everything on the configured device (cuda:1 included): the capture
        # stream torch.cuda.graph makes by default belongs to the current one.
        with torch.cuda.device(self.device):
            static_obs = {k: torch.zeros((size,) + v.shape[1:], dtype=v.dtype, device=self.device)
                          for k, v in obs.items()}
            static_core = None if core is None else torch.zeros((size,) + core.shape[1:], dtype=core.dtype,
                                                                 device=self.device)
            # Warm-up off the capturing stream (lazy initialisation, cuDNN's
            # algorithm choice), as torch.cuda.graphs asks.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.step(static_obs, static_core)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a learner thread may be launching work while this one captures.
            with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(self.device),
                                  capture_error_mode="thread_local"):
                out = self.step(static_obs, static_core)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[size] = (graph, static_obs, static_core, out)

    def __call__(self, obs: dict[str, torch.Tensor], core=None):
        n = next(iter(obs.values())).shape[0]
        size = self.bucket(n)
        if size not in self.graphs:
            self._capture(size, obs, core)
        graph, static_obs, static_core, out = self.graphs[size]
        for k, v in obs.items():
            static_obs[k][:n].copy_(v)
        if core is not None:
            static_core[:n].copy_(core)
        graph.replay()
        return tuple(None if o is None else o[:n].clone() for o in out)


class ModelPolicy:
    """Samples actions from an ``ActorCritic`` without tracking gradients.

    ``fence`` (a ``WeightFence`` shared with the learner's optimiser step)
    keeps a forward pass from reading parameters halfway through an update.
    ``cuda_graphs`` replays the forward from CUDA graphs (``GraphedStep``).
    """

    def __init__(self, model: ActorCritic, spec: EnvSpec, fence: WeightFence | None = None,
                 precision: str = "fp32", cuda_graphs: bool = False):
        self.model = model
        self.outputs = policy_outputs(spec)
        self.core_state = model.core_spec
        self.device = next(model.parameters()).device
        self.fence = fence if fence is not None else WeightFence(self.device)
        self.precision = precision
        self._step = GraphedStep(self._autocast_step, self.device) if cuda_graphs else self._autocast_step

    def prepare(self, sizes, obs: dict[str, torch.Tensor]) -> None:
        """Before the run: capture the CUDA graphs of every batch size the loop will serve."""
        if isinstance(self._step, GraphedStep):
            core = None if self.core_state is None else torch.zeros((1,) + self.core_state.shape, device=self.device)
            self._step.capture(sizes, obs, core)

    def _autocast_step(self, obs, core):
        with autocast(self.device, self.precision, cache=False):
            return self.model.step(obs, core)

    @torch.inference_mode()
    def act(self, obs: dict[str, torch.Tensor], core=None):
        with self.fence.reading():
            logits, value, core = self._step(obs, core)
        logits, value = logits.float(), value.float()
        if core is not None:
            core = core.float()
        actions = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
        return actions, {"logits": logits, "value": value}, core


class RecurrentQNet(nn.Module):
    """R2D2's network: encoder → LSTM → dueling head Q = V + A - mean(A)
    (Wang et al. 2016). ``step`` serves one time step of a batch with state
    ``core`` [B, 2, H]; ``unroll`` a time-major sequence from the state
    before its row 0 (already reset if row 0 starts an episode), zeroing the
    state where ``first`` marks later episode starts. Returns (Q, final core).

    The core is an ``nn.LSTM``: on CUDA its weights live in the one flat
    buffer cuDNN's RNN kernel reads (``flatten_parameters``, redone by every
    ``.to()``), so no call repacks them; ``step`` runs the same weights
    through the fused single-step cell kernel, which CUDA graphs capture.
    """

    def __init__(self, spec: EnvSpec, encoder: str = "auto", hidden: tuple[int, ...] = (64, 64),
                 lstm_size: int = 64, head_size: int = 0):
        super().__init__()
        self.obs_keys = list(spec.obs)
        self.kind, self.encoder = build_encoder(spec, encoder, hidden)
        self.lstm = nn.LSTM(self.encoder.out_dim, lstm_size)
        head = head_size or lstm_size
        self.value = nn.Sequential(nn.Linear(lstm_size, head), nn.ReLU(), nn.Linear(head, 1))
        self.advantage = nn.Sequential(nn.Linear(lstm_size, head), nn.ReLU(), nn.Linear(head, spec.num_actions))
        if self.kind in ("nature", "impala"):
            use_channels_last(self.encoder)
        self.precision = "fp32"  # the torso's arithmetic (resolve_precision); the rest is fp32
        self._register_load_state_dict_pre_hook(_lstm_cell_names)

    @property
    def core_spec(self) -> TensorSpec:
        return TensorSpec((2, self.lstm.hidden_size), "float32")

    def _encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = next(iter(obs.values()))
        with autocast(x.device, self.precision, cache=False):  # each weight is used once; safe to graph
            return encode_obs(self.kind, self.encoder, self.obs_keys, obs).float()

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        a = self.advantage(h)
        return self.value(h) + a - a.mean(-1, keepdim=True)

    def step(self, obs: dict[str, torch.Tensor], core: torch.Tensor):
        x = self._encode(obs)
        m = self.lstm
        hx, cx = torch.lstm_cell(x, _state_pair(core), m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
        return self._q(hx), torch.stack([hx, cx], dim=1)

    def unroll(self, obs: dict[str, torch.Tensor], core: torch.Tensor, first: torch.Tensor,
               starts: list[int] | None = None):
        """``starts``: the rows t > 0 where some env starts an episode, when
        the caller has them on the host (otherwise read from ``first``,
        which on a GPU waits for the device)."""
        L, B = first.shape
        flat = {k: v.reshape((L * B,) + v.shape[2:]) for k, v in obs.items()}
        x = self._encode(flat).reshape(L, B, -1)
        hx, cx = _state_pair(core)
        keep = (~first).to(hx.dtype).unsqueeze(-1)
        # Run the fused LSTM kernel over each stretch of rows in which no env
        # starts an episode, zeroing the state only where one does: a handful
        # of kernel calls per sequence instead of one cell call per row
        # (3-5x faster learner steps on a CPU), the same arithmetic.
        if starts is None:
            starts = (torch.nonzero(first[1:].any(dim=1)).flatten() + 1).tolist()
        cuts = [0, *starts, L]
        outs = []
        for t0, t1 in zip(cuts[:-1], cuts[1:]):
            if t0 > 0:
                hx, cx = hx * keep[t0], cx * keep[t0]
            out, (h1, c1) = self.lstm(x[t0:t1], (hx.unsqueeze(0), cx.unsqueeze(0)))
            hx, cx = h1[0], c1[0]
            outs.append(out)
        return self._q(torch.cat(outs)), torch.stack([hx, cx], dim=1)


def episode_starts(first) -> list[int]:
    """The rows t > 0 of host-side ``first`` flags [L, B] where some env starts an episode."""
    import numpy as np

    return (np.flatnonzero(np.asarray(first)[1:].any(axis=1)) + 1).tolist()


def _lstm_cell_names(state_dict, prefix, *args) -> None:
    """Checkpoints written when the core was an ``nn.LSTMCell`` name its
    weights without the layer suffix; they are the same tensors."""
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        old = f"{prefix}lstm.{name}"
        if old in state_dict:
            state_dict[f"{old}_l0"] = state_dict.pop(old)
