"""A population of V-trace learners in one run (issue 46): members own whole env groups and learn only from
their own unrolls, act from their own networks and generators in one inference call, report rliable's
statistics, sweep, run PBT through the trainer's own step, resume whole, and refuse what does not fit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import seedlocal
from conftest import leaked_segments, live_children
from seedlocal.api import _prepared

# Two workers of 8 envs: 4 groups of 4, one or two per member; each member's batch one or two unrolls.
SMALL = dict(pipeline={"num_workers": 2, "envs_per_worker": 8, "unroll_length": 16}, algo={"batch_size": 16},
             network={"hidden": (16,)}, progress=False, log_every_s=0.5)


def _trainer(**population):
    from seedlocal.trainers.population import PopulationTrainer

    prepared = _prepared("vtrace", {**SMALL, "population": population, "log_dir": "unused"})
    return PopulationTrainer(prepared, torch.device("cpu"))


def _train(tmp_path, **overrides) -> dict:
    s = seedlocal.train("vtrace", **{**SMALL, "log_dir": str(tmp_path), **overrides})
    assert not live_children() and not leaked_segments()
    return s.data


def test_each_members_batches_hold_only_its_own_groups_unrolls(tmp_path, monkeypatch):
    """Routing (the production run): every batch a member learns from was filled by its own groups only, every
    member learned, and each member's episodes are counted apart and add up to the run's."""
    from seedlocal.trainers.population import PopulationTrainer

    seen: list[tuple[int, list[int], int]] = []
    batch = PopulationTrainer._batch

    def spy(self, mb, fetched):
        seen.append((mb.index, list(fetched.groups), self.groups_per_member))
        return batch(self, mb, fetched)

    monkeypatch.setattr(PopulationTrainer, "_batch", spy)
    data = _train(tmp_path, total_steps=6_000, population={"size": 4})
    assert {m for m, _, _ in seen} == {0, 1, 2, 3}
    for member, groups, per in seen:
        assert all(g // per == member for g in groups), (member, groups)
    members = data["population"]["members"]
    assert sum(m["episodes"] for m in members) == data["episodes"] and all(m["episodes"] for m in members)
    steps = [m["steps"] for m in members]
    assert 4 * min(steps) >= max(steps), steps  # none starved by the others (the box's load moves the shares)


def test_a_members_actions_do_not_depend_on_the_other_members_rows():
    """The one inference call: each row is its own member's network's output, and a member's sampled actions
    are the same whether its rows are served alone or beside another member's rows (its own generator)."""
    t = _trainer(size=2)
    policy = t.policy()
    E = policy.envs_per_member
    obs = {"": torch.randn(2 * E, 4)}
    ids = np.arange(2 * E)
    for mb in t.members:
        mb.sampling.manual_seed(7)
    actions, out, _ = policy.act(obs, None, ids, np.zeros(2 * E, bool))
    for m, mb in enumerate(t.members):
        with torch.no_grad():
            own, _ = mb.model({"": obs[""][m * E:(m + 1) * E]})
        torch.testing.assert_close(out["logits"][m * E:(m + 1) * E], own.float())
    assert not torch.equal(out["logits"][:E], out["logits"][E:])  # two networks, not one
    t.members[1].sampling.manual_seed(7)
    alone, _, _ = policy.act({"": obs[""][E:]}, None, ids[E:], np.zeros(E, bool))
    assert torch.equal(alone, actions[E:])
    mixed = np.random.default_rng(0).permutation(2 * E)  # members' rows interleaved, as a batch collects them
    for mb in t.members:
        mb.sampling.manual_seed(7)
    actions, _, _ = policy.act({"": obs[""][mixed]}, None, ids[mixed], np.zeros(2 * E, bool))
    for m, mb in enumerate(t.members):
        rows = np.flatnonzero(ids[mixed] // E == m)
        mb.sampling.manual_seed(7)
        alone, _, _ = policy.act({"": obs[""][mixed[rows]]}, None, ids[mixed[rows]], np.zeros(len(rows), bool))
        assert torch.equal(alone, actions[rows])


def _reference_summary(scores):
    """rliable's IQM (trim floor(n/4) each end) and the percentile bootstrap over members, written out."""
    x = np.sort(np.asarray(scores, dtype=np.float64))
    cut = len(x) // 4
    draws = np.random.default_rng(0).integers(0, len(x), size=(2000, len(x)))
    boot = np.sort(np.asarray(scores)[draws], axis=1)[:, cut:len(x) - cut].mean(axis=1)
    return x[cut:len(x) - cut].mean(), tuple(np.percentile(boot, [2.5, 97.5]))


def test_seeds_summary_matches_a_reference_computation(tmp_path):
    data = _train(tmp_path, total_steps=6_000, population={"size": 4})
    pop = data["population"]
    finals = [m["mean_return_last20"] for m in pop["members"]]
    iqm, ci = _reference_summary(finals)
    s = pop["summary"]
    assert s["members"] == 4 and s["iqm"] == pytest.approx(iqm) and s["iqm_ci"] == pytest.approx(list(ci))
    assert s["mean"] == pytest.approx(np.mean(finals))
    assert pop["best"] == int(np.argmax(finals)) and data["mean_return_last20"] == max(finals)
    assert next(tmp_path.glob("*/population.csv")).read_text().startswith("run_steps,member")
    assert next(tmp_path.glob("*/population.svg")).read_text().count("<polyline") == 5  # 4 members and the IQM
    saved = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert saved["population"]["summary"] == s


def test_a_population_stops_at_its_target_and_says_when(tmp_path):
    """--stop-at-return stops the run once a member's last-20 mean reaches it, and the summary says at which step
    (such a run once failed at its closing line, for want of frames_to_target)."""
    data = _train(tmp_path, total_steps=50_000, stop_at_return=15, population={"size": 2})
    assert data["stopped_by"] == "target" and data["return_at_target"] >= 15
    assert data["frames_to_target"] == data["steps_to_target"] <= data["steps"]


def test_eval_plays_the_best_member_by_default_or_the_one_asked(tmp_path, capsys):
    data = _train(tmp_path, total_steps=3_000, population={"size": 2})
    run_dir, best = data["run_dir"], data["population"]["best"]
    seedlocal.evaluate(run_dir, episodes=1)
    assert f"(member {best}) at" in capsys.readouterr().out
    seedlocal.evaluate(run_dir, episodes=1, member=1 - best)
    assert f"(member {1 - best}) at" in capsys.readouterr().out
    with pytest.raises(seedlocal.SeedlocalError, match="member 2 is not there: its population has members 0..1"):
        seedlocal.evaluate(run_dir, episodes=1, member=2)


@pytest.mark.parametrize("overrides, words", [
    (dict(population={"size": 8}), "members own whole env groups: the run's 4 groups"),
    (dict(population={"size": 3}), "do not divide among 3 members; give --pipeline.num-workers 3 "),
    (dict(population={"size": 6}), "do not divide among 6 members; give --pipeline.num-workers 3 "),
    (dict(population={"size": 4}, algo={"batch_size": 8}), "algo.batch_size=8: each member learns"),
    (dict(population={"size": 2}, learners=2), "not yet supported"),
    (dict(population={"size": 2}, network={"lstm_size": 8}), "not yet with a population"),
    (dict(population={"size": 2, "sweep": ("learning_rate=1e-3,1e-4",)}), "is for --population.mode sweep or pbt"),
    (dict(population={"size": 2, "mode": "sweep", "sweep": ("learnin_rate=1e-3,1e-4",)}),
     "did you mean learning_rate"),
    (dict(population={"size": 2, "mode": "sweep", "sweep": ("init_std=1,2",)}), "no hyperparameter init_std"),
    (dict(population={"size": 2, "mode": "sweep", "sweep": ("learning_rate=abc",)}),
     "population.sweep='learning_rate=abc': 'abc' is not a finite number, which learning_rate is"),
    (dict(population={"size": 2, "mode": "pbt", "sweep": ("learning_rate=nan,1e-3",)}), "nan is not a finite number"),
    (dict(population={"size": 2, "mode": "pbt", "perturb": ("learnin_rate",)}),
     "population.perturb='learnin_rate': no hyperparameter learnin_rate; did you mean learning_rate?"),
    (dict(population={"size": 2, "mode": "sweep", "sweep": ("clip=0.5,2",)}), "algo.clip=2"),
    (dict(population={"size": 1, "mode": "pbt"}), "needs population.size >= 2"),
    (dict(population={"size": 2}, network={"hidden": (16,), "obs_norm": True}), "obs_norm=True: not yet"),
    (dict(population={"size": 2, "mode": "pbt", "quantile": 0.7}), "population.quantile"),
])
def test_what_does_not_fit_is_refused_in_one_line(overrides, words, tmp_path):
    with pytest.raises(seedlocal.SeedlocalError) as e:
        seedlocal.train("vtrace", **{**SMALL, "log_dir": str(tmp_path), **overrides})
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


def test_r2d2_refuses_a_population_not_yet(tmp_path):
    with pytest.raises(seedlocal.SeedlocalError, match="population.size=2: not yet for R2D2"):
        seedlocal.train("r2d2", log_dir=str(tmp_path), population={"size": 2})


def test_a_sweep_gives_each_member_its_values_and_ranks_them(tmp_path):
    data = _train(tmp_path, total_steps=4_000,
                  population={"size": 4, "mode": "sweep", "sweep": ("learning_rate=1e-3,3e-3", "entropy_cost=1e-3..1e-1")})
    pop = data["population"]
    lrs = [m["values"]["learning_rate"] for m in pop["members"]]
    assert lrs == [1e-3, 3e-3, 1e-3, 3e-3]
    costs = [m["values"]["entropy_cost"] for m in pop["members"]]
    assert len(set(costs)) == 4 and all(1e-3 <= c <= 1e-1 for c in costs)
    finals = [m["mean_return_last20"] for m in pop["members"]]
    assert list(pop["summary"]["ranking"]) == sorted(range(4), key=lambda m: (-finals[m], m))


class _Texts:
    def __init__(self):
        self.lines = []

    def text(self, tag, value, step=0):
        self.lines.append((tag, value))


def test_a_pbt_exploit_copies_weights_and_optimizer_state_exactly():
    """The trainer's own PBT step: the bottom member becomes its donor (every parameter, Adam's moments and step
    counts), in its rows of the stack that inference reads; it then explores the donor's values; the lineage
    and TensorBoard's text say so."""
    t = _trainer(size=4, mode="pbt", sweep=("learning_rate=1e-4..1e-2",), quantile=0.25, interval=100)
    for mb in t.members:  # optimizer state of its own for each member
        loss = sum((p * torch.randn_like(p)).sum() for p in mb.model.parameters())
        loss.backward()
        mb.optimizer.step()
        mb.optimizer.zero_grad()
    for mb, scores in zip(t.members, ([1.0], [5.0], [9.0], [3.0])):
        mb.recent.extend(scores)
        mb.counters["steps"] = 100
    texts = _Texts()
    records = t.pbt_step(texts)
    assert [(r.member, r.donor) for r in records] == [(0, 2)]
    low, top = t.members[0], t.members[2]
    for (name, a), b in zip(low.model.state_dict().items(), top.model.state_dict().values()):
        assert torch.equal(a, b), name
    sa, sb = low.optimizer.state_dict()["state"], top.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for key in sa[i]:
            assert torch.equal(sa[i][key], sb[i][key]), (i, key)
            assert sa[i][key].data_ptr() != sb[i][key].data_ptr()  # a copy, not the donor's own tensors
    for name, row in t.stack.params.items():
        assert torch.equal(row[0], row[2]), name
    t.stack.check()
    r = records[0]
    assert r.copied == top.values and low.values == r.new and t.lineage == [dataclasses.asdict(r)]
    assert texts.lines and texts.lines[0][0] == "population/lineage" and "member 0" in texts.lines[0][1]
    assert not low.recent and t.next_round == 200


def test_a_resumed_pbt_population_continues_every_members_curve_and_the_lineage(tmp_path):
    """PBT rounds in a real run (the lineage in summary.json), then a resume from its checkpoint: every member goes
    on from its own counters, its curve goes on past the checkpoint, and the lineage keeps the first session's
    records ahead of the new ones."""
    pbt = {"size": 2, "mode": "pbt", "interval": 600, "sweep": ("learning_rate=1e-4..1e-2",)}
    first = seedlocal.train("vtrace", **{**SMALL, "log_dir": str(tmp_path)}, total_steps=6_000, population=pbt)
    pop1 = first.data["population"]
    assert pop1["lineage"] and all(r["member"] != r["donor"] for r in pop1["lineage"])
    second = seedlocal.train("vtrace", resume=str(first.run_dir), total_steps=12_000, progress=False)
    pop2 = second.data["population"]
    assert pop2["lineage"][:len(pop1["lineage"])] == pop1["lineage"]
    assert len(pop2["lineage"]) > len(pop1["lineage"])
    for a, b in zip(pop1["members"], pop2["members"]):
        assert b["steps"] > a["steps"] and b["updates"] > a["updates"] and b["episodes"] > a["episodes"]
    for m in range(2):
        steps, _ = second.scalars(f"member_{m}/charts/steps")
        assert min(steps) <= first.data["steps"] < max(steps)
        assert second.scalars(f"member_{m}/hyper/learning_rate")[1]
    for tag in ("population/best", "population/median", "population/iqm"):
        assert max(second.scalars(tag)[0]) > first.data["steps"]
    assert not live_children() and not leaked_segments()


def test_the_command_line_builds_the_population_the_keywords_build():
    from seedlocal.cli import _parse

    argv = ["train", "vtrace", "--population.size", "2", "--population.mode", "pbt", "--population.sweep",
            "learning_rate=1e-4..1e-2", "entropy_cost=0.01,0.03", "--population.perturb", "learning_rate"]
    cfg = _parse(argv)[1].config
    assert cfg == seedlocal.run_config("vtrace", population={
        "size": 2, "mode": "pbt", "sweep": ("learning_rate=1e-4..1e-2", "entropy_cost=0.01,0.03"),
        "perturb": ("learning_rate",)})
    assert cfg.population.sweep == ("learning_rate=1e-4..1e-2", "entropy_cost=0.01,0.03")


def test_pbt_draws_from_a_stream_apart_from_the_sweeps_starting_values():
    """The starting values are drawn from default_rng(seed) (``sweep_values``); PBT's rounds drew from a generator
    seeded the same, so its first donor choices and resamples reused the numbers that had set the starting values."""
    t = _trainer(size=4, mode="pbt", sweep=("learning_rate=1e-4..1e-2",), seed=3)
    assert not np.array_equal(t.pbt_rng.random(8), np.random.default_rng(3).random(8))


def test_pbt_perturbs_within_the_sweeps_range_or_a_decade_each_side_capped():
    from seedlocal.algos.pbt import LogUniform
    from seedlocal.recipes.vtrace import pbt_space

    cfg = seedlocal.run_config("vtrace", preset="minatar", population={
        "size": 2, "mode": "pbt", "sweep": ("learning_rate=1e-4..1e-2",),
        "perturb": ("learning_rate", "entropy_cost", "clip", "reward_clip")})
    space = pbt_space(cfg)
    assert space["learning_rate"] == LogUniform(1e-4, 1e-2)
    assert space["entropy_cost"] == LogUniform(0.001, 0.1)
    assert space["clip"] == LogUniform(pytest.approx(0.02), 0.99)
    assert "reward_clip" not in space  # 0 in this preset, and no range given


def test_members_learn_together_in_one_batched_update_where_asked(tmp_path, monkeypatch):
    """The GPU's path (``together``), run here on the CPU: every update is one ``population_learner_step`` for
    all members, so each member makes as many updates as the others, from its own batches."""
    from seedlocal.trainers import population

    calls = []
    step = population.population_learner_step

    def spy(stack, optimizers, batches, params, **kw):
        calls.append(len(batches))
        return step(stack, optimizers, batches, params, **kw)

    monkeypatch.setattr(population.PopulationTrainer, "together", lambda self: True)
    monkeypatch.setattr(population, "population_learner_step", spy)
    data = _train(tmp_path, total_steps=3_000, population={"size": 2})
    members = data["population"]["members"]
    assert calls and set(calls) == {2} and members[0]["updates"] == members[1]["updates"] == data["updates"] / 2
    assert all(m["episodes"] for m in members)


@pytest.mark.parametrize("together", [False, True])
def test_a_learning_step_reads_the_members_losses_in_one_conversion(together, monkeypatch):
    """Each member's loss enters its interval's sum as before, read from the device once for all members (on CUDA
    a float() per member was a sync per member)."""
    from types import SimpleNamespace

    from seedlocal.trainers import population

    t = _trainer(size=4)
    losses = torch.tensor([0.25, 1.5, -3.0, 7.0])

    def one(model, *args, **kw):
        return {"total_loss": losses[[mb.model for mb in t.members].index(model)].clone(), "updates": 2}

    monkeypatch.setattr(population, "learner_step", one)
    monkeypatch.setattr(population, "population_learner_step", lambda *a, **kw: {"total_loss": losses, "updates": 2})
    monkeypatch.setattr(t, "_learned", lambda *a: None)
    conversions = []
    to_float = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: conversions.append(1) or to_float(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a loss read with item()"))
    t._learn(SimpleNamespace(loop=SimpleNamespace(version=0)),
             [(mb, {"policy_version": np.zeros(4)}) for mb in t.members], together)
    assert not conversions and [mb.loss_sum for mb in t.members] == [0.25, 1.5, -3.0, 7.0]
    assert [mb.n for mb in t.members] == [1] * 4 and t.counters["updates"] == 8


@pytest.mark.slow
def test_eight_minatar_members_share_the_steps(tmp_path):
    """Issue 46's measured case: 8 MinAtar learners on 8 groups of 8 envs, one unroll per group. With freed unrolls
    going to the lowest parked group, member 0 learned from 8,192 of 12,000 steps and five members from 256 each;
    first parked, first resumed (``pipeline/unrolls.py``) gives every member its share."""
    data = _train(tmp_path, preset="minatar", pipeline={"num_workers": 4, "envs_per_worker": 16},
                  algo={"batch_size": 64}, network={}, total_steps=12_000, population={"size": 8})
    steps = [m["steps"] for m in data["population"]["members"]]
    assert 2 * min(steps) >= max(steps), steps


def test_a_population_refuses_ranks_that_torchrun_started_without_learners():
    """torchrun's ranks may leave --learners out (it counts 1 then, so the recipe's check passes): the trainer
    itself refuses to be one of several ranks, rather than each rank training a population of its own."""
    from seedlocal.errors import ConfigError
    from seedlocal.pipeline.ranks import Solo

    class TwoRanks(Solo):
        world = 2

    with pytest.raises(ConfigError, match="learners=2: vtrace has no data-parallel learner"):
        _trainer(size=2).join_ranks(TwoRanks())
