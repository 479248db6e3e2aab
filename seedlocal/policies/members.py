"""One forward for a population of learners: every member's env rows in one batched call over the members' stacked
weights (issue 46; the design's "a population is a batch dimension").

Reference: PureJaxRL's ``vmap`` over agents' stacked parameters (cited in ``algos/member_stack.py``), here
``torch.func.vmap`` over ``functional_call`` on a ``MemberStack``.

Why not ``PopulationForward``, neuroevolution's batched forward: it keeps a network per *env slot*, each row through
its own copy (a matrix-vector product per row), because a neuroevolution member plays one episode on one slot and
moves on. A learner owns whole env groups for the run and its weights change at every update: per-slot copies would
be refreshed on every slot after every update. Here each member's rows go through its weights together (a matrix
product per member), read in place from the stack the learners write, with ``ActorCritic.forward``'s two heads.

Rows arrive in any order (whole env groups: usually contiguous runs) and are padded per member for one vmapped call
(``row_layout``). On the 2-core development CPU, 8 MinAtar members' 64 rows each took 1.2-3.0x less time in one call
than in 8 (``scripts/bench_population_learners.py``); on a GPU, where P calls are P rounds of kernel launches, it is
unmeasured. A batch of one member's rows (usually one group) goes through that member's own network instead: there
vmap's fixed cost made the call about 3x a plain forward (docs/populations.md, "Remeasured with the box to itself").
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from seedlocal.algos.member_stack import MemberStack
from seedlocal.arithmetic import autocast
from seedlocal.normalize import occurrence
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.policy import SERVE
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.spec import EnvSpec


def row_layout(members: np.ndarray, num_members: int) -> tuple[np.ndarray, int, np.ndarray | None, np.ndarray | None]:
    """How rows owned by ``members`` [n] go into one padded batch: (the members present, ascending; rows per
    member R; for each padded position, member-major, the row it reads; for each row, its padded position).
    The last two are None when the rows already are in that order."""
    members = np.asarray(members, dtype=np.int64)
    if members.ndim != 1 or not len(members) or members.min() < 0 or members.max() >= num_members:
        raise ValueError(f"members: one index in [0, {num_members}) per row, got {members!r}")
    counts = np.bincount(members, minlength=num_members)
    present = np.flatnonzero(counts)
    per = int(counts.max())
    slot = np.cumsum(counts > 0) - 1  # a present member's place among the present ones
    pos = slot[members] * per + occurrence(members)
    if len(members) == len(present) * per and np.array_equal(pos, np.arange(len(members))):
        return present, per, None, None
    src = np.full(len(present) * per, -1, np.int64)
    src[pos] = np.arange(len(members))
    src = np.where(src < 0, np.repeat(src[::per], per), src)  # a padded position rereads its member's first row
    return present, per, src, pos


class MembersForward:
    """Policy parameters (logits, or a Gaussian's mean and log-std) [n, ...] and values [n] for rows of many
    members' envs: row i from member ``members[i]``'s network on ``obs`` row i, in one call. Reads the stack's
    tensors as they are: call it under the learners' weight lock when they may be mid-update. Feed-forward
    networks only: torch.func has no vmap rule for an LSTM cell (the recipe refuses a population with one)."""

    def __init__(self, stack: MemberStack, precision: str = "fp32"):
        self.stack, self.precision = stack, precision

    @torch.inference_mode()
    def __call__(self, members: np.ndarray, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        present, per, src, pos = row_layout(members, len(self.stack))
        if len(present) == 1:  # one member's rows (a batch of one group): its own network, vmap costs 3x that
            with autocast(obs[next(iter(obs))].device, self.precision, cache=False):
                params, values = self.stack.members[int(present[0])](obs)
            return params.float(), values.float()
        tensors = self.stack.tensors()
        device = next(iter(tensors.values())).device
        if len(present) < len(self.stack):
            which = torch.from_numpy(present).to(device)
            tensors = {k: v.index_select(0, which) for k, v in tensors.items()}
        src_t = None if src is None else torch.from_numpy(src).to(device)
        # Rows [n, ...] -> [members present, per, ...], gathered by ``src`` unless already in order.
        padded = {k: (v if src_t is None else v.index_select(0, src_t)).reshape((-1, per) + tuple(v.shape[1:]))
                  for k, v in obs.items()}
        with autocast(device, self.precision, cache=False):
            params, values = vmap(lambda t, o: self.stack.call(t, "forward", o))(tensors, padded)
        params, values = params.float().flatten(0, 1), values.float().flatten(0, 1)  # [members present * per, ...]
        if pos is None:
            return params, values
        pos_t = torch.from_numpy(pos).to(device)  # back into the caller's order
        return params.index_select(0, pos_t), values.index_select(0, pos_t)


class MembersPolicy(ModelPolicy):
    """A population of learners acting (``trainers/population.py``; docs/populations.md): member m owns the env
    slots ``m * envs_per_member`` .. ``(m + 1) * envs_per_member - 1``; its rows go through its own network in one
    ``MembersForward`` call and its actions come from its own ``generators[m]``, whatever rows share the batch.
    With ``episodes`` (one ``EpisodeLog`` per member) it ``plans``: each ready group's episode ends go to its
    member's log (the loop's own log pools every member's episodes)."""

    def __init__(self, stack: MemberStack, spec: EnvSpec, envs_per_member: int, generators: list,
                 lock: WeightLock | None = None, precision: str = "fp32", frames: int = 1, episodes=None):
        super().__init__(stack.members[0], spec, lock, precision=precision, stack=frames)
        self.forward = MembersForward(stack, precision)
        self.envs_per_member, self.generators = envs_per_member, generators
        self.episodes, self.plans = episodes, episodes is not None

    def plan(self, groups, first, done, ep_return, ep_length=None) -> np.ndarray:
        if done.any():
            members = self.members_of(np.asarray(groups) * done.shape[1])  # a group's first env's member
            for m in np.unique(members[done.any(axis=1)]).tolist():
                ended = done & (members == m)[:, None]
                self.episodes[m].add(ep_return[ended], ep_length[ended] if ep_length is not None
                                     else np.zeros(int(ended.sum()), np.int64))
        return np.full(len(groups), SERVE, np.int8)

    def members_of(self, env_ids: np.ndarray) -> np.ndarray:
        return np.asarray(env_ids, dtype=np.int64) // self.envs_per_member

    def _forward(self, obs, core, env_ids: np.ndarray):
        return (*self.forward(self.members_of(env_ids), obs), None)  # no recurrent core

    def _actions(self, params, env_ids: np.ndarray):
        members = self.members_of(env_ids)
        present, counts = np.unique(members, return_counts=True)
        if len(present) == 1:
            return self.dist.sample(params, self.generators[int(present[0])])
        # each member's rows in ascending order, all in one host-to-device copy; drawn back into their rows
        order = torch.from_numpy(np.argsort(members, kind="stable")).to(params.device)
        drawn = torch.cat([self.dist.sample(params.index_select(0, r), self.generators[m])
                           for r, m in zip(order.split(counts.tolist()), present.tolist())])
        return torch.empty_like(drawn).index_copy_(0, order, drawn)
