"""R2D2: recurrent experience replay in distributed Q-learning (the math).

Reference: S. Kapturowski et al., 2019, "Recurrent Experience Replay in Distributed Reinforcement Learning", ICLR 2019
(SEED RL's ``agents/r2d2`` for the Atari settings).

Conventions (time-major, a batch of B stored sequences of L rows):
  * row t holds the observation the actor saw, the action it took, the reward of that action and whether the episode
    then ended (``terminated``: a terminal state, no bootstrap; ``truncated``: a time limit, bootstrap from the next
    row's observation, which is the episode's final one). ``ignored`` marks the auto-reset row after an episode end: its
    action did nothing, it is never trained on and never crossed.
  * the first ``burn_in`` rows only warm up the recurrent state (both networks, no gradient); Q-learning trains on the
    rows after them, and each row's n-step target uses the rows that follow it in the sequence (fewer than n at its end:
    it then bootstraps from the last row).
  * values are learned in the rescaled space of h(x) = sign(x)(sqrt(|x|+1)-1) + eps x (Pohlen et al. 2018): targets are
    h(G) with G computed from h^-1 of the target network's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from seedlocal.algos.vtrace import clipped_gradients, masked_mean
from seedlocal.networks import cut_rows
from seedlocal.spec import episode_starts

RESCALE_EPS = 1e-3


def value_rescale(x: Tensor, eps: float = RESCALE_EPS) -> Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: Tensor, eps: float = RESCALE_EPS) -> Tensor:
    """h^-1 in closed form: sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root * root - 1.0)


def n_step_returns(rewards: Tensor, terminated: Tensor, truncated: Tensor, bootstrap: Tensor,
                   n: int, discount: float) -> Tensor:
    """Untransformed n-step returns G_t for rows t = 0 .. L-2 of [L, B] inputs.

    ``bootstrap[t]`` is the (untransformed) value of row t's observation. G_t sums discount^k r_{t+k} for k < n and
    stops early at an episode end: a terminal adds nothing more; a truncation adds discount^(k+1) bootstrap[t+k+1] (the
    final observation). Without an end it adds discount^m bootstrap[t+m] with m = min(n, L - 1 - t): the sequence's last
    row bounds the horizon.
    """
    T = rewards.shape[0] - 1
    dtype = bootstrap.dtype

    # Padded by n rows so that row t + k exists for every t: past the end zeros (never used: alive stops there).
    r, te, tr, v = (torch.cat([x, x.new_zeros((n,) + x.shape[1:])])
                    for x in (rewards.to(dtype), terminated, truncated, bootstrap))
    t_index = torch.arange(T, device=rewards.device).view(-1, *([1] * (rewards.dim() - 1)))
    returns = torch.zeros((T,) + rewards.shape[1:], dtype=dtype, device=rewards.device)
    alive = torch.ones_like(returns, dtype=torch.bool)
    scale = 1.0
    for k in range(n):
        ran_out = alive & (t_index + k >= T)  # row t + k is the last row: bootstrap from it
        returns = returns + torch.where(ran_out, scale * v[k:k + T], 0.0)
        alive = alive & ~ran_out
        returns = returns + torch.where(alive, scale * r[k:k + T], 0.0)
        ended_te = alive & te[k:k + T]
        ended_tr = alive & tr[k:k + T] & ~ended_te
        returns = returns + torch.where(ended_tr, scale * discount * v[k + 1:k + 1 + T], 0.0)
        alive = alive & ~ended_te & ~ended_tr
        scale *= discount
    return returns + torch.where(alive, scale * v[n:n + T], 0.0)


def double_q_bootstrap(q_online: Tensor, q_target: Tensor) -> Tensor:
    """h^-1 of the target network's Q at the online network's argmax, per row: [L, B]."""
    best = q_online.argmax(-1, keepdim=True)
    return inverse_value_rescale(q_target.gather(-1, best).squeeze(-1))


def sequence_priorities(td_abs: Tensor, valid: Tensor, eta: float) -> Tensor:
    """eta max_t |delta| + (1 - eta) mean_t |delta| per sequence, over valid rows: [B]."""
    masked = torch.where(valid, td_abs, torch.zeros_like(td_abs))
    count = valid.sum(0).clamp(min=1)
    return eta * masked.max(0).values + (1.0 - eta) * masked.sum(0) / count


def td_loss(q_taken: Tensor, targets: Tensor, valid: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Importance-weighted squared TD loss: mean over sequences of w_b * sum_t 0.5 delta^2. Returns (loss, delta) with
    delta detached.

    Summed over time, as SEED does: the published Adam settings (lr 1e-4, eps 1e-3) and gradient clip (40) are for that
    scale. A mean over time made Adam's eps dominate and every update a tiny SGD step (Pong: docs/r2d2.md)."""
    delta = q_taken - targets.detach()
    per_row = torch.where(valid, 0.5 * delta * delta, torch.zeros_like(delta))
    return (weights * per_row.sum(0)).mean(), delta.detach()


# -- the learner step ---------------------------------------------------------------


@dataclass
class R2D2Params:
    """R2D2 learner hyperparameters (defaults: CartPole; see presets for Atari)."""

    batch_size: int = 32
    """sequences per update"""
    burn_in: int = 8
    """rows that only warm up the LSTM state (no gradient)"""
    unroll_length: int = 16
    """rows trained on after the burn-in"""
    n_step: int = 5
    """steps in each Q-learning target"""
    discount: float = 0.99
    """gamma"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    adam_eps: float = 1e-3
    """Adam epsilon (R2D2: 1e-3)"""
    max_grad_norm: float = 40.0
    """clip the global gradient norm (0 = off)"""
    target_update_every: int = 25
    """updates between copies of the online network into the target network"""
    priority_exponent: float = 0.9
    """alpha: sampling probability ~ priority^alpha"""
    priority_eta: float = 0.9
    """eta: a sequence's priority is eta max|delta| + (1 - eta) mean|delta|"""
    importance_exponent: float = 0.6
    """beta: importance weights (N P(i))^-beta, normalised by their max"""
    replay_size: int = 20_000
    """sequences the replay holds (oldest overwritten)"""
    min_replay: int = 1_000
    """sequences stored before learning starts"""
    replay_ratio: float = 8.0
    """trained rows per env step; the learner waits for actors (or they for it) to keep to it"""
    epsilon_base: float = 0.4
    """per-env exploration: env i of N acts epsilon-greedily with base^(1 + alpha i / (N - 1))"""
    epsilon_alpha: float = 7.0
    """see epsilon_base"""
    eval_envs: int = 4
    """env slots acting with eval_epsilon that do not write to replay; their return drives --stop-at-return"""
    eval_epsilon: float = 0.001
    """exploration of evaluation slots and of seedlocal eval"""
    reward_clip: float = 0.0
    """clip rewards to [-x, x] for learning (0 = off)"""
    precision: Literal["auto", "fp32", "tf32", "bf16"] = "auto"
    """torso arithmetic: auto = tf32 on CUDA; on a CPU bf16 for CNN torsos where it has native bf16
    (AMX/AVX512-BF16), else fp32; the LSTM, the head and the targets stay float32 (TF32 matmuls with tf32, bf16)"""


def per_env_epsilons(n: int, base: float = 0.4, alpha: float = 7.0) -> Tensor:
    """Ape-X / R2D2 exploration: env i of n acts with base^(1 + alpha i / (n - 1)); one env acts with base."""
    i = torch.arange(n, dtype=torch.float64)
    return (base ** (1.0 + alpha * i / max(n - 1, 1))).float()


def learner_step(online, target, optimizer, batch: dict, weights: Tensor, p: R2D2Params,
                 step_lock, ranks=None) -> tuple[dict[str, float], Tensor]:
    """One update on a batch of sequences; returns (stats, new priorities [B]).

    ``batch`` (time-major, L = burn_in + unroll_length + 1 rows, on the networks' device): ``obs`` (dict), ``action``,
    ``reward``, ``terminated``, ``truncated``, ``ignored`` [L, B] and ``core_state`` [B, 2, H], the recurrent state the
    actor had before row 0; ``ignored_host``, a numpy copy of ``ignored``, so that nothing waits for the device.
    ``online.unroll(obs, core, first, starts)`` returns (Q [L', B, A], final core). ``weights`` [B] are the importance
    weights of the sampled sequences. ``ranks``: data-parallel learners, each sampling its own replay.
    """
    ignored = batch["ignored"]
    first = episode_starts(ignored)
    b = p.burn_in
    # Where the LSTM cuts its fused runs, from the host's copy of the flags: reading a GPU's would wait for it.
    first_host = episode_starts(batch["ignored_host"])
    head_starts, tail_starts = cut_rows(first_host[:b]), cut_rows(first_host[b:])
    head = {k: v[:b] for k, v in batch["obs"].items()}
    tail = {k: v[b:] for k, v in batch["obs"].items()}
    core = batch["core_state"]
    with torch.no_grad():
        online_core = target_core = core
        if b:  # unroll() expects the state before its row 0 already reset where that row starts an episode
            keep = (~first[b]).to(core.dtype).view(-1, 1, 1)
            online_core, target_core = (net.unroll(head, core, first[:b], head_starts)[1] * keep
                                        for net in (online, target))
        q_target, _ = target.unroll(tail, target_core, first[b:], tail_starts)
    q_online, _ = online.unroll(tail, online_core.detach(), first[b:], tail_starts)
    actions = batch["action"][b:-1].long()
    rewards = batch["reward"][b:]
    if p.reward_clip > 0:
        rewards = rewards.clamp(-p.reward_clip, p.reward_clip)
    boot = double_q_bootstrap(q_online.detach().float(), q_target.float())
    returns = n_step_returns(rewards, batch["terminated"][b:], batch["truncated"][b:], boot, p.n_step, p.discount)
    targets = value_rescale(returns)
    q_taken = q_online[:-1].float().gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    valid = ~ignored[b:-1]
    loss, delta = td_loss(q_taken, targets, valid, weights)
    grad_norm = clipped_gradients(loss, online, optimizer, p, ranks)  # every rank has as many sequences
    with step_lock:
        optimizer.step()
    priorities = sequence_priorities(delta.abs(), valid, p.priority_eta)
    # 0-dim device tensors, summed by the caller and read once per log: only the priorities cross to the host per update
    stats = {"loss": loss.detach(), "grad_norm": grad_norm.detach(),
             "td_abs": masked_mean(delta.abs(), valid), "q_mean": masked_mean(q_taken.detach(), valid)}
    return stats, priorities
