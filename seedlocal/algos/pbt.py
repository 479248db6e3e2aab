"""Population-based training's exploit and explore, and a sweep's search space.

Reference: M. Jaderberg et al., 2017, "Population Based Training of Neural Networks", arXiv:1711.09846: every so often
each member of the bottom of the population (truncation selection) copies the weights and hyperparameters of a random
member of the top (*exploit*), then perturbs those hyperparameters (*explore*). The defaults are Ray Tune's
``PopulationBasedTraining``: quantile 0.25, resample probability 0.25, perturbation by x0.8 or x1.2.

Why x0.8 / x1.2 and not Sample Factory 2's x or / U[1.1, 1.5], applied with p = 0.15 per hyperparameter: it is the
paper's own explore for its RL runs and Ray's, so results compare with theirs; a small set of factors makes the lineage
readable (each step names its factor) and a run's walk of a value exact to replay (``PBTParams.factors``: any set).

A hyperparameter's distribution serves three ends: a sweep's values (``sweep_values``), PBT's resampling, and the
range a perturbation is clipped to. On the command line (``parse_space``) ``name=a,b,c`` is a list (``Choice``, whose
perturbation moves to a neighbouring value, as Ray's does) and ``name=lo..hi`` log-uniform on [lo, hi] (``LogUniform``).

Everything here but ``copy_member`` is plain data in, plain data out, with randomness from a numpy ``Generator`` the
caller owns (and checkpoints).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import itertools
import math
from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np
from torch import nn

from seedlocal.errors import fail


@dataclass(frozen=True)
class Choice:
    """One of a list of values, uniformly."""

    values: tuple

    def sample(self, rng: np.random.Generator):
        return self.values[int(rng.integers(len(self.values)))]


@dataclass(frozen=True)
class LogUniform:
    """Log-uniform on [low, high]."""

    low: float
    high: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(np.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def clip(self, x: float) -> float:
        return min(max(x, self.low), self.high)


Distribution = Choice | LogUniform


def _number(token: str):
    """A list value as written: an int, else a float, else the word itself (``adam``)."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(token)
    return token


def _distribution(field: str, item: str, value: str) -> Distribution:
    if ".." in value:
        low, _, high = value.partition("..")
        try:
            lo, hi = float(low), float(high)
        except ValueError:
            fail(field, item, "a range is lo..hi with two numbers, e.g. learning_rate=1e-4..1e-2")
        if not (0 < lo < hi) or not math.isfinite(hi):
            fail(field, item, "a log-uniform range needs 0 < lo < hi")
        return LogUniform(lo, hi)
    tokens = [t.strip() for t in value.split(",")]
    if not all(tokens):
        fail(field, item, "a list is a,b,c with no empty value, e.g. entropy_cost=0.003,0.01,0.03")
    return Choice(tuple(_number(t) for t in tokens))


def parse_space(items: Sequence[str], field: str = "population.sweep",
                known: Collection[str] | None = None) -> dict[str, Distribution]:
    """``name=a,b,c`` and ``name=lo..hi`` items -> {name: distribution}, in the order given. ``known``: the
    hyperparameters the family has; another name is refused with the nearest one. Every problem is one line
    naming ``field`` and the item."""
    space: dict[str, Distribution] = {}
    for item in items:
        name, eq, value = (s.strip() for s in str(item).partition("="))
        if not eq or not name or not value:
            fail(field, item, "expected name=a,b,c (a list) or name=lo..hi (log-uniform)")
        if name in space:
            fail(field, item, f"{name} is given twice")
        if known is not None and name not in known:
            fail(field, item, unknown_hyperparameter(name, known))
        space[name] = _distribution(field, item, value)
    return space


def unknown_hyperparameter(name: str, known: Collection[str]) -> str:
    """Why ``name`` is refused, with the nearest of ``known``."""
    near = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {near[0]}?" if near else f"it has {', '.join(sorted(known))}"
    return f"no hyperparameter {name}; {hint}"


def sweep_values(space: dict[str, Distribution], members: int, seed: int = 0) -> list[dict]:
    """One value per name for each of ``members`` members. The lists make a grid (every combination, the first
    name slowest), repeated to fill the population, so its size must divide ``members`` (8 members over
    lr=a,b: 4 seeds of each); each range is drawn for each member from ``np.random.default_rng(seed)``."""
    lists = {k: d.values for k, d in space.items() if isinstance(d, Choice)}
    grid = list(itertools.product(*lists.values()))
    if members % len(grid):
        fail("population.sweep", " ".join(f"{k}={','.join(map(str, v))}" for k, v in lists.items()),
             f"the lists make {len(grid)} combinations, which do not divide the {members} members")
    rng = np.random.default_rng(seed)
    combos = [dict(zip(lists, grid[m % len(grid)])) for m in range(members)]
    return [{k: c[k] if k in c else d.sample(rng) for k, d in space.items()} for c in combos]


# -- PBT ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PBTParams:
    """How a PBT round chooses and perturbs (defaults: Ray Tune's)."""

    quantile: float = 0.25
    """share of members in the bottom (they copy) and in the top (they are copied); SF2 uses 0.3"""
    resample_probability: float = 0.25
    """chance that a hyperparameter is drawn afresh from its distribution instead of perturbed"""
    factors: tuple[float, ...] = (0.8, 1.2)
    """a perturbation multiplies a range's value by one of these, chosen uniformly, then clips it to the range"""

    def check(self) -> None:
        if not 0 < self.quantile <= 0.5:
            fail("population.quantile", self.quantile, "must lie in (0, 0.5]: the bottom and the top may not overlap")
        if not 0 <= self.resample_probability <= 1:
            fail("population.resample_probability", self.resample_probability, "must lie in [0, 1]")
        if not self.factors or not all(f > 0 and math.isfinite(f) for f in self.factors):
            fail("population.factors", self.factors, "must be one or more positive numbers")


def quantiles(scores: Sequence[float], quantile: float) -> tuple[list[int], list[int]]:
    """(bottom, top): the members with the ``k`` lowest and the ``k`` highest scores, lowest first, ``k`` the
    smallest whole number of members at least ``quantile`` x P (to within rounding: 10 x 0.3 is 3), at most
    P / 2; none for fewer than 2 members (Ray Tune's rule). Equal scores: the lower index counts as lower."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or np.isnan(x).any():
        fail("scores", list(scores), "PBT needs one score per member, none NaN")
    n = len(x)
    k = min(math.ceil(n * quantile - 1e-9), n // 2)  # 0 for fewer than 2 members
    order = [int(i) for i in np.argsort(x, kind="stable")]
    return order[:k], order[n - k:]


def exploit(scores: Sequence[float], quantile: float, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(member, donor) pairs: each bottom member, in index order, with a top member drawn uniformly."""
    bottom, top = quantiles(scores, quantile)
    return [(m, top[int(rng.integers(len(top)))]) for m in sorted(bottom)]


def _perturb(value, dist: Distribution, p: PBTParams, rng: np.random.Generator) -> tuple[object, str]:
    """(new value, how) for one hyperparameter: resampled with ``p.resample_probability`` (or when a list's value
    is not in the list), else a list's neighbour (up or down, staying at an end) or a range's value times a
    factor, clipped to the range."""
    if (isinstance(dist, Choice) and value not in dist.values) or rng.random() < p.resample_probability:
        return dist.sample(rng), "resample"
    if isinstance(dist, Choice):
        i = dist.values.index(value)
        up = rng.random() < 0.5
        return dist.values[min(i + 1, len(dist.values) - 1) if up else max(i - 1, 0)], "up" if up else "down"
    factor = p.factors[int(rng.integers(len(p.factors)))]
    return dist.clip(float(value) * factor), f"x{factor:g}"


def explore(values: dict, space: dict[str, Distribution], p: PBTParams,
            rng: np.random.Generator) -> tuple[dict, dict[str, str]]:
    """``values`` with every hyperparameter of ``space`` perturbed (``_perturb``), in ``space``'s order; and how
    each one moved. Names outside ``space`` keep their values."""
    new, how = dict(values), {}
    for name, dist in space.items():
        if name not in values:
            fail("population.pbt", name, f"the member has no hyperparameter {name} (it has {', '.join(values)})")
        new[name], how[name] = _perturb(values[name], dist, p, rng)
    return new, how


@dataclass(frozen=True)
class Exploit:
    """One exploit and explore, as the lineage keeps it: at ``step`` member ``member`` (score ``score``) took the
    weights, optimizer state and hyperparameters of ``donor`` (``donor_score``) and explored them: its own
    values ``old``, the donor's ``copied``, the ones it goes on with ``new``, and how each moved (``how``)."""

    step: int
    member: int
    donor: int
    score: float
    donor_score: float
    old: dict
    copied: dict
    new: dict
    how: dict


def pbt_round(scores: Sequence[float], values: Sequence[dict], space: dict[str, Distribution], p: PBTParams,
              rng: np.random.Generator, step: int) -> tuple[list[dict], list[Exploit]]:
    """One PBT round over a population: every member's hyperparameters after it (the top and the middle keep
    theirs) and a record of each exploit. The caller copies each record's donor into its member
    (``copy_member``) and applies the new values."""
    if len(values) != len(scores):
        fail("scores", list(scores), f"one score per member: {len(values)} members")
    out = [dict(v) for v in values]
    records = []
    for member, donor in exploit(scores, p.quantile, rng):
        out[member], how = explore(values[donor], space, p, rng)
        records.append(Exploit(int(step), member, donor, float(scores[member]), float(scores[donor]),
                               dict(values[member]), dict(values[donor]), dict(out[member]), how))
    return out, records


def copy_member(donor: nn.Module, donor_optimizer, recipient: nn.Module, recipient_optimizer) -> None:
    """The recipient becomes the donor: weights and buffers copied into its own tensors (``load_state_dict``
    writes in place, so a recipient whose tensors are rows of a ``MemberStack`` stays one), and the optimizer's
    state (step counts, moments, and its param groups' values, the learning rate among them) as a deep copy:
    ``Optimizer.load_state_dict`` keeps the tensors it is given, which would otherwise be the donor's own.
    Under the learner's weight lock if the inference loop reads the recipient."""
    recipient.load_state_dict(donor.state_dict())
    recipient_optimizer.load_state_dict(copy.deepcopy(donor_optimizer.state_dict()))
