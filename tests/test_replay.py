"""The R2D2 replay: sum tree, per-env streams, stacking, stale priority updates."""

from __future__ import annotations

import numpy as np
import pytest

from seedlocal.trainers.replay import SequenceReplay, SumTree


def test_sum_tree_totals_and_sampling_follow_priorities():
    rng = np.random.default_rng(0)
    t = SumTree(100)
    p = rng.random(100)
    p[::7] = 0.0
    t.update(np.arange(100), p)
    assert t.total == pytest.approx(p.sum(), rel=1e-12)
    # find(): the leaf whose cumulative interval holds the mass, as a naive scan says.
    cum = np.cumsum(p)
    mass = rng.random(1000) * p.sum()
    expected = np.searchsorted(cum, mass, side="right")
    np.testing.assert_array_equal(t.find(mass), expected)
    counts = np.bincount(np.concatenate([t.sample(256, rng) for _ in range(400)]), minlength=100)
    assert counts[::7].sum() == 0  # zero priority: never sampled
    np.testing.assert_allclose(counts / counts.sum(), p / p.sum(), atol=0.004)
    t.update(np.array([3, 3, 5]), np.array([9.0, 2.0, 0.5]))  # repeated index: the last value wins
    assert t.get(np.array([3]))[0] == 2.0
    assert t.total == pytest.approx(p.sum() - p[3] - p[5] + 2.5, rel=1e-12)


def fields(frame_shape=(2, 2)):
    return {"obs": (frame_shape, "uint8"), "action": ((), "int64"), "reward": ((), "float32"),
            "terminated": ((), "bool"), "truncated": ((), "bool"), "ignored": ((), "bool")}


def steps(env: int, start: int, n: int, ignored_at=()) -> dict:
    """Rows whose frame encodes (env, absolute step) so a gather can be checked."""
    idx = np.arange(start, start + n)
    obs = np.zeros((n, 2, 2), np.uint8)
    obs[:, 0, 0], obs[:, 0, 1] = env, idx % 256
    ign = np.isin(idx, ignored_at)
    return {"obs": obs, "action": idx % 4, "reward": idx.astype(np.float32), "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool), "ignored": ign}


def feed(r: SequenceReplay, env: int, start: int, n: int) -> None:
    """As ``ReplayFeeder.ingest`` feeds an unroll: the actor's recurrent state at its start, then its rows."""
    for s in range(start, start + n, r.stride):
        r.set_core(env, s, np.full((2, 3), s, np.float32))
    r.append(env, steps(env, start, n))


@pytest.mark.parametrize("compress", [False, True])
def test_sequences_are_index_ranges_with_stacks_rebuilt_within_episodes(compress):
    r = SequenceReplay(num_envs=2, sequences=20, length=7, stride=4, fields=fields(), core_shape=(2, 3),
                       stack=3, compress=compress)
    for env in (0, 1):
        for s in range(0, 40, 4):
            r.set_core(env, s, np.full((2, 3), 100 * env + s, np.float32))
            r.append(env, steps(env, s, 4, ignored_at=(13,)))
    # Starts 0, 4, ..., 32 are complete (start + 7 <= 40): 9 per env.
    assert r.size == 18 and r.added == 18
    # Each step is stored once however many sequences cover it.
    assert r.data["reward"].shape[1] == r.cap < 18 * 7 / 2
    rows, slots, gens, w = r.sample(8, beta=0.6)
    assert rows["obs"].shape == (7, 8, 3, 2, 2) and w.max() == 1.0
    for b, slot in enumerate(slots):
        env, start = r.slot_env[slot], r.slot_start[slot]
        np.testing.assert_array_equal(rows["core_state"][b], 100 * env + start)
        for t in range(7):
            step = start + t
            assert rows["reward"][t, b] == step
            ep0 = 14 if step >= 14 else 0  # row 13 is an auto-reset row: step 14 starts an episode
            lags = [max(step - 2, ep0), max(step - 1, ep0), step]
            assert rows["obs"][t, b, :, 0, 0].tolist() == [env] * 3
            assert rows["obs"][t, b, :, 0, 1].tolist() == lags


def test_overwritten_sequences_are_evicted_and_stale_priority_updates_dropped():
    r = SequenceReplay(num_envs=1, sequences=3, length=6, stride=4, fields=fields(), core_shape=(2, 3), stack=2)
    for s in range(0, 20, 4):
        feed(r, 0, s, 4)
    _, slots, gens, _ = r.sample(4, beta=0.5)
    before = set(zip(r.slot_start[slots].tolist(), slots.tolist()))
    for s in range(20, 60, 4):  # the ring wraps several times: old sequences go
        feed(r, 0, s, 4)
    assert r.size <= 3
    alive = {start for start, _ in r.live[0]}
    assert min(alive) >= 60 - r.cap
    applied = r.update_priorities(slots, gens, np.full(len(slots), 50.0))
    assert applied == 0, "a priority computed for evicted data was applied to its replacement"
    assert r.max_priority == 1.0
    rows, slots2, gens2, _ = r.sample(4, beta=0.5)
    assert r.update_priorities(slots2, gens2, np.full(4, 3.0)) == 4
    assert not before & set(zip(r.slot_start[slots2].tolist(), slots2.tolist()))


def test_a_cut_stream_never_stitches_steps_across_it():
    r = SequenceReplay(num_envs=1, sequences=10, length=6, stride=4, fields=fields(), core_shape=(2, 3), stack=2)
    feed(r, 0, 0, 6)
    r.cut(0)  # a restart: steps 6.. are gone, the stream resumes at the next stride boundary
    assert r.count[0] == 8
    feed(r, 0, 8, 12)
    starts = sorted(s for s, _ in r.live[0])
    assert starts == [0, 8, 12] and all(s >= 8 or s + 6 <= 6 for s in starts)


def test_new_sequences_enter_at_the_recent_largest_priority_not_the_all_time_one():
    """Max-priority insertion over a window of updates: one early spike of TD
    error does not set every later insertion for the rest of the run."""
    from seedlocal.trainers.replay import PRIORITY_WINDOW

    r = SequenceReplay(num_envs=1, sequences=50, length=6, stride=4, fields=fields(), core_shape=(2, 3),
                       stack=1, alpha=1.0)
    for s in range(0, 40, 4):
        feed(r, 0, s, 4)
    _, slots, gens, _ = r.sample(4, beta=0.5)
    r.update_priorities(slots, gens, np.full(4, 80.0))  # an early spike
    assert r.max_priority == 80.0
    for _ in range(PRIORITY_WINDOW):
        _, slots, gens, _ = r.sample(4, beta=0.5)
        r.update_priorities(slots, gens, np.full(4, 0.5))
    assert r.max_priority == 0.5
    feed(r, 0, 40, 4)
    newest = r.live[0][-1][1]
    assert r.tree.get(np.array([newest]))[0] == pytest.approx(0.5)
    state = r.state_dict()
    fresh = SequenceReplay(num_envs=1, sequences=50, length=6, stride=4, fields=fields(), core_shape=(2, 3),
                           stack=1, alpha=1.0)
    fresh.load_state_dict(state)
    assert fresh.max_priority == 0.5
    old = dict(state)
    del old["recent_max"]
    old["barrier"] = np.zeros(1, np.int64)  # a replay saved when cuts kept one
    old["max_priority"] = 7.0  # a replay saved before the window
    fresh.load_state_dict(old)
    assert fresh.max_priority == 7.0


def test_a_cut_drops_the_recurrent_states_of_sequences_that_will_never_complete():
    r = SequenceReplay(num_envs=2, sequences=10, length=6, stride=4, fields=fields(), core_shape=(2, 3), stack=1)
    r.set_core(0, 0, np.zeros((2, 3)))
    r.append(0, steps(0, 0, 4))
    r.set_core(0, 4, np.ones((2, 3)))  # the sequence starting at 4 needs rows up to 9
    r.set_core(1, 0, np.ones((2, 3)))
    r.append(0, steps(0, 4, 3))
    assert (0, 4) in r.pending_core
    r.cut(0)
    assert not [k for k in r.pending_core if k[0] == 0], "a cut stream kept states no sequence will use"
    assert (1, 0) in r.pending_core  # another env's are kept
    assert (0, 4) not in r.state_dict()["pending_core"]


def test_episode_starts_follow_the_one_rule_everywhere():
    """``first`` has one definition (shm/rollout.py): the row after an
    ignored action starts an episode; row 0 takes what came before. The
    replay's stacking keeps it across appends."""
    import torch

    from seedlocal.spec import episode_starts

    ign = np.array([False, True, False, False, True])
    np.testing.assert_array_equal(episode_starts(ign), [False, False, True, False, False])
    np.testing.assert_array_equal(episode_starts(ign, before=True), [True, False, True, False, False])
    assert episode_starts(torch.from_numpy(ign)).tolist() == [False, False, True, False, False]
    r = SequenceReplay(num_envs=1, sequences=10, length=4, stride=2, fields=fields(), core_shape=(2, 3), stack=1)
    r.append(0, steps(0, 0, 3, ignored_at=(2,)))  # step 3, in the next append, starts an episode
    r.append(0, steps(0, 3, 3))
    assert r.ep_start[0, :6].tolist() == [0, 0, 0, 3, 3, 3]


def test_the_learner_owes_no_updates_while_the_replay_warms_up():
    """The progress line's "actors wait: N updates" (``owed_updates``) is for after the warm-up: before
    ``min_replay`` sequences the learner does not learn and the actors step on."""
    from seedlocal.trainers.replay_feeder import ReplayFeeder

    r = SequenceReplay(num_envs=1, sequences=50, length=6, stride=4, fields=fields(), core_shape=(2, 3), stack=1)
    feeder = ReplayFeeder(r, np.zeros(1, bool), 1, 4, replay_ratio=1.0, batch_size=2, min_replay=5)
    for s in range(0, 20, 4):
        feed(r, 0, s, 4)
        feeder.added_steps += 4
    assert r.size == 4 and not feeder.behind() and feeder.owed_updates() == 0  # 20 steps in, warm-up not over
    feed(r, 0, 20, 4)
    feeder.added_steps += 4
    assert r.size == 5 and feeder.behind() and feeder.owed_updates() == 3  # 24 rows owed, 8 rows an update
