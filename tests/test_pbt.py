"""PBT's exploit and explore (Jaderberg et al. 2017, Ray Tune's defaults), a sweep's search space, and the exact copy
of a donor's weights and optimizer state into a recipient."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from seedlocal.algos.pbt import (Choice, LogUniform, PBTParams, copy_member, explore, exploit, parse_space,
                                 pbt_round, quantiles, sweep_values)
from seedlocal.errors import ConfigError

KNOWN = ("learning_rate", "entropy_cost", "clip", "max_grad_norm", "baseline_cost", "optimizer")


def test_a_space_reads_lists_and_log_uniform_ranges():
    space = parse_space(["learning_rate=1e-4..1e-2", "entropy_cost=0.003, 0.01,0.03", "optimizer=adam,rmsprop",
                         "max_grad_norm=1,40"], known=KNOWN)
    assert list(space) == ["learning_rate", "entropy_cost", "optimizer", "max_grad_norm"]
    assert space["learning_rate"] == LogUniform(1e-4, 1e-2)
    assert space["entropy_cost"] == Choice((0.003, 0.01, 0.03))
    assert space["optimizer"] == Choice(("adam", "rmsprop"))
    assert space["max_grad_norm"] == Choice((1, 40)) and isinstance(space["max_grad_norm"].values[0], int)


@pytest.mark.parametrize("item, words", [
    ("learning_rate", "expected name=a,b,c"),
    ("=1,2", "expected name=a,b,c"),
    ("clip=", "expected name=a,b,c"),
    ("learning_rate=1e-2..1e-4", "0 < lo < hi"),
    ("learning_rate=0..1e-2", "0 < lo < hi"),
    ("learning_rate=a..b", "two numbers"),
    ("entropy_cost=0.01,,0.1", "no empty value"),
    ("learning_rte=1e-4..1e-3", "did you mean learning_rate"),
    ("zzz=1", "it has baseline_cost, clip"),
])
def test_a_malformed_space_is_refused_in_one_line_naming_the_item(item, words):
    with pytest.raises(ConfigError, match=words) as err:
        parse_space([item], known=KNOWN)
    assert str(err.value).startswith(f"population.sweep={item!r}") and "\n" not in str(err.value)


def test_a_name_given_twice_is_refused():
    with pytest.raises(ConfigError, match="clip is given twice"):
        parse_space(["clip=0.1,0.2", "clip=0.3"])


def test_sweep_values_make_a_grid_of_the_lists_and_draw_the_ranges_per_member():
    space = parse_space(["learning_rate=1e-4..1e-2", "entropy_cost=0.01,0.03", "clip=0.1,0.2"])
    values = sweep_values(space, 8, seed=3)
    grid = [(0.01, 0.1), (0.01, 0.2), (0.03, 0.1), (0.03, 0.2)]
    assert [(v["entropy_cost"], v["clip"]) for v in values] == grid + grid  # first name slowest, then repeated
    lrs = [v["learning_rate"] for v in values]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 8
    assert values == sweep_values(space, 8, seed=3)
    assert lrs != [v["learning_rate"] for v in sweep_values(space, 8, seed=4)]
    rng = np.random.default_rng(3)  # the draws: one per member, in member order, log-uniform
    assert lrs == pytest.approx([math.exp(rng.uniform(math.log(1e-4), math.log(1e-2))) for _ in range(8)])


def test_a_grid_that_does_not_divide_the_population_is_refused():
    with pytest.raises(ConfigError, match="3 combinations, which do not divide the 8 members"):
        sweep_values(parse_space(["clip=0.1,0.2,0.3"]), 8)
    assert len(sweep_values(parse_space(["learning_rate=1e-3..1e-2"]), 5)) == 5  # ranges alone fit any size


@pytest.mark.parametrize("scores, q, bottom, top", [
    ([1.0, 2.0], 0.25, [0], [1]),
    ([5.0, 1.0, 3.0], 0.25, [1], [0]),
    ([4.0, 3.0, 2.0, 1.0], 0.25, [3], [0]),
    ([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0], 0.25, [1, 3], [2, 0]),
    ([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0], 0.3, [1, 3, 5], [4, 2, 0]),  # ceil(2.4) = 3
    (list(range(10)), 0.3, [0, 1, 2], [7, 8, 9]),  # 10 x 0.3 is 3, not ceil(3.0000000000000004)
    ([1.0, 2.0, 3.0], 0.5, [0], [2]),  # at most half: a member is never both
    ([2.0, 2.0, 2.0, 2.0], 0.25, [0], [3]),  # ties: the lower index counts as lower
    ([7.0], 0.25, [], []),
])
def test_quantiles_of_small_populations(scores, q, bottom, top):
    assert quantiles(scores, q) == (bottom, top)


def test_a_nan_score_is_refused():
    with pytest.raises(ConfigError, match="none NaN"):
        quantiles([1.0, float("nan"), 2.0], 0.25)


def test_exploit_pairs_each_bottom_member_with_a_random_top_member_by_seed():
    scores = [8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]
    pairs = exploit(scores, 0.25, np.random.default_rng(0))
    assert [m for m, _ in pairs] == [1, 3] and all(d in (0, 2) for _, d in pairs)
    assert pairs == exploit(scores, 0.25, np.random.default_rng(0))
    donors = {d for s in range(40) for _, d in exploit(scores, 0.25, np.random.default_rng(s))}
    assert donors == {0, 2}


def test_explore_perturbs_by_a_factor_within_the_range_or_resamples():
    space = {"learning_rate": LogUniform(1e-4, 1e-2), "clip": Choice((0.1, 0.2, 0.3))}
    seen = set()
    for s in range(30):
        new, how = explore({"learning_rate": 1e-3, "clip": 0.2, "other": 7}, space,
                           PBTParams(resample_probability=0.0), np.random.default_rng(s))
        assert new["other"] == 7
        assert (how["learning_rate"], new["learning_rate"]) in (("x0.8", pytest.approx(8e-4)),
                                                               ("x1.2", pytest.approx(1.2e-3)))
        assert (how["clip"], new["clip"]) in (("down", 0.1), ("up", 0.3))
        seen.add((how["learning_rate"], how["clip"]))
    assert len(seen) == 4
    new, how = explore({"learning_rate": 1e-2, "clip": 0.3}, space, PBTParams(resample_probability=0.0,
                       factors=(1.5,)), np.random.default_rng(0))
    assert new["learning_rate"] == 1e-2  # clipped to the range
    assert new["clip"] in (0.2, 0.3)  # at the end of the list an up stays there
    for s in range(20):
        new, how = explore({"learning_rate": 5.0, "clip": 0.25}, space, PBTParams(resample_probability=1.0),
                           np.random.default_rng(s))
        assert how == {"learning_rate": "resample", "clip": "resample"}
        assert 1e-4 <= new["learning_rate"] <= 1e-2 and new["clip"] in (0.1, 0.2, 0.3)
    with pytest.raises(ConfigError, match="no hyperparameter clip"):
        explore({"learning_rate": 1e-3}, space, PBTParams(), np.random.default_rng(0))


def test_a_pbt_round_records_every_exploit_and_is_seeded():
    scores = [3.0, 9.0, 1.0, 5.0]
    values = [{"learning_rate": lr, "entropy_cost": 0.01} for lr in (1e-4, 1e-3, 3e-3, 5e-4)]
    space = parse_space(["learning_rate=1e-5..1e-1"])
    new, records = pbt_round(scores, values, space, PBTParams(), np.random.default_rng(2), step=5_000_000)
    assert len(records) == 1
    r = records[0]
    assert (r.step, r.member, r.donor, r.score, r.donor_score) == (5_000_000, 2, 1, 1.0, 9.0)
    assert r.old == values[2] and r.copied == values[1] and r.new == new[2]
    assert new[2]["entropy_cost"] == 0.01 and r.how["learning_rate"] in ("x0.8", "x1.2", "resample")
    assert [new[i] for i in (0, 1, 3)] == [values[i] for i in (0, 1, 3)]
    assert json.loads(json.dumps(dataclasses.asdict(r))) == dataclasses.asdict(r)  # a lineage log's line as it is
    again, records_again = pbt_round(scores, values, space, PBTParams(), np.random.default_rng(2), 5_000_000)
    assert (again, records_again) == (new, records)
    with pytest.raises(ConfigError, match="one score per member"):
        pbt_round(scores[:3], values, space, PBTParams(), np.random.default_rng(2), 0)


@pytest.mark.parametrize("field, value", [("quantile", 0.6), ("quantile", 0.0), ("resample_probability", 1.5),
                                          ("factors", ()), ("factors", (0.8, -1.0))])
def test_bad_pbt_params_are_refused(field, value):
    with pytest.raises(ConfigError, match=f"population.{field}="):
        PBTParams(**{field: value}).check()


def _trained(seed: int, optimizer: str):
    from seedlocal.algos.vtrace import VTraceParams, make_optimizer

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = make_optimizer(net.parameters(), VTraceParams(optimizer=optimizer, learning_rate=1e-2 * (seed + 1)))
    for _ in range(seed + 2):
        opt.zero_grad()
        net(torch.randn(16, 4)).square().mean().backward()
        opt.step()
    return net, opt


def _optimizer_tensors(opt) -> list[torch.Tensor]:
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_copy_member_copies_weights_and_optimizer_state_exactly_and_apart(optimizer):
    donor, donor_opt = _trained(0, optimizer)
    recipient, recipient_opt = _trained(1, optimizer)
    copy_member(donor, donor_opt, recipient, recipient_opt)
    for a, b in zip(donor.parameters(), recipient.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    donor_state, recipient_state = _optimizer_tensors(donor_opt), _optimizer_tensors(recipient_opt)
    assert len(donor_state) == len(recipient_state) > 0
    for a, b in zip(donor_state, recipient_state):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert recipient_opt.param_groups[0]["lr"] == donor_opt.param_groups[0]["lr"]
    assert recipient_opt.state_dict()["state"].keys() == donor_opt.state_dict()["state"].keys()
    # The recipient's optimizer drives the recipient's own parameters, not the donor's.
    assert [id(p) for p in recipient_opt.param_groups[0]["params"]] == [id(p) for p in recipient.parameters()]

    kept = [t.clone() for t in (*recipient.parameters(), *recipient_state)]
    donor_opt.zero_grad()
    donor(torch.randn(16, 4)).square().mean().backward()
    donor_opt.step()  # the donor moves on; the recipient must not
    assert all(torch.equal(a, b) for a, b in zip(kept, (*recipient.parameters(), *recipient_state)))
    assert not all(torch.equal(a, b) for a, b in zip(donor.parameters(), recipient.parameters()))
