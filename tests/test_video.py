"""Eval's videos show what a person sees: the env's own frames at their native size and colour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlocal.config import EnvConfig, validate_env
from seedlocal.evaluate import record
from seedlocal.networks import ActorCritic
from seedlocal.video import RenderUnavailable


def _model(env_id: str):
    spec = validate_env(EnvConfig(id=env_id))
    torch.manual_seed(0)
    return ActorCritic(spec).eval(), spec


def test_atari_frames_are_the_games_colour_frames_of_the_episode_played():
    model, spec = _model("Pong-v5")
    frames = record(model, spec, greedy=False, seed=3, max_steps=40)
    assert len(frames) == 40
    assert frames[0].shape == (210, 160, 3) and frames[0].dtype == np.uint8  # not the network's 84 x 84 grey
    assert len({f.tobytes() for f in frames}) > 1  # it plays


def test_a_gymnasium_env_is_recorded_through_its_render():
    model, spec = _model("faulty_envs:ActionStart-v0")
    frames = record(model, spec, greedy=True, seed=0, max_steps=10)
    assert frames and frames[0].shape == (8, 8, 3)


def test_mujoco_renders_headless_where_a_context_can_be_made():
    pytest.importorskip("mujoco", reason="the mujoco package draws MuJoCo's frames")
    from seedlocal.video import _headless_gl

    try:
        _headless_gl()
    except RenderUnavailable as e:
        pytest.skip(f"no headless OpenGL here: {e}")
    spec = validate_env(EnvConfig(id="InvertedPendulum-v5"))
    model = ActorCritic(spec).eval()
    frames = record(model, spec, greedy=True, seed=0, max_steps=5)
    assert frames[0].shape[2] == 3 and min(frames[0].shape[:2]) >= 240 and frames[0].std() > 0


def test_an_env_that_cannot_render_still_reports_its_returns(tmp_path, capsys):
    """No renderer: one line says why and what to install; the episodes are played and scored."""
    from seedlocal.evaluate import EvalConfig
    from seedlocal.evaluate import main as evaluate
    from seedlocal.trainers.vtrace import VTraceRun, train

    train(VTraceRun(env=EnvConfig(id="faulty_envs:ActionStart-v0"), total_steps=600, log_dir=str(tmp_path),
                    run_name="r", progress=False))
    import faulty_envs

    original = faulty_envs.ActionStart.render
    faulty_envs.ActionStart.render = lambda self: (_ for _ in ()).throw(RuntimeError("no renderer here"))
    try:
        out = evaluate(EvalConfig(checkpoint=str(tmp_path / "r"), episodes=2, video=str(tmp_path / "v.gif")))
    finally:
        faulty_envs.ActionStart.render = original
    text = capsys.readouterr().out
    assert "no video: cannot render faulty_envs:ActionStart-v0 (RuntimeError: no renderer here)" in text
    assert len(out["returns"]) == 2 and not (tmp_path / "v.gif").exists()
