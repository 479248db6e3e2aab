"""One object that owns a run's data path: workers, shared memory, inference.

    spec, shape = prepare_pipeline(env_cfg, pipe_cfg)   # seedlocal/prepare.py: checked, described, shaped
    with Pipeline(env_cfg, pipe_cfg, make_policy, spec, shape) as pipe:
        pipe.loop.run(seconds=10)

Its sizes are a ``PipelineShape`` (``seedlocal/shape.py``), made by preparation. Leaving the ``with`` block, by
return, exception or Ctrl-C, stops the workers and unlinks the shared memory.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable

import torch

from seedlocal.config.schema import BridgeConfig, EnvConfig, PipelineConfig
from seedlocal.config.checks import resolve_device, short_of_memory
from seedlocal.errors import ConfigError
from seedlocal.pipeline.actors import ActorPool
from seedlocal.envs.make import SEED_END
from seedlocal.spec import EnvSpec
from seedlocal.pipeline.inference import InferenceLoop
from seedlocal.shape import PipelineShape
from seedlocal.shm.rollout import RolloutLayout


WORKER_BYTES = 100e6  # one env worker process (numpy + envpool): CartPole's measured 95 MB proportional set size
SEED_LIMIT = SEED_END - 1  # envpool (and most envs) take int32 seeds


def _check_fits(env: EnvConfig, spec: EnvSpec, shape: PipelineShape, layout: RolloutLayout) -> None:
    """Refuse sizes this machine cannot hold, before a worker starts (a thousand workers, or a store of billions of
    rows, would end in the OOM killer minutes later, with no message)."""
    store = sum(s.nbytes for s in layout.specs())
    need = store + shape.num_workers * WORKER_BYTES
    if (have := short_of_memory(need)) is not None:
        raise ConfigError(
            f"pipeline: needs {need / 1e9:.1f} GB of memory, {have / 1e9:.1f} GB are available: "
            f"{shape.num_workers} env workers (~{WORKER_BYTES / 1e6:.0f} MB each) and an unroll store of "
            f"{layout.num_buffers:,d} unrolls x {layout.length:,d} steps x {layout.envs} envs ({store / 1e9:.1f} GB); "
            "lower pipeline.num_workers, pipeline.num_buffers (V-trace: algo.batch_size), pipeline.unroll_length "
            "or bridge.remote_envs")
    # Seeds come in blocks per start and rank, wrapping below int32's end (actors.local_seed); envpool asserts they
    # fit (Gymnasium envs take any size), so one start of every env of every rank must.
    used = shape.ranks * shape.num_envs
    if spec.backend == "envpool" and env.seed + used - 1 > SEED_LIMIT:
        raise ConfigError(f"env.seed={env.seed}: envpool seeds are int32, and this run uses {used:,d} seeds from "
                          f"it (one per env): at most {SEED_LIMIT - used + 1:,d}")


class Pipeline(AbstractContextManager):
    def __init__(self, env: EnvConfig, pipe: PipelineConfig, make_policy: Callable[[EnvSpec, torch.device], object],
                 spec: EnvSpec, shape: PipelineShape, consume: bool = False, bridge: BridgeConfig | None = None,
                 errors_file: str = ""):
        """``spec`` and ``shape``: preparation's, from this config (the module docstring; nothing is checked or
        derived again here). ``errors_file``: where env workers' tracebacks go (``ActorPool``)."""
        self.shape, self.spec = shape, spec
        self.device = resolve_device(pipe.device)
        self.policy = make_policy(self.spec, self.device)
        self.layout = RolloutLayout(
            num_buffers=shape.num_buffers, length=shape.unroll_length + 1, envs=shape.envs_per_group, obs=spec.obs,
            action=spec.action, outputs=self.policy.outputs, core_state=self.policy.core_state)
        _check_fits(env, self.spec, shape, self.layout)
        self.pool = ActorPool(self.spec, self.layout, shape, env.seed, pipe.max_restarts, bridge=bridge,
                              restart_window_s=pipe.restart_window_s, errors_file=errors_file)
        try:
            self.loop = InferenceLoop(self.pool, self.policy, self.device, pipe.batch_timeout_ms / 1000.0,
                                      consume=consume, threads=pipe.inference_threads)
            self.loop.start()
        except BaseException:
            self.pool.close()
            raise

    @property
    def store(self):
        return self.pool.store

    def __exit__(self, *exc) -> None:
        self.pool.close()
