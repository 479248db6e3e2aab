"""Typed configuration, parsed by tyro; checked before any process starts. Its modules (the schema, the checks,
the request, the machine, a resume's config, keyword overrides) are listed in docs/architecture.md's ``config/`` row.

The schema is re-exported here for the Python API; seedlocal's own modules import the submodule they use.
Nothing here imports torch at module import: an actor host (``seedlocal actors``) reads it and needs none.
"""

from seedlocal.config.schema import BridgeConfig, EnvConfig, NetworkConfig, PipelineConfig, RunConfig, StepRunConfig

__all__ = ["BridgeConfig", "EnvConfig", "NetworkConfig", "PipelineConfig", "RunConfig", "StepRunConfig"]
