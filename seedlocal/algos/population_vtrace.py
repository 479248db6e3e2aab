"""V-trace for a population of learners in one batched update.

Reference: PureJaxRL (C. Lu et al., 2022, "Discovered Policy Optimisation", NeurIPS): P agents learn at once by ``vmap``
over their stacked parameters. Here ``torch.func``'s ``vmap(grad(...))`` over a ``MemberStack`` runs every member's
forward, V-trace targets and loss (``algos/vtrace.py``'s own functions, unchanged) and gradients in one call per
update: the same updates as P ``learner_step`` calls, member by member, on the same batches.

After the gradients each member is clipped to its own ``max_grad_norm`` and stepped by its own optimizer (torch's Adam
or RMSprop over its own parameters, which are rows of the stack), so its learning rate, schedule and optimizer state
stay its own and the arithmetic after the gradient is exactly ``learner_step``'s. The price is P small optimizer calls
per update (a few foreach kernels each); one Adam over the stacked tensors with a [P, 1, ...] learning rate would launch
fewer, but would be a second Adam to keep equal to torch's.

Each member has its own ``VTraceParams``, as P ``learner_step``s would; what shapes the update must agree
(``shared_params``): a vmapped loss cannot branch per member.

On a GPU this is the intended path, P small networks in about the kernels of one; unmeasured there
(``scripts/bench_population_learners.py --device cuda``). On the 2-core development CPU one update of P = 8 MinAtar
torsos took 1.4-4.0x less time than 8 ``learner_step`` calls (three runs of that script). Not here: ``learner_step``'s
``diagnose``, and (refused by the recipe) data-parallel ranks and LSTM cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from types import SimpleNamespace
from typing import Sequence

import torch
from torch import Tensor
from torch.func import grad, vmap

from seedlocal.algos.member_stack import MemberStack
from seedlocal.algos.vtrace import (VTraceParams, add_stats, as_rows, batch_targets, grad_clip, mean_rho,
                                    network_outputs, policy_dist, update_loss)
from seedlocal.arithmetic import autocast
from seedlocal.errors import fail
from seedlocal.spec import episode_starts

PER_MEMBER = ("discount", "entropy_cost", "baseline_cost", "clip")  # [P] tensors inside the vmapped loss
AFTER_GRADIENT = ("max_grad_norm", "learning_rate", "lr_decay", "optimizer", "optimizer_eps", "rmsprop_alpha")
NOT_IN_THE_UPDATE = ("init", "init_std", "separate_critic", "reward_scale", "sync")  # the network's, the trainer's


def shared_params(params: Sequence[VTraceParams]) -> VTraceParams:
    """The members' common hyperparameters: every field not in ``PER_MEMBER``, ``AFTER_GRADIENT`` or
    ``NOT_IN_THE_UPDATE`` must agree, and so must whether ``clip`` is on."""
    free = PER_MEMBER + AFTER_GRADIENT + NOT_IN_THE_UPDATE
    for name in [f.name for f in dataclasses.fields(VTraceParams) if f.name not in free]:
        values = [getattr(p, name) for p in params]
        if any(v != values[0] for v in values):
            fail(f"algo.{name}", values, "members of a batched update take one value (it shapes the update); "
                 f"they may differ in {', '.join(PER_MEMBER + AFTER_GRADIENT[:2])}")
    if len({p.clip > 0 for p in params}) > 1:
        fail("algo.clip", [p.clip for p in params], "members of a batched update clip all (> 0) or none (0)")
    return params[0]


def _member_costs(params: Sequence[VTraceParams], device: torch.device) -> dict[str, Tensor]:
    """The per-member loss hyperparameters as [P] float32 tensors (``clip`` only when on: 0 means the plain
    policy gradient, which ``impala_loss`` chooses by a Python test)."""
    names = [n for n in PER_MEMBER if n != "clip" or params[0].clip > 0]
    return {n: torch.tensor([float(getattr(p, n)) for p in params], dtype=torch.float32, device=device) for n in names}


def _stacked_batch(batches: Sequence[dict]) -> dict:
    """P members' batches (``learner_step``'s layout, one shape) as one with a leading member dimension; without
    ``core_state``, which is None for the feed-forward networks a stack batches."""
    out = {k: torch.stack([b[k] for b in batches]) for k in batches[0] if k not in ("obs", "core_state")}
    out["obs"] = {f: torch.stack([b["obs"][f] for b in batches]) for f in batches[0]["obs"]}
    return out


def _member(stack: MemberStack, tensors: dict[str, Tensor]) -> SimpleNamespace:
    """One member's network as ``network_outputs`` calls a model: its ``unroll`` on that member's tensors."""
    return SimpleNamespace(unroll=functools.partial(stack.call, tensors, "unroll"))


def _whole_batch_loss(params, buffers, batch, costs, *, stack, p, precision):
    """IMPALA's one update on a whole batch, targets from the differentiated forward (as ``learner_step``)."""
    member, pm = _member(stack, {**params, **buffers}), dataclasses.replace(p, **costs)
    logits, values = network_outputs(member, batch, episode_starts(batch["ignored"]), precision)
    targets = batch_targets(pm, batch, logits.detach(), values.detach())
    loss, stats = update_loss(pm, policy_dist(batch), logits[:-1], values[:-1], targets)  # row T only bootstraps
    return loss, {**stats, "mean_rho": mean_rho(targets)}


def _batch_targets(tensors, batch, costs, *, stack, p, precision):
    """V-trace targets over a whole batch, as rows (no gradient: they stay fixed for the batch's updates)."""
    member, pm = _member(stack, tensors), dataclasses.replace(p, **costs)
    targets = batch_targets(pm, batch, *network_outputs(member, batch, episode_starts(batch["ignored"]), precision))
    return as_rows(batch["obs"], targets)


def _minibatch_loss(params, buffers, obs, targets, idx, costs, *, stack, p, precision, dist):
    """One update's loss on the rows ``idx`` of a member's batch (as ``learner_step``'s minibatch passes)."""
    pm = dataclasses.replace(p, **costs)
    with autocast(idx.device, precision):
        logits, values = stack.call({**params, **buffers}, "forward", {k: v[idx] for k, v in obs.items()})
    return update_loss(pm, dist, logits.float(), values.float(), targets.select(idx))


class _Steps:
    """Each member's update from its row of the stacked gradients: its own gradient-norm clip and optimizer step,
    all under one hold of ``step_lock``; sums each update's statistics ([P] each) into ``totals``."""

    def __init__(self, stack: MemberStack, optimizers, params: Sequence[VTraceParams], step_lock, after_update):
        self.stack, self.optimizers = stack, list(optimizers)
        self.max_norms = [grad_clip(p) for p in params]
        self.step_lock, self.after_update = step_lock, after_update
        self.totals: dict[str, Tensor] = {}
        self.count = 0

    def __call__(self, grads: dict[str, Tensor], stats: dict[str, Tensor]) -> None:
        for i, member in enumerate(self.stack.members):
            for name, prm in member.named_parameters():
                prm.grad = grads[name][i]
        norms = [torch.nn.utils.clip_grad_norm_(m.parameters(), c) for m, c in zip(self.stack.members, self.max_norms)]
        with self.step_lock if self.step_lock is not None else contextlib.nullcontext():
            for opt in self.optimizers:
                opt.step()
            if self.after_update is not None:
                self.after_update()
        for member in self.stack.members:
            for prm in member.parameters():
                prm.grad = None  # views of this update's stacked gradients: not kept alive
        add_stats(self.totals, {**stats, "grad_norm": torch.stack(norms)})
        self.count += 1


def population_learner_step(stack: MemberStack, optimizers, batches: Sequence[dict],
                            params: Sequence[VTraceParams], step_lock=None, precision: str = "fp32",
                            after_update=None, shuffles: Sequence[torch.Generator] | None = None) -> dict:
    """Every member learns from its own batch (``batches[i]``, ``learner_step``'s layout, all of one shape) with
    its own hyperparameters (``params[i]``) and optimizer (``optimizers[i]``, over ``stack.members[i]``'s
    parameters): ``p.echo`` passes of ``p.minibatches`` updates, each one vmapped gradient call for all members.
    ``shuffles[i]``: member i's minibatch order (as ``learner_step``'s ``shuffle``; torch's default CPU
    generator if None). Returns ``learner_step``'s statistics as [P] device tensors, and ``updates``."""
    if not len(stack) == len(optimizers) == len(batches) == len(params):
        raise ValueError(f"{len(stack)} members need as many optimizers, batches and params")
    p = shared_params(params)
    batch = _stacked_batch(batches)
    costs = _member_costs(params, batch["ignored"].device)
    steps = _Steps(stack, optimizers, params, step_lock, after_update)
    kw = dict(stack=stack, p=p, precision=precision)
    if p.echo == 1 and p.minibatches == 1:
        grads, stats = vmap(grad(functools.partial(_whole_batch_loss, **kw), has_aux=True))(
            stack.params, stack.buffers, batch, costs)
        rho = stats.pop("mean_rho")
        steps(grads, stats)
    else:
        with torch.no_grad():
            obs, targets = vmap(functools.partial(_batch_targets, **kw))(stack.tensors(), batch, costs)
        _passes(steps, obs, targets, costs, shuffles, dict(kw, dist=policy_dist(batch)))
        rho = vmap(mean_rho)(targets)
    out = {k: v / steps.count for k, v in steps.totals.items()}
    out["mean_rho"], out["updates"] = rho, steps.count
    return out


def _passes(steps: _Steps, obs: dict, targets, costs: dict, shuffles, kw: dict) -> None:
    """``p.echo`` passes of ``p.minibatches`` updates over every member's rows, each member's rows in its own
    shuffled order (one ``randperm`` per member and pass, drawn as ``learner_step`` draws it)."""
    p, stack = kw["p"], kw["stack"]
    n = targets.valid.shape[1]
    gens = list(shuffles) if shuffles is not None else [None] * len(stack)
    loss_grad = vmap(grad(functools.partial(_minibatch_loss, **kw), has_aux=True))
    for _ in range(p.echo):
        orders = torch.stack([torch.randperm(n, generator=g) for g in gens])
        # tensor_split as learner_step's: every member's pieces of one size, so the members stay one batch.
        for idx in orders.to(targets.valid.device, non_blocking=True).tensor_split(p.minibatches, dim=1):
            steps(*loss_grad(stack.params, stack.buffers, obs, targets, idx, costs))
