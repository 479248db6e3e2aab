"""A population's summary statistics against references computed here another way: the IQM by an explicit
sorted-trim loop (rliable's rule, scipy's trim_mean where scipy is installed), the bootstrap interval by numpy's own
resampling, one draw at a time."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from seedlocal.algos.population_stats import bootstrap_ci, iqm, summarize, trimmed_mean
from seedlocal.errors import ConfigError


def reference_iqm(scores) -> float:
    """rliable's IQM (scipy.stats.trim_mean(x, 0.25)) written out: sort, drop int(n / 4) from each end by hand."""
    ordered = sorted(float(s) for s in scores)
    cut = len(ordered) // 4
    kept = [ordered[i] for i in range(len(ordered)) if cut <= i < len(ordered) - cut]
    total = 0.0
    for s in kept:
        total += s
    return total / len(kept)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16])
def test_iqm_is_rliables_trimmed_mean_for_every_size(n):
    scores = np.random.default_rng(n).normal(10.0, 5.0, n)
    assert iqm(scores) == pytest.approx(reference_iqm(scores), rel=1e-12, abs=1e-12)
    if importlib.util.find_spec("scipy") is not None:
        from scipy.stats import trim_mean

        assert iqm(scores) == pytest.approx(float(trim_mean(scores, 0.25)), rel=1e-12, abs=1e-12)


def test_iqm_of_known_values():
    assert iqm([1.0, 2.0, 3.0, 100.0]) == 2.5  # the middle two of four
    assert iqm([7.0]) == 7.0
    assert iqm([1.0, 2.0, 30.0]) == 11.0  # fewer than four: nothing is trimmed, as in scipy
    assert iqm([5.0, 1.0, 9.0, 3.0, 7.0]) == 5.0  # one trimmed each side of five: mean of 3, 5, 7
    assert iqm([2.0, 2.0, 2.0, 2.0, 9.0, -9.0]) == 2.0  # ties


def reference_bootstrap(scores, statistic, resamples, confidence, seed):
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        sample = rng.choice(np.asarray(scores, dtype=np.float64), size=len(scores), replace=True)
        values.append(statistic(sample))
    tail = 100 * (1 - confidence) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


@pytest.mark.parametrize("n, seed", [(2, 0), (5, 1), (8, 2), (11, 3)])
def test_bootstrap_interval_matches_numpys_resampling(n, seed):
    scores = np.random.default_rng(100 + n).exponential(3.0, n)
    for statistic, ref in ((trimmed_mean, reference_iqm), (lambda rows: rows.mean(-1), np.mean)):
        got = bootstrap_ci(scores, statistic, resamples=500, confidence=0.95, seed=seed)
        want = reference_bootstrap(scores, ref, 500, 0.95, seed)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    narrower = bootstrap_ci(scores, resamples=500, confidence=0.5, seed=seed)
    wider = bootstrap_ci(scores, resamples=500, confidence=0.95, seed=seed)
    assert wider[0] <= narrower[0] <= narrower[1] <= wider[1]


def test_the_summary_is_seeded_and_consistent():
    scores = [3.0, 9.0, 4.0, 4.0, 12.0, 1.0, 7.0, 5.0]
    a, b = summarize(scores, resamples=300, seed=5), summarize(scores, resamples=300, seed=5)
    assert a == b
    assert a != summarize(scores, resamples=300, seed=6)
    assert a.members == 8 and a.mean == pytest.approx(np.mean(scores)) and a.iqm == reference_iqm(scores)
    assert a.mean_ci[0] <= a.mean <= a.mean_ci[1] and a.iqm_ci[0] <= a.iqm <= a.iqm_ci[1]
    assert a.ranking == (4, 1, 6, 7, 2, 3, 0, 5)  # the tie (members 2 and 3) keeps the lower index first
    assert dataclasses.asdict(a)["iqm_ci"] == a.iqm_ci


def test_one_member_and_equal_members_have_a_point_interval():
    one = summarize([4.5], resamples=50)
    assert (one.mean, one.iqm, one.mean_ci, one.iqm_ci, one.ranking) == (4.5, 4.5, (4.5, 4.5), (4.5, 4.5), (0,))
    same = summarize([2.0] * 6, resamples=50)
    assert same.iqm_ci == (2.0, 2.0) and same.ranking == tuple(range(6))


@pytest.mark.parametrize("bad, words", [
    ([1.0, float("nan"), 2.0], "member 1's score is nan"),
    ([float("inf")], "member 0's score is inf"),
    ([], "non-empty"),
    ([[1.0, 2.0]], "non-empty list"),
])
def test_bad_scores_are_refused_in_one_line(bad, words):
    with pytest.raises(ConfigError, match=words) as err:
        summarize(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        iqm(bad)


def test_bad_bootstrap_settings_are_refused():
    with pytest.raises(ConfigError, match="resamples=0"):
        bootstrap_ci([1.0, 2.0], resamples=0)
    with pytest.raises(ConfigError, match="confidence=1.0"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)
