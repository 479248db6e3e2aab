"""What a population's final scores say: their mean, interquartile mean and percentile-bootstrap confidence intervals.

Reference: R. Agarwal, M. Schwarzer, P. S. Castro, A. Courville and M. G. Bellemare, 2021, "Deep Reinforcement Learning
at the Edge of the Statistical Precipice", NeurIPS (arXiv:2108.13264), and its library rliable.

* The interquartile mean (IQM) is rliable's ``aggregate_iqm``: ``scipy.stats.trim_mean(scores, 0.25)``, which drops
  ``floor(n / 4)`` scores from each end of the sorted scores and averages the rest. For n not divisible by 4 this trims
  less than a quarter (n = 5, 6, 7 drop one each side; n < 4 drops none), unlike the textbook IQM that weights the
  boundary scores by a fraction: rliable's figures are the rule here, so a summary reads the same as a paper's.
* rliable's confidence intervals come from a stratified bootstrap over runs within each task; one task (one env, P
  members) makes it the plain bootstrap over members (``bootstrap_ci``, numpy's linear interpolation).

Pure numpy: no torch, no process. A NaN or infinite score is refused in one line (a diverged member is a fact to report,
not a number to average).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from seedlocal.errors import fail

TRIM = 0.25  # the share trimmed from each end, rounded down to whole scores (rliable's IQM)
RESAMPLES = 2000  # rliable's default number of bootstrap draws
CONFIDENCE = 0.95


def scores_array(scores: Sequence[float] | np.ndarray, field: str = "scores") -> np.ndarray:
    """``scores`` as a float64 vector; refuses none, more than one dimension, NaN and infinities."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        fail(field, scores, "expected a non-empty list of numbers, one per member")
    bad = np.flatnonzero(~np.isfinite(x))
    if len(bad):
        fail(field, scores, f"member {int(bad[0])}'s score is {x[bad[0]]}: a population's statistics need "
                            "finite scores")
    return x


def trimmed_mean(x: np.ndarray, trim: float = TRIM) -> np.ndarray:
    """The mean of each row of ``x`` [..., n] without its ``floor(trim * n)`` lowest and highest (scipy's rule)."""
    n = x.shape[-1]
    cut = int(trim * n)
    return np.sort(x, axis=-1)[..., cut:n - cut].mean(axis=-1)


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """The interquartile mean of the scores, as rliable's ``aggregate_iqm`` computes it."""
    return float(trimmed_mean(scores_array(scores)))


def bootstrap_ci(scores: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], np.ndarray] = trimmed_mean,
                 resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of ``statistic`` over members: ``resamples`` draws of n members with
    replacement from ``np.random.default_rng(seed)`` (all at once, [resamples, n], which is the same stream as
    one draw of n after another), ``statistic`` of each row (it takes [resamples, n], returns [resamples])."""
    x = scores_array(scores)
    if resamples < 1:
        fail("resamples", resamples, "must be >= 1")
    if not 0 < confidence < 1:
        fail("confidence", confidence, "must lie strictly between 0 and 1")
    draws = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    values = statistic(x[draws])
    low, high = np.percentile(values, [50 * (1 - confidence), 50 * (1 + confidence)])
    return float(low), float(high)


@dataclass(frozen=True)
class PopulationSummary:
    """A population's final scores in the numbers a paper reports (rliable's): the mean and the IQM, each with
    its bootstrap interval, and the members ranked best first."""

    members: int
    mean: float
    mean_ci: tuple[float, float]
    iqm: float
    iqm_ci: tuple[float, float]
    confidence: float
    ranking: tuple[int, ...]


def summarize(scores: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
              seed: int = 0) -> PopulationSummary:
    """Mean, IQM, their percentile-bootstrap intervals (the same resamples for both) and the ranking (member indices,
    best score first; equal scores keep the lower index first)."""
    x = scores_array(scores)
    mean_ci = bootstrap_ci(x, lambda rows: rows.mean(axis=-1), resamples, confidence, seed)
    iqm_ci = bootstrap_ci(x, trimmed_mean, resamples, confidence, seed)
    ranking = tuple(int(i) for i in np.argsort(-x, kind="stable"))
    return PopulationSummary(len(x), float(x.mean()), mean_ci, float(trimmed_mean(x)), iqm_ci, confidence, ranking)
