"""R2D2's math against naive per-step references (as tests/test_vtrace.py does)."""

from __future__ import annotations

import math

import pytest
import torch

from seedlocal.algos.r2d2 import (double_q_bootstrap, inverse_value_rescale, n_step_returns, per_env_epsilons,
                                  sequence_priorities, td_loss, value_rescale)


def test_value_rescale_and_its_inverse():
    x = torch.cat([torch.linspace(-1000, 1000, 2001, dtype=torch.float64), torch.tensor([0.0, 1e-9, -1e-9])])
    h = value_rescale(x)
    for xi, hi in zip(x.tolist(), h.tolist()):
        ref = math.copysign(math.sqrt(abs(xi) + 1) - 1, xi) + 1e-3 * xi
        assert hi == pytest.approx(ref, abs=1e-12)
    torch.testing.assert_close(inverse_value_rescale(h), x, atol=1e-8, rtol=1e-10)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(x)), x, atol=1e-8, rtol=1e-10)


def naive_n_step(r, te, tr, v, n, gamma):
    L, B = r.shape
    out = torch.zeros(L - 1, B, dtype=torch.float64)
    for b in range(B):
        for t in range(L - 1):
            g, k = 0.0, 0
            while True:
                if t + k >= L - 1:  # the sequence's last row: bootstrap from it
                    g += gamma ** k * v[t + k, b]
                    break
                g += gamma ** k * r[t + k, b]
                if te[t + k, b]:
                    break
                if tr[t + k, b]:
                    g += gamma ** (k + 1) * v[t + k + 1, b]
                    break
                k += 1
                if k == n:
                    g += gamma ** n * v[t + n, b]
                    break
            out[t, b] = g
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_returns_match_a_naive_loop(n):
    g = torch.Generator().manual_seed(n)
    L, B = 17, 6
    r = torch.randn(L, B, generator=g, dtype=torch.float64)
    v = torch.randn(L, B, generator=g, dtype=torch.float64) * 5
    te = torch.rand(L, B, generator=g) < 0.08
    tr = (torch.rand(L, B, generator=g) < 0.08) & ~te
    te[4, 0], tr[9, 1] = True, True  # at least one of each
    got = n_step_returns(r, te, tr, v, n, 0.97)
    torch.testing.assert_close(got, naive_n_step(r, te, tr, v, n, 0.97), atol=1e-12, rtol=0)


def test_terminal_stops_the_bootstrap_and_truncation_bootstraps_from_the_final_observation():
    r = torch.tensor([[1.0], [2.0], [4.0], [8.0], [0.0]], dtype=torch.float64)
    v = torch.tensor([[100.0], [200.0], [300.0], [400.0], [500.0]], dtype=torch.float64)
    no = torch.zeros(5, 1, dtype=torch.bool)
    te = no.clone()
    te[1, 0] = True
    got = n_step_returns(r, te, no, v, 3, 0.5)
    assert got[0, 0] == 1 + 0.5 * 2  # ends at the terminal: no value after it
    tr = no.clone()
    tr[1, 0] = True
    got = n_step_returns(r, no, tr, v, 3, 0.5)
    assert got[0, 0] == 1 + 0.5 * 2 + 0.25 * 300  # the final observation's value
    got = n_step_returns(r, no, no, v, 3, 0.5)
    assert got[0, 0] == 1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 400
    assert got[3, 0] == 8 + 0.5 * 500  # the last row bounds the horizon


def test_double_q_takes_the_target_value_at_the_online_argmax():
    q_online = torch.tensor([[[1.0, 3.0, 2.0]], [[5.0, 0.0, 1.0]]])
    q_target = torch.tensor([[[10.0, 20.0, 30.0]], [[40.0, 50.0, 60.0]]])
    got = double_q_bootstrap(q_online, q_target)
    torch.testing.assert_close(got, inverse_value_rescale(torch.tensor([[20.0], [40.0]])))


def test_priorities_mix_max_and_mean_over_valid_rows():
    td = torch.tensor([[1.0, 2.0], [3.0, 100.0], [2.0, 4.0]])
    valid = torch.tensor([[True, True], [True, False], [True, True]])
    got = sequence_priorities(td, valid, 0.9)
    torch.testing.assert_close(got, torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 4 + 0.1 * 3]))


def test_td_loss_weights_sequences_and_skips_invalid_rows():
    q = torch.tensor([[1.0, 2.0], [3.0, 5.0]], requires_grad=True)
    y = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    valid = torch.tensor([[True, True], [False, True]])
    w = torch.tensor([1.0, 0.5])
    loss, delta = td_loss(q, y, valid, w)
    ref = (1.0 * (0.5 * 1.0) + 0.5 * (0.5 * 4 + 0.5 * 16)) / 2  # summed over valid rows, as SEED
    assert float(loss.detach()) == pytest.approx(ref)
    loss.backward()
    assert q.grad[1, 0] == 0.0  # the invalid row gets no gradient
    assert delta.tolist() == [[1.0, 2.0], [2.0, 4.0]]


def test_per_env_epsilons_follow_ape_x():
    eps = per_env_epsilons(8)
    for i, e in enumerate(eps.tolist()):
        assert e == pytest.approx(0.4 ** (1 + 7 * i / 7))
    assert per_env_epsilons(1).tolist() == pytest.approx([0.4])


def test_acting_and_replay_stack_frames_the_same_way():
    """R2D2 stacks Atari frames on the learner side twice: per env while acting
    (R2D2Policy's FrameHistory) and per sampled row in replay. Both must give the network the
    same input for the same step, episode starts included."""
    import numpy as np

    from seedlocal.algos.frames import FrameHistory
    from seedlocal.spec import TensorSpec
    from seedlocal.trainers.replay import SequenceReplay

    history = FrameHistory(TensorSpec((1, 2, 2), "uint8"), 4, "cpu", slots=1)
    n = 24
    ignored = np.zeros(n, bool)
    ignored[[9, 17]] = True  # auto-reset rows: steps 10 and 18 start episodes
    frames = (np.arange(n, dtype=np.uint8) + 1)[:, None, None, None].repeat(2, 2).repeat(2, 3)
    acted = []
    for t in range(n):
        first = t == 0 or ignored[t - 1]
        out = history(torch.from_numpy(frames[t:t + 1]), torch.tensor([0]), torch.tensor([first]), 1)
        acted.append(out[0, :, 0, 0].tolist())
    fields = {"obs": ((1, 2, 2), "uint8"), "ignored": ((), "bool")}
    r = SequenceReplay(1, 4, length=n, stride=n - 1, fields=fields, core_shape=(2, 1), stack=4)
    r.append(0, {"obs": frames, "ignored": ignored})
    stacked = r._stacked(np.array([0]), np.arange(n)[:, None])[:, 0, :, 0, 0, 0]
    assert stacked.tolist() == acted
    assert acted[10] == [11, 11, 11, 11] and acted[12] == [11, 11, 12, 13]


def test_learner_step_trains_only_after_the_burn_in_and_returns_priorities():
    from seedlocal.algos.r2d2 import R2D2Params, learner_step
    from seedlocal.networks import RecurrentQNet
    from seedlocal.pipeline.cuda import WeightLock
    from seedlocal.envs.spaces import describe

    torch.manual_seed(0)
    spec = describe("CartPole-v1")
    online, target = RecurrentQNet(spec, lstm_size=16), RecurrentQNet(spec, lstm_size=16)
    target.load_state_dict(online.state_dict())
    p = R2D2Params(burn_in=4, unroll_length=6, n_step=2, batch_size=3)
    L, B = 11, 3
    g = torch.Generator().manual_seed(1)
    batch = {"obs": {"": torch.randn(L, B, 4, generator=g)}, "action": torch.randint(0, 2, (L, B), generator=g),
             "reward": torch.ones(L, B), "terminated": torch.zeros(L, B, dtype=torch.bool),
             "truncated": torch.zeros(L, B, dtype=torch.bool), "ignored": torch.zeros(L, B, dtype=torch.bool),
             "core_state": torch.zeros(B, 2, 16)}
    batch["ignored_host"] = batch["ignored"].numpy()
    obs = batch["obs"][""].requires_grad_(True)
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    stats, prio = learner_step(online, target, opt, batch, torch.ones(B), p, WeightLock())
    assert prio.shape == (B,) and (prio > 0).all()
    assert set(stats) == {"loss", "grad_norm", "td_abs", "q_mean"}
    # The burn-in rows only warm up the state: no gradient reaches them; the trained rows get one.
    assert obs.grad is not None and obs.grad[:4].abs().sum() == 0 and obs.grad[4:-1].abs().sum() > 0
    stats2, _ = learner_step(online, target, opt, batch, torch.zeros(B), p, WeightLock())
    assert stats2["loss"] == 0.0 and stats2["grad_norm"] == 0.0  # zero importance weight: no gradient


def test_target_network_is_a_frozen_independent_copy():
    """``frozen_copy`` (the trainer's target): the same outputs, no
    gradients, and storage of its own, so online updates leave it alone."""
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.networks import RecurrentQNet

    torch.manual_seed(0)
    online = RecurrentQNet(validate_env(EnvConfig(id="CartPole-v1")), lstm_size=16)
    target = online.frozen_copy()
    assert not any(p.requires_grad for p in target.parameters())
    assert all(p.requires_grad for p in online.parameters())
    obs, core, first = {"": torch.randn(5, 2, 4)}, torch.zeros(2, 2, 16), torch.zeros(5, 2, dtype=torch.bool)
    before = target.unroll(obs, core, first, [])[0]
    assert torch.equal(before, online.unroll(obs, core, first, [])[0])
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    assert torch.equal(target.unroll(obs, core, first, [])[0], before)
