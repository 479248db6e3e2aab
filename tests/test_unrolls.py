"""The unroll allocator: its invariants on their own, and the restart that
used to stop the whole inference loop."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from helpers import tiny_pipeline
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.policies import RandomPolicy
from seedlocal.pipeline.inference import InferenceThread
from seedlocal.pipeline.unrolls import BOUND, PARKED, WAITING, UnrollAllocator
from seedlocal.shm.rollout import RolloutLayout, create_store
from seedlocal.shm.slots import create_control


@pytest.fixture
def segments():
    spec = validate_env(EnvConfig(id="CartPole-v1"))
    layout = RolloutLayout(num_buffers=5, length=4, envs=2, obs=spec.obs, action=spec.action)
    store, control = create_store(layout), create_control(4)
    yield store, control
    store.close()
    control.close()


def check(alloc: UnrollAllocator, held: int) -> None:
    """The conservation invariant, given the unrolls the consumer holds (the allocator cannot know them)."""
    with alloc._lock:
        free = list(alloc._free)
    bound = [int(alloc._tbuf[g]) for g in range(alloc.G) if alloc.state[g] == BOUND]
    assert len(set(free)) == len(free) and not set(free) & set(bound), (free, bound)
    assert len(set(bound)) == len(bound), bound
    assert len(free) + len(bound) + held == alloc.num_buffers, (len(free), len(bound), held, alloc.num_buffers)


def test_every_operation_conserves_unrolls_and_none_blocks(segments):
    """Random sequences of what the loop and a consumer do: after each call
    every group is bound, parked or waiting; free + bound + held = all,
    each unroll once; and every call returns at once, whatever is free."""
    store, control = segments
    held: list[int] = []
    alloc = UnrollAllocator(store, control, 4, ["obs"], epoch_of=lambda g: 0, hand_on=held.append)
    alloc.bind_all()
    check(alloc, held=0)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(3000):
        op, g = rng.integers(4), int(rng.integers(4))
        if op == 0 and alloc.state[g] == BOUND:
            store["obs"][control["target_buf"][g], -1] = g + 0.5  # the observation a parked group keeps
            if alloc.rotate(g, np.ones(2, bool)) is not None:
                assert control["target_row"][g] == 0 and (store["obs"][control["target_buf"][g], 0] == g + 0.5).all()
        elif op == 1:
            alloc.restart(g)
        elif op == 2 and held:
            alloc.release(held.pop(int(rng.integers(len(held)))))
        elif op == 3:
            for s in alloc.resume():
                assert alloc.state[s] == BOUND and control["target_row"][s] == 0
        check(alloc, held=len(held))
        seen.add(tuple(alloc.state))
        for h in range(4):
            if alloc.state[h] == BOUND:
                assert store["unroll_group"][control["target_buf"][h]] == h
    states = {s for t in seen for s in t}
    assert states == {BOUND, PARKED, WAITING}, "the sequence never reached every state"


def test_a_parked_group_resumes_where_it_stopped_and_a_waiting_one_fresh(segments):
    store, control = segments
    held: list[int] = []
    alloc = UnrollAllocator(store, control, 4, ["obs"], epoch_of=lambda g: 7, hand_on=held.append)
    alloc.bind_all()  # 4 of 5 unrolls bound, 1 free
    assert alloc.rotate(0, np.zeros(2, bool)) is not None  # takes the free one
    store["obs"][control["target_buf"][1], -1] = 3.0
    first = np.array([True, False])
    assert alloc.rotate(1, first) is None and alloc.state[1] == PARKED  # nothing free: parked
    assert alloc.rotate(3, first) is None and alloc.state[3] == PARKED
    assert alloc.restart(2)  # a bound group restarts in the unroll it gives up
    assert not alloc.restart(3) and alloc.state[3] == WAITING  # a parked one has none to give up
    assert alloc.resume() == [] and alloc.state[1] == PARKED
    alloc.release(held.pop(0))
    alloc.release(held.pop(0))
    assert alloc.resume() == [3]  # the waiting group, for the caller to start fresh
    assert alloc.state[1] == BOUND and (store["obs"][control["target_buf"][1], 0] == 3.0).all()
    np.testing.assert_array_equal(alloc.take_resume_first(1), first)
    assert alloc.take_resume_first(1) is None  # once
    assert alloc.take_resume_first(3) is None  # fresh episodes carry nothing over
    assert store["unroll_epoch"][control["target_buf"][1]] == 7
    check(alloc, held=len(held))


def test_a_worker_dying_while_its_group_is_parked_does_not_stop_the_loop():
    """The Atari preset's sizes: one worker (2 groups), a learner batch of
    k = 2 unrolls, num_buffers = max(G, k) = 2. The consumer holds one full
    unroll and waits for a second; one group is parked with no unroll, the
    other is early in its unroll. Then the worker dies. Its restart must not
    block the batch server (it used to wait for a free unroll that only the
    consumer could free, while the consumer waited for the loop): the bound
    group starts over and fills the consumer's second unroll, and once the
    consumer releases them the parked group starts again on fresh episodes."""
    with tiny_pipeline(RandomPolicy, num_workers=1, envs_per_worker=4, unroll_length=16, num_buffers=2) as pipe:
        loop, store, trow = pipe.loop, pipe.store, pipe.pool.control["target_row"]
        held = []
        while len(held) < 2:  # both groups fill their unroll and park
            loop.step()
            while not loop.completed.empty():
                held.append(loop.completed.get())
        assert (loop.unrolls.state == PARKED).all()
        loop.release(held.pop(0))  # the consumer keeps one and waits for another
        while not (loop.unrolls.state == BOUND).any() or trow[loop.unrolls.state == BOUND][0] == 0:
            loop.step()  # the first parked group goes on, one step into its new unroll
        bound = int(np.flatnonzero(loop.unrolls.state == BOUND)[0])
        parked = 1 - bound
        assert loop.unrolls.state[parked] == PARKED and len(held) == 1
        check(loop.unrolls, held=1)  # two unrolls, the consumer's and the bound group's: none free
        assert 0 < trow[bound] < 8  # far from filling its unroll without a worker
        victim = pipe.pool.procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        runner = InferenceThread(loop)
        runner.start()
        try:
            second = loop.completed.get(timeout=60)  # the batch server kept serving
            runner.check()
            assert loop.stats.restarts == 1
            assert int(store["unroll_group"][second]) == bound
            assert int(store["unroll_epoch"][second]) == 1  # begun after the restart
            assert loop.unrolls.state[parked] == WAITING
            loop.release(held.pop())
            loop.release(second)
            fresh = None
            while fresh is None or int(store["unroll_group"][fresh]) != parked:
                if fresh is not None:
                    loop.release(fresh)
                fresh = loop.completed.get(timeout=60)
            runner.check()
            assert int(store["unroll_epoch"][fresh]) == 1
            assert np.all(np.abs(store["obs"][fresh, 0]) <= 0.05)  # a reset observation
            assert not np.isnan(store["reward"][fresh, :-1]).any()
        finally:
            runner.stop()
        assert not runner.is_alive()
