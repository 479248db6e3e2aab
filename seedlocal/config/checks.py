"""Checks of the config, before any process starts: each raises a ``ConfigError`` whose message starts with the
field and the value it refuses (``pipeline.envs_per_worker=3: ...``). torch is imported inside the functions that
need it: an actor host (``seedlocal actors``) reads this module and needs no torch.
"""

from __future__ import annotations

import importlib
import ipaddress
import math
import os
import typing
from pathlib import Path
from typing import TYPE_CHECKING

from seedlocal.config.overrides import options_of
from seedlocal.config.resume import leaves
from seedlocal.config.schema import NETWORK_OPTIONS, BridgeConfig, PipelineConfig
from seedlocal.errors import ConfigError, fail, fail_if

if TYPE_CHECKING:
    import torch


THREADS_PER_CORE = 8


def validate_run_options(cfg) -> None:
    """What every family's run (a ``RunConfig``) shares: numbers that are numbers, values among their choices,
    and a run folder that can be written."""
    kinds = options_of(type(cfg))
    for name, value in leaves(cfg).items():
        if isinstance(value, float) and not math.isfinite(value):
            fail(name, value, "must be a finite number")
        # A Literal's choices, also where a config was built in Python or read from a checkpoint (tyro never parsed).
        if typing.get_origin(kinds[name]) is typing.Literal and value not in typing.get_args(kinds[name]):
            fail(name, value, "expected " + ", ".join(map(str, typing.get_args(kinds[name]))))
    if cfg.env.seed < 0:  # before the run's first line, as every other field
        fail("env.seed", cfg.env.seed, "must be >= 0")
    if cfg.keep_checkpoints < 0:
        fail("keep_checkpoints", cfg.keep_checkpoints, "must be >= 0 (0 keeps every checkpoint)")
    name = cfg.run_name
    if name and (name in (".", "..") or "/" in name or "\\" in name):
        fail("run_name", name, "must be a folder name under log_dir, without path separators")
    if len(name.encode()) > 200:
        fail("run_name", name[:20] + "...", f"is {len(name.encode())} bytes long; folder names may have 255 at most "
             "and seedlocal keeps some for its own")
    if cfg.log_dir == "":
        fail("log_dir", "", "must name a folder (e.g. runs)")
    if hasattr(cfg, "total_steps"):  # a run counted in steps, logged and saved by the clock (V-trace, R2D2)
        fail_if(lambda v: v <= 0, cfg, ("log_every_s", "checkpoint_every_min"), "must be positive")
        fail_if(lambda v: v < 0, cfg, ("total_steps", "seconds"), "must be >= 0")
        if cfg.total_steps == 0 and cfg.seconds == 0:
            fail("total_steps", 0, "with seconds=0 the run would never end; set one budget")
    if cfg.learners < 1:
        fail("learners", cfg.learners, "must be >= 1 (data-parallel learner ranks)")
    if cfg.dist_timeout_s <= 0:
        fail("dist_timeout_s", cfg.dist_timeout_s, "must be positive")
    if not cfg.resume:
        check_writable("log_dir", cfg.log_dir, folder=True)
    if cfg.network.lstm_size < 0:  # what a family's network cannot be (R2D2's without an LSTM) is its own check
        fail("network.lstm_size", cfg.network.lstm_size, "must be >= 0 (0 = no LSTM core)")
    if cfg.video_every_min < 0:
        fail("video_every_min", cfg.video_every_min, "must be >= 0 (0 = no videos)")
    if cfg.track:
        try:
            importlib.import_module("wandb")  # an optional extra
        except ImportError:
            raise ConfigError("track=True: the wandb package is not installed; pip install 'seedlocal[wandb]'") \
                from None


def check_writable(field: str, value: str, folder: bool) -> None:
    """Fail unless a folder (``folder``) or a file could be created at ``value``: checked, not created, so a config
    refused later leaves nothing behind and hours of work are not lost to a bad path at the end."""
    path = Path(value).resolve()
    if path.exists() and path.is_dir() != folder:
        fail(field, value, "is a file, not a folder" if folder else "is a folder, not a file")
    base = next((p for p in (path.parents if not folder else [path, *path.parents]) if p.exists()), None)
    if base is None or not base.is_dir():
        fail(field, value, f"cannot be created ({base} is not a folder)")
    if not os.access(base, os.W_OK | os.X_OK):
        fail(field, value, f"cannot be written ({base} is not writable)")


def short_of_memory(need: float) -> int | None:
    """The memory available, when ``need`` bytes would take more than 80% of it (the rest is the OS's and the
    run's own Python); None when it fits or is unknown."""
    have = available_bytes()
    return have if have is not None and need > 0.8 * have else None


def check_network_fits(make, copies: int, fields: str, what: str):
    """Build ``make()`` on the meta device (shapes only, no memory) and refuse a network whose ``copies`` float32
    copies (``what``: weights, gradients, optimiser state ...) would not fit in memory, naming the ``fields``
    that size it; otherwise torch would fail inside the allocator with a traceback. Returns the meta network.
    The constructor's refusal (``encoder=...: why``) is raised named by the network option it came from."""
    import torch

    try:
        with torch.device("meta"):
            net = make()
    except ValueError as e:
        text = str(e)
        raise ConfigError(f"network.{text}" if text.startswith(NETWORK_OPTIONS) else text) from None
    n = sum(p.numel() for p in net.parameters())
    need = n * 4 * copies
    if (have := short_of_memory(need)) is not None:
        raise ConfigError(f"{fields}: the network has {n:,} parameters; {what} need {need / 1e9:,.1f} GB, "
                          f"{have / 1e9:.1f} GB are available: make it smaller")
    return net


def available_bytes() -> int | None:
    """Memory the kernel could give a new allocation now (MemAvailable), if known."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it: taskset, a container's or a batch
    system's cpuset), else all: what thread defaults and limits count, as ``os.cpu_count()`` counts every core."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_device(value: str, field: str = "device") -> torch.device:
    import torch  # here, not at the top: an actor host (seedlocal actors) reads this module and needs no torch

    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(value)
    except RuntimeError:
        fail(field, value, "not a torch device name (auto, cpu, cuda, cuda:N)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            fail(field, value, "CUDA is not available on this machine (torch sees no GPU)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            fail(field, value, f"only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        fail(field, value, "only cpu and cuda devices are supported")
    return dev


def validate_pipeline(p: PipelineConfig, prefix: str = "pipeline") -> None:
    """The pipeline's fields besides its sizes, which ``shape.pipeline_shape`` checks as it derives them."""
    fail_if(lambda v: v < 0, p, ("max_restarts", "batch_timeout_ms"), "must be >= 0", f"{prefix}.")
    fail_if(lambda v: not v > 0, p, ("inference_threads", "stall_s"), "must be positive", f"{prefix}.")
    fail_if(lambda v: v < 0, p, ("env_threads", "learner_threads"), "must be 0 (automatic) or positive", f"{prefix}.")
    if not (math.isfinite(p.restart_window_s) and p.restart_window_s >= 0):
        fail(f"{prefix}.restart_window_s", p.restart_window_s, "must be >= 0 and finite (0 = the whole run)")
    cores = usable_cores()
    fail_if(lambda v: v > THREADS_PER_CORE * cores, p, ("env_threads", "learner_threads", "inference_threads"),
            f"more than {THREADS_PER_CORE} per core of the {cores} this process may use: threads beyond the cores only "
            "wait for them (and thousands fail to start)", f"{prefix}.")
    device = resolve_device(p.device, f"{prefix}.device")
    if p.cuda_graphs and device.type != "cuda":
        fail(f"{prefix}.cuda_graphs", p.cuda_graphs, f"needs a CUDA device ({prefix}.device={p.device!r} is {device})")


def is_loopback(host: str) -> bool:
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_address(field: str, address: str, listen: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; a bare ``:PORT`` is loopback) as (host, port); a listening address may give 0."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        fail(field, address, "expected HOST:PORT, e.g. 127.0.0.1:50051 or :50051")
    if not (0 if listen else 1) <= int(port) < 65536:
        fail(field, address, "the port must be in 0..65535 (0: any free one)" if listen else
             "the port must be in 1..65535")
    if host.startswith("[") and host.endswith("]"):  # the brackets are the address's syntax, not the host's
        host = host[1:-1]
    return (host or "127.0.0.1"), int(port)


def bridge_token(token_file: str, field: str = "bridge.token_file") -> str:
    """The shared secret: from ``token_file`` if given, else $SEEDLOCAL_BRIDGE_TOKEN ('' if neither)."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            fail(field, token_file, f"cannot read it ({e.strerror})")
        if not token:
            fail(field, token_file, "the file is empty")
        return token
    return os.environ.get("SEEDLOCAL_BRIDGE_TOKEN", "").strip()


def validate_bridge(b: BridgeConfig) -> None:
    """The bridge's address, secrets and TLS files (its remote envs are sized by ``shape.pipeline_shape``)."""
    if not b.listen:
        for name in ("remote_envs", "token_file", "tls_cert", "tls_key", "insecure", "handshakes_per_peer"):
            if getattr(b, name) != getattr(BridgeConfig, name):  # would be silently ignored
                fail(f"bridge.{name}", getattr(b, name), "needs bridge.listen HOST:PORT for actor hosts to connect to")
        return
    host, _ = split_address("bridge.listen", b.listen, listen=True)
    token = bridge_token(b.token_file)  # read now: a bad path fails before the run starts
    if not is_loopback(host) and not b.tls_cert and not b.insecure:
        # The token never travels (both ends prove it by HMAC), but the steps, the actions and the env id that
        # actor hosts run do, and without TLS anyone on the path can read and alter them.
        fail("bridge.listen", b.listen, "beyond loopback without TLS the bridge can be read and altered on the way: "
             "give bridge.tls_cert and bridge.tls_key, or pass --bridge.insecure if this network is trusted")
    if not is_loopback(host) and not token:
        fail("bridge.listen", b.listen, "listening beyond loopback needs a token: set SEEDLOCAL_BRIDGE_TOKEN "
             "or bridge.token_file")
    if bool(b.tls_cert) != bool(b.tls_key):
        fail("bridge.tls_cert" if not b.tls_cert else "bridge.tls_key", b.tls_cert or b.tls_key,
             "TLS needs both bridge.tls_cert and bridge.tls_key")
    fail_if(lambda path: path and not os.path.isfile(path), b, ("tls_cert", "tls_key"), "no such file", "bridge.")
    if b.handshakes_per_peer < 1:
        fail("bridge.handshakes_per_peer", b.handshakes_per_peer, "must be >= 1: an actor host needs one")
