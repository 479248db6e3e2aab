"""The stacks seedlocal builds from single frames, against envpool's own.

Two envpool envs of one id step side by side, one sending stacks of four (``stack_num=4``, what the Atari
presets used before) and one single frames (``stack_num=1``, what they send now), from the same seed with
the same actions, through episode ends, noop starts and a worker's restart. Every stack the policies act
on (``FrameHistory`` inside ``policy.act``), V-trace's learner builds (``UnrollStacks`` over the batches
``Batcher`` copies out of the unroll store) and R2D2's replay returns (``ReplayFeeder`` into
``SequenceReplay``, sampled and staged) must equal envpool's, bit for bit. The flags that say where
episodes start come from the worker's own writer (``_GroupWriter``) and the inference loop's rule
(an observation after an ignored step starts one), so what is compared is what training computes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from seedlocal.envs.envpool_group import EnvpoolGroup
from seedlocal.envs.spaces import describe
from seedlocal.pipeline.batches import Batcher
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.worker import _GroupWriter
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.policies.q_greedy import R2D2Policy
from seedlocal.shm.rollout import RolloutLayout
from seedlocal.spec import TensorSpec
from seedlocal.recipes import r2d2, vtrace
from seedlocal.trainers.r2d2 import make_replay
from seedlocal.trainers.replay_feeder import BatchStager, ReplayFeeder

CPU = torch.device("cpu")
CORE = TensorSpec((2, 4), "float32")  # R2D2's recurrent state per env (its size does not matter here)


@dataclasses.dataclass
class Segment:
    """One worker's life: [rows, n, 1, H, W] single frames, [rows, n, 4, H, W] envpool's stacks of the
    same steps, and the worker's ``ignored`` [rows, n] (the last row's is never written)."""

    frames: np.ndarray
    stacks: np.ndarray
    ignored: np.ndarray
    ends: int  # episodes ended
    life_losses: int


def _lockstep(single: EnvpoolGroup, stack, steps: int, rng) -> Segment:
    """``steps`` random actions in both envs after a reset: the single frames from ``single``, made as a worker
    makes them and written by the worker's writer; envpool's stacks from ``stack``. Asserts at every step that
    the two are in lockstep: the same newest frame, rewards and episode ends."""
    n = stack.config["num_envs"]
    store = {"obs": np.zeros((1, steps + 1, n, 1, 84, 84), np.uint8)}
    store.update({k: np.zeros((1, steps + 1, n), np.float32) for k in ("reward", "ep_return")})
    store.update({k: np.zeros((1, steps + 1, n), bool) for k in ("terminated", "truncated", "ignored")})
    store["ep_length"] = np.zeros((1, steps + 1, n), np.int32)
    writer = _GroupWriter(n)
    stacks = np.zeros((steps + 1, n, 4, 84, 84), np.uint8)
    stack.async_reset(), single.reset()
    lives, life_losses = None, 0
    for row in range(steps + 1):
        if row:
            actions = rng.integers(0, stack.action_space.n, n)
            stack.send(actions), single.send(actions)
        obs, reward, terminated, truncated, info = stack.recv()
        result = single.recv()
        assert np.array_equal(info["env_id"], np.arange(n))
        assert np.array_equal(obs[:, -1:], result[0][""]), f"the envs left lockstep at row {row}"
        assert all(np.array_equal(a, b) for a, b in zip((reward, terminated, truncated), result[1:])), row
        if lives is not None:  # a life lost within a game (not at its end, where lives start again)
            life_losses += int(((info["lives"] < lives) & ~terminated).sum())
        lives = info["lives"]
        stacks[row] = obs
        writer.write(store, 0, row, result)
    ends = int((store["terminated"] | store["truncated"]).sum())
    return Segment(store["obs"][0], stacks, store["ignored"][0], ends, life_losses)


def _episodes(env_id: str, n: int, steps: tuple[int, ...], seed: int) -> list[Segment]:
    """A worker's lives, ``steps[i]`` steps each, from the same seed in both envs: single frames from an
    ``EnvpoolGroup`` as a worker makes it, stacks from envpool itself, made alike but for ``stack_num``. The
    worker restarts between its lives, dropping the unroll it had filled in part; its envs reset (a new
    worker's new envs would too: here the same ones reset, so that both stay in lockstep)."""
    import envpool

    single = EnvpoolGroup(describe(env_id, "envpool", 1), n, 1, seed)
    stack = envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=n, num_threads=1, seed=seed,
                         stack_num=4)
    assert not stack.config["episodic_life"] and not single._env.config["episodic_life"]
    rng = np.random.default_rng(3)
    try:
        return [_lockstep(single, stack, s, rng) for s in steps]
    finally:
        single.close(), stack.close()


def _outputs_of(policy):
    """The stacks ``policy`` hands its network, in the order it acts; the network itself is not run (its
    outputs are zeros of the right shape): what is checked is what it would read."""
    seen = []

    def step(obs, core):
        seen.append(obs[""].clone())
        n, actions = len(obs[""]), policy.spec.num_actions
        zeros = torch.zeros(n, actions)
        return (zeros, core) if isinstance(policy, R2D2Policy) else (zeros, torch.zeros(n), core)

    policy._step = step
    return seen


def _check_acting(policy, segments: list[Segment], groups: int, rng) -> None:
    """Every env's every step through ``policy.act`` as the inference loop calls it: its groups in batches
    of their own, in any order, each env's episode start read from the step before (a worker's first row
    starts one)."""
    seen = _outputs_of(policy)
    n = segments[0].frames.shape[1]
    E = n // groups
    core = None if policy.core_state is None else torch.zeros((E,) + policy.core_state.shape)
    for seg in segments:
        for t in range(len(seg.frames)):
            first = np.ones(n, bool) if t == 0 else seg.ignored[t - 1]
            for g in rng.permutation(groups):
                cols = np.arange(g * E, (g + 1) * E)
                policy.act({"": torch.from_numpy(seg.frames[t, cols])}, core, cols, first[cols])
                got = seen.pop()
                assert got.dtype == torch.uint8 and got.shape == (E, 4, 84, 84)
                assert torch.equal(got, torch.from_numpy(seg.stacks[t, cols])), f"row {t}, group {g}"


def _unroll_store(segments: list[Segment], groups: int, T: int, rng):
    """The segments laid out as the pipeline's unroll store (``RolloutLayout``): each group's unrolls of
    T + 1 rows, the last row the next one's first, a worker's partial last unroll dropped; the step fields
    of each unroll's last row never written (here: noise). Returns the store, each group's buffers in the
    order it filled them, and envpool's stacks of each buffer's rows [T + 1, E, 4, H, W]."""
    n = segments[0].frames.shape[1]
    E = n // groups
    per = [(len(seg.frames) - 1) // T for seg in segments]
    spec = describe("Pong-v5", "envpool", 1)
    layout = RolloutLayout(num_buffers=groups * sum(per), length=T + 1, envs=E, obs=spec.obs, action=spec.action,
                           core_state=CORE)
    store = {a.name: np.zeros(a.shape, a.dtype) for a in layout.specs()}
    order, want, b = [[] for _ in range(groups)], [], 0
    for epoch, (seg, units) in enumerate(zip(segments, per)):
        for g in range(groups):
            cols = slice(g * E, (g + 1) * E)
            for u in range(units):
                rows = slice(u * T, u * T + T + 1)
                store["obs"][b] = seg.frames[rows, cols]
                store["ignored"][b] = seg.ignored[rows, cols]
                store["ignored"][b, T] = rng.random(E) < 0.5
                store["unroll_group"][b], store["unroll_epoch"][b] = g, epoch
                want.append(seg.stacks[rows, cols])
                order[g].append(b)
                b += 1
    return store, order, want


def _handed_on(order: list[list[int]], rng) -> list[int]:
    """The groups' buffers in an order the learner may get them: interleaved at random, each group's own
    in the order it filled them."""
    queues, out = [list(q) for q in order], []
    while any(queues):
        out.append(queues[int(rng.choice([i for i, q in enumerate(queues) if q]))].pop(0))
    return out


def _check_vtrace_learner(segments: list[Segment], groups: int, T: int, rng) -> int:
    """V-trace's learner: batches of k = groups + 1 unrolls (so one group is in each twice), stacked by
    ``UnrollStacks`` as ``VTraceLearner`` does. Returns how many episodes began on an unroll's row 0 (its
    first frame the previous unroll's bootstrap row)."""
    from seedlocal.algos.frames import UnrollStacks

    store, order, want = _unroll_store(segments, groups, T, rng)
    E = segments[0].frames.shape[1] // groups
    k = groups + 1
    batcher = Batcher(store, ["obs"], k, CPU, sets=1)
    stacks = UnrollStacks(4, groups * E, E, (84, 84), torch.uint8, CPU)
    bufs = _handed_on(order, rng)
    for i in range(0, len(bufs) - k + 1, k):
        batch = batcher.fill(bufs[i:i + k], 0)
        got = stacks(batch.data["obs"][""], batch.data["ignored"], batch.groups, batch.epochs)
        expect = np.concatenate([want[b] for b in bufs[i:i + k]], axis=1)
        assert got.dtype == torch.uint8 and got.shape == expect.shape
        assert torch.equal(got, torch.from_numpy(expect)), f"batch {i // k}: unrolls {bufs[i:i + k]}"
    return int(store["ignored"][:, T - 1].sum())


def _check_r2d2_replay(segments: list[Segment], groups: int, T: int, rng) -> None:
    """R2D2's learner: the unrolls into the replay through ``ReplayFeeder`` (its streams cut at the
    restart), every sequence sampled once and staged as the learner's batch."""
    store, order, want = _unroll_store(segments, groups, T, rng)
    n = segments[0].frames.shape[1]
    E = n // groups
    preset = r2d2.PRESETS["atari"]
    cfg = dataclasses.replace(preset, algo=dataclasses.replace(preset.algo, burn_in=3, unroll_length=T,
                                                               replay_size=n * len(want)))
    replay = make_replay(cfg, describe("Pong-v5", "envpool", 1), n, CORE.shape, seed=0)
    feeder = ReplayFeeder(replay, np.zeros(n, bool), E, T, 1.0, 1, 1)
    rows_of = [[] for _ in range(n)]  # each stream's steps: (buffer, row)
    for b in _handed_on(order, rng):
        feeder.ingest(store, b)
        g = int(store["unroll_group"][b])
        for e in range(E):
            rows_of[g * E + e] += [(b, r) for r in range(T)]
    sampled = replay.sample(replay.size, 0.6)
    slots = sampled[1]
    assert len(set(slots.tolist())) == len(slots) == replay.size > 0
    batch, *_ = BatchStager(CPU, ["obs"]).stage(sampled)
    got = batch["obs"][""]
    for j, slot in enumerate(slots.tolist()):
        env, start = int(replay.slot_env[slot]), int(replay.slot_start[slot])
        expect = np.stack([want[b][r, env % E] for b, r in rows_of[env][start:start + replay.length]])
        assert got.dtype == torch.uint8 and torch.equal(got[:, j], torch.from_numpy(expect)), \
            f"stream {env}, steps {start} ..."


def _policies(spec, n: int):
    """V-trace's and R2D2's acting policies for ``n`` env slots as the Atari presets make them (frames
    stacked 4 deep; R2D2's with an epsilon per slot)."""
    v, q = vtrace.PRESETS["atari"], r2d2.PRESETS["atari"]
    yield ModelPolicy(vtrace.build_model(v, spec), spec, stack=v.frame_stack)
    yield R2D2Policy(r2d2.build_net(q, spec, CPU), spec, torch.zeros(n), WeightLock(CPU), CPU, q.frame_stack, 0)


def _check_all(env_id: str, segments: list[Segment], groups: int) -> None:
    rng = np.random.default_rng(0)
    for policy in _policies(describe(env_id, "envpool", 1), segments[0].frames.shape[1]):
        _check_acting(policy, segments, groups, rng)
    at_row_0 = 0
    for T in (12, 17):  # unroll boundaries at different steps; in both games an episode begins on a row 0
        at_row_0 += _check_vtrace_learner(segments, groups, T, rng)
        _check_r2d2_replay(segments, groups, T, rng)
    assert at_row_0, "no episode began on an unroll's first row"


def test_pong_stacks_are_envpools():
    """Pong: two episodes end (random play's last 750 to 1,200 steps), two begin after them, two at the
    start and two at the restart, each with envpool's noop start (noop_max 30)."""
    segments = _episodes("Pong-v5", 2, (800, 60), seed=11)
    assert sum(s.ends for s in segments) == 2
    _check_all("Pong-v5", segments, groups=2)


def test_breakout_stacks_are_envpools_through_lost_lives():
    """Breakout: games end and lives are lost within them. seedlocal leaves envpool's ``episodic_life`` off,
    so a lost life ends no episode: envpool's stack and seedlocal's both go on through it."""
    segments = _episodes("Breakout-v5", 4, (250, 100), seed=2)
    assert sum(s.ends for s in segments) >= 4 and sum(s.life_losses for s in segments) >= 10
    _check_all("Breakout-v5", segments, groups=2)


def test_envpool_keeps_its_stack_through_a_lost_life_only_under_episodic_life():
    """What turning envpool's ``episodic_life`` on would change (seedlocal leaves it off, envpool's default;
    ``_episodes`` asserts it is off): a lost life would end envpool's episode but not its game, and envpool's
    stack rolls on through the reset after it (the three frames before stay), where a game's end refills it
    (the tests above). seedlocal's stacks refill at every episode start: they would differ after each lost
    life."""
    import envpool

    env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, num_threads=1, seed=2, episodic_life=True)
    rng = np.random.default_rng(3)
    prev, _ = env.reset()
    ended, rolled_on = False, 0
    for _ in range(80):
        obs, _, terminated, _, info = env.step(rng.integers(0, 4, 1))
        if ended:  # the reset after a lost life (its action ignored): the stack rolled on, not refilled
            assert np.array_equal(obs[0, :3], prev[0, 1:])
            assert not all(np.array_equal(obs[0, i], obs[0, 3]) for i in range(3))
            rolled_on += 1
        ended = bool(terminated[0]) and info["lives"][0] > 0
        prev = obs
    env.close()
    assert rolled_on >= 2
