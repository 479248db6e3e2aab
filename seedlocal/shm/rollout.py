"""Unroll storage: the one place a step's data lives, from env to learner.

The store holds ``num_buffers`` unrolls, each ``length`` rows (T steps and a bootstrap row) of a group's ``envs`` envs:

    obs[k]        observation the policy acted on at row t   (worker)
    action        action chosen at row t                     (inference loop)
    out[k]        policy outputs at row t: logits, value ... (inference loop)
    reward        reward of stepping ``action[t]``           (worker)
    terminated    the episode ended in a terminal state      (worker)
    truncated     the episode was cut by a time limit        (worker)
    ignored       ``action[t]`` was discarded by an auto-reset; reward[t] is 0 and obs[t+1] is the first of a new
                  episode. Learners must mask row t; no return is attributed to it.
    ep_return     episode return, valid where terminated|truncated (worker)
    ep_length     episode length in steps, same rows            (worker)
    core_state    recurrent state at row 0, one per env     (inference loop)
    policy_version  parameter version that acted at row t   (inference loop)
    unroll_group  the group that filled the unroll          (inference loop)
    unroll_epoch  that group's worker restarts when it began (inference loop)

Row ``length - 1`` holds only an observation: it is copied to row 0 of the group's next unroll, so consecutive
unrolls share it as in IMPALA.

Where episodes start is not stored: it follows from ``ignored``, by one rule (``seedlocal/spec.py``'s
``episode_starts``) that the inference loop, the learners and the replay all use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seedlocal.shm.arrays import ArraySpec, SharedArrays
from seedlocal.spec import TensorSpec

STEP_FIELDS = {"reward": "float32", "terminated": "bool", "truncated": "bool", "ignored": "bool",
               "ep_return": "float32", "ep_length": "int32"}


@dataclass(frozen=True)
class RolloutLayout:
    """Everything needed to allocate or attach the unroll store."""

    num_buffers: int
    length: int
    envs: int
    obs: dict[str, TensorSpec]
    action: TensorSpec
    outputs: dict[str, TensorSpec] = field(default_factory=dict)
    core_state: TensorSpec | None = None

    def specs(self) -> list[ArraySpec]:
        lead = (self.num_buffers, self.length, self.envs)
        specs = [ArraySpec(obs_key(k), lead + s.shape, s.dtype) for k, s in self.obs.items()]
        specs.append(ArraySpec("action", lead + self.action.shape, self.action.dtype))
        specs += [ArraySpec(name, lead, dt) for name, dt in STEP_FIELDS.items()]
        specs += [ArraySpec(f"out.{k}", lead + s.shape, s.dtype) for k, s in self.outputs.items()]
        if self.core_state is not None:
            shape = (self.num_buffers, self.envs) + self.core_state.shape
            specs.append(ArraySpec("core_state", shape, self.core_state.dtype))
        return specs + [ArraySpec("policy_version", (self.num_buffers, self.length), "int64"),
                        ArraySpec("unroll_group", (self.num_buffers,), "int32"),
                        ArraySpec("unroll_epoch", (self.num_buffers,), "int32")]

    def obs_keys(self) -> list[str]:
        return [obs_key(k) for k in self.obs]


def obs_key(k: str) -> str:
    return "obs" if k == "" else f"obs.{k}"


def obs_name(key: str) -> str:
    """``obs_key``'s inverse: the observation field a store key holds ("" for a lone one)."""
    return "" if key == "obs" else key[4:]


def create_store(layout: RolloutLayout) -> SharedArrays:
    store = SharedArrays.create(layout.specs(), "rollout")
    # A stale read stands out: NaN rewards, not plausible zeros.
    store["reward"].fill(np.nan)
    return store
