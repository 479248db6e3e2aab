import numpy as np
import pytest
import torch

from helpers import check_autoreset_rows, take_unrolls, tiny_pipeline
from seedlocal.networks import ActorCritic
from seedlocal.policies import RandomPolicy
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.envs.ids import resolve_backend


def cartpole_reset(obs) -> bool:
    return bool(np.all(np.abs(obs) <= 0.05))  # CartPole resets uniformly in [-0.05, 0.05]


def short_cartpole(*args, **kw):
    return tiny_pipeline(RandomPolicy, *args, **kw)


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_ignored_actions_get_no_reward_or_transition(backend):
    with tiny_pipeline(RandomPolicy, backend=backend, unroll_length=64) as pipe:
        unrolls = take_unrolls(pipe, 30)
    episodes = sum(check_autoreset_rows(u, cartpole_reset) for u in unrolls)
    assert episodes >= 5
    ignored = sum(int(u["ignored"][:-1].sum()) for u in unrolls)
    assert ignored > 0  # the test saw auto-resets at all


def test_episode_stats_reach_the_loop():
    with tiny_pipeline(RandomPolicy) as pipe:
        take_unrolls(pipe, 30)
        eps = pipe.loop.stats.episodes.take().recent
    assert len(eps) >= 5
    for ret, length in eps:
        assert ret == length  # CartPole: +1 per real step, nothing for the ignored reset step
        assert 8 <= length <= 500


def test_unrolls_share_the_bootstrap_observation():
    with tiny_pipeline(RandomPolicy, num_buffers=2 * 2 + 40) as pipe:
        unrolls = take_unrolls(pipe, 20)
    by_group = {}
    for u in unrolls:
        by_group.setdefault(u["group"], []).append(u)
    pairs = 0
    for us in by_group.values():
        for a, b in zip(us, us[1:]):
            np.testing.assert_array_equal(a["obs"][-1], b["obs"][0])
            pairs += 1
    assert pairs >= 10


def test_model_policy_rows_are_consistent():
    """Observation, action, behaviour logits and value of a row belong together."""
    torch.manual_seed(0)
    holder = {}

    def make(spec, device):
        holder["model"] = ActorCritic(spec).to(device)
        return ModelPolicy(holder["model"], spec)

    with tiny_pipeline(make) as pipe:
        unrolls = take_unrolls(pipe, 6)
    model = holder["model"]
    for u in unrolls:
        obs = torch.from_numpy(u["obs"][:-1].reshape(-1, 4))
        logits, value = model({"": obs})
        np.testing.assert_allclose(u["out.logits"][:-1].reshape(-1, 2), logits.detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(u["out.value"][:-1].reshape(-1), value.detach().numpy(), atol=1e-5)
        assert set(np.unique(u["action"][:-1])) <= {0, 1}


def test_dict_observations_minigrid():
    with tiny_pipeline(lambda spec, dev: ModelPolicy(ActorCritic(spec), spec), env="MiniGrid-Empty-5x5-v0") as pipe:
        assert set(pipe.layout.obs) == {"direction", "image", "mission"}
        unrolls = take_unrolls(pipe, 2)
    u = unrolls[0]
    assert u["obs.image"].shape == (9, 2, 7, 7, 3) and u["obs.image"].dtype == np.uint8
    assert u["obs.image"].max() > 0
    check_autoreset_rows(u)


def test_atari_with_nature_cnn():
    with tiny_pipeline(lambda spec, dev: ModelPolicy(ActorCritic(spec), spec), env="Pong-v5", unroll_length=4) as pipe:
        assert pipe.spec.frames_per_step == 4
        assert isinstance(pipe.policy.model.encoder, torch.nn.Module) and pipe.policy.model.kind == "nature"
        unrolls = take_unrolls(pipe, 2)
    assert unrolls[0]["obs"].shape == (5, 2, 4, 84, 84)
    assert unrolls[0]["obs"].max() > 0


def test_gymnasium_fallback_for_ids_envpool_lacks():
    assert resolve_backend("Taxi-v4") == "gymnasium"
    # Episodes last at most 200 steps + 1 reset row: any 448 rows hold a whole one.
    with tiny_pipeline(RandomPolicy, env="Taxi-v4", unroll_length=448) as pipe:
        assert pipe.spec.obs[""].shape == ()  # a Discrete observation
        unrolls = take_unrolls(pipe, 6)
        eps = pipe.loop.stats.episodes.take().recent
    assert all(check_autoreset_rows(u) >= 1 for u in unrolls)
    # Taxi's 200-step limit truncates (not terminates) random episodes.
    assert any(length == 200 for _, length in eps)
    assert any(u["truncated"].any() and not u["terminated"][u["truncated"]].any() for u in unrolls)


def test_lstm_state_is_kept_reset_and_stored_per_unroll():
    """Replaying a stored unroll from its stored start state reproduces the
    behaviour logits: the inference side kept one state per env, zeroed it
    where an episode began, and saved it at row 0 of every unroll."""
    torch.manual_seed(0)
    holder = {}

    def make(spec, device):
        holder["model"] = ActorCritic(spec, lstm_size=16)
        return ModelPolicy(holder["model"], spec)

    with tiny_pipeline(make, unroll_length=32, num_buffers=40) as pipe:
        assert pipe.layout.core_state.shape == (2, 16)
        store = pipe.store
        unrolls = []
        for _ in range(20000):
            pipe.loop.step()
            while not pipe.loop.completed.empty():
                b = pipe.loop.completed.get()
                unrolls.append({k: np.array(store[k][b]) for k in ("obs", "ignored", "out.logits", "core_state")})
                pipe.loop.release(b)
            if len(unrolls) >= 8:
                break
    model = holder["model"]
    resets = 0
    for u in unrolls:
        first = torch.zeros(u["ignored"].shape, dtype=torch.bool)
        first[1:] = torch.from_numpy(u["ignored"][:-1])
        resets += int(first.sum())
        with torch.no_grad():
            logits, _ = model.unroll({"": torch.from_numpy(u["obs"])}, torch.from_numpy(u["core_state"]), first)
        np.testing.assert_allclose(logits[:-1].numpy(), u["out.logits"][:-1], atol=1e-5)
    assert resets > 0  # episodes began inside the unrolls, so the resets were exercised


def test_impala_resnet_encoder_shapes():
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env

    spec = validate_env(EnvConfig(id="Pong-v5"))
    model = ActorCritic(spec, encoder="impala")
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    logits, value = model({"": obs})
    assert logits.shape == (3, 6) and value.shape == (3,)


def test_google_research_football_through_envpool():
    with tiny_pipeline(RandomPolicy, env="gfootball/academy_empty_goal_close-v1", unroll_length=8) as pipe:
        assert pipe.spec.backend == "envpool" and pipe.spec.num_actions == 19
        unrolls = take_unrolls(pipe, 2)
    assert unrolls[0]["obs"].shape == (9, 2, 72, 96, 4)
    check_autoreset_rows(unrolls[0])


def test_atari_data_path_end_to_end():
    """Pong as the learner sees it: a 4-frame stack that shifts by one frame per
    step (and restarts on reset), raw rewards in {-1, 0, 1} that the learner's
    clip leaves alone, the network's input scaled to [0, 1], and actions
    sampled from exactly the behaviour logits stored beside them."""
    from seedlocal.networks import as_float

    bias = torch.tensor([2.0, 0.0, -1.0, 1.0, 0.0, -2.0])

    def make(spec, device):
        model = ActorCritic(spec, init="orthogonal")
        with torch.no_grad():  # a fixed, far from uniform policy
            model.policy.weight.zero_()
            model.policy.bias.copy_(bias)
        return ModelPolicy(model, spec)

    with tiny_pipeline(make, env="Pong-v5", unroll_length=64, num_buffers=40) as pipe:
        unrolls = take_unrolls(pipe, 24)
    actions = np.concatenate([u["action"][:-1].ravel() for u in unrolls])
    logits = np.concatenate([u["out.logits"][:-1].reshape(-1, 6) for u in unrolls])
    np.testing.assert_allclose(logits, np.broadcast_to(bias.numpy(), logits.shape), atol=1e-6)
    freq = np.bincount(actions, minlength=6) / len(actions)
    expected = torch.softmax(bias, 0).numpy()
    # ~3,000 samples: each frequency within 4 standard errors of its probability.
    assert np.all(np.abs(freq - expected) <= 4 * np.sqrt(expected * (1 - expected) / len(actions)) + 1e-3), freq

    shifted = resets = 0
    for u in unrolls:
        obs, ign = u["obs"], u["ignored"]
        assert obs.dtype == np.uint8 and obs.shape[2:] == (4, 84, 84)
        assert set(np.unique(u["reward"][:-1])) <= {-1.0, 0.0, 1.0}
        for t in range(obs.shape[0] - 1):
            for e in range(obs.shape[1]):
                if ign[t, e]:
                    resets += 1
                else:  # the newest three frames of t are the oldest three of t + 1
                    np.testing.assert_array_equal(obs[t + 1, e, :3], obs[t, e, 1:])
                    shifted += 1
    assert shifted > 1000
    x = as_float(torch.from_numpy(unrolls[0]["obs"][:2]))
    assert x.dtype == torch.float32 and 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and float(x.max()) > 0.1


def test_episode_counts_and_means_are_exact_at_high_episode_rates():
    """Far more than 4,096 episodes end between two reads (a bounded window
    used to drop them): the count still matches the workers' own count and the
    sums stay exact (CartPole: return == length for every episode)."""
    with tiny_pipeline(RandomPolicy, num_workers=1, envs_per_worker=512, unroll_length=16, consume=False) as pipe:
        loop = pipe.loop
        while pipe.pool.control["group_episodes"].sum() < 12_000:
            loop.step()
        eps = loop.stats.episodes.take()
        by_workers = int(pipe.pool.control["group_episodes"].sum())
    # The loop counts a step's episode ends when it serves the next observation:
    # at most one step per group (256 envs) can be ahead of it.
    assert by_workers - 2 * 256 <= eps.count <= by_workers
    assert eps.count > 4096
    assert eps.return_sum == eps.length_sum
    assert 12 <= eps.length_sum / eps.count <= 40  # random CartPole play


def test_groups_park_while_the_learner_holds_every_unroll():
    """Back-pressure without blocking a batch: once the consumer holds every
    unroll, groups that fill theirs are parked (their workers sleep, the loop
    keeps serving the others) and go on, from the same observation, as soon
    as unrolls are released. Nothing is lost or stitched wrongly."""
    import time

    from seedlocal.pipeline.inference import InferenceThread

    with tiny_pipeline(RandomPolicy, num_workers=2, envs_per_worker=4, unroll_length=4, num_buffers=4) as pipe:
        loop, store = pipe.loop, pipe.store
        runner = InferenceThread(loop)
        runner.start()
        try:
            held = [loop.completed.get(timeout=20) for _ in range(4)]
            time.sleep(0.5)
            steps = loop.stats.env_steps
            time.sleep(0.5)
            runner.check()
            assert loop.completed.empty(), "an unroll was filled while the consumer held all of them"
            assert loop.stats.env_steps == steps, "actors kept stepping with nowhere to write"
            last = {int(store["unroll_group"][b]): store["obs"][b, -1].copy() for b in held}
            assert sorted(last) == [0, 1, 2, 3]
            for b in held:
                loop.release(b)
            again = [loop.completed.get(timeout=20) for _ in range(4)]
            for b in again:
                g = int(store["unroll_group"][b])
                np.testing.assert_array_equal(store["obs"][b, 0], last[g])
                assert not np.isnan(store["reward"][b, :-1]).any()
        finally:
            runner.stop()
        runner.check()
