"""The machine a run is sized for: its usable cores and whether the run's device is a GPU.

A preset is a learning recipe; its sizes follow the machine (DESIGN.md, decision 9) by each family's sizing rule
(``Recipe.sizing``); what was measured and what was not is in docs/tuning.md ("Sized to the machine").
"""

from __future__ import annotations

from dataclasses import dataclass

from seedlocal.config import checks
from seedlocal.errors import ConfigError

ENVS_PER_CORE = 8
"""envs stepped per usable core on a GPU machine (issue 33's H200 run: 128 envs on 16 cores)"""
MAX_ENVS = 512
"""the most envs a sizing gives, whatever the cores (unmeasured beyond 128)"""


@dataclass(frozen=True)
class Machine:
    cores: int
    """CPU cores this process may run on"""
    accelerator: bool
    """whether the run's device (pipeline.device) is CUDA"""

    @classmethod
    def detect(cls, device: str) -> Machine:
        """This machine, for a run on ``device`` (pipeline.device). A device that cannot be had counts as none:
        validation names it."""
        try:
            cuda = checks.resolve_device(device).type == "cuda"
        except ConfigError:
            cuda = False
        return cls(cores=checks.usable_cores(), accelerator=cuda)

    def __str__(self) -> str:
        return f"{self.cores} cores, {'cuda' if self.accelerator else 'cpu'}"

    def gpu_envs(self) -> int:
        """Local envs for a GPU run: ``ENVS_PER_CORE`` per core, at most ``MAX_ENVS``; 0 without a GPU."""
        return min(MAX_ENVS, ENVS_PER_CORE * self.cores) if self.accelerator else 0

