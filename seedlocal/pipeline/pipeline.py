"""One object that owns a run's data path: workers, shared memory, inference.

    with Pipeline(env_cfg, pipe_cfg, make_policy) as pipe:
        pipe.loop.run(seconds=10)

Leaving the ``with`` block, by return, exception or Ctrl-C, stops the workers
and unlinks the shared memory.
"""

from __future__ import annotations

from typing import Callable

import torch

from seedlocal.config import (BridgeConfig, EnvConfig, PipelineConfig, resolve_device, threads_per_group,
                              validate_bridge, validate_env, validate_pipeline)
from seedlocal.pipeline.actors import GROUPS_PER_WORKER, ActorPool
from seedlocal.pipeline.envs import EnvSpec
from seedlocal.pipeline.inference import InferenceLoop
from seedlocal.shm.rollout import RolloutLayout


class Pipeline:
    def __init__(
        self,
        env: EnvConfig,
        pipe: PipelineConfig,
        make_policy: Callable[[EnvSpec, torch.device], object],
        consume: bool = False,
        spec: EnvSpec | None = None,
        bridge: BridgeConfig | None = None,
    ):
        remote = bridge.remote_envs if bridge is not None and bridge.listen else 0
        validate_pipeline(pipe, remote_envs=remote)
        if bridge is not None:
            validate_bridge(bridge, pipe)
        self.spec = spec or validate_env(env)
        self.device = resolve_device(pipe.device)
        self.policy = make_policy(self.spec, self.device)
        groups = pipe.num_workers * GROUPS_PER_WORKER + remote // (pipe.envs_per_worker // GROUPS_PER_WORKER)
        self.layout = RolloutLayout(
            num_buffers=pipe.num_buffers or 3 * groups,
            length=pipe.unroll_length + 1,
            envs=pipe.envs_per_worker // GROUPS_PER_WORKER,
            obs=self.spec.obs,
            action=self.spec.action,
            outputs=self.policy.outputs,
            core_state=self.policy.core_state,
        )
        self.pool = ActorPool(
            self.spec, self.layout, pipe.num_workers, threads_per_group(pipe), env.seed, pipe.max_restarts,
            bridge=bridge,
        )
        try:
            self.loop = InferenceLoop(
                self.pool, self.policy, self.device,
                min_batch_envs=pipe.min_batch_envs or (pipe.num_workers * pipe.envs_per_worker + remote) // 2,
                batch_timeout_s=pipe.batch_timeout_ms / 1000.0,
                consume=consume,
                threads=pipe.inference_threads,
            )
            self.loop.start()
        except BaseException:
            self.pool.close()
            raise

    @property
    def store(self):
        return self.pool.store

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
