"""Eval's videos show what a person sees: the env's own frames at their native size and colour."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from seedlocal import video
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.evaluate import Acting
from seedlocal.networks import ActorCritic
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.video import RenderUnavailable, encode_gif
from helpers import prepared


class Painted(gym.Env):
    """Draws a 37 x 53 colour frame whose red channel counts the steps; an env of 200 steps a second."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": ["rgb_array"], "render_fps": 200}

    def __init__(self, render_mode=None, frame=None):
        self.render_mode, self.frame = render_mode, frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t == 30, False, {}

    def render(self):
        if self.frame != "default":
            return self.frame
        img = np.zeros((37, 53, 3), np.uint8)
        img[..., 0], img[..., 1], img[..., 2] = self.t, 100, 200
        return img


gym.register("SeedlocalPainted-v0", entry_point=Painted, kwargs={"frame": "default"})
gym.register("SeedlocalDrawsNothing-v0", entry_point=Painted, kwargs={"frame": None})


def record(policy, seed: int, max_steps: int) -> video.Clip:
    """The episode eval records: ``policy`` playing one env of its spec's backend."""
    return video.record(Acting(policy, 1), policy.spec, seed, max_steps)


def _model(env_id: str, greedy: bool = True):
    """A fresh actor-critic's policy as eval plays it, and its env."""
    spec = validate_env(EnvConfig(id=env_id))
    torch.manual_seed(0)
    return ModelPolicy(ActorCritic(spec).eval(), spec, greedy=greedy), spec


def test_atari_frames_are_the_games_colour_frames_of_the_episode_played():
    """210 x 160 colour frames at Atari's real-time 15 steps a second, and each one the screen of the
    very observation the network acted on (the frame, greyed and shrunk, is the stack's newest)."""
    from PIL import Image

    policy, spec = _model("Pong-v5", greedy=False)
    seen = []
    act = Acting(policy, 1)

    def watching(obs):
        seen.append(np.asarray(obs[""][0, -1], float))
        return act(obs)

    frames = video.record(watching, spec, seed=3, max_steps=40)
    assert len(frames) == 40 and frames.fps == 15.0
    assert frames[0].shape == (210, 160, 3) and frames[0].dtype == np.uint8  # not the network's 84 x 84 grey
    assert (frames[0][..., 0] != frames[0][..., 2]).any()  # colour
    assert len({f.tobytes() for f in frames}) > 1  # it plays
    for frame, obs in zip(frames, seen):
        grey = np.asarray(Image.fromarray(frame).convert("L").resize((84, 84), Image.BILINEAR), float)
        assert np.abs(grey - obs).mean() < 2.0


def test_a_gymnasium_env_is_recorded_through_its_render():
    model, spec = _model("faulty_envs:ActionStart-v0")
    frames = record(model, seed=0, max_steps=10)
    assert frames and frames[0].shape == (160, 160, 3)  # its 8 x 8 render, each pixel a 20 x 20 block


def test_a_gymnasium_frame_keeps_its_size_and_colour_and_plays_in_real_time():
    """200 steps a second: every 4th step drawn, played at 50 frames a second, the last step's frame kept."""
    model, spec = _model("SeedlocalPainted-v0")
    frames = record(model, seed=0, max_steps=1000)
    assert frames[0].shape == (37, 53, 3) and frames[0][0, 0].tolist() == [0, 100, 200]
    assert [int(f[0, 0, 0]) for f in frames] == [0, 4, 8, 12, 16, 20, 24, 28, 30] and frames.fps == 50.0
    gif, h, w = encode_gif(frames)
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(gif))
    assert (h, w) == (37, 53) and im.n_frames == 9
    durations = []
    for k in range(im.n_frames):
        im.seek(k)
        durations.append(im.info["duration"])
    assert durations == [20] * 9  # 30 steps at 200 a second: 0.15 s, shown in 0.18 s (its last frame whole)


def test_a_small_float_grid_is_drawn_in_colour_with_cells_a_person_can_see():
    """MinAtar's render() gives a 10 x 10 grid of float colours in [0, 1]: a
    cast to uint8 made every frame black (an 84-byte GIF); each cell becomes a
    16 x 16 block of its colour, 160 x 160 in all."""
    from seedlocal.video import _frame

    grid = np.zeros((10, 10, 3))
    grid[2, 7] = (1.0, 0.5, 0.0)
    f = _frame(grid)
    assert f.shape == (160, 160, 3) and f.dtype == np.uint8
    assert f[2 * 16:3 * 16, 7 * 16:8 * 16].reshape(-1, 3).tolist() == [[255, 128, 0]] * 256
    assert int(f.sum()) == 256 * (255 + 128)  # the rest stays black
    assert _frame(np.full((37, 53, 3), 7, np.uint8)).shape == (37, 53, 3)  # a picture keeps its size


def test_render_returning_nothing_is_named():
    model, spec = _model("SeedlocalDrawsNothing-v0")
    with pytest.raises(RenderUnavailable, match="render\\(\\) returned None"):
        record(model, seed=0, max_steps=5)


def test_gymnasiums_own_mujoco_env_renders_its_480_by_480_camera():
    pytest.importorskip("mujoco", reason="the mujoco package draws MuJoCo's frames")
    from seedlocal.video import _headless_gl

    try:
        _headless_gl()
    except RenderUnavailable as e:
        pytest.skip(f"no headless OpenGL here: {e}")
    spec = validate_env(EnvConfig(id="InvertedPendulum-v5", backend="gymnasium"))
    frames = record(ModelPolicy(ActorCritic(spec).eval(), spec, greedy=True), seed=0, max_steps=3)
    assert frames[0].shape == (480, 480, 3) and (frames[0][..., 0] != frames[0][..., 2]).any()
    assert frames.fps == 25.0  # InvertedPendulum's dt: 0.04 s


def test_mujoco_renders_headless_where_a_context_can_be_made():
    pytest.importorskip("mujoco", reason="the mujoco package draws MuJoCo's frames")
    from seedlocal.video import _headless_gl

    try:
        _headless_gl()
    except RenderUnavailable as e:
        pytest.skip(f"no headless OpenGL here: {e}")
    spec = validate_env(EnvConfig(id="InvertedPendulum-v5"))
    frames = record(ModelPolicy(ActorCritic(spec).eval(), spec, greedy=True), seed=0, max_steps=5)
    assert frames[0].shape[2] == 3 and min(frames[0].shape[:2]) >= 240 and frames[0].std() > 0


def test_an_env_that_cannot_render_still_reports_its_returns(tmp_path, capsys):
    """No renderer: one line says why and what to install; the episodes are played and scored."""
    from seedlocal.evaluate import EvalConfig
    from seedlocal.evaluate import main as evaluate
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.trainers.vtrace import train

    train(prepared(VTraceRun(env=EnvConfig(id="faulty_envs:ActionStart-v0"), total_steps=600, log_dir=str(tmp_path),
                    run_name="r", progress=False)))
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


def test_a_video_of_a_run_on_a_read_only_file_system_is_written_and_said_so(tmp_path):
    """An archived run, or someone else's, may sit on a read-only file system: eval --video wrote the GIF, then
    its TensorBoard writer failed in a thread and eval exited 1. It now says the video stays out of TensorBoard."""
    import shutil
    import subprocess
    import sys

    from seedlocal.recipes.vtrace import VTraceRun

    from seedlocal.trainers.vtrace import train

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("no mount namespace here to make a read-only run folder in")
    train(prepared(VTraceRun(total_steps=600, log_dir=str(tmp_path), run_name="r", progress=False)))
    run, gif = tmp_path / "r", tmp_path / "out" / "v.gif"
    script = (f"mount --bind {run} {run} && mount -o remount,bind,ro {run} && exec {sys.executable} -m seedlocal "
              f"eval --checkpoint {run} --episodes 2 --max-steps 50 --video {gif}")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"not added to the run's TensorBoard: {run} cannot be written here" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr and gif.stat().st_size > 0, out.stderr[-2000:]
