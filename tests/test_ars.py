"""Augmented Random Search (algos/ars.py) against a naive per-direction loop."""

from __future__ import annotations

import io
from dataclasses import asdict

import numpy as np
import pytest
import torch

from seedlocal.algos import ars
from seedlocal.algos.neuroevo import noise
from seedlocal.errors import ConfigError
from helpers import prepared

NAN, INF = float("nan"), float("inf")


def naive_step(theta, p, seeds, fitness):
    """Algorithm 2 of Mania et al., one direction at a time, in float64."""
    f = np.array([-np.inf if np.isnan(x) else x for x in fitness], np.float64)
    finite = f[np.isfinite(f)]
    ranked = sorted(range(len(seeds)), key=lambda k: (-max(f[2 * k], f[2 * k + 1]), k))[:p.top]
    f = np.clip(f, finite.min(), finite.max())
    kept = [(f[2 * k], f[2 * k + 1]) for k in ranked]
    sigma_r = np.std([r for pair in kept for r in pair]) or 1.0
    g = np.zeros(theta.numel())
    for k, (plus, minus) in zip(ranked, kept):
        g += (plus - minus) * noise(seeds[k], theta.numel()).double().numpy()
    return p.step_size / (p.top * sigma_r) * g


def quadratic(params, target):
    return (-((params - target) ** 2).sum(1)).tolist()


def weights_only_roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# NaN on both sides of direction 2, on one side of direction 4 (its other side ranks it);
# directions 1 and 3 tie on their better side (4.0), direction 3's pair is itself a tie.
FITNESS = [3.0, 1.0, 0.5, 7.0, NAN, NAN, 4.0, 4.0, NAN, 2.5, -1.0, 4.0]


@pytest.mark.parametrize("top", [1, 2, 3, 4, 6])
def test_the_step_equals_a_per_direction_loop(top):
    p = ars.ARSParams(directions=6, top=top, step_size=0.05, noise=0.1)
    state = ars.ARSState(theta=torch.linspace(-1, 1, 12), generation=3, rng={"seed": 7})
    seeds, _ = ars.ask(state, p)
    got = ars.step(state, p, seeds, FITNESS).double().numpy()
    np.testing.assert_allclose(got, naive_step(state.theta, p, seeds, FITNESS), rtol=1e-6, atol=1e-8)


def test_the_step_without_ties_or_nan():
    p = ars.ARSParams(directions=16, top=5, step_size=0.02, noise=0.03)
    state = ars.init(50, seed=11)
    seeds, _ = ars.ask(state, p)
    fitness = np.random.default_rng(0).normal(100.0, 30.0, 32).tolist()
    got = ars.step(state, p, seeds, fitness).double().numpy()
    np.testing.assert_allclose(got, naive_step(state.theta, p, seeds, fitness), rtol=1e-6, atol=1e-8)


def test_ask_orders_pairs_plus_then_minus():
    p = ars.ARSParams(directions=3, noise=0.1)
    state = ars.ARSState(theta=torch.arange(5.0), generation=0, rng={"seed": 1})
    seeds, params = ars.ask(state, p)
    assert len(seeds) == 3 and params.shape == (6, 5) and p.population_size == 6
    for k, s in enumerate(seeds):
        torch.testing.assert_close(params[2 * k], state.theta + 0.1 * noise(s, 5), rtol=0, atol=0)
        torch.testing.assert_close(params[2 * k + 1], state.theta - 0.1 * noise(s, 5), rtol=0, atol=0)


def test_top_b_ranks_by_the_better_side_ties_by_index_nan_last():
    f = torch.tensor([1.0, 5.0, 5.0, 0.0, -INF, 9.0, 2.0, 2.0, -INF, -INF, 5.0, 5.0], dtype=torch.float64)
    assert ars.top_directions(f, 6).tolist() == [2, 0, 1, 5, 3, 4]
    assert ars.top_directions(f, 2).tolist() == [2, 0]
    # Many ties: large enough that an unstable sort would reorder them.
    f = torch.tensor(np.random.default_rng(0).integers(0, 3, 6000), dtype=torch.float64)
    best = f.reshape(-1, 2).max(1).values.tolist()
    assert ars.top_directions(f, 1000).tolist() == sorted(range(3000), key=lambda k: (-best[k], k))[:1000]


def test_top_b_of_the_fitness_as_given():
    """Through ``step``: the kept directions are the ones whose delta makes it."""
    p = ars.ARSParams(directions=6, top=3, step_size=1.0, noise=0.1)
    state = ars.init(8, seed=0)
    seeds, _ = ars.ask(state, p)
    # better sides: 3, 7, nan, 4, 2.5, 4 -> directions 1, 3, 5 (3 and 5 tie; both kept at b = 3)
    g = ars.step(state, p, seeds, FITNESS)
    kept = torch.stack([noise(seeds[k], 8).double() for k in (1, 3, 5)])
    weights = torch.tensor([0.5 - 7.0, 4.0 - 4.0, -1.0 - 4.0], dtype=torch.float64)
    sigma_r = torch.tensor([0.5, 7.0, 4.0, 4.0, -1.0, 4.0], dtype=torch.float64).std(unbiased=False)
    torch.testing.assert_close(g.double(), weights @ kept / (3 * sigma_r), rtol=1e-6, atol=1e-8)
    # b = 2: the tie at 4 goes to the lower index (3, not 5)
    g2 = ars.step(state, ars.ARSParams(directions=6, top=2, step_size=1.0), seeds, FITNESS)
    sigma_r2 = torch.tensor([0.5, 7.0, 4.0, 4.0], dtype=torch.float64).std(unbiased=False)
    torch.testing.assert_close(g2.double(), (0.5 - 7.0) * kept[0] / (2 * sigma_r2), rtol=1e-6, atol=1e-8)


def test_a_diverged_side_counts_as_the_worst_finite_return():
    p = ars.ARSParams(directions=2, top=2, step_size=1.0, noise=0.1)
    state = ars.init(4, seed=0)
    seeds, _ = ars.ask(state, p)
    torch.testing.assert_close(ars.step(state, p, seeds, [NAN, 3.0, 1.0, 2.0]),
                               ars.step(state, p, seeds, [1.0, 3.0, 1.0, 2.0]))
    torch.testing.assert_close(ars.step(state, p, seeds, [INF, 3.0, 1.0, 2.0]),
                               ars.step(state, p, seeds, [3.0, 3.0, 1.0, 2.0]))


@pytest.mark.parametrize("fitness", [[2.0] * 8, [NAN] * 8, [5.0, NAN, 5.0, NAN, NAN, 5.0, 5.0, 5.0]])
def test_no_information_is_no_step(fitness):
    p = ars.ARSParams(directions=4, top=2)
    state = ars.ARSState(theta=torch.ones(6), generation=0, rng={"seed": 0})
    seeds, _ = ars.ask(state, p)
    after = ars.tell(state, p, seeds, fitness)
    assert torch.equal(after.theta, state.theta)


def test_fitness_must_match_the_directions():
    p = ars.ARSParams(directions=4)
    state = ars.init(3, seed=0)
    seeds, _ = ars.ask(state, p)
    with pytest.raises(ValueError, match="7 fitness values for 4 directions"):
        ars.tell(state, p, seeds, [0.0] * 7)


def test_ask_is_a_pure_function_of_the_state_and_tell_advances_it():
    p = ars.ARSParams()
    state = ars.init(30, seed=1)
    s1, x1 = ars.ask(state, p)
    s2, x2 = ars.ask(state, p)
    assert s1 == s2 and torch.equal(x1, x2)
    assert ars.ask(ars.init(30, seed=2), p)[0] != s1
    fitness = np.arange(2 * p.directions, dtype=float)
    nxt = ars.tell(state, p, s1, fitness)
    assert nxt.generation == 1 and state.generation == 0 and nxt.rng == state.rng
    assert torch.equal(nxt.theta, state.theta + ars.step(state, p, s1, fitness))
    assert ars.ask(nxt, p)[0] != s1
    # a state rebuilt from its fields asks the same generation
    same = ars.ARSState(theta=nxt.theta.clone(), generation=1, rng={"seed": 1})
    assert ars.ask(same, p)[0] == ars.ask(nxt, p)[0]


def test_state_survives_weights_only_save():
    p = ars.ARSParams(directions=4, top=2)
    state = ars.init(10, seed=5)
    seeds, params = ars.ask(state, p)
    state = ars.tell(state, p, seeds, quadratic(params, torch.ones(10)))
    restored = ars.ARSState(**weights_only_roundtrip(asdict(state)))
    assert torch.equal(restored.theta, state.theta)
    assert (restored.generation, restored.rng) == (state.generation, state.rng)
    assert ars.ask(restored, p)[0] == ars.ask(state, p)[0]


@pytest.mark.parametrize("field, value, message", [
    ("directions", 0, "algo.directions=0: must be >= 1"),
    ("top", 9, "algo.top=9: must be in [1, algo.directions (8)]"),
    ("top", 0, "algo.top=0: must be in [1, algo.directions (8)]"),
    ("step_size", float("nan"), "algo.step_size=nan: must be > 0"),
    ("step_size", -0.01, "algo.step_size=-0.01: must be > 0"),
    ("noise", 0.0, "algo.noise=0.0: must be > 0"),
])
def test_bad_values_are_named(field, value, message):
    with pytest.raises(ConfigError) as e:
        ars.validate(ars.ARSParams(**{field: value}))
    assert str(e.value) == message


def test_the_defaults_are_valid_and_a_refusal_names_the_field():
    ars.validate(ars.ARSParams())
    with pytest.raises(ConfigError, match=r"^algo\.noise="):
        ars.validate(ars.ARSParams(noise=-1.0))


def test_ars_finds_a_linear_target():
    """Maximise -|theta - target|^2 from theta = 0: the toy problem random search must solve."""
    target = torch.linspace(-1, 1, 10)
    p = ars.ARSParams(directions=16, top=8, step_size=0.1, noise=0.2)
    state = ars.init(10, seed=0)
    start = float(((state.theta - target) ** 2).sum())
    for _ in range(40):
        seeds, params = ars.ask(state, p)
        state = ars.tell(state, p, seeds, quadratic(params, target))
    assert state.generation == 40
    assert float(((state.theta - target) ** 2).sum()) < 1e-3 * start


def test_a_pair_its_centre_and_the_checkpoint_share_one_set_of_observation_statistics(tmp_path, monkeypatch):
    """ARS V2 on the pipeline (Pendulum, 3 generations): the statistics are
    committed once a generation, before the next population is submitted,
    and each job keeps those it was submitted with, so a generation's pairs
    and the centre scored beside them are normalised alike; the checkpoint
    holds the statistics its state's population plays under."""
    from seedlocal import checkpoint
    from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig
    from seedlocal.normalize import RunningNorm
    from seedlocal.policies.population import PopulationPolicy
    from seedlocal.recipes.neuroevolution import ARSRun
    from seedlocal.trainers.neuroevolution import train

    jobs = []  # (spare, statistics) of every job, in submission order
    submit = PopulationPolicy.submit

    def recorded(self, params, episodes, front=False, spare=False):
        job = submit(self, params, episodes, front=front, spare=spare)
        jobs.append((spare, job.stats.clone()))
        return job

    monkeypatch.setattr(PopulationPolicy, "submit", recorded)
    train(prepared(ARSRun(env=EnvConfig(id="Pendulum-v1"), generations=3, network=NetworkConfig(hidden=(), obs_norm=True), best_episodes=2,
                 pipeline=PipelineConfig(num_workers=1, envs_per_worker=8, unroll_length=8), log_dir=str(tmp_path),
                 run_name="a", progress=False)))
    # population 1, its centre, population 2, its centre, ..., population 4 (submitted, not awaited)
    assert [spare for spare, _ in jobs] == [False, True] * 3 + [False]
    populations, centres = [s for spare, s in jobs if not spare], [s for spare, s in jobs if spare]
    for g, centre in enumerate(centres):
        assert torch.equal(centre, populations[g]), g
        assert not torch.equal(populations[g + 1], populations[g]), g  # each generation's observations, committed
    saved = RunningNorm(populations[0].numel() // 2)
    saved.load_state_dict(checkpoint.load(tmp_path / "a")["obs_norm"])
    assert torch.equal(torch.cat([saved.mean, saved.scale()]).float(), populations[-1])
