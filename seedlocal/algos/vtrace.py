"""V-trace off-policy correction and the IMPALA actor-critic loss.

Reference: L. Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", arXiv:1802.01561 (section 4).

Conventions (all inputs are time-major):
  * Shapes are [T, B]; logits are [T, B, A]; ``bootstrap_value`` is [B] = V(x_T).
  * ``discounts[t] = gamma * (1 - terminated_t)``. A time-limit truncation keeps gamma, so the step bootstraps from the
    value of the next observation.
  * ``valid[t]`` is False for a row whose action was ignored by an environment auto-reset (the step after an episode
    ended: reward 0, the next observation starts a new episode). An invalid row contributes nothing: its TD error is 0,
    vs_t = V(x_t) exactly, and the correction does not propagate through it. The row before it (the end of the episode)
    therefore sees vs - V = 0 there; if it was truncated it bootstraps from values[t] = V(final observation).
  * rho_t = min(rho_bar, pi/mu), c_t = lam * min(c_bar, pi/mu). delta_t = rho_t * (r_t + discount_t * V(x_{t+1}) -
    V(x_t)). vs_t - V(x_t) = delta_t + discount_t * c_t * (vs_{t+1} - V(x_{t+1})), with vs_T = bootstrap_value.
  * advantages_t = r_t + discount_t * vs_{t+1} - V(x_t), and pg_advantages_t = rho_t * advantages_t, where the
    policy-gradient importance weight is clipped by the same ``rho_bar`` (as in the paper).
  * Everything returned by ``vtrace`` is detached (computed under no_grad).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from seedlocal.algos.distributions import Categorical, DiagGaussian
from seedlocal.arithmetic import autocast
from seedlocal.spec import episode_starts


class VTraceReturns(NamedTuple):
    vs: Tensor  # [T, B] v-trace value targets
    pg_advantages: Tensor  # [T, B] advantages for the policy gradient, weighted by rhos
    rhos: Tensor  # [T, B] clipped importance weights min(rho_bar, pi/mu)
    advantages: Tensor  # [T, B] the same advantages before the rho weighting


def masked(x: Tensor, valid: Tensor) -> Tensor:
    """``x`` where ``valid``, 0 elsewhere: the one masking rule of this module. A select, never a multiply: NaN or inf
    in a masked row (a stale store row, a diverged value) times 0 is still NaN and would leak into every target the
    recursion reaches."""
    return torch.where(valid, x, torch.zeros_like(x))


def masked_mean(x: Tensor, valid: Tensor, n: Tensor | None = None) -> Tensor:
    """The mean of ``x`` over its ``valid`` rows: they neither contribute nor dilute (0 with none). ``n``: their
    count (at least 1), where a caller takes several means over the same rows."""
    return masked(x, valid).sum() / (valid.sum().clamp(min=1) if n is None else n)


@torch.no_grad()
def vtrace(behaviour_log_probs: Tensor, target_log_probs: Tensor, rewards: Tensor, discounts: Tensor, values: Tensor,
           bootstrap_value: Tensor, valid: Tensor, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages (see module docstring)."""
    ratios = torch.exp(target_log_probs - behaviour_log_probs)
    rhos = torch.clamp(ratios, max=rho_bar)
    cs = lam * torch.clamp(ratios, max=c_bar)

    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # V(x_{t+1})
    deltas = masked(rhos * (rewards + discounts * next_values - values), valid)
    # Backward recursion on vs_t - V(x_t); masking each step forces vs = V on invalid rows and cuts the trace.
    corrections = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)  # vs_T - V(x_T) = 0
    for t in reversed(range(values.shape[0])):
        acc = masked(deltas[t] + discounts[t] * cs[t] * acc, valid[t])
        corrections[t] = acc
    vs = values + corrections

    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    advantages = masked(rewards + discounts * next_vs - values, valid)
    return VTraceReturns(vs=vs, pg_advantages=masked(rhos * advantages, valid), rhos=rhos, advantages=advantages)


def impala_loss(target_params: Tensor, actions: Tensor, values: Tensor, vtrace_returns: VTraceReturns, valid: Tensor,
                baseline_cost: float = 0.5, entropy_cost: float = 0.01, behaviour_log_probs: Tensor | None = None,
                clip: float = 0.0, normalize_advantages: bool = False, dist=Categorical,
                proximal_log_probs: Tensor | None = None, moments=None) -> tuple[Tensor, dict[str, Tensor]]:
    """IMPALA loss: policy gradient + baseline regression - entropy bonus.

    Means are over valid rows only: invalid (auto-reset) rows neither contribute nor dilute. ``values`` carries the
    baseline's graph, ``target_params`` (the policy's parameters under ``dist``) the policy's.

    With ``clip`` > 0 the policy term is PPO's clipped surrogate (Schulman et al. 2017) on r = pi/mu with the V-trace
    advantages (as in APPO), and ``clip_fraction`` the share of valid rows whose r lies outside the clip range. It
    bounds how far one batch can pull the policy, which makes reusing a batch (``echo``) safe; IMPALA's rho-weighted
    gradient keeps pushing however far the policy already moved. With ``proximal_log_probs`` (the learner's policy at
    the batch's start) it is decoupled PPO (Hilton et al. 2021): r = pi/pi_prox, each row weighted by V-trace's
    min(rho_bar, pi_prox/mu). With no lag that is PPO's; with actors running ahead (algo.sync off) a stale row no longer
    starts outside the clip range, and the truncated weight corrects for mu. ``clip`` may be a tensor (a population's
    clips, one per member under vmap, which cannot branch on a member's value: the members of a batched update take the
    surrogate all or none, ``algos/population_vtrace.py``). ``normalize_advantages`` rescales A to zero mean, unit
    variance over the valid rows (or by ``moments(adv, valid)``, which data-parallel ranks take over every rank's rows):
    the policy step is then independent of scale.
    """
    clipped = isinstance(clip, Tensor) or clip > 0
    action_log_probs = dist.log_prob(target_params, actions)
    # V-trace's rho-weighted advantages, or with ``clip`` the plain ones (the surrogate's ratio weights them)
    adv = (vtrace_returns.advantages if clipped else vtrace_returns.pg_advantages).detach()
    n = valid.sum().clamp(min=1)  # the valid rows every mean below is over
    if normalize_advantages:
        if moments is not None:
            mean, std = moments(adv, valid)
        else:
            mean = masked_mean(adv, valid, n)
            std = masked_mean((adv - mean) ** 2, valid, n).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    stats = {}
    if clipped:
        decoupled = proximal_log_probs is not None
        ratio = torch.exp(action_log_probs - (proximal_log_probs if decoupled else behaviour_log_probs))
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
        policy_loss = -masked_mean(vtrace_returns.rhos * surrogate if decoupled else surrogate, valid, n)
        stats["clip_fraction"] = masked_mean(((ratio - 1.0).abs() > clip).to(values.dtype), valid, n).detach()
    else:
        policy_loss = -masked_mean(action_log_probs * adv, valid, n)
    baseline_loss = 0.5 * masked_mean((vtrace_returns.vs.detach() - values) ** 2, valid, n)
    entropy = masked_mean(dist.entropy(target_params), valid, n)
    total_loss = policy_loss + baseline_cost * baseline_loss - entropy_cost * entropy
    stats.update(policy_loss=policy_loss.detach(), baseline_loss=baseline_loss.detach(), entropy=entropy.detach(),
                 total_loss=total_loss.detach())
    return total_loss, stats


# -- the learner step -----------------------------------------------------------


@dataclass
class VTraceParams:
    """IMPALA learner hyperparameters (defaults: CartPole; see presets for Atari)."""

    batch_size: int = 4
    """unrolls (T steps of one env each) per batch; a multiple of the envs per group"""
    learning_rate: float = 1e-3
    """initial learning rate"""
    lr_decay: bool = True
    """decay the learning rate linearly to 0 over the step budget"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam, or rmsprop as in the IMPALA paper"""
    rmsprop_alpha: float = 0.99
    """RMSProp smoothing constant"""
    optimizer_eps: float = 1e-5
    """epsilon of Adam / RMSProp (IMPALA used 0.01 with RMSProp)"""
    discount: float = 0.99
    """gamma"""
    entropy_cost: float = 0.001
    """weight of the entropy bonus"""
    baseline_cost: float = 0.5
    """weight of the value loss"""
    reward_clip: float = 0.0
    """clip rewards to [-x, x] for learning (0 = off; 1 for Atari); logged returns stay raw"""
    max_grad_norm: float = 40.0
    """clip the global gradient norm (0 = off)"""
    rho_bar: float = 1.0
    """V-trace truncation of importance weights for values and policy gradient"""
    c_bar: float = 1.0
    """V-trace truncation of the trace coefficients"""
    lam: float = 1.0
    """V-trace lambda"""
    separate_critic: bool = True
    """give the value its own MLP; applies to MLP torsos without LSTM (image torsos are shared)"""
    init: Literal["torch", "orthogonal"] = "torch"
    """weight init: torch's default, or orthogonal (gain sqrt 2; 0.01 policy head, 1 value head)"""
    reward_scale: bool = False
    """divide the learner's rewards by the running std of each env's discounted return, clipped to +-10
    (logged returns stay raw)"""
    init_std: float = 0.5
    """a Gaussian policy's initial standard deviation (Box actions; "What Matters in On-Policy RL": 0.5)"""
    echo: int = 1
    """passes over each batch (data echoing, Choi et al. 2019; PPO's epochs): the replay ratio, how many times
    each step is learned from"""
    minibatches: int = 1
    """updates per pass: each pass splits the batch into this many shuffled minibatches (of rows; of whole
    unrolls with an LSTM), their sizes within one of each other"""
    clip: float = 0.0
    """PPO's clipped surrogate on pi/mu with V-trace advantages (0 = IMPALA's policy gradient); keeps echo > 1 safe"""
    proximal: Literal["behaviour", "batch"] = "behaviour"
    """what the clip keeps each update near: behaviour = the actors' policy mu (PPO, APPO); batch = the learner's
    own at the batch's start, each row weighted by V-trace's min(rho_bar, pi_start/mu) (decoupled PPO; for actors
    that run ahead of the learner, algo.sync off)"""
    normalize_advantages: bool = False
    """rescale the policy-gradient advantages of each batch to zero mean and unit variance"""
    sync: Literal["on", "off", "auto"] = "on"
    """on: actors pause while the learner works on a batch (PPO's rhythm: no policy lag at a batch's first pass;
    the presets' rhythm, but MinAtar's on a GPU); off: they fill the next batch meanwhile (more throughput on a
    GPU, ~23 updates of policy lag; learned faster per frame on MinAtar, docs/tuning.md); auto: the same as on
    (the name older runs saved)"""
    precision: Literal["auto", "fp32", "tf32", "bf16"] = "auto"
    """network arithmetic: auto = tf32 on CUDA; on a CPU bf16 for CNN torsos where it has native bf16
    (AMX/AVX512-BF16), else fp32"""


def make_optimizer(params, p: VTraceParams) -> torch.optim.Optimizer:
    if p.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=p.learning_rate, alpha=p.rmsprop_alpha, eps=p.optimizer_eps)
    return torch.optim.Adam(params, lr=p.learning_rate, eps=p.optimizer_eps)


class _Targets(NamedTuple):
    """What the loss needs of each row besides the network's outputs: [T, B] each. ``proximal_log_probs``: log
    pi(a) under the weights the targets were computed with (the learner's at the batch's start)."""

    actions: Tensor
    behaviour_log_probs: Tensor
    valid: Tensor
    returns: VTraceReturns
    proximal_log_probs: Tensor

    def map(self, fn) -> "_Targets":
        return _Targets(fn(self.actions), fn(self.behaviour_log_probs), fn(self.valid),
                        VTraceReturns(*map(fn, self.returns)), fn(self.proximal_log_probs))

    def select(self, index) -> "_Targets":
        return self.map(lambda x: x[index])


def network_outputs(model, batch: dict, first: Tensor, precision: str, cols=None) -> tuple[Tensor, Tensor]:
    """Logits [L, B, A] and values [L, B] of whole unrolls (or of columns ``cols``)."""
    obs, core = batch["obs"], batch.get("core_state")  # none in a population's stacked batch
    if cols is not None:
        obs = {k: v[:, cols] for k, v in obs.items()}
        core, first = (None if core is None else core[cols]), first[:, cols]
    with autocast(first.device, precision):
        logits, values = model.unroll(obs, core, first)
    return logits.float(), values.float()


def policy_dist(batch: dict):
    """The action distribution a batch's behaviour parameters belong to."""
    return DiagGaussian if "behaviour_gaussian" in batch else Categorical


def batch_targets(p: VTraceParams, batch: dict, params: Tensor, values: Tensor) -> _Targets:
    """V-trace targets for every row of a batch from the network's detached outputs [L, B]."""
    T = values.shape[0] - 1
    actions = batch["action"][:T]
    rewards = batch["reward"][:T]
    if p.reward_clip > 0:
        rewards = rewards.clamp(-p.reward_clip, p.reward_clip)
    discounts = p.discount * (~batch["terminated"][:T]).to(values.dtype)
    valid = ~batch["ignored"][:T]
    dist = policy_dist(batch)
    behaviour_log_probs = dist.log_prob(batch[f"behaviour_{dist.field}"][:T], actions)
    proximal_log_probs = dist.log_prob(params[:T], actions).detach()
    returns = vtrace(behaviour_log_probs, proximal_log_probs, rewards, discounts,
                     values[:T], values[T], valid, rho_bar=p.rho_bar, c_bar=p.c_bar, lam=p.lam)
    return _Targets(actions, behaviour_log_probs, valid, returns, proximal_log_probs)


def learner_step(model, optimizer, batch: dict, p: VTraceParams, step_lock=None,
                 diagnose: bool = False, precision: str = "fp32", after_update=None,
                 shuffle: torch.Generator | None = None, ranks=None) -> dict[str, float]:
    """Learn from one batch of unrolls: ``p.echo`` passes of ``p.minibatches`` updates.

    ``batch`` is time-major on the model's device: ``obs`` (a dict, L = T + 1 rows), ``action``, ``reward``,
    ``terminated``, ``ignored``, ``behaviour_logits`` ([L, B, ...], row T unused) and ``core_state`` ([B, 2, H] or
    None). ``step_lock`` guards only each parameter write (what the inference thread must not see half done);
    ``after_update`` is called after each one.

    With one pass of one minibatch (IMPALA) the V-trace targets come from the differentiated forward pass. Otherwise a
    no-grad pass over the whole batch computes them once, fixed for all its updates as PPO's advantages are; each update
    recomputes pi on its own minibatch of shuffled rows (whole unrolls with an LSTM). Their order is drawn on the CPU
    from ``shuffle`` (torch's default CPU generator if None), so a seed gives the same minibatches on a CPU and a GPU.

    ``diagnose``: the first update also measures what tells a stuck learner from a working one: each weight tensor's
    update relative to the tensor (``update_ratio/<name>``; about 1e-3 is healthy for Adam/RMSProp, 1e-5 and below
    barely moves), the advantages' scale and the variance of the V-trace targets the value head explains. ``precision``
    ``bf16`` runs the network under autocast; V-trace and the loss stay fp32.

    ``ranks`` (data-parallel learners, ``pipeline/ranks.py``): gradients are averaged over every rank's valid rows
    before clipping, and normalised advantages take every rank's moments, so G ranks' parts of a batch make the update
    one process makes of it all.

    Returns 0-dim device tensors (the diagnostics excepted, which are floats) and ``updates``: nothing in an update
    waits for the device.
    """
    first = episode_starts(batch["ignored"])
    if p.echo == 1 and p.minibatches == 1:
        logits, values = network_outputs(model, batch, first, precision)
        targets = batch_targets(p, batch, logits.detach(), values.detach())
        updates = [(logits[:-1], values[:-1], targets)]  # row T only bootstraps
    else:
        with torch.no_grad():
            targets = batch_targets(p, batch, *network_outputs(model, batch, first, precision))
        updates = _minibatch_passes(model, batch, first, targets, p, precision, shuffle)
    dist, moments = policy_dist(batch), None if ranks is None else ranks.masked_moments
    totals, diag = {}, {}
    for count, (logits, values, t) in enumerate(updates, 1):
        loss, stats = update_loss(p, dist, logits, values, t, moments)
        # the masked means' gradients, each rank weighted by its valid rows
        stats["grad_norm"] = clipped_gradients(loss, model, optimizer, p, ranks, t.valid.sum())
        before = ({n: w.detach().clone() for n, w in model.named_parameters() if w.dim() > 1}
                  if diagnose and count == 1 else None)
        with step_lock if step_lock is not None else contextlib.nullcontext():
            optimizer.step()
            if after_update is not None:
                after_update()  # inside: no forward runs between the write and the version bump
        if before is not None:
            diag = _diagnostics(model, before, t.returns, values.detach(), t.valid)
        add_stats(totals, stats)
    # The mean is over the updates made, whatever the split, so the mean, the counter and the lag agree.
    out = {k: v / count for k, v in totals.items()}
    out.update(mean_rho=mean_rho(targets), updates=count, **diag)
    return out


def mean_rho(targets: _Targets) -> Tensor:
    """The mean clipped importance weight over a batch's valid rows (1 with none): how far the actors lag."""
    return torch.where(targets.valid.any(), masked_mean(targets.returns.rhos, targets.valid), 1.0).detach()


def update_loss(p: VTraceParams, dist, logits: Tensor, values: Tensor, t: _Targets,
                moments=None) -> tuple[Tensor, dict[str, Tensor]]:
    """One update's ``impala_loss`` on a minibatch's network outputs and V-trace targets, with ``p``'s costs (a
    population's per-member costs are tensors there, ``algos/population_vtrace.py``)."""
    proximal = t.proximal_log_probs if p.proximal == "batch" else None
    return impala_loss(logits, t.actions, values, t.returns, t.valid, baseline_cost=p.baseline_cost,
                       entropy_cost=p.entropy_cost, clip=p.clip, dist=dist,
                       normalize_advantages=p.normalize_advantages, moments=moments,
                       behaviour_log_probs=t.behaviour_log_probs, proximal_log_probs=proximal)


def grad_clip(p) -> float:
    """The norm a learner's gradients are clipped to: ``p.max_grad_norm``, no clip at 0."""
    return p.max_grad_norm if p.max_grad_norm > 0 else float("inf")


def clipped_gradients(loss: Tensor, model, optimizer, p, ranks=None, weight=1.0) -> Tensor:
    """``loss``'s gradients, averaged over data-parallel ``ranks`` (``pipeline/ranks.py``; this rank's share
    weighted by ``weight``) when given, then clipped to ``grad_clip(p)``; returns their norm."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if ranks is not None:
        ranks.average_gradients(model.parameters(), weight)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip(p))


def add_stats(totals: dict[str, Tensor], stats: dict[str, Tensor]) -> None:
    """Sum one update's statistics into ``totals`` (device tensors, detached)."""
    for k, v in stats.items():
        totals[k] = totals.get(k, 0.0) + v.detach()


def as_rows(obs: dict, targets: _Targets) -> tuple[dict, _Targets]:
    """A batch's observations of its T targeted steps and its targets as rows: [T, B, ...] -> [T * B, ...], the
    rows a feed-forward network's minibatches index."""
    T = targets.valid.shape[0]
    return {k: v[:T].flatten(0, 1) for k, v in obs.items()}, targets.map(lambda x: x.flatten(0, 1))


def _minibatch_passes(model, batch: dict, first: Tensor, targets: _Targets, p: VTraceParams, precision: str,
                      shuffle: torch.Generator | None):
    """The network's outputs and the targets of each update, made as it is asked for: ``p.echo`` shuffled passes
    of ``p.minibatches`` over the batch's rows (its unrolls with an LSTM), see ``learner_step``."""
    ignored = batch["ignored"]
    T, B = ignored.shape[0] - 1, ignored.shape[1]
    recurrent = getattr(model, "lstm", None) is not None
    n = B if recurrent else T * B
    if not recurrent:
        obs, targets = as_rows(batch["obs"], targets)
    for _ in range(p.echo):
        order = torch.randperm(n, generator=shuffle).to(ignored.device, non_blocking=True)
        # tensor_split, not chunk: chunk's pieces of ceil(n / k) can be fewer than k (16 unrolls into 7 gave 6),
        # breaking algo.minibatches updates per pass and, with data-parallel ranks, the count of collectives
        # ranks of different sizes make. These pieces differ by at most one row (unroll).
        for idx in order.tensor_split(p.minibatches):
            if recurrent:
                logits, values = network_outputs(model, batch, first, precision, cols=idx)
                yield logits[:T], values[:T], targets.select((slice(None), idx))
            else:
                with autocast(ignored.device, precision):
                    logits, values = model({k: v[idx] for k, v in obs.items()})
                yield logits.float(), values.float(), targets.select(idx)


@torch.no_grad()
def _diagnostics(model, before: dict[str, Tensor], returns: VTraceReturns, values: Tensor,
                 valid: Tensor) -> dict[str, float]:
    out = {f"update_ratio/{name}": float((w - before[name]).norm() / before[name].norm().clamp(min=1e-12))
           for name, w in model.named_parameters() if name in before}
    ratios = list(out.values())
    out["update_ratio"] = float(torch.tensor(ratios).median()) if ratios else 0.0
    adv = returns.pg_advantages[valid]
    vs, v = returns.vs[valid], values[valid]
    out["advantage_std"] = float(adv.std()) if adv.numel() > 1 else 0.0
    out["value_error"] = float((vs - v).abs().mean()) if vs.numel() else 0.0
    var = vs.var() if vs.numel() > 1 else torch.tensor(0.0)
    out["explained_variance"] = float(1 - (vs - v).var() / var) if var > 0 else 0.0
    return out
