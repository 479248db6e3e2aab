"""Typed configuration, parsed by tyro; checked before any process starts.

- ``schema.py``: the dataclasses (``RunConfig``, the base of every family's run, and its groups), their fields
  and one-line docs.
- ``checks.py``: the checks that refuse a value in one line naming the field, and the bridge's address and secret.
- ``request.py``: what the user asked for (``Request``); ``machine.py``: the machine a run is sized for.
- ``resume.py``: a resumed run's config against the one its checkpoint saved.
- ``overrides.py``: keyword options (``seedlocal.train(..., network={...})``) checked and applied to a config.

The schema is re-exported here for the Python API; seedlocal's own modules import the submodule they use.
Nothing here imports torch at module import: an actor host (``seedlocal actors``) reads it and needs none.
"""

from seedlocal.config.schema import BridgeConfig, EnvConfig, NetworkConfig, PipelineConfig, RunConfig, StepRunConfig

__all__ = ["BridgeConfig", "EnvConfig", "NetworkConfig", "PipelineConfig", "RunConfig", "StepRunConfig"]
