"""How a network's numbers are computed: precision and a faster CPU tanh.

``precision`` (a trainer's ``algo.precision``) is one of auto, fp32, tf32 and bf16: ``resolve_precision`` says
what auto means on a device and for a torso, ``apply_precision`` sets the float32 matmul flags it implies, and
``autocast`` runs a forward pass in it.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import timeit

import torch
from torch import nn


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
    """``auto`` is bf16 on a CPU only where it measured faster: a CNN torso on a CPU with native bf16 (Nature CNN
    update 2.6x faster here, see docs/tuning.md); MLPs stay fp32 there (nothing to gain at their size). On CUDA
    ``auto`` is tf32: torch already runs cuDNN's convolutions in TF32 by default, so an "fp32" CNN was TF32 in its
    convolutions and fp32 only in its matmuls; tf32 makes them one arithmetic (the H200's timings: docs/gpu.md,
    "Precision"). ``tf32`` on a CPU is plain fp32 (no such arithmetic there)."""
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
    """Set what ``precision`` means for the float32 arithmetic outside autocast on ``device``: TF32 tensor-core
    matmuls and convolutions for tf32 and bf16 (whose LSTM, heads and targets stay float32), none for fp32, which
    is then fp32 in its convolutions too. Process-wide flags: one run per process."""
    if device.type == "cuda":
        tf32 = precision in ("tf32", "bf16")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def autocast(device: torch.device, precision: str, cache: bool = True):
    """Mixed precision for a forward pass: weights and their gradients stay fp32; convolutions and matmuls run in
    bf16; callers cast outputs back. ``cache=False`` for anything a CUDA graph captures: a graph must cast the
    weights itself, not read casts cached before (and freed after) capture."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()  # fp32 and tf32 (apply_precision)


@functools.lru_cache(maxsize=1)
def _cpu_tanh_is_slow() -> bool:
    """Whether this torch build's CPU tanh is slower than 2 sigmoid(2x) - 1. torch 2.13's x86 wheels run tanh at
    scalar speed (512 x 64 floats: 85 us against 14 us for sigmoid on the 2-core development machine), so the
    identity is about 3x faster there; a build with a vectorised tanh keeps it."""
    x = torch.linspace(-4, 4, 256 * 64).reshape(256, 64)  # not randn: the check must not draw from the run's stream

    def median_s(fn) -> float:  # of 7 calls, after one to warm up
        with torch.inference_mode():
            fn(x)
            return statistics.median(timeit.repeat(lambda: fn(x), number=1, repeat=7))

    tanh = median_s(torch.tanh)
    return median_s(_tanh_from_sigmoid) < 0.8 * tanh


def _tanh_from_sigmoid(x: torch.Tensor) -> torch.Tensor:
    y = torch.sigmoid(x * 2)
    if y.requires_grad:
        return y * 2 - 1
    return y.mul_(2).sub_(1)  # no graph to keep: reuse the buffer


class Tanh(nn.Tanh):
    """tanh, computed as 2 sigmoid(2x) - 1 on a CPU whose torch tanh measures slower (see ``_cpu_tanh_is_slow``):
    within 2e-7 of torch.tanh. Only from 8,192 elements (a batch of 128 rows of 64 units) up: below about 4,096
    the three kernel launches cost more than tanh itself (1 thread here: 1,024 elements 8.8 vs 3.6 us; 8,192: 12.9
    vs 21.8; 32,768: 28 vs 85). The MLP torsos' activation, so CartPole-sized policies, their learner and
    population evaluation all get it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() >= 8192 and x.device.type == "cpu" and x.dtype == torch.float32 and _cpu_tanh_is_slow():
            return _tanh_from_sigmoid(x)
        return torch.tanh(x)
