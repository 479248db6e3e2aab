"""Typed configuration, parsed by tyro and checked before any process starts (its modules: docs/architecture.md's
``config/`` row). The schema is re-exported here for the Python API; seedlocal's own modules import the submodule
they use. Nothing here imports torch at module import: an actor host (``seedlocal actors``) reads it.
"""

from seedlocal.config.schema import BridgeConfig, EnvConfig, NetworkConfig, PipelineConfig, RunConfig, StepRunConfig

__all__ = ["BridgeConfig", "EnvConfig", "NetworkConfig", "PipelineConfig", "RunConfig", "StepRunConfig"]
