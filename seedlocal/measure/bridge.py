"""``seedlocal bench --bridge``: what the gRPC bridge costs, in one run.

Two set-ups with the same envs and a random policy, alternating for ``--rounds`` rounds so that drift on a shared
machine hits both alike: the usual pipeline, ``W`` workers of ``E`` envs on this host, and a learner with ``W x E``
remote envs only, on loopback, stepped by one ``seedlocal actors`` process (a second "host" on the same cores, so
this is a floor). ``ratio_bridge`` = bridge steps/s / local steps/s; MB/s counts both directions. The keys and
``--bridge-delay-ms``: docs/multihost.md, "What to watch".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from seedlocal.config.schema import BridgeConfig, EnvConfig, PipelineConfig
from seedlocal.pipeline.pipeline import Pipeline
from seedlocal.policies import RandomPolicy
from seedlocal.prepare import prepare_pipeline


def _measure(pipe, seconds: float) -> tuple[float, float]:
    """(steps/s, bridge bytes/s) of ``pipe``'s loop over ``seconds``."""
    loop, c = pipe.loop, pipe.pool.control
    loop.run(0.3)  # it slept while the other set-up ran
    s0, b0, t0 = loop.stats.env_steps, int(c["host_bytes"].sum()), time.perf_counter()
    loop.run(seconds)
    dt = time.perf_counter() - t0
    return (loop.stats.env_steps - s0) / dt, (int(c["host_bytes"].sum()) - b0) / dt


def _actor_host(cfg, env: EnvConfig, port: int, workers: int, envs: int) -> subprocess.Popen:
    """One ``seedlocal actors`` process, on loopback, for the remote pipeline's envs."""
    return subprocess.Popen(
        [sys.executable, "-m", "seedlocal", "actors", "--connect", f"127.0.0.1:{port}",
         "--num-workers", str(workers), "--envs-per-worker", str(envs), "--env-threads", str(cfg.env_threads),
         "--no-progress", "--retry-s", "10", "--delay-ms", str(cfg.bridge_delay_ms),
         # The host it starts is this user's own: it may import the module of a module:EnvId id.
         *(["--allow-module", env.id.partition(":")[0]] if ":" in env.id else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def run_bridge_bench(cfg, workers: int, envs: int) -> dict:
    # The same envs stepped by local workers, and by one actor host through the bridge.
    env = EnvConfig(id=cfg.env, backend="null" if cfg.transport_only else "auto", frame_stack=cfg.frame_stack)
    pipe_cfg = PipelineConfig(num_workers=workers, envs_per_worker=envs, env_threads=cfg.env_threads,
                              device=cfg.device, min_batch_envs=cfg.min_batch_envs,
                              batch_timeout_ms=cfg.batch_timeout_ms, unroll_length=32)
    remote_cfg = PipelineConfig(**{**pipe_cfg.__dict__, "num_workers": 0})
    bridge = BridgeConfig(listen="127.0.0.1:0", remote_envs=workers * envs)
    spec, shape = prepare_pipeline(env, pipe_cfg)
    _, remote_shape = prepare_pipeline(env, remote_cfg, bridge)
    rounds = []  # (local steps/s, bridge steps/s, bridge bytes/s) per round
    with Pipeline(env, pipe_cfg, RandomPolicy, spec, shape) as local, \
            Pipeline(env, remote_cfg, RandomPolicy, spec, remote_shape, bridge=bridge) as remote:
        host = _actor_host(cfg, env, remote.pool.bridge_port, workers, envs)
        try:
            end = time.monotonic() + 60
            while remote.pool.control["group_connected"].sum() < remote.pool.num_remote_groups:
                if host.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"the actor host did not connect: {host.communicate()[0]}")
                time.sleep(0.1)
            local.loop.run(cfg.warmup)
            remote.loop.run(cfg.warmup)
            for _ in range(cfg.rounds):
                rounds.append((_measure(local, cfg.seconds)[0], *_measure(remote, cfg.seconds)))
            rtt = remote.pool.control["host_rtt_ms"][0].copy()
        finally:
            host.send_signal(2)  # Ctrl-C: a clean disconnect that unlinks the host's ring
            try:
                host.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(host.pid, 9)
                host.wait()
    local_rates, bridge_rates, rates_bytes = zip(*rounds)
    ratios = [b / max(1e-9, a) for a, b in zip(local_rates, bridge_rates)]
    mbs = [b / 1e6 for b in rates_bytes]
    prefix = "transport_" if cfg.transport_only else ""
    result = {"env": cfg.env, "transport_only": cfg.transport_only, "delay_ms": cfg.bridge_delay_ms,
              "num_workers": workers, "envs_per_worker": envs, "cpu_count": os.cpu_count(),
              f"{prefix}local_steps_per_s": float(np.median(local_rates)),
              f"{prefix}bridge_steps_per_s": float(np.median(bridge_rates)),
              "ratio_bridge": float(np.median(ratios)), "ratios": ratios,
              "bridge_mb_per_s": float(np.median(mbs)), "rtt_ms_p50": float(rtt[0]), "rtt_ms_p99": float(rtt[1])}
    print(f"\n{cfg.env}{' (null env: transport only)' if cfg.transport_only else ''}: {workers} worker(s) x "
          f"{envs} envs, local vs behind the bridge on loopback, {cfg.seconds:g}s x {cfg.rounds} rounds")
    print(f"  local   {result[prefix + 'local_steps_per_s']:12,.0f} steps/s")
    print(f"  bridge  {result[prefix + 'bridge_steps_per_s']:12,.0f} steps/s  ratio {result['ratio_bridge']:.3f}  "
          f"{result['bridge_mb_per_s']:.1f} MB/s  round trip p50 {rtt[0]:.2f} ms, p99 {rtt[1]:.2f} ms")
    return result
