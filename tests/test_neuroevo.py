"""Tests for the neuroevolution algorithms: seeds, GA, ES and random search."""

import io
import pickle
from dataclasses import asdict

import numpy as np
import pytest
import torch
from torch import nn

from seedlocal.algos import es, ga, random_search
from seedlocal.algos.neuroevo import ParamSpace, centered_ranks, new_seeds, noise, noise_table, noise_table_length
from seedlocal.errors import ConfigError

TARGET = torch.linspace(-1.0, 1.0, 10)


def toy_fitness(theta: torch.Tensor) -> torch.Tensor:
    """-||theta - target||^2, row-wise for a [P, 10] matrix."""
    return -((theta.reshape(-1, 10) - TARGET) ** 2).sum(-1)


def mlp_space() -> ParamSpace:
    return ParamSpace(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)))


def weights_only_roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# -- shared pieces ----------------------------------------------------------------


def test_param_space_init_is_deterministic_and_seed_dependent():
    space = mlp_space()
    assert space.size == 4 * 16 + 16 + 16 * 2 + 2
    a, b, c = space.init(7), space.init(7), space.init(8)
    assert a.dtype == torch.float32 and a.shape == (space.size,)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_param_space_init_leaves_the_global_rng_alone():
    space = mlp_space()  # building the template draws from the global RNG itself
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    space.init(3)
    assert torch.equal(torch.rand(3), expected)


def test_param_space_stack():
    space = mlp_space()
    vec = space.init(5)
    assert torch.equal(space.stack([vec, vec + 1]), torch.stack([vec, vec + 1]))
    assert space.stack([]).shape == (0, space.size)  # a rank with no member of a small population


def test_noise_is_deterministic():
    assert torch.equal(noise(3, 100), noise(3, 100))
    assert not torch.equal(noise(3, 100), noise(4, 100))
    assert noise(3, 100).dtype == torch.float32
    # Pinned values: genomes stored by an older run must rebuild the same
    # vectors, so a change in the table or torch's CPU generator has to be noticed.
    assert noise(12345, 4).tolist() == pytest.approx([1.1650299, 1.4095559, -0.4212222, -0.3691930], abs=1e-6)


def test_noise_is_a_slice_of_one_shared_table():
    """Seeds name offsets into one table drawn once (Salimans et al.'s shared
    noise): no generator runs per perturbation, and a seed's vector is the
    table at its offset, whatever the vector's length."""
    size = 1000
    table = noise_table(noise_table_length(size))
    assert noise_table(noise_table_length(size)) is table  # drawn once per process
    assert table.numel() >= 8 * size and table.numel() & (table.numel() - 1) == 0
    for seed in (0, 7, 2**31 - 1):
        v = noise(seed, size)
        offset = seed % (table.numel() - size + 1)
        assert v.data_ptr() == table[offset:].data_ptr()  # a view, not a copy
        assert torch.equal(v, table[offset:offset + size])
    assert abs(float(table.mean())) < 1e-3 and abs(float(table.std()) - 1) < 1e-3
    big = noise(5, 3_000_000)  # a Nature-CNN-sized vector gets a table 8x its size
    assert big.numel() == 3_000_000 and noise_table_length(3_000_000) >= 24_000_000


def test_new_seeds_are_31_bit_python_ints():
    seeds = new_seeds(np.random.default_rng(0), 1000)
    assert all(type(s) is int and 0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == 1000


def reference_centered_ranks(x: list[float]) -> list[float]:
    n = len(x)
    if n == 1:
        return [0.0]
    out = []
    for v in x:  # a tie shares the mean of the positions it spans
        below, equal = sum(u < v for u in x), sum(u == v for u in x)
        out.append((below + (equal - 1) / 2) / (n - 1) - 0.5)
    return out


@pytest.mark.parametrize("values", [[3.0], [1.0, -1.0], [0.5, 2.0, -7.0, 2.0, 0.0, 11.0, 0.5], list(range(20))[::-1]])
def test_centered_ranks_match_reference(values):
    r = centered_ranks(torch.tensor(values))
    assert r.tolist() == pytest.approx(reference_centered_ranks(values), abs=1e-7)
    assert float(r.min()) >= -0.5 and float(r.max()) <= 0.5
    assert abs(float(r.mean())) < 1e-6
    if len(values) > 1:
        assert float(r[int(np.argmin(values))]) == -0.5
        assert float(r[len(values) - 1 - int(np.argmax(values[::-1]))]) == 0.5


def test_centered_ranks_put_nan_last():
    assert centered_ranks(torch.tensor([1.0, float("nan"), 0.0])).tolist() == [0.5, -0.5, 0.0]


def test_tied_fitness_shares_its_rank_and_a_tied_pair_does_not_move_es():
    # MinAtar Breakout early on: most members score 0 or 1. Ranking ties by position would give each tied
    # antithetic pair (+e, -e) a weight of -1/(P-1) and step the centre along -e for no reason.
    r = centered_ranks(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 3.0]))
    assert r.tolist() == pytest.approx([0.2, 0.2, -0.3, -0.3, -0.3, 0.5])
    p = es.ESParams(population_size=4, sigma=0.1)
    state = es.init(torch.zeros(6), seed=3)
    seeds, _ = es.ask(state, p)
    g = es.gradient(state, p, seeds, [1.0, 1.0, 2.0, 0.0])
    torch.testing.assert_close(g, (0.5 - -0.5) * noise(seeds[1], 6) / (4 * 0.1))
    assert torch.count_nonzero(es.gradient(state, p, seeds, [0.0, 0.0, 0.0, 0.0])) == 0


# -- GA ---------------------------------------------------------------------------


def rebuild(genome, space: ParamSpace, sigma: float) -> torch.Tensor:
    """The parameter vector a genome stands for, from its initialisation up."""
    vec = space.init(genome[0])
    for s in genome[1:]:
        vec = ga.mutate(vec, s, sigma)
    return vec


def test_rebuild_equals_incremental_mutation_bit_for_bit():
    space, sigma = mlp_space(), 0.05
    genome = (11,)
    vec = space.init(11)
    sizes = [len(pickle.dumps(genome))]
    for seed in new_seeds(np.random.default_rng(1), 20):
        vec = ga.mutate(vec, seed, sigma)
        genome = genome + (seed,)
        sizes.append(len(pickle.dumps(genome)))
    assert len(genome) == 21
    assert torch.equal(rebuild(genome, space, sigma), vec)
    assert all(0 < b - a < 16 for a, b in zip(sizes, sizes[1:]))


class GenomeVectors:
    """Vectors by genome, each child built from its parent's with one mutation."""

    def __init__(self, space: ParamSpace, sigma: float):
        self.space, self.sigma, self.known = space, sigma, {}

    def __call__(self, genome):
        if genome not in self.known:
            if len(genome) == 1:
                self.known[genome] = self.space.init(genome[0])
            else:
                self.known[genome] = ga.mutate(self(genome[:-1]), genome[-1], self.sigma)
        return self.known[genome]


def test_ga_improves_the_toy_fitness():
    p = ga.GAParams(population_size=32, truncation=8, sigma=0.05, elite_candidates=2, elite_episodes=1)
    vectors = GenomeVectors(ParamSpace(nn.Linear(10, 1, bias=False)), p.sigma)
    state = ga.init(p, seed=0)
    best = []
    for _ in range(50):
        fitness = [float(toy_fitness(vectors(g))) for g in state.genomes]
        best.append(max(fitness))
        candidates = ga.tell(state, p, fitness)
        state = ga.advance(state, p, fitness, [[float(toy_fitness(vectors(c)))] for c in candidates])
    assert best[-1] > best[0] / 20  # fitness is negative: the error shrank > 20x
    assert all(b >= a for a, b in zip(best, best[1:]))  # deterministic fitness + elitism
    assert torch.equal(rebuild(state.elite, vectors.space, p.sigma), vectors(state.elite))


def test_ga_elite_and_children():
    p = ga.GAParams(population_size=10, truncation=3, sigma=0.1, elite_candidates=2, elite_episodes=2)
    state = ga.init(p, seed=4)
    assert len(state.genomes) == 10 and all(len(g) == 1 for g in state.genomes)
    fitness = [float(i) for i in range(10)]  # the last genome is the best
    candidates = ga.tell(state, p, fitness)
    assert candidates == [state.genomes[9], state.genomes[8]]
    # The runner-up wins the re-evaluation: it, not the best single score, is the elite.
    nxt = ga.advance(state, p, fitness, [[1.0, 1.0], [5.0, 3.0]])
    assert nxt.elite == state.genomes[8] and nxt.genomes[0] == nxt.elite
    assert nxt.generation == 1 and len(nxt.genomes) == 10
    parents = set(state.genomes[7:])
    for child in nxt.genomes[1:]:
        assert child[:-1] in parents and len(child) == 2

    # Next generation: the previous elite is a candidate even when it scores worst,
    # and, winning again, is carried over unchanged.
    fitness2 = [-100.0] + [float(i) for i in range(9)]
    candidates2 = ga.tell(nxt, p, fitness2)
    assert candidates2 == [nxt.genomes[9], nxt.genomes[8], nxt.elite]
    nxt2 = ga.advance(nxt, p, fitness2, [[0.0], [0.0], [9.0, 9.0]])
    assert nxt2.genomes[0] == nxt.elite
    for child in nxt2.genomes[1:]:
        assert child[:-1] in set(nxt.genomes[7:]) and len(child) == 3


def test_ga_is_reproducible_and_its_state_is_plain():
    p = ga.GAParams(population_size=6, truncation=2, elite_candidates=1, elite_episodes=1)
    fitness = [0.0, 5.0, 1.0, 2.0, 3.0, 4.0]

    def step(state):
        return ga.advance(state, p, fitness, [[0.0] for _ in ga.tell(state, p, fitness)])

    a, b = step(ga.init(p, 3)), step(ga.init(p, 3))
    assert a == b and step(ga.init(p, 4)) != a
    restored = ga.GAState(**weights_only_roundtrip(asdict(a)))
    assert restored == a and step(restored) == step(a)


# -- ES ---------------------------------------------------------------------------


def test_es_perturbations_are_antithetic_and_reproducible():
    p = es.ESParams(population_size=6, sigma=0.1)
    state = es.init(torch.randn(12), seed=2)
    seeds, X = es.ask(state, p)
    assert len(seeds) == 3 and X.shape == (6, 12)
    for i, s in enumerate(seeds):
        assert torch.equal(X[2 * i], state.theta + p.sigma * noise(s, 12))
        assert torch.equal(X[2 * i + 1], state.theta - p.sigma * noise(s, 12))
        torch.testing.assert_close(X[2 * i] + X[2 * i + 1], 2 * state.theta)
    assert es.ask(state, p)[0] == seeds  # asking is pure


def test_es_gradient_matches_plain_loop():
    p = es.ESParams(population_size=8, sigma=0.2)
    state = es.init(torch.randn(5), seed=9)
    seeds, X = es.ask(state, p)
    fitness = [3.0, -1.0, 0.5, 0.5, 7.0, 2.0, -4.0, 1.0]
    ranks = reference_centered_ranks(fitness)
    expected = [0.0] * 5
    for i, s in enumerate(seeds):
        eps = noise(s, 5).tolist()
        for j in range(5):
            expected[j] += (ranks[2 * i] - ranks[2 * i + 1]) * eps[j] / (8 * 0.2)
    g = es.gradient(state, p, seeds, fitness)
    assert g.tolist() == pytest.approx(expected, abs=1e-6)

    # The first Adam step (m = v = 0) moves each coordinate by ~lr along the ascent direction.
    new = es.tell(state, p, seeds, fitness)
    ascent = g - p.weight_decay * state.theta
    torch.testing.assert_close(new.theta - state.theta, p.learning_rate * torch.sign(ascent), atol=1e-5, rtol=0)
    assert new.t == 1 and new.generation == 1
    assert es.ask(new, p)[0] != seeds


def test_es_maximises_the_toy_fitness():
    p = es.ESParams(population_size=20)
    state = es.init(torch.zeros(10), seed=0)
    start = float((state.theta - TARGET).norm())
    for _ in range(300):
        seeds, X = es.ask(state, p)
        state = es.tell(state, p, seeds, toy_fitness(X))
    assert float((state.theta - TARGET).norm()) < start / 10


def test_es_state_survives_weights_only_save():
    p = es.ESParams(population_size=4)
    state = es.init(torch.arange(3.0), seed=1)
    seeds, X = es.ask(state, p)
    state = es.tell(state, p, seeds, [1.0, 2.0, 3.0, 4.0])
    restored = es.ESState(**weights_only_roundtrip(asdict(state)))
    assert torch.equal(restored.theta, state.theta) and torch.equal(restored.v, state.v)
    assert restored.t == state.t and es.ask(restored, p)[0] == es.ask(state, p)[0]


# -- random search ----------------------------------------------------------------


def test_random_search_keeps_the_best():
    p = random_search.RSParams(population_size=4)
    state = random_search.init(seed=0)
    assert state.best_seed is None
    seeds = random_search.ask(state, p)
    state = random_search.tell(state, [1.0, 3.0, float("nan"), 2.0])
    assert (state.best_seed, state.best_fitness) == (seeds[1], 3.0)
    seeds2 = random_search.ask(state, p)
    assert set(seeds2) != set(seeds)
    state = random_search.tell(state, [0.0, 2.5, 1.0, -1.0])  # no improvement
    assert (state.best_seed, state.best_fitness) == (seeds[1], 3.0)
    seeds3 = random_search.ask(state, p)
    state = random_search.tell(state, [0.0, 4.0, 1.0, 4.0])  # ties keep the earlier
    assert (state.best_seed, state.best_fitness) == (seeds3[1], 4.0)
    assert state.generation == 3


# -- validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "validate, params, message",
    [
        (ga.validate, ga.GAParams(population_size=10, truncation=20),
         r"^algo\.truncation=20: must be <= algo\.population_size \(10\)"),
        (ga.validate, ga.GAParams(sigma=0.0), r"^algo\.sigma=0\.0: must be > 0"),
        (ga.validate, ga.GAParams(sigma=-0.1), r"^algo\.sigma=-0\.1: must be > 0"),
        (ga.validate, ga.GAParams(population_size=1, truncation=1, elite_candidates=1), r"^algo\.population_size=1"),
        (ga.validate, ga.GAParams(truncation=2, elite_candidates=3), r"^algo\.elite_candidates=3"),
        (ga.validate, ga.GAParams(elite_episodes=0), r"^algo\.elite_episodes=0"),
        (es.validate, es.ESParams(population_size=7), r"^algo\.population_size=7: must be even \(antithetic pairs\)"),
        (es.validate, es.ESParams(sigma=0.0), r"^algo\.sigma=0\.0: must be > 0"),
        (es.validate, es.ESParams(sigma=float("nan")), r"^algo\.sigma=nan"),
        (es.validate, es.ESParams(learning_rate=-1.0), r"^algo\.learning_rate=-1\.0"),
        (es.validate, es.ESParams(weight_decay=-0.1), r"^algo\.weight_decay=-0\.1"),
        (random_search.validate, random_search.RSParams(population_size=0), r"^algo\.population_size=0"),
    ],
)
def test_validate_names_the_field(validate, params, message):
    with pytest.raises(ConfigError, match=message):
        validate(params)


def test_defaults_are_valid():
    ga.validate(ga.GAParams())
    es.validate(es.ESParams())
    random_search.validate(random_search.RSParams())
    with pytest.raises(ConfigError, match=r"^algo\.truncation"):
        ga.validate(ga.GAParams(truncation=0))
