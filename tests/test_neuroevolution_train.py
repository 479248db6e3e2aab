"""Neuroevolution end to end: population inference, the work queue, GA and ES learning."""

import contextlib
import dataclasses
import json
import re
from collections import deque
from types import MethodType, ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import prepared, tiny_pipeline
from seedlocal import checkpoint
from seedlocal.algos.neuroevo import ParamSpace
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.evaluate import EvalConfig
from seedlocal.evaluate import main as evaluate
from seedlocal.networks import PolicyNet
from seedlocal.recipes.neuroevolution import ESRun, GARun, RandomSearchRun
from seedlocal.trainers.neuroevolution import train
from seedlocal.policies.population import PopulationPolicy
from seedlocal.policies.population_forward import PopulationForward

GA_FRAME_BUDGET = 1_000_000  # CartPole-v1: best member >= 475 over 5 episodes within this many frames
ES_FRAME_BUDGET = 3_000_000


def _flats(nets):
    return torch.stack([torch.nn.utils.parameters_to_vector(n.parameters()) for n in nets])


@pytest.mark.parametrize("strategy", ["bmm", "mulsum", "vmap", "auto"])
def test_population_forward_equals_each_network_alone(strategy):
    """Slots loaded with members, served in runs of consecutive slots and in
    fragmented batches (gathered), give each network's own logits."""
    spec = validate_env(EnvConfig(id="CartPole-v1"))
    nets = [PolicyNet(spec) for _ in range(5)]
    fwd = PopulationForward(nets[0], num_slots=16, strategy=strategy)
    members = torch.tensor([3, 0, 4, 4, 1, 2, 0, 3, 1, 2, 2, 0, 1, 4, 3, 3])
    fwd.load(torch.arange(16), _flats(nets), members)
    obs = torch.randn(16, 4)
    batches = [np.arange(16), np.arange(3, 12), np.array([0, 1, 2, 8, 9, 15]), np.array([0, 2, 4, 6, 8, 10, 12, 14])]
    for _ in range(3):  # auto: every candidate timed on several batches, then settled
        for slots in batches:
            out = fwd(slots, {"": obs[slots]})
            for i, s in enumerate(slots.tolist()):
                torch.testing.assert_close(out[i], nets[members[s]]({"": obs[s:s + 1]})[0])
    assert fwd.strategy in ("bmm", "mulsum", "vmap")


def test_population_forward_reads_slot_rows_in_place():
    """A batch of consecutive slots is computed from views of the slot rows:
    the parameters are not copied per step (the slots are read, not gathered)."""
    spec = validate_env(EnvConfig(id="CartPole-v1"))
    nets = [PolicyNet(spec) for _ in range(2)]
    fwd = PopulationForward(nets[0], num_slots=8, strategy="bmm")
    fwd.load(torch.arange(8), _flats(nets), torch.tensor([0, 1] * 4))
    seen = []
    original = fwd._plan_forward
    fwd._plan_forward = lambda params, obs, m: seen.append(params) or original(params, obs, m)
    fwd(np.arange(2, 8), {"": torch.randn(6, 4)})
    assert seen[0].data_ptr() == fwd.slots[2].data_ptr() and seen[0].shape == (6, fwd.size)
    fwd.load(torch.tensor([5]), _flats(nets), torch.tensor([0]))  # a new job: one row rewritten
    torch.testing.assert_close(fwd.slots[5], fwd.to_slots(_flats(nets))[0])
    # The slot layout (weights [in, out]) read back as the member's own parameters, exactly.
    for name, p in nets[0].named_parameters():
        assert torch.equal(fwd.unflatten(fwd.slots[5])[name], p), name


@pytest.mark.parametrize("strategy", ["bmm", "vmap", "loop"])
def test_population_forward_nature_cnn(strategy):
    spec = validate_env(EnvConfig(id="Pong-v5"))
    nets = [PolicyNet(spec) for _ in range(2)]
    fwd = PopulationForward(nets[0], num_slots=3, strategy=strategy)
    fwd.load(torch.arange(3), _flats(nets), torch.tensor([1, 0, 1]))
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    out = fwd(np.arange(3), {"": obs})
    for i, m in enumerate([1, 0, 1]):
        torch.testing.assert_close(out[i], nets[m]({"": obs[i:i + 1]})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strategy", ["bmm", "vmap", "loop", "auto"])
def test_population_forward_minatar_grids(strategy):
    """MinAtar's (H, W, C) bool grids through the one-conv torso, each slot's
    own network: in runs of consecutive slots and gathered, every strategy
    gives what each network gives alone."""
    spec = validate_env(EnvConfig(id="grid_envs:BoolGrid-v0"))  # 10 x 10 x 4 bool grids, as MinAtar's
    nets = [PolicyNet(spec) for _ in range(3)]
    assert nets[0].kind == "minatar"
    fwd = PopulationForward(nets[0], num_slots=8, strategy=strategy)
    members = torch.tensor([2, 0, 1, 1, 2, 0, 0, 2])
    fwd.load(torch.arange(8), _flats(nets), members)
    obs = torch.rand(8, 10, 10, 4) < 0.2
    for _ in range(6):  # auto: timed on several batches, then settled
        for slots in (np.arange(8), np.arange(2, 7), np.array([0, 2, 3, 5, 7])):
            out = fwd(slots, {"": obs[slots]})
            for i, s in enumerate(slots.tolist()):
                torch.testing.assert_close(out[i], nets[members[s]]({"": obs[s:s + 1]})[0], rtol=1e-5, atol=1e-5)
    assert fwd.strategy in ("bmm", "vmap", "loop")


def test_a_forward_strategy_the_network_cannot_use_is_refused_before_the_run():
    """The recipe's refusal, one line naming the option (the forward itself no longer checks again)."""
    from seedlocal.api import _prepared
    from seedlocal.errors import ConfigError

    pong = {"env": {"id": "Pong-v5"}}
    with pytest.raises(ConfigError, match="forward='mulsum': expected one of auto, bmm, vmap, loop for a nature"):
        _prepared("ga", {**pong, "forward": "mulsum"})
    with pytest.raises(ConfigError, match="forward='bmm': expected one of auto, vmap, loop for a impala"):
        _prepared("ga", {**pong, "network": {"encoder": "impala"}, "forward": "bmm"})  # its residual blocks


def test_population_forward_builds_its_layer_plan_once(monkeypatch):
    """The plan gives the candidate strategies too: PopulationForward (and eval's ``serving``) walk the network
    once, not once for the plan and again for the candidates."""
    from seedlocal.policies import population_forward

    calls = []
    plan = population_forward._layer_plan
    monkeypatch.setattr(population_forward, "_layer_plan", lambda *a: calls.append(1) or plan(*a))
    net = PolicyNet(validate_env(EnvConfig(id="CartPole-v1")))
    fwd = PopulationForward(net, num_slots=2)
    assert len(calls) == 1 and fwd.candidates == ("bmm", "mulsum", "vmap")
    served = PopulationPolicy.serving(net, None, greedy=True)
    assert len(calls) == 2 and served.forward.strategy == "bmm"


@contextlib.contextmanager
def population_pipeline(num_groups: int, policy_options: dict | None = None, env: str = "CartPole-v1",
                        net_options: dict | None = None, **pipe):
    """A pipeline of ``env`` whose inference loop serves a PopulationPolicy of
    ``num_groups`` groups of 4 envs (``policy_options`` its keyword
    arguments; ``net_options`` the PolicyNet's), wired as the trainer wires
    it; yields (spec, policy, pipe) with the loop not yet running."""
    spec = validate_env(EnvConfig(id=env))
    template = PolicyNet(spec, **(net_options or {}))
    holder = {}

    def make(s, device):
        holder["p"] = PopulationPolicy(template, 4, num_groups, device, **(policy_options or {}))
        return holder["p"]

    with tiny_pipeline(make, env=env, consume=False, **pipe) as p:
        yield spec, holder["p"], p


def test_work_queue_serves_every_job_once_and_nothing_else():
    """Each (member, episode) job gets one episode; forward rows = steps of those
    episodes exactly (CartPole: return == length), so idle slots cost no compute."""
    with population_pipeline(4, num_workers=2, envs_per_worker=8) as (spec, policy, pipe):
        import threading

        t = threading.Thread(target=pipe.loop.run_until_stopped, daemon=True)
        t.start()
        try:
            params = torch.stack([torch.nn.utils.parameters_to_vector(PolicyNet(spec).parameters()) for _ in range(7)])
            results = policy.submit(params, episodes=3).wait()  # 21 jobs on 16 slots: a queue, then a tail
            second = policy.submit(params[:2], episodes=1).wait()  # held groups come back on fresh episodes
        finally:
            pipe.loop.request_stop()
            t.join(10)
    assert [len(r) for r in results] == [3] * 7 and [len(r) for r in second] == [1, 1]
    served = sum(sum(r) for r in results) + sum(sum(r) for r in second)
    assert policy.forward_envs == served
    # Greedy members are deterministic, but episodes start from different states.
    assert all(1 <= x <= 500 for r in results for x in r)


def test_the_policy_does_not_hold_the_loop_that_holds_it():
    """The loop holds its policy; the policy reaches the loop through none of
    its attributes (its Unhold, made with it, holds the loop's wake-up, not
    the loop), and submitting work still wakes the loop."""
    with population_pipeline(1, num_workers=1, envs_per_worker=8) as (spec, policy, pipe):
        assert pipe.loop.policy is policy
        seen, todo = set(), [policy]
        while todo:  # what the policy reaches through attributes, containers and bound methods
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, (torch.Tensor, np.ndarray, str, bytes, int, float, type,
                                                   ModuleType)):
                continue
            seen.add(id(obj))
            assert obj is not pipe.loop and obj is not pipe.pool, f"the policy reaches {type(obj).__name__}"
            if isinstance(obj, MethodType):
                todo.append(obj.__self__)
            elif isinstance(obj, (list, tuple, set, frozenset, deque)):
                todo.extend(obj)
            elif isinstance(obj, dict):
                todo.extend(obj.values())
            elif hasattr(obj, "__dict__"):
                todo.extend(vars(obj).values())
        while pipe.pool.obs_ready.try_acquire():  # the workers' first wake-ups (the loop is not running)
            pass
        policy.submit(_flats([PolicyNet(spec)]), episodes=1)
        assert pipe.pool.obs_ready.try_acquire()  # the loop's wake-up
        assert policy.unhold.take()  # which then serves held groups again


def test_spare_jobs_take_only_the_slots_other_jobs_leave():
    """ES scores its centre as spare work: it starts on a slot only when no
    population job waits, so it never pushes a member into another wave."""
    with population_pipeline(1, num_workers=1, envs_per_worker=8) as (spec, policy, pipe):
        # The loop does not run: plan() is driven by hand below, for group 0.
        nets = _flats([PolicyNet(spec) for _ in range(3)])
        centre = policy.submit(nets[:1], episodes=3, spare=True)
        population = policy.submit(nets[1:], episodes=1)
        group, ret = np.array([0]), np.zeros((1, 4), np.float32)
        everyone = np.ones((1, 4), bool)
        nobody = np.zeros((1, 4), bool)
        policy.plan(group, everyone, nobody, ret)
        # Both members first, then the centre in the two slots left.
        assert [policy._env_job[i] for i in range(4)] == [population, population, centre, centre]
        assert population.pending == 2 and len(policy._spare) == 1
        more = policy.submit(nets[1:2], episodes=1)  # a population job arrives: it goes before the spare one
        slot0 = np.array([[True, False, False, False]])
        policy.plan(group, slot0, slot0, ret + 9.0)
        assert policy._env_job[0] is more and population.returns[0] == [9.0] and len(policy._spare) == 1
        policy.plan(group, slot0, slot0, ret + 7.0)
        assert policy._env_job[0] is centre and not policy._spare and more.done.is_set()


@pytest.mark.parametrize("strategy", ["bmm", "mulsum", "vmap"])
def test_a_job_normalises_every_step_by_the_statistics_it_was_submitted_with(strategy):
    """Observation statistics committed while a job plays do not reach its
    episodes: every step of a job reads the statistics committed when it was
    submitted (so an ARS pair is scored under one normalisation), and a job
    submitted after the commit reads the new ones, in the same batch. Driven
    through plan, act and commit_obs_stats by hand, on a Box env so that the
    actions are the networks' outputs."""
    from seedlocal.policies.population_norm import OBS_STATS_EVERY

    with population_pipeline(1, {"strategy": strategy}, env="Pendulum-v1", net_options={"obs_norm": True},
                             num_workers=1, envs_per_worker=8) as (spec, policy, pipe):
        # The loop does not run: plan() and act() are driven by hand below, for group 0's 4 slots.
        nets = [PolicyNet(spec, obs_norm=True) for _ in range(2)]
        group, ret, nobody = np.array([0]), np.zeros((1, 4), np.float32), np.zeros((1, 4), bool)
        x = torch.randn(4, 3)  # the observation every check reads

        def act(obs):
            return policy.act({"": obs}, env_ids=np.arange(4))[0]

        first = policy.submit(_flats(nets), episodes=1)  # the statistics are the identity so far
        policy.plan(group, np.array([[True, True, False, False]]), nobody, ret)
        assert [policy._env_job[i] for i in range(4)] == [first, first, None, None]
        before = act(x)[:2]
        far = torch.Generator().manual_seed(0)  # seeded: 2 rows are gathered, and a draw may fall near 0
        for _ in range(OBS_STATS_EVERY):  # observations far from the identity's (mean 0, std 1)
            act(5.0 + 3.0 * torch.randn(4, 3, generator=far))
        policy.commit_obs_stats()  # mid-job, as the trainer's commit is for the episodes still playing
        committed = policy.forward.template.obs_norm
        assert float(committed.count) > 0 and float(committed.mean.mean()) > 2.0

        second = policy.submit(_flats(nets), episodes=1)
        policy.plan(group, np.array([[False, False, True, True]]), nobody, ret)  # beside the first job's
        assert [policy._env_job[i] for i in range(4)] == [first, first, second, second]
        after = act(x)

    torch.testing.assert_close(after[:2], before, rtol=0, atol=0)  # the first job: one normalisation throughout
    with torch.no_grad():
        for i, net in enumerate(nets):  # slot i plays member i of the first job, slot 2 + i of the second
            torch.testing.assert_close(before[i], net({"": x[i:i + 1]})[0])  # the identity, as submitted
            old = net({"": x[2 + i:3 + i]})[0]
            net.obs_norm.load_state_dict(committed.state_dict())
            torch.testing.assert_close(after[2 + i], net({"": x[2 + i:3 + i]})[0])  # the second: the new ones,
            assert not torch.allclose(after[2 + i], old)  # which differ from the first's


def test_ga_learns_cartpole(tmp_path):
    cfg = GARun(generations=0, total_frames=GA_FRAME_BUDGET, stop_at_return=475, log_dir=str(tmp_path),
                run_name="ga", progress=False)
    summary = train(prepared(cfg))
    assert summary["frames_to_target"] is not None and summary["frames_to_target"] <= GA_FRAME_BUDGET, summary
    assert summary["best_member_return"] >= 475
    state = checkpoint.load(tmp_path / "ga")
    genomes = state["algo_state"]["genomes"]
    assert len(genomes) == cfg.algo.population_size
    assert all(len(g) <= state["counters"]["generation"] + 1 for g in genomes)  # one seed per generation
    out = evaluate(EvalConfig(checkpoint=str(tmp_path / "ga"), episodes=5))
    assert out["policy"] == "argmax"  # as the GA acted in training, without being told
    # The elite, replayed on fresh seeds: it passed 475 on its training episodes, and on 5 new ones it ended at
    # 241.8 once in a full suite (over 300 in 4 of 4 runs alone). Random play lasts about 22 steps, an untrained
    # argmax policy about 10: 150 still says the elite, not a new member, plays.
    assert out["mean"] >= 150


def test_es_learns_cartpole(tmp_path):
    cfg = ESRun(generations=0, total_frames=ES_FRAME_BUDGET, stop_at_return=475, log_dir=str(tmp_path),
                run_name="es", progress=False)
    summary = train(prepared(cfg))
    assert summary["frames_to_target"] is not None and summary["frames_to_target"] <= ES_FRAME_BUDGET, summary


@pytest.mark.parametrize("run", [GARun, ESRun, RandomSearchRun])
def test_resume_restores_each_algorithm_bitwise_and_continues(tmp_path, run):
    """Two generations; a resume whose budget is spent restores, runs nothing
    and saves the same state bitwise; a resume with one more generation
    continues from it (one TensorBoard curve, steps 1, 2, 3)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_train_vtrace import assert_same_state

    first = train(prepared(run(generations=2, log_dir=str(tmp_path), run_name="b", progress=False)))
    saved = checkpoint.load(tmp_path / "b")
    train(prepared(run(generations=2, log_dir=str(tmp_path), resume=str(tmp_path / "b"), progress=False)))
    restored = checkpoint.load(tmp_path / "b")
    for key in ("algo_state", "best_params", "best_return", "counters", "identity"):
        assert_same_state(saved[key], restored[key], key)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["algo"] == {GARun: "ga", ESRun: "es", RandomSearchRun: "random-search"}[run]
    assert summary["generations"] == 2 and summary["best_member_return"] == saved["best_return"]
    # Episodes are evaluation episodes: at least every member's, and each one at least a frame long (idle
    # slots' episodes, which once made this count several times the frames, are not counted).
    cfg = run()
    members = cfg.algo.population_size * cfg.episodes_per_member * 2
    assert members <= saved["counters"]["episodes"] <= saved["counters"]["frames"], saved["counters"]

    second = train(prepared(run(generations=3, log_dir=str(tmp_path), resume=str(tmp_path / "b"), progress=False)))
    assert second["generations"] == 3
    if run is RandomSearchRun:  # keeps the best ever seen
        assert second["best_member_return"] >= first["best_member_return"]
    if run is GARun:  # the resumed population descends from the saved one
        after = checkpoint.load(tmp_path / "b")["algo_state"]["genomes"]
        parents = {tuple(g) for g in saved["algo_state"]["genomes"]}
        assert all(tuple(g)[:-1] in parents or tuple(g) in parents for g in after)
    ea = EventAccumulator(str(tmp_path / "b"))
    ea.Reload()
    for tag in ("charts/best_fitness", "charts/mean_fitness", "charts/median_fitness", "charts/episodes",
                "charts/frames", "perf/frames_per_s", "perf/env_time_s", "perf/inference_time_s"):
        assert tag in ea.Tags()["scalars"], tag
    assert [e.step for e in ea.Scalars("charts/best_fitness")] == [1, 2, 3]


def test_ga_draws_one_mutation_per_child_every_generation(monkeypatch):
    """The production ``GAEvolver`` builds each child from its parent's cached
    vector: noise draws per generation stay at P - 1 (one per child), not a
    count that grows with the genome's length."""
    import numpy as np

    from seedlocal.algos import ga
    from seedlocal.algos.neuroevo import ParamSpace
    from seedlocal.trainers.evolvers import GAEvolver

    draws = []
    real_noise = ga.noise
    monkeypatch.setattr(ga, "noise", lambda seed, size: (draws.append(seed), real_noise(seed, size))[1])
    spec = validate_env(EnvConfig(id="CartPole-v1"))
    cfg = GARun()
    cfg.algo.population_size, cfg.algo.truncation = 16, 4
    evolver = GAEvolver(cfg, ParamSpace(PolicyNet(spec)))
    rng = np.random.default_rng(0)

    class Pool:  # any fitness will do: the cache is what is tested
        def submit(self, params, episodes, front=False):
            scores = [[float(rng.normal())] * episodes for _ in range(params.shape[0])]
            return SimpleNamespace(wait=lambda check=None: scores, returns=scores, fitness=scores)

        def commit_obs_stats(self):
            pass

    per_generation = []
    for _ in range(20):
        before = len(draws)
        evolver.generation(Pool())
        per_generation.append(len(draws) - before)
    # Each generation mutates the next one's P - 1 children (started early,
    # beside the elite's re-evaluation), once each; generation 0 initialises.
    assert per_generation == [15] * 20, per_generation


def test_a_few_busy_groups_do_not_wait_for_held_ones():
    """While only some groups have work (a generation's tail, the elite's extra
    episodes), batches must not wait out ``batch_timeout_ms`` for groups that
    are held and can never become ready."""
    import threading

    # min_batch_envs 32 = every group's envs; a 200 ms timeout makes any wait for held groups obvious.
    with population_pipeline(8, num_workers=4, envs_per_worker=8, min_batch_envs=32,
                             batch_timeout_ms=200.0) as (spec, policy, pipe):
        t = threading.Thread(target=pipe.loop.run_until_stopped, daemon=True)
        t.start()
        try:
            params = torch.stack([torch.nn.utils.parameters_to_vector(PolicyNet(spec).parameters()) for _ in range(2)])
            policy.submit(params, episodes=1).wait()  # the first call holds the idle groups
            before, batches = pipe.loop.stats.timeouts, pipe.loop.stats.batches
            results = policy.submit(params, episodes=2).wait()  # 4 jobs: at most 1-2 groups busy
            timeouts, batches = pipe.loop.stats.timeouts - before, pipe.loop.stats.batches - batches
        finally:
            pipe.loop.request_stop()
            t.join(10)
    assert [len(r) for r in results] == [2, 2]
    assert batches >= 8  # episodes of >= 8 steps each were served
    assert timeouts <= 2, f"{timeouts} of {batches} batches waited out the timeout"


def test_eval_acts_as_the_run_acted_in_training():
    """A member acts by argmax or by a sample, as the run's --greedy said, unless eval is told otherwise."""
    from pathlib import Path

    from seedlocal.evaluate import policy_of

    state = checkpoint.load(Path(__file__).parent / "fixtures" / "saved_runs" / "ga")
    cpu = torch.device("cpu")
    assert policy_of(state, cpu).acting == "argmax"
    sampled = {**state, "config": {**state["config"], "greedy": False}}
    assert policy_of(sampled, cpu).acting == "sampled" and policy_of(sampled, cpu, greedy=True).acting == "argmax"


def test_discrete_observations_enter_every_network_one_hot():
    """A Discrete observation is a category: networks see it one-hot (16
    inputs for FrozenLake's 16 cells, not one number), in the population
    forward's every strategy as in each network alone and in the actor-critic."""
    from seedlocal.networks import ActorCritic

    spec = validate_env(EnvConfig(id="FrozenLake-v1"))
    assert spec.obs_classes == {"": (16, 0)}
    nets = [PolicyNet(spec) for _ in range(3)]
    assert nets[0].encoder.net[0].in_features == 16
    x = torch.tensor([0, 5, 15])
    hot = torch.nn.functional.one_hot(x, 16).float()
    torch.testing.assert_close(nets[0]({"": x}), nets[0].policy(nets[0].encoder(hot)))
    for strategy in ("bmm", "mulsum", "vmap", "auto"):
        fwd = PopulationForward(nets[0], num_slots=3, strategy=strategy)
        fwd.load(torch.arange(3), _flats(nets), torch.arange(3))
        out = fwd(np.arange(3), {"": x})
        for i in range(3):
            torch.testing.assert_close(out[i], nets[i]({"": x[i:i + 1]})[0])
    ac = ActorCritic(spec, separate_critic=True)
    logits, values = ac({"": x})
    assert logits.shape == (3, 4) and values.shape == (3,)
    assert ac.critic.net[0].in_features == 16


# -- long generations: progress inside them, frames as they are stepped, the episode frame cap ------------

ENDLESS = EnvConfig(id="faulty_envs:Endless-v0")  # tests/faulty_envs.py: never ends; reward 1 for action 1


def _endless_ga(tmp_path, **options) -> GARun:
    """A GA of 8 members on 4 env slots of Endless-v0."""
    from seedlocal.algos.ga import GAParams
    from seedlocal.config.schema import PipelineConfig

    return GARun(**{"env": ENDLESS, "log_dir": str(tmp_path), "progress": False,
                    "algo": GAParams(population_size=8, truncation=2, elite_candidates=2, elite_episodes=1),
                    "pipeline": PipelineConfig(num_workers=1, envs_per_worker=4, unroll_length=8), **options})


def _scalars(run_dir, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    return {e.step: e.value for e in ea.Scalars(tag)}


def test_the_frame_cap_ends_a_job_episode_at_its_step_and_scores_its_return_so_far():
    """plan() ends a member's episode once it has played max_episode_steps
    steps (not a step later), scores its return so far (less the reward
    shift per step), frees the slot and counts the episode as capped."""
    with population_pipeline(1, {"max_episode_steps": 3, "reward_shift": 0.5}, num_workers=1,
                             envs_per_worker=8) as (spec, policy, pipe):
        # The loop does not run: plan() is driven by hand below, for group 0.
        job = policy.submit(_flats([PolicyNet(spec) for _ in range(2)]), episodes=1)
        group, nobody = np.array([0]), np.zeros((1, 4), bool)
        policy.plan(group, np.ones((1, 4), bool), nobody, np.zeros((1, 4), np.float32), np.zeros((1, 4), np.int32))
        assert policy.assign[:4].tolist() == [0, 1, -1, -1]
        for t in (1, 2):
            policy.plan(group, nobody, nobody, np.full((1, 4), 2.0 * t, np.float32), np.full((1, 4), t, np.int32))
            assert policy.longest_running() == t and job.members_done() == 0
        policy.plan(group, nobody, nobody, np.full((1, 4), 6.0, np.float32), np.full((1, 4), 3, np.int32))
    assert job.done.is_set() and job.returns == [[6.0], [6.0]] and job.fitness == [[4.5], [4.5]]
    assert policy.assign[:4].tolist() == [-1] * 4 and policy.longest_running() == 0
    assert policy.episodes_capped == 2 and policy.episodes_scored == 2 and job.members_done() == 2


def test_a_run_stopped_inside_its_first_generation_shows_progress_and_counts_its_frames(tmp_path, capsys):
    """Endless episodes and no cap: the first generation never ends. While
    it runs, the progress line says how far it is (members finished of P,
    frames, frames/s, the longest episode still playing); stopped by its
    time budget, the run reports the frames it stepped (it reported 0)."""
    # The clock starts before the spawned workers have imported and made their envs: 6 s leaves a loaded
    # 2-core machine seconds of stepping after that.
    summary = train(prepared(_endless_ga(tmp_path, max_episode_frames=0, generations=0, seconds=6.0, run_name="s",
                                progress=True)))
    err = capsys.readouterr().err
    shown = re.findall(r"gen +1  members +0/8 finished  frames +([\d,]+)  frames/s +[\d,]+  longest episode [\d,]+ "
                       r"frames", err)
    assert shown, err[-2000:]
    assert summary["stopped_by"] == "seconds" and summary["generations"] == 0, summary
    # However few frames a loaded machine stepped in the budget, the summary counts every one the line showed.
    assert summary["frames"] >= max(int(f.replace(",", "")) for f in shown), (summary, shown)
    assert summary["steps"] == summary["frames"] and summary["episodes"] == 0, summary


def test_the_frame_budget_holds_inside_a_generation(tmp_path):
    """--total-frames sees a generation's frames as they are stepped: a
    generation that never ends is abandoned once they reach the budget."""
    # --seconds only so that a run that missed its frame budget ends (and fails) instead of hanging.
    summary = train(prepared(_endless_ga(tmp_path, max_episode_frames=0, generations=0, total_frames=500, seconds=20.0,
                                run_name="f")))
    assert summary["stopped_by"] == "frames" and summary["generations"] == 0, summary
    assert summary["frames"] >= 500, summary


def test_the_frame_cap_lets_endless_episodes_end_scored_on_their_return_so_far(tmp_path):
    """With --max-episode-frames, a generation of endless episodes ends, and
    each member's fitness is the return it gathered up to the cap: the same
    as its network playing that many steps of the env alone."""
    import gymnasium

    from seedlocal.trainers.evolvers import GAEvolver
    from seedlocal.recipes.neuroevolution import build_policy

    cap = 40
    cfg = _endless_ga(tmp_path, max_episode_frames=cap, generations=1, run_name="cap")
    summary = train(prepared(cfg))
    assert summary["generations"] == 1, summary
    spec = validate_env(cfg.env)
    evolver = GAEvolver(cfg, ParamSpace(build_policy(cfg, spec)))  # generation 1's population, rebuilt
    net = build_policy(cfg, spec)
    expected = []
    for vec in evolver._vecs(evolver.state.genomes):
        torch.nn.utils.vector_to_parameters(vec, net.parameters())
        env = gymnasium.make(ENDLESS.id)
        obs, _ = env.reset(seed=0)
        ret = 0.0
        for _ in range(cap):
            with torch.no_grad():
                action = int(net({"": torch.as_tensor(obs)[None]}).argmax())
            obs, reward, *_ = env.step(action)
            ret += reward
        expected.append(ret)
    assert len(set(expected)) > 1, expected  # members that differ, or the comparison says little
    got = {k: _scalars(tmp_path / "cap", f"charts/{k}_fitness")[1] for k in ("best", "mean", "median")}
    assert got == pytest.approx({"best": max(expected), "mean": np.mean(expected), "median": np.median(expected)})
    assert _scalars(tmp_path / "cap", "perf/capped_share")[1] == 1.0  # every episode was cut
    # The population's 8 episodes and the 2 elite candidates', cap frames each (and the next children's start).
    assert _scalars(tmp_path / "cap", "perf/frames_per_generation")[1] >= (8 + 2) * cap


def test_counters_after_a_stop_inside_a_generation_and_a_resume(tmp_path):
    """A checkpoint's counters are those of its last whole generation. A run
    stopped inside the next one reports the frames it stepped there, leaves
    the checkpoint as it was, and a resumed run evaluates that generation
    again, counting its frames from the checkpoint's."""
    run_dir = tmp_path / "r"
    first = train(prepared(_endless_ga(tmp_path, max_episode_frames=40, generations=1, run_name="r")))
    saved = checkpoint.load(run_dir)["counters"]
    assert first["frames"] == saved["frames"] > 0 and first["episodes"] == saved["episodes"] >= 10
    # Resumed without the cap, generation 2 cannot end: a frame budget stops the run inside it (a time budget
    # would leave what it stepped there to the machine's load; --seconds only ends a run that missed it).
    stopped = train(prepared(_endless_ga(tmp_path, max_episode_frames=0, generations=0, total_frames=saved["frames"] + 200,
                                seconds=60.0, resume=str(run_dir))))
    assert stopped["stopped_by"] == "frames" and stopped["generations"] == 1, stopped
    assert stopped["frames"] >= saved["frames"] + 200 and stopped["episodes"] == saved["episodes"], stopped
    assert checkpoint.load(run_dir)["counters"] == saved
    done = train(prepared(_endless_ga(tmp_path, max_episode_frames=40, generations=2, resume=str(run_dir))))
    after = checkpoint.load(run_dir)["counters"]
    assert after["generation"] == done["generations"] == 2
    assert done["frames"] == after["frames"] and done["episodes"] == after["episodes"], (done, after)
    frames = _scalars(run_dir, "charts/frames")
    assert frames == {1: saved["frames"], 2: after["frames"]}
    assert _scalars(run_dir, "perf/frames_per_generation")[2] == after["frames"] - saved["frames"]
    assert _scalars(run_dir, "charts/episodes") == {1: saved["episodes"], 2: after["episodes"]}


def test_the_frame_cap_defaults_by_env_kind():
    """-1 (the default): the deep GA's 20,000 frames for image frames (Atari:
    5,000 steps of 4 frames), 10,000 for small grids (MinAtar, 1 frame a
    step), no cap otherwise; 0 turns it off; below -1 is refused naming the
    field."""
    from seedlocal.errors import ConfigError
    from seedlocal.recipes.neuroevolution import episode_frame_cap
    from seedlocal.trainers.neuroevolution import episode_step_cap

    def run(cfg, env_id):
        return prepared(dataclasses.replace(cfg, env=EnvConfig(id=env_id)))

    atari = run(GARun(), "Pong-v5")
    assert (episode_frame_cap(atari.config, atari.kind), episode_step_cap(atari)) == (20_000, 5_000)
    assert episode_step_cap(run(GARun(max_episode_frames=10_001), "Pong-v5")) == 2_501  # the step reaching it
    assert episode_frame_cap(GARun(max_episode_frames=0), atari.kind) == 0
    cartpole = run(ESRun(), "CartPole-v1")
    assert episode_frame_cap(cartpole.config, cartpole.kind) == 0
    assert episode_frame_cap(GARun(max_episode_frames=500), cartpole.kind) == 500
    grid = run(ESRun(), "grid_envs:BoolGrid-v0")
    assert (episode_frame_cap(grid.config, grid.kind), episode_step_cap(grid)) == (10_000, 10_000)
    with pytest.raises(ConfigError, match="max_episode_frames=-2"):
        prepared(GARun(max_episode_frames=-2))
