"""--video-every-min: the policy's episodes while it trains, in TensorBoard and W&B."""

import io

import numpy as np
import pytest
from PIL import Image

from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.trainers.videos import TAG
from seedlocal.recipes.vtrace import VTraceRun
from seedlocal.trainers.vtrace import train
from helpers import prepared


def _images(run_dir) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    ea.Reload()
    return ea.Images(TAG) if TAG in ea.Tags()["images"] else []


def _gif_frames(encoded: bytes) -> list[np.ndarray]:
    img = Image.open(io.BytesIO(encoded))
    out = []
    for i in range(img.n_frames):
        img.seek(i)
        out.append(np.asarray(img.convert("RGB")))
    return out


def test_videos_during_training_go_to_the_run_folder_tensorboard_and_wandb(tmp_path, monkeypatch, capsys):
    """CartPole's own drawing (envpool's 400 x 600 colour frames), one GIF per video in <run>/videos, the same GIF in
    TensorBoard under videos/episode at the step it was asked for, and in the run's W&B history."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from wandb_files import offline_runs

    monkeypatch.setenv("WANDB_MODE", "offline")
    train(prepared(VTraceRun(total_steps=20_000, log_dir=str(tmp_path), run_name="v", progress=False, track=True,
                    video_every_min=0.01, env=EnvConfig(seed=4))))
    run_dir = tmp_path / "v"
    gifs = sorted((run_dir / "videos").glob("steps_*.gif"))
    assert gifs, "no video was written"
    images = _images(run_dir)
    assert [e.step for e in images] == [int(p.stem.split("_")[1]) for p in gifs]
    assert images[0].encoded_image_string == gifs[0].read_bytes()
    frames = _gif_frames(gifs[0].read_bytes())
    assert frames[0].shape == (400, 600, 3) and len(frames) > 1 and len({f.tobytes() for f in frames}) > 1
    (wb,) = offline_runs(run_dir)
    sent = [row for row in wb.history if f"{TAG}/_type" in row]
    assert len(sent) == len(gifs) and [row["steps"] for row in sent] == [e.step for e in images]
    assert "no videos" not in capsys.readouterr().out


def test_an_env_that_cannot_render_is_said_once_and_the_run_goes_on(tmp_path, capsys):
    import faulty_envs

    def no_renderer(self):
        raise RuntimeError("no renderer here")

    original = faulty_envs.ActionStart.render
    faulty_envs.ActionStart.render = no_renderer  # in this process only: the env workers step the real class
    try:
        summary = train(prepared(VTraceRun(env=EnvConfig(id="faulty_envs:ActionStart-v0"), total_steps=6_000,
                                  log_dir=str(tmp_path), run_name="r", progress=False, video_every_min=0.002,
                                  pipeline=PipelineConfig(num_workers=1, envs_per_worker=8))))
    finally:
        faulty_envs.ActionStart.render = original
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "videos" in line]
    assert lines == ["seedlocal: no videos during training: cannot render faulty_envs:ActionStart-v0 "
                     "(RuntimeError: no renderer here); the env must take render_mode='rgb_array' and return "
                     "frames from render()"]
    assert summary["status"] == "done" and summary["steps"] >= 6_000
    assert not (tmp_path / "r" / "videos").exists()


@pytest.mark.parametrize("algo, budget, made", [("r2d2", ["--total-steps", "6000"], "steps_"),
                                                ("ga", ["--generations", "2"], "generation_")])
def test_every_kind_of_family_makes_videos_of_its_policy(tmp_path, algo, budget, made):
    """R2D2's online network (epsilon-greedy as eval acts), a population's best member so far."""
    from seedlocal.cli import main

    assert main(["train", algo, *budget, "--video-every-min", "0.001", "--log-dir", str(tmp_path),
                 "--run-name", "x", "--no-progress"]) == 0
    gifs = list((tmp_path / "x" / "videos").glob(made + "*.gif"))
    assert gifs and _gif_frames(gifs[0].read_bytes())[0].shape == (400, 600, 3)


def test_a_negative_period_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from seedlocal.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "vtrace", "--video-every-min", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "seedlocal: error: video_every_min=-1.0: must be >= 0 (0 = no videos)"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("family, run, trainer", [("vtrace", "VTraceRun", "VTraceTrainer"),
                                                  ("r2d2", "R2D2Run", "R2D2Trainer")])
def test_a_video_leaves_the_trainings_random_stream_as_it_was(tmp_path, family, run, trainer):
    """Training's acting samples from torch's global generator. A video played meanwhile (its policy rebuilt from
    the weights, then sampling an episode) draws from a generator of its own: the global stream is the same with
    and without it."""
    import importlib
    import time

    import torch

    from seedlocal.monitor import RunMonitor
    from seedlocal.trainers.videos import TrainingVideos

    module = importlib.import_module(f"seedlocal.trainers.{family}")
    recipe = importlib.import_module(f"seedlocal.recipes.{family}")
    cfg = getattr(recipe, run)(video_every_min=1.0, env=EnvConfig(seed=5), log_dir=str(tmp_path), run_name="v")
    p = prepared(cfg)
    t = getattr(module, trainer)(p, torch.device("cpu"))
    (tmp_path / "v").mkdir()
    monitor = RunMonitor(tmp_path / "v")
    try:
        torch.manual_seed(0)
        before = torch.get_rng_state()
        with TrainingVideos(t, cfg, monitor, module.from_checkpoint) as videos:
            videos.maybe(time.monotonic() + 61.0, t)
        assert len(list((tmp_path / "v" / "videos").glob("steps_*.gif"))) == 1  # the video was made, to its end
        assert torch.equal(torch.get_rng_state(), before)
    finally:
        monitor.close()


def test_a_run_that_ends_finishes_the_video_handed_over_last_and_says_so_once(tmp_path, monkeypatch, capsys):
    """``close(finish=True)`` waits, past its one-second polls, for the video it handed over last, and says so in
    one line."""
    import dataclasses
    import time
    import types

    from seedlocal.trainers import videos

    @dataclasses.dataclass
    class Cfg:
        video_every_min: float = 1.0
        env: EnvConfig = dataclasses.field(default_factory=EnvConfig)

    made = []

    def record(self, state, x_axis, x):
        time.sleep(2.2)
        made.append((x_axis, x))

    monkeypatch.setattr(videos, "_lowest_priority", lambda: None)  # torch's threads are the test process's
    monkeypatch.setattr(videos.TrainingVideos, "_record", record)
    trainer = types.SimpleNamespace(identity=dict, ranks=types.SimpleNamespace(main=True), acting_state=dict,
                                    counters={"steps": 7}, x_axis="steps", spec=None)
    monitor = types.SimpleNamespace(run_dir=tmp_path)
    with videos.TrainingVideos(trainer, Cfg(), monitor, lambda *a: None) as v:
        v.maybe(time.monotonic() + 61.0, trainer)
        v.maybe(time.monotonic() + 122.0, trainer)  # due while the first is made: skipped
    assert made == [("steps", 7)]
    assert capsys.readouterr().out.count("finishing the last training video") == 1
