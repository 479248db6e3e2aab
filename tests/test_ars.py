"""Augmented Random Search (algos/ars.py) against a naive per-direction loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlocal.algos import ars
from seedlocal.algos.neuroevo import noise
from seedlocal.errors import ConfigError


def naive_step(theta, p, seeds, fitness):
    f = np.array([-np.inf if np.isnan(x) else x for x in fitness], np.float64).reshape(-1, 2)
    finite = f[np.isfinite(f)]
    f = np.where(np.isfinite(f), f, finite.min())
    order = sorted(range(len(f)), key=lambda k: (-f[k].max(), k))[:p.top]
    kept = f[order]
    sigma = kept.std() or 1.0
    g = np.zeros(theta.numel())
    for k in order:
        g += (f[k, 0] - f[k, 1]) * noise(seeds[k], theta.numel()).double().numpy()
    return p.step_size / (p.top * sigma) * g


@pytest.mark.parametrize("top", [1, 3, 5])
def test_the_step_equals_a_per_direction_loop(top):
    p = ars.ARSParams(directions=5, top=top, step_size=0.05, noise=0.1)
    state = ars.init(12, seed=3)
    seeds, params = ars.ask(state, p)
    assert params.shape == (10, 12)
    for k, s in enumerate(seeds):  # ordered [+1, -1, +2, -2, ...]
        torch.testing.assert_close(params[2 * k], state.theta + 0.1 * noise(s, 12))
        torch.testing.assert_close(params[2 * k + 1], state.theta - 0.1 * noise(s, 12))
    fitness = [3.0, 1.0, 0.5, 7.0, float("nan"), 2.0, 4.0, 4.0, -1.0, 0.0]
    got = ars.step(state, p, seeds, fitness).double().numpy()
    np.testing.assert_allclose(got, naive_step(state.theta, p, seeds, fitness), rtol=1e-5, atol=1e-7)
    after = ars.tell(state, p, seeds, fitness)
    assert after.generation == 1 and torch.equal(after.theta, state.theta + ars.step(state, p, seeds, fitness))


def test_top_directions_rank_by_the_better_side_ties_by_index_nan_last():
    f = torch.tensor([1.0, 5.0, 5.0, 0.0, float("-inf"), 9.0, 2.0, 2.0, -np.inf, -np.inf], dtype=torch.float64)
    assert ars.top_directions(f, 5).tolist() == [2, 0, 1, 3, 4]


def test_ask_is_a_pure_function_of_the_state():
    p = ars.ARSParams()
    state = ars.init(30, seed=1)
    s1, x1 = ars.ask(state, p)
    s2, x2 = ars.ask(state, p)
    assert s1 == s2 and torch.equal(x1, x2)
    nxt = ars.tell(state, p, s1, np.arange(2 * p.directions, dtype=float))
    assert ars.ask(nxt, p)[0] != s1


@pytest.mark.parametrize("field, value, message", [
    ("directions", 0, "algo.directions=0: must be >= 1"),
    ("top", 9, "algo.top=9: must be in [1, algo.directions (8)]"),
    ("step_size", float("nan"), "algo.step_size=nan: must be > 0"),
    ("noise", 0.0, "algo.noise=0.0: must be > 0"),
])
def test_bad_values_are_named(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ars.validate(ars.ARSParams(**{field: value}))


def test_ars_finds_a_linear_target():
    """Maximise -|theta - target|^2: the toy problem random search must solve."""
    target = torch.linspace(-1, 1, 10)
    p = ars.ARSParams(directions=8, top=4, step_size=0.02, noise=0.05)
    state = ars.init(10, seed=0)
    start = float(((state.theta - target) ** 2).sum())
    for _ in range(300):
        seeds, params = ars.ask(state, p)
        state = ars.tell(state, p, seeds, (-((params - target) ** 2).sum(1)).tolist())
    assert float(((state.theta - target) ** 2).sum()) < 0.01 * start
