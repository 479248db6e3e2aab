"""Frames stacked beside the network (``algos/frames.py``): the learner's stacks of V-trace's unrolls must be
the ones the policy acted on, step by step, across unroll boundaries, episode starts, a group's restart and a
batch that holds two unrolls of one group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlocal.algos.frames import FrameHistory, UnrollStacks, net_spec, stack_problem, stacking
from seedlocal.spec import EnvSpec, TensorSpec
from helpers import prepared

S, E, T, H = 4, 2, 5, 2  # stack, envs per group, unroll length, frame side
FRAME = TensorSpec((1, H, H), "uint8")


def _epoch(rng, steps: int, start: int):
    """One run of a group's envs from fresh episodes: frames [steps, E, 1, H, H] (each its own number),
    ignored [steps, E], and the stacks the policy acts on at each step (FrameHistory, as the inference loop
    drives it: an episode starts at step 0 and after an ignored step)."""
    frames = ((start + np.arange(steps * E)) % 251).astype(np.uint8).reshape(steps, E, 1, 1, 1)
    frames = np.broadcast_to(frames, (steps, E, 1, H, H)).copy()
    ignored = rng.random((steps, E)) < 0.15
    history = FrameHistory(FRAME, S, "cpu", slots=E)
    acted = []
    for t in range(steps):
        first = np.ones(E, bool) if t == 0 else ignored[t - 1]
        acted.append(history(torch.from_numpy(frames[t]), torch.arange(E), torch.from_numpy(first), E).clone())
    return frames, ignored, torch.stack(acted)


def _unrolls(rng, group: int):
    """A group's handed-on unrolls in the order it filled them: epoch 0 of 4 unrolls, a restart that drops a
    partial unroll (its rows never reach the learner), then epoch 1 of 3."""
    out, start = [], 1000 * group
    for epoch, n in enumerate((4, 3)):
        steps = n * T + 1 + (3 if epoch == 0 else 0)  # the partial unroll the restart gives up
        frames, ignored, acted = _epoch(rng, steps, start)
        start += steps * E
        for u in range(n):
            rows = slice(u * T, u * T + T + 1)  # L = T + 1 rows, the last the next one's first
            out.append((group, epoch, frames[rows], ignored[rows], acted[rows]))
    return out


def test_the_learners_stacks_are_the_ones_the_policy_acted_on():
    rng = np.random.default_rng(0)
    groups = 3
    queues = [_unrolls(rng, g) for g in range(groups)]
    # Hand-on order: groups interleaved at random, each in its own order; batches of k=3 unrolls, which may
    # hold one group twice (a fast group with actors that do not wait).
    order = []
    while any(queues):
        g = int(rng.choice([i for i, q in enumerate(queues) if q]))
        order.append(queues[g].pop(0))
    assert any(len({u[0] for u in order[i:i + 3]}) < 3 for i in range(0, len(order) - 2, 3))
    stacks = UnrollStacks(S, groups * E, E, (H, H), torch.uint8, "cpu")
    k = 3
    for i in range(0, len(order) - len(order) % k, k):
        batch = order[i:i + k]
        frames = torch.from_numpy(np.concatenate([u[2] for u in batch], axis=1))
        ignored = torch.from_numpy(np.concatenate([u[3] for u in batch], axis=1))
        got = stacks(frames, ignored, [u[0] for u in batch], [u[1] for u in batch])
        want = torch.cat([u[4] for u in batch], dim=1)
        assert got.shape == (T + 1, k * E, S, H, H)
        assert torch.equal(got, want), f"batch {i // k}"


def test_an_episode_start_inside_an_unroll_repeats_its_first_frame():
    """An episode's first frame in every slot, then rolled on (envpool's rule; test_frames_envpool.py checks the
    stackers against envpool itself)."""
    stacks = UnrollStacks(S, 1, 1, (1, 1), torch.uint8, "cpu")
    frames = torch.arange(1, 8, dtype=torch.uint8).view(7, 1, 1, 1, 1)
    ignored = torch.zeros(7, 1, dtype=torch.bool)
    ignored[2] = True  # row 3 starts an episode
    got = stacks(frames, ignored, [0], [0])[:, 0, :, 0, 0].tolist()
    assert got[:3] == [[1, 1, 1, 1], [1, 1, 1, 2], [1, 1, 2, 3]]
    assert got[3:] == [[4, 4, 4, 4], [4, 4, 4, 5], [4, 4, 5, 6], [4, 5, 6, 7]]
    # The next unroll goes on from row 6 (its row 0), then a restart (epoch 1) starts afresh.
    nxt = stacks(torch.tensor([7, 8], dtype=torch.uint8).view(2, 1, 1, 1, 1), torch.zeros(2, 1, dtype=torch.bool),
                 [0], [0])[:, 0, :, 0, 0].tolist()
    assert nxt == [[4, 5, 6, 7], [5, 6, 7, 8]]
    again = stacks(torch.tensor([9, 10], dtype=torch.uint8).view(2, 1, 1, 1, 1), torch.zeros(2, 1, dtype=torch.bool),
                   [0], [1])[:, 0, :, 0, 0].tolist()
    assert again == [[9, 9, 9, 9], [9, 9, 9, 10]]


def _spec(shape, dtype="uint8"):
    return EnvSpec("X", "gymnasium", {"": TensorSpec(shape, dtype)}, TensorSpec((), "int64"), 6, None, None, 1)


@pytest.mark.parametrize("shape, ok", [((1, 84, 84), True), ((4, 84, 84), False), ((84, 84, 3), False),
                                       ((8,), False)])
def test_only_single_channel_frames_are_stacked(shape, ok):
    spec = _spec(shape, "uint8" if len(shape) > 1 else "float32")
    assert (stack_problem(spec, 4) is None) == ok
    assert stacking(spec, 4) == (4 if ok else 1) and stacking(spec, 0) == 1 and stack_problem(spec, 0) is None
    assert net_spec(spec, stacking(spec, 4)).obs[""].shape == ((4, 84, 84) if ok else shape)
    assert "must be >= 0" in stack_problem(spec, -1)


def test_a_sync_run_learns_from_the_stacks_its_actors_acted_on(tmp_path):
    """Through the real pipeline and train(): single frames from the env, stacked by the policy while acting
    and by the learner from the unrolls. With actors that wait for each update, the learner's first pass
    recomputes exactly the policy the actors sampled from (pi/mu = 1) only if its stacks are theirs."""
    import dataclasses

    from seedlocal.algos.vtrace import VTraceParams
    from seedlocal.config.schema import EnvConfig, PipelineConfig
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.trainers.vtrace import train
    from test_train_vtrace import scalars

    algo = dataclasses.replace(VTraceParams(), batch_size=4, precision="fp32")
    cfg = VTraceRun(env=EnvConfig(id="image_catch:ImageCatch1-v0"), frame_stack=4, algo=algo, total_steps=1500,
                    pipeline=PipelineConfig(num_workers=1, envs_per_worker=4, unroll_length=16),
                    log_dir=str(tmp_path), run_name="s", progress=False, log_every_s=0.2)
    summary = train(prepared(cfg))
    assert summary["updates"] >= 10, summary
    rho = [v for _, v in scalars(tmp_path / "s")[0]["losses/mean_rho"]]
    assert rho and min(rho) > 0.99999, rho


def test_a_checkpoint_from_before_the_stacks_still_plays_and_resumes(tmp_path):
    """Atari runs before the stacks beside the network had envpool stack 4 frames and saved no frame_stack in
    their identity: such a run (env.frame_stack 0, frame_stack 0) still plays with eval's policy and resumes."""
    import dataclasses

    from seedlocal import checkpoint
    from seedlocal.config.schema import EnvConfig, PipelineConfig
    from seedlocal.recipes.vtrace import PRESETS
    from seedlocal.trainers.vtrace import from_checkpoint, train

    preset = PRESETS["atari"]
    old = dataclasses.replace(preset, env=EnvConfig(id="Pong-v5"), frame_stack=0, total_steps=300,
                              algo=dataclasses.replace(preset.algo, batch_size=4, echo=1, minibatches=1),
                              pipeline=PipelineConfig(num_workers=1, envs_per_worker=4, unroll_length=8),
                              log_dir=str(tmp_path), run_name="old", progress=False)
    train(prepared(old))
    state = checkpoint.load(tmp_path / "old")
    assert "frame_stack" not in state["identity"] and "env_frame_stack" not in state["identity"]
    policy = from_checkpoint(state, torch.device("cpu"))
    assert policy.frames is None and policy.model.encoder.conv[0].in_channels == 4
    actions, _, _ = policy.act({"": torch.zeros(2, 4, 84, 84, dtype=torch.uint8)}, None, np.arange(2), np.ones(2, bool))
    assert actions.shape == (2,)
    again = train(prepared(dataclasses.replace(old, total_steps=600, resume=str(tmp_path / "old"))))
    assert again["steps"] >= 600
