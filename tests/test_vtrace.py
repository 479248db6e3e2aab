"""Tests for seedlocal.algos.vtrace against a plain per-step reference."""

import math

import pytest
import torch

from seedlocal.algos.distributions import Categorical
from seedlocal.algos.vtrace import impala_loss, vtrace

GAMMA = 0.99
log_prob = Categorical.log_prob  # log pi(a|x) as the learner step takes it (its ``dist.log_prob``)


def reference_vtrace(mu_lp, pi_lp, rewards, discounts, values, bootstrap, valid,
                     rho_bar=1.0, c_bar=1.0, lam=1.0):
    """Per-step V-trace from the sum definition (IMPALA eq. 1), python floats.

    vs_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i c_i) delta_t,
    where the sum stops at the first invalid row (and vs_s = V(x_s) if s is invalid).
    """
    T, B = len(rewards), len(rewards[0])
    vs = [[0.0] * B for _ in range(T)]
    pg = [[0.0] * B for _ in range(T)]
    for b in range(B):
        def v(t):
            return values[t][b] if t < T else bootstrap[b]

        def ratio(t):
            return math.exp(pi_lp[t][b] - mu_lp[t][b])

        def rho(t):
            return min(rho_bar, ratio(t))

        def c(t):
            return lam * min(c_bar, ratio(t))

        def delta(t):
            return rho(t) * (rewards[t][b] + discounts[t][b] * v(t + 1) - v(t))

        for s in range(T):
            if not valid[s][b]:
                vs[s][b] = values[s][b]
                continue
            total, trace = 0.0, 1.0
            for t in range(s, T):
                if not valid[t][b]:
                    break
                total += trace * delta(t)
                trace *= discounts[t][b] * c(t)
            vs[s][b] = values[s][b] + total
        for s in range(T):
            if not valid[s][b]:
                pg[s][b] = 0.0
                continue
            next_vs = vs[s + 1][b] if s + 1 < T else bootstrap[b]
            pg[s][b] = rho(s) * (rewards[s][b] + discounts[s][b] * next_vs - values[s][b])
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(pg, dtype=torch.float64)


def random_inputs(T, B, seed, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    kw = dict(generator=g, dtype=torch.float64)
    mu_lp = -torch.rand(T, B, **kw) * 2.0
    pi_lp = (mu_lp + torch.randn(T, B, **kw) * 0.7).clamp(max=0.0) if off_policy else mu_lp.clone()
    return dict(
        behaviour_log_probs=mu_lp,
        target_log_probs=pi_lp,
        rewards=torch.randn(T, B, **kw),
        discounts=torch.full((T, B), GAMMA, dtype=torch.float64),
        values=torch.randn(T, B, **kw),
        bootstrap_value=torch.randn(B, **kw),
        valid=torch.ones(T, B, dtype=torch.bool),
    )


def run_both(inputs, **clip):
    out = vtrace(**inputs, **clip)
    ref_vs, ref_pg = reference_vtrace(
        inputs["behaviour_log_probs"].tolist(), inputs["target_log_probs"].tolist(),
        inputs["rewards"].tolist(), inputs["discounts"].tolist(), inputs["values"].tolist(),
        inputs["bootstrap_value"].tolist(), inputs["valid"].tolist(), **clip)
    return out, ref_vs, ref_pg


@pytest.mark.parametrize("clip", [
    dict(rho_bar=1.0, c_bar=1.0, lam=1.0),
    dict(rho_bar=0.8, c_bar=0.9, lam=0.95),
], ids=["unclipped_defaults", "rho0.8_c0.9_lam0.95"])
def test_vtrace_matches_reference_off_policy(clip):
    inputs = random_inputs(T=7, B=5, seed=0)
    # Off-policy for real: some ratios above and some below the clip thresholds.
    ratios = torch.exp(inputs["target_log_probs"] - inputs["behaviour_log_probs"])
    assert (ratios > 1.0).any() and (ratios < 0.8).any()
    out, ref_vs, ref_pg = run_both(inputs, **clip)
    torch.testing.assert_close(out.vs, ref_vs, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.pg_advantages, ref_pg, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.rhos, ratios.clamp(max=clip["rho_bar"]), atol=1e-12, rtol=0)


def episode_end_inputs():
    """T=8, B=5 with episode ends inside the unroll.

    col 0: terminated at t=2, invalid row t=3
    col 1: truncated at t=3 (discount stays gamma), invalid row t=4
    col 2: terminated at t=1 (invalid t=2) and truncated at t=5 (invalid t=6)
    col 3: invalid at t=0 (previous unroll ended on its last step), truncated at t=6, invalid t=7
    col 4: no episode end
    """
    inputs = random_inputs(T=8, B=5, seed=1)
    valid, disc = inputs["valid"], inputs["discounts"]
    for t, b in [(3, 0), (4, 1), (2, 2), (6, 2), (0, 3), (7, 3)]:
        valid[t, b] = False
        inputs["rewards"][t, b] = 0.0  # what an auto-reset step reports
    for t, b in [(2, 0), (1, 2)]:  # terminations
        disc[t, b] = 0.0
    # truncations (3,1), (5,2), (6,3) keep discount gamma
    return inputs


@pytest.mark.parametrize("clip", [
    dict(rho_bar=1.0, c_bar=1.0, lam=1.0),
    dict(rho_bar=0.8, c_bar=0.9, lam=0.95),
], ids=["unclipped_defaults", "rho0.8_c0.9_lam0.95"])
def test_vtrace_episode_ends_inside_unroll(clip):
    inputs = episode_end_inputs()
    out, ref_vs, ref_pg = run_both(inputs, **clip)
    torch.testing.assert_close(out.vs, ref_vs, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.pg_advantages, ref_pg, atol=1e-6, rtol=0)

    invalid = ~inputs["valid"]
    values = inputs["values"]
    # Invalid rows: zero correction (vs == V exactly) and zero advantage.
    assert torch.equal(out.vs[invalid], values[invalid])
    assert torch.all(out.pg_advantages[invalid] == 0)

    # A truncated row bootstraps from V(final obs) = values of the invalid row after it.
    rho = out.rhos
    r = inputs["rewards"]
    for t, b in [(3, 1), (5, 2), (6, 3)]:
        expected = values[t, b] + rho[t, b] * (r[t, b] + GAMMA * values[t + 1, b] - values[t, b])
        assert out.vs[t, b].item() == pytest.approx(expected.item(), abs=1e-12)
        assert out.pg_advantages[t, b].item() == pytest.approx((expected - values[t, b]).item(), abs=1e-12)
    # A terminated row's target is just its (clipped) reward.
    for t, b in [(2, 0), (1, 2)]:
        expected = values[t, b] + rho[t, b] * (r[t, b] - values[t, b])
        assert out.vs[t, b].item() == pytest.approx(expected.item(), abs=1e-12)

    # delta at invalid rows is 0: their reward and importance ratio change nothing.
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["rewards"][invalid] = 123.0
    changed["target_log_probs"][invalid] = 0.0
    changed["behaviour_log_probs"][invalid] = -5.0
    out2 = vtrace(**changed, **clip)
    assert torch.equal(out2.vs, out.vs)
    assert torch.equal(out2.pg_advantages, out.pg_advantages)

    # Nor do NaN or inf there (a stale store row, a diverged behaviour logit): masked by a select,
    # never a multiply, since NaN * 0 is NaN and the recursion would carry it into every earlier row.
    poisoned = {k: v.clone() for k, v in inputs.items()}
    poisoned["rewards"][invalid] = float("nan")
    poisoned["behaviour_log_probs"][invalid] = float("-inf")
    poisoned["target_log_probs"][invalid] = float("nan")
    out3 = vtrace(**poisoned, **clip)
    assert torch.equal(out3.vs, out.vs)
    assert torch.equal(out3.pg_advantages, out.pg_advantages)
    assert torch.equal(out3.advantages, out.advantages)


def test_vtrace_on_policy_equals_n_step_returns():
    inputs = random_inputs(T=9, B=4, seed=2, off_policy=False)
    inputs["discounts"][4, 1] = 0.0  # a terminal inside the unroll (no invalid rows here)
    out = vtrace(**inputs)
    r, d = inputs["rewards"], inputs["discounts"]
    returns = torch.zeros_like(r)
    g = inputs["bootstrap_value"].clone()
    for t in reversed(range(r.shape[0])):
        g = r[t] + d[t] * g
        returns[t] = g
    torch.testing.assert_close(out.vs, returns, atol=1e-6, rtol=0)
    next_returns = torch.cat([returns[1:], inputs["bootstrap_value"][None]])
    torch.testing.assert_close(out.pg_advantages, r + d * next_returns - inputs["values"], atol=1e-6, rtol=0)
    assert torch.all(out.rhos == 1.0)


def test_vtrace_outputs_are_detached():
    inputs = random_inputs(T=5, B=3, seed=3)
    inputs["values"].requires_grad_(True)
    inputs["target_log_probs"].requires_grad_(True)
    out = vtrace(**inputs)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad and not out.rhos.requires_grad


def _loss_setup(seed=4, T=6, B=4, A=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, B, A, generator=g, dtype=torch.float64)
    behaviour_logits = torch.randn(T, B, A, generator=g, dtype=torch.float64)
    actions = torch.randint(0, A, (T, B), generator=g)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    discounts = torch.full((T, B), GAMMA, dtype=torch.float64)
    valid = torch.ones(T, B, dtype=torch.bool)
    # Terminated rows followed by invalid auto-reset rows (one also at t=0).
    for t, b in [(2, 0), (4, 2)]:
        discounts[t, b] = 0.0
        valid[t + 1, b] = False
    valid[0, 3] = False
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    return logits, behaviour_logits, actions, values, rewards, discounts, valid, bootstrap


def _full_loss(logits, behaviour_logits, actions, values, rewards, discounts, valid, bootstrap):
    returns = vtrace(log_prob(behaviour_logits, actions), log_prob(logits, actions),
                     rewards, discounts, values, bootstrap, valid)
    return impala_loss(logits, actions, values, returns, valid)


def test_impala_loss_gradients_flow_and_skip_invalid_rows():
    logits, beh, actions, values, rewards, discounts, valid, bootstrap = _loss_setup()
    logits.requires_grad_(True)
    values.requires_grad_(True)
    total, stats = _full_loss(logits, beh, actions, values, rewards, discounts, valid, bootstrap)
    total.backward()
    assert logits.grad is not None and values.grad is not None
    invalid = ~valid
    assert logits.grad[valid].abs().sum() > 0 and values.grad[valid].abs().sum() > 0
    assert torch.all(logits.grad[invalid] == 0) and torch.all(values.grad[invalid] == 0)
    assert set(stats) == {"policy_loss", "baseline_loss", "entropy", "total_loss"}
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())
    expected_total = stats["policy_loss"] + 0.5 * stats["baseline_loss"] - 0.01 * stats["entropy"]
    assert stats["total_loss"].item() == pytest.approx(expected_total.item(), abs=1e-12)


def test_impala_loss_ignores_invalid_rows():
    args = _loss_setup()
    logits, beh, actions, values, rewards, discounts, valid, bootstrap = args
    total, _ = _full_loss(*args)

    invalid = ~valid
    logits2, values2, rewards2, beh2 = logits.clone(), values.clone(), rewards.clone(), beh.clone()
    logits2[invalid] = 50.0 * torch.randn_like(logits2[invalid])
    beh2[invalid] = -logits2[invalid]
    values2[invalid] = 1e3
    rewards2[invalid] = -1e3
    # The rows before these invalid ones are terminated (discount 0), so even the
    # invalid rows' values (their bootstrap) play no part here.
    total2, _ = _full_loss(logits2, beh2, actions, values2, rewards2, discounts, valid, bootstrap)
    assert total2.item() == pytest.approx(total.item(), abs=1e-10)

    # With the v-trace targets held fixed, the loss itself never reads invalid rows.
    returns = vtrace(log_prob(beh, actions), log_prob(logits, actions),
                     rewards, discounts, values, bootstrap, valid)
    a, _ = impala_loss(logits, actions, values, returns, valid)
    b, _ = impala_loss(logits2, actions, values2, returns, valid)
    assert a.item() == pytest.approx(b.item(), abs=1e-10)


def test_impala_loss_uniform_entropy_and_empty_mask():
    T, B, A = 4, 3, 6
    logits = torch.zeros(T, B, A, dtype=torch.float64)
    actions = torch.zeros(T, B, dtype=torch.long)
    values = torch.zeros(T, B, dtype=torch.float64)
    valid = torch.ones(T, B, dtype=torch.bool)
    valid[1, 2] = False
    lp = log_prob(logits, actions)
    returns = vtrace(lp, lp, torch.zeros(T, B, dtype=torch.float64),
                     torch.full((T, B), GAMMA, dtype=torch.float64), values,
                     torch.zeros(B, dtype=torch.float64), valid)
    _, stats = impala_loss(logits, actions, values, returns, valid)
    assert stats["entropy"].item() == pytest.approx(math.log(A), abs=1e-12)
    assert torch.allclose(lp, torch.full_like(lp, -math.log(A)))

    # No valid rows at all: means divide by 1, everything is 0 and finite.
    none_valid = torch.zeros(T, B, dtype=torch.bool)
    total, stats = impala_loss(logits, actions, values, returns, none_valid)
    assert total.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())


def test_the_tanh_speed_check_draws_nothing_from_torchs_global_generator():
    """The check runs at the first large MLP forward, mid-run: a draw there would shift every later draw from
    the global generator (a seeded run's later network inits), so it must leave the generator as it found it."""
    from seedlocal.arithmetic import _cpu_tanh_is_slow

    _cpu_tanh_is_slow.cache_clear()
    torch.manual_seed(0)
    state = torch.get_rng_state()
    _cpu_tanh_is_slow()
    assert torch.equal(torch.get_rng_state(), state)


def test_mlp_tanh_matches_torch_in_values_and_gradients():
    """The MLP torsos' Tanh may compute 2 sigmoid(2x) - 1 (faster on some CPU
    builds): it must stay torch.tanh in value and gradient, with and without
    a graph, saturated inputs included."""
    from seedlocal.arithmetic import Tanh, _tanh_from_sigmoid

    # Large enough for the identity to be used where it measures faster.
    specials = torch.tensor([0.0, 1e-8, -1e-8, 30.0, -30.0, 100.0, -100.0])
    x0 = torch.cat([torch.randn(16384) * 3, specials]).view(-1, 1)
    for fn in (Tanh(), _tanh_from_sigmoid):  # the module, and the identity whether or not it chose it
        x = x0.clone().requires_grad_(True)
        y = fn(x)
        y.backward(torch.ones_like(y))
        ref = x0.clone().requires_grad_(True)
        torch.tanh(ref).backward(torch.ones_like(ref))
        assert torch.allclose(y, torch.tanh(ref), atol=1e-6, rtol=0)
        assert torch.allclose(x.grad, ref.grad, atol=1e-6, rtol=0)
        with torch.inference_mode():
            assert torch.allclose(fn(x0), torch.tanh(x0), atol=1e-6, rtol=0)


def test_minibatch_order_comes_from_the_given_cpu_generator_only():
    """Shuffled minibatches are drawn from the learner's own seeded CPU
    generator, not from torch's global (or, on a GPU, the CUDA) generator:
    the same config then gives the same updates on every device."""
    import copy

    from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.networks import ActorCritic

    spec = validate_env(EnvConfig(id="CartPole-v1"))
    g = torch.Generator().manual_seed(0)
    L, B = 9, 4
    batch = {"obs": {"": torch.randn(L, B, 4, generator=g)}, "action": torch.randint(0, 2, (L, B), generator=g),
             "reward": torch.ones(L, B), "terminated": torch.zeros(L, B, dtype=torch.bool),
             "ignored": torch.zeros(L, B, dtype=torch.bool), "behaviour_logits": torch.randn(L, B, 2, generator=g),
             "core_state": None}
    p = VTraceParams(echo=2, minibatches=4, clip=0.1, learning_rate=1e-2)
    torch.manual_seed(0)
    base = ActorCritic(spec)
    after = []
    for global_seed in (1, 2):
        model = copy.deepcopy(base)
        torch.manual_seed(global_seed)  # must not matter
        learner_step(model, make_optimizer(model.parameters(), p), batch, p, shuffle=torch.Generator().manual_seed(7))
        after.append(torch.nn.utils.parameters_to_vector(model.parameters()))
    assert torch.equal(after[0], after[1])
    model = copy.deepcopy(base)
    learner_step(model, make_optimizer(model.parameters(), p), batch, p, shuffle=torch.Generator().manual_seed(8))
    assert not torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), after[0])


def test_the_proximal_clip_is_ppos_when_the_learner_acted_and_a_weighted_reference_otherwise():
    """Decoupled PPO (algo.proximal batch): the ratio is taken to the learner's policy at the batch's start
    (pi_prox) and each row's surrogate weighted by min(rho_bar, pi_prox/mu), with V-trace's targets under pi_prox.
    With no lag (mu = pi_prox) it is exactly PPO's clip against mu; with lag it matches a hand computation."""
    logits, beh, actions, values, rewards, discounts, valid, bootstrap = _loss_setup(seed=7)
    clip = 0.2
    prox_lp = log_prob(logits, actions)

    def loss(mu_logits, prox, pi_logits):
        returns = vtrace(log_prob(mu_logits, actions), prox_lp, rewards, discounts, values, bootstrap, valid)
        return impala_loss(pi_logits, actions, values, returns, valid, behaviour_log_probs=log_prob(mu_logits,
                           actions), clip=clip, proximal_log_probs=prox)[1]["policy_loss"], returns

    moved = logits + 0.3 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1), dtype=logits.dtype)
    no_lag, _ = loss(logits, prox_lp, moved)
    ppo, _ = loss(logits, None, moved)
    assert no_lag.item() == pytest.approx(ppo.item(), abs=1e-12)

    lagged, returns = loss(beh, prox_lp, moved)
    ratio = torch.exp(log_prob(moved, actions) - prox_lp)
    weight = torch.clamp(torch.exp(prox_lp - log_prob(beh, actions)), max=1.0)
    adv = returns.advantages
    surrogate = weight * torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    expected = -(torch.where(valid, surrogate, 0.0).sum() / valid.sum())
    assert lagged.item() == pytest.approx(expected.item(), abs=1e-10)
    assert lagged.item() != pytest.approx(loss(beh, None, moved)[0].item(), abs=1e-6)  # not the clip against mu


def test_a_lagged_batch_still_gives_a_gradient_with_the_proximal_clip():
    """Actors far behind the learner (pi/mu well outside the clip range, advantages positive): clipped against mu,
    those rows give no policy gradient; against the learner's own policy at the batch's start (r = 1 at its first
    update) every valid row does."""
    logits, _, actions, values, rewards, discounts, valid, bootstrap = _loss_setup(seed=3)
    mu = logits.clone()
    mu.scatter_(-1, actions.unsqueeze(-1), -4.0)  # the actors gave the taken actions little probability
    rewards = rewards.abs() + 1.0
    returns = vtrace(log_prob(mu, actions), log_prob(logits, actions), rewards, discounts, values, bootstrap,
                     valid)
    grads = {}
    for name, prox in (("behaviour", None), ("batch", log_prob(logits, actions))):
        pi = logits.clone().requires_grad_(True)
        loss, stats = impala_loss(pi, actions, values, returns, valid, entropy_cost=0.0, baseline_cost=0.0,
                                  behaviour_log_probs=log_prob(mu, actions), clip=0.1, proximal_log_probs=prox)
        loss.backward()
        grads[name] = (pi.grad.abs().sum(-1), stats["clip_fraction"].item())
    positive = valid & (returns.advantages > 0)
    assert grads["behaviour"][1] > 0.9 and grads["batch"][1] == 0.0
    assert (grads["behaviour"][0][positive] == 0).all() and (grads["batch"][0][positive] > 0).all()


@pytest.mark.parametrize("lstm_size", [0, 8])
def test_minibatches_that_do_not_divide_the_batch_make_as_many_updates_as_asked_and_count_them(lstm_size,
                                                                                              monkeypatch):
    """16 rows (or 16 unrolls, with an LSTM) in 7 minibatches: torch.chunk made 6 pieces, so 6 optimiser steps
    while the update count, the policy lag and the statistics' mean divided by 7. Every pass now makes exactly
    algo.minibatches updates, and what learner_step returns is the mean over the updates it made."""
    from seedlocal.algos import vtrace as vt
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.networks import ActorCritic

    spec = validate_env(EnvConfig(id="CartPole-v1"))
    g = torch.Generator().manual_seed(0)
    L, B = (3, 8) if not lstm_size else (4, 16)  # 2 rows x 8 unrolls, or 16 unrolls
    batch = {"obs": {"": torch.randn(L, B, 4, generator=g)}, "action": torch.randint(0, 2, (L, B), generator=g),
             "reward": torch.ones(L, B), "terminated": torch.zeros(L, B, dtype=torch.bool),
             "ignored": torch.zeros(L, B, dtype=torch.bool), "behaviour_logits": torch.randn(L, B, 2, generator=g),
             "core_state": torch.zeros(B, 2, lstm_size) if lstm_size else None}
    losses, real_loss = [], vt.impala_loss

    def recorded_loss(*args, **kw):
        loss, stats = real_loss(*args, **kw)
        losses.append(stats)  # the updater adds grad_norm to it
        return loss, stats

    monkeypatch.setattr(vt, "impala_loss", recorded_loss)
    p = vt.VTraceParams(echo=2, minibatches=7, clip=0.1, learning_rate=1e-3)
    model = ActorCritic(spec, lstm_size=lstm_size)
    steps = []
    out = vt.learner_step(model, vt.make_optimizer(model.parameters(), p), batch, p,
                          after_update=lambda: steps.append(1), shuffle=torch.Generator().manual_seed(1))
    assert len(steps) == len(losses) == out["updates"] == 2 * 7
    for key in ("total_loss", "policy_loss", "entropy", "grad_norm"):
        expected = torch.stack([s[key] for s in losses]).mean()
        assert out[key].item() == pytest.approx(expected.item(), rel=1e-6), key
