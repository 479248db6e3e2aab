"""Typed configuration, parsed by tyro; checked before any process starts.

- ``schema.py``: the dataclasses (``EnvConfig``, ``PipelineConfig``,
  ``BridgeConfig``, ``NetworkConfig``, and ``RunConfig``, the base of every
  family's run), their fields and one-line docs.
- ``checks.py``: the checks that refuse a value in one line naming the field
  (``validate_pipeline``, ``validate_bridge``, ``resolve_device`` ...), and
  the bridge's address and secret.
- ``resume.py``: a resumed run's config against the one its checkpoint saved.
- ``overrides.py``: keyword options (``seedlocal.train(..., network={...})``)
  checked against the dataclasses and applied to a config.

The schema is re-exported here for the Python API (``from seedlocal.config
import EnvConfig``); seedlocal's own modules import the submodule they use.
Nothing here imports torch at module import: an actor host (``seedlocal
actors``) reads it and needs none.
"""

from seedlocal.config.schema import BridgeConfig, EnvConfig, NetworkConfig, PipelineConfig, RunConfig, StepRunConfig

__all__ = ["BridgeConfig", "EnvConfig", "NetworkConfig", "PipelineConfig", "RunConfig", "StepRunConfig"]
