"""seedlocal train r2d2 end to end: the run loop, the CLI, eval and learning."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from seedlocal.errors import ConfigError
from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.networks import RecurrentQNet, cut_rows, encode
from seedlocal.envs.spaces import describe
from seedlocal.recipes.r2d2 import PRESETS, R2D2Run
from seedlocal.trainers.r2d2 import train
from helpers import prepared


def small(tmp_path, **algo) -> R2D2Run:
    base = PRESETS["cartpole"]
    return dataclasses.replace(
        base, algo=dataclasses.replace(base.algo, **{"min_replay": 40, "replay_size": 400, **algo}),
        pipeline=PipelineConfig(num_workers=1, envs_per_worker=8, min_batch_envs=2, unroll_length=0),
        log_dir=str(tmp_path), run_name="r", progress=False, log_every_s=0.5, total_steps=6000)


def test_unroll_matches_a_per_step_loop_with_resets():
    """The fused, segmented LSTM unroll equals stepping one row at a time and
    zeroing the state of each env at its episode starts."""
    torch.manual_seed(0)
    net = RecurrentQNet(describe("CartPole-v1"), lstm_size=16)
    L, B = 13, 5
    obs = {"": torch.randn(L, B, 4)}
    core = torch.randn(B, 2, 16)
    first = torch.zeros(L, B, dtype=torch.bool)
    first[3, 1] = first[3, 4] = first[7, 0] = first[12, 2] = True
    q, final = net.unroll(obs, core, first, cut_rows(first.numpy()))
    state, qs = core, []
    for t in range(L):
        if t > 0:
            state = state * (~first[t]).float().view(-1, 1, 1)
        q_t, state = net.step({"": obs[""][t]}, state)
        qs.append(q_t)
    torch.testing.assert_close(q, torch.stack(qs), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final, state, rtol=1e-5, atol=1e-6)
    x = encode(net, {"": obs[""][0]})
    assert x.shape == (B, net.lstm.input_size)


def test_learner_lstm_gets_contiguous_states_flat_weights_and_host_side_cuts():
    """What cuDNN's RNN needs, checked on the CPU (whose kernel checks none
    of it): every state reaching the LSTM is contiguous, its weights are the
    module's flat list (no repacking per call), and with the host's copy of
    the flags (``ignored_host``) the update reads nothing back from the
    device."""
    import copy

    import numpy as np
    from torch.overrides import TorchFunctionMode

    from seedlocal.algos.r2d2 import R2D2Params, learner_step
    from seedlocal.pipeline.cuda import WeightLock

    class Spy(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.lstm, self.nonzero = [], 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name == "lstm":
                self.lstm.append(args)
            elif name == "nonzero":
                self.nonzero += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    p = R2D2Params(burn_in=4, unroll_length=8)
    online = RecurrentQNet(describe("CartPole-v1"), lstm_size=16)
    target = copy.deepcopy(online)
    L, B = p.burn_in + p.unroll_length + 1, 6
    g = torch.Generator().manual_seed(1)
    ignored = torch.zeros(L, B, dtype=torch.bool)
    ignored[2, 1] = ignored[6, 3] = ignored[9, 0] = True
    batch = {"obs": {"": torch.randn(L, B, 4, generator=g)}, "action": torch.randint(0, 2, (L, B), generator=g),
             "reward": torch.ones(L, B), "terminated": torch.zeros(L, B, dtype=torch.bool),
             "truncated": torch.zeros(L, B, dtype=torch.bool), "ignored": ignored,
             "core_state": torch.randn(B, 2, 16, generator=g)}
    net = copy.deepcopy(online)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    with Spy() as spy:
        _, prio = learner_step(net, target, opt, {**batch, "ignored_host": ignored.numpy()}, torch.ones(B), p,
                               WeightLock())
    for args in spy.lstm:
        assert all(t.is_contiguous() for t in args[1]), "a strided state reached the LSTM"
        assert args[2] is net.lstm._flat_weights or args[2] is target.lstm._flat_weights
    assert len(spy.lstm) >= 4  # burn-in and trained rows, both networks, cut at the episode starts
    assert spy.nonzero == 0, "the update read its cuts back from the device"
    assert np.isfinite(prio.numpy()).all()


def test_r2d2_checkpoints_from_the_lstm_cell_core_still_load():
    """The core was an nn.LSTMCell (weights named without a layer suffix): its checkpoints load unchanged."""
    net = RecurrentQNet(describe("CartPole-v1"), lstm_size=8)
    old = {k.replace("lstm.weight_ih_l0", "lstm.weight_ih").replace("lstm.weight_hh_l0", "lstm.weight_hh")
           .replace("lstm.bias_ih_l0", "lstm.bias_ih").replace("lstm.bias_hh_l0", "lstm.bias_hh"): v + 1.0
           for k, v in net.state_dict().items()}
    assert "lstm.weight_ih" in old
    fresh = RecurrentQNet(describe("CartPole-v1"), lstm_size=8)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.lstm.weight_ih_l0, old["lstm.weight_ih"])


@pytest.mark.parametrize("change, message", [
    (dict(burn_in=100, replay_size=32, min_replay=32), "too small to hold one burn-in"),
    (dict(n_step=16), "must be shorter than algo.unroll_length"),
    (dict(priority_exponent=1.5), "algo.priority_exponent=1.5: must be in [0, 1]"),
    (dict(importance_exponent=-0.1), "algo.importance_exponent=-0.1: must be in [0, 1]"),
    (dict(replay_size=16), "smaller than a batch"),
    (dict(eval_envs=16), "leaves no env to fill the replay"),
    (dict(replay_size=10**12), "the replay needs"),
])
def test_bad_r2d2_settings_fail_before_any_process_starts(change, message):
    cfg = dataclasses.replace(PRESETS["cartpole"], algo=dataclasses.replace(PRESETS["cartpole"].algo, **change))
    with pytest.raises(ConfigError) as e:
        prepared(cfg)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_short_run_writes_summary_checkpoint_and_eval_plays_it(tmp_path, capsys):
    from seedlocal.cli import main

    summary = train(prepared(small(tmp_path)))
    run = tmp_path / "r"
    assert summary["status"] == "done" and summary["steps"] >= 6000 and summary["updates"] > 0
    assert json.loads((run / "summary.json").read_text())["algo"] == "r2d2"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    for tag in ("charts/eval_return", "charts/replay_ratio", "losses/td_abs", "losses/q_mean", "replay/size",
                "replay/priority_mean", "replay/insert_per_s", "replay/sample_per_s", "perf/updates_per_s"):
        assert tag in tags, tag
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "epsilon" in out or "return" in out, out
    # Resume continues the counters (the replay restarts empty unless --checkpoint-replay).
    again = train(prepared(dataclasses.replace(small(tmp_path), resume=str(run), total_steps=9000)))
    assert again["steps"] >= 9000 and again["updates"] > summary["updates"]


def test_cli_refuses_bad_values_in_one_line(tmp_path, capsys):
    from seedlocal.cli import main

    assert main(["train", "r2d2", "--algo.n-step", "40", "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "algo.n_step=40" in lines[0], err
    assert not list(tmp_path.iterdir())  # nothing was started or written


R2D2_CARTPOLE_BUDGET = 300_000


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_r2d2_learns_cartpole_within_budget(tmp_path, seed):
    """Issue 10's target: evaluation return (epsilon 0.001, 20 episodes) >= 450
    within 300k steps with the defaults."""
    cfg = dataclasses.replace(PRESETS["cartpole"], env=EnvConfig(seed=seed), log_dir=str(tmp_path), run_name="c",
                              progress=False, total_steps=R2D2_CARTPOLE_BUDGET, stop_at_return=450.0)
    summary = train(prepared(cfg))
    assert summary["steps_to_target"] is not None, summary
    assert summary["return_at_target"] >= 450 and summary["target_return_source"] == "eval", summary


def test_checkpoint_replay_restores_the_replay_on_resume(tmp_path, capsys):
    """--checkpoint-replay saves the replay (lz4 frames included) and a resumed
    run samples from it at once; without it the replay restarts empty."""
    cfg = dataclasses.replace(small(tmp_path), checkpoint_replay=True, compress=True)
    first = train(prepared(cfg))
    saved = torch.load(first["checkpoint"], map_location="cpu", weights_only=True)
    assert "replay" in saved
    capsys.readouterr()
    train(prepared(dataclasses.replace(cfg, resume=str(tmp_path / "r"), total_steps=8000)))
    out = capsys.readouterr().out
    restored = [ln for ln in out.splitlines() if "replay restored with" in ln]
    assert restored and int(restored[0].split("with ")[1].split()[0].replace(",", "")) > 0, out


def test_evaluation_slots_are_local_and_neither_fill_nor_count_in_the_replay(tmp_path):
    """The replay holds a stream per acting env only; the replay ratio counts
    acting steps only (evaluation steps counted as data made the learner
    train that much more per acting step); the evaluation slots are local
    envs, so --stop-at-return never waits for actor hosts to join."""
    from seedlocal.trainers.r2d2 import eval_env_ids

    assert eval_env_ids(num_local=16, num_envs=48, eval_envs=2).tolist() == [14, 15]
    assert eval_env_ids(num_local=0, num_envs=16, eval_envs=2).tolist() == [14, 15]  # every env remote
    cfg = small(tmp_path, eval_envs=4, replay_ratio=1.0, batch_size=8, min_replay=8, replay_size=200)
    cfg = dataclasses.replace(cfg, total_steps=4000)
    summary = train(prepared(cfg))
    acting_steps = summary["steps"] / 2  # 8 envs, the last 4 (one group) evaluate
    learned_rows = summary["updates"] * cfg.algo.batch_size * cfg.algo.unroll_length
    assert summary["updates"] > 0 and summary["eval_return_last20"] is not None
    assert learned_rows <= 1.3 * cfg.algo.replay_ratio * acting_steps + cfg.algo.batch_size * cfg.algo.unroll_length
