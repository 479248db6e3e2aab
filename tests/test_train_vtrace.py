"""V-trace end to end: it learns, it logs, it checkpoints, it resumes, it evaluates."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import seedlocal_segments
from helpers import prepared, terminal_like
from seedlocal import checkpoint
from seedlocal.checkpoint import CheckpointError
from seedlocal.errors import ConfigError
from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig
from seedlocal.evaluate import EvalConfig
from seedlocal.evaluate import main as evaluate
from seedlocal.recipes.vtrace import PRESETS, VTraceRun
from seedlocal.trainers.vtrace import train

STEP_BUDGET = 400_000  # CartPole-v1 must reach a mean return of 450 (last 20 episodes) within this many agent steps
TAGS = [
    "charts/episode_return", "charts/episode_length", "charts/steps_per_s", "charts/frames_per_s",
    "charts/learning_rate", "losses/policy_loss", "losses/baseline_loss", "losses/entropy",
    "losses/total_loss", "losses/grad_norm", "perf/inference_batch_size", "perf/inference_forward_ms",
    "perf/batch_collect_ms", "perf/learner_wait_share", "perf/worker_wait_share", "perf/policy_lag",
]


def scalars(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}, ea


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """The default settings on CartPole, to a 20-episode mean of 450.

    Measured on the 2-core machine: 30 of 30 runs reached it (median 71k steps, slowest 110k, 15-38 s). One CI
    run in about 35 did not within 400k: it hovered at 150-330 with its policy's entropy rising from 0.35 to
    0.54, with the same policy lag and importance ratios as the runs that learned. The seed is fixed, so what
    differs between runs is the actors' timing. A run stuck like that is a property of one trajectory, so a
    second seed gets one more try; both stuck is a failure (about 1 in 1,000 at that rate)."""
    log_dir = tmp_path_factory.mktemp("runs")
    tries = []
    for seed in (1, 2):
        cfg = VTraceRun(total_steps=STEP_BUDGET, stop_at_return=450, log_dir=str(log_dir), run_name=f"cp{seed}",
                        progress=False, log_every_s=1.0, env=EnvConfig(seed=seed))
        summary = train(prepared(cfg))
        tries.append(summary)
        if summary["steps_to_target"] is not None:
            break
    return cfg, summary, log_dir / cfg.run_name, tries


def test_vtrace_learns_cartpole_within_budget(cartpole_run):
    _, summary, _, tries = cartpole_run
    assert summary["steps_to_target"] is not None, f"no 450 within {STEP_BUDGET} steps, twice: {tries}"
    assert summary["steps_to_target"] <= STEP_BUDGET
    # The mean that met the target; the final one may include episodes that ended while the run stopped.
    assert summary["return_at_target"] >= 450
    assert summary["mean_return_last20"] is not None
    print(f"steps to 450: {summary['steps_to_target']:,d} ({summary['seconds']:.1f} s)")


def test_tensorboard_has_the_documented_tags(cartpole_run):
    _, _, run_dir, _ = cartpole_run
    found, ea = scalars(run_dir)
    missing = [t for t in TAGS if t not in found]
    assert not missing, f"missing tags: {missing}"
    returns = [v for _, v in found["charts/episode_return"]]
    assert returns and all(math.isfinite(v) for v in returns)
    assert max(returns) > 100  # the curve rose
    assert "config/text_summary" in ea.Tags()["tensors"]
    # The interval the run ended in is on the curve too: every episode of the run, the one that reached the
    # target among them. (The actors step on while the run stops, so the last point can precede the last step.)
    summary = cartpole_run[1]
    last_step, episodes = found["charts/episodes"][-1]
    assert episodes == summary["episodes"]
    assert summary["steps_to_target"] <= last_step <= summary["steps"]
    assert found["losses/total_loss"][-1][0] <= summary["steps"]
    shares = [v for _, v in found["perf/worker_wait_share"] + found["perf/worker_env_share"]]
    assert all(0 <= v <= 1.001 for v in shares), shares  # a wait begun before an interval is not lumped into it


def test_eval_plays_the_checkpoint(cartpole_run, capsys):
    _, _, run_dir, _ = cartpole_run
    out = evaluate(EvalConfig(checkpoint=str(run_dir), episodes=8))
    assert out["policy"] == "sampled"  # V-trace's behaviour policy samples
    # The trained weights, sampled on fresh seeds: random play averages ~22. (The
    # snapshot taken the moment training first averages 450 is mid-learning and
    # measured 270 +- 19 here; a full 300k-step run ends near 500.)
    assert out["mean"] >= 100
    printed = capsys.readouterr().out
    assert "return mean" in printed and "std" in printed


def _tiny(tmp_path, **kw) -> VTraceRun:
    base = dict(total_steps=3000, log_dir=str(tmp_path), run_name="tiny", progress=False, log_every_s=0.2)
    base.update(kw)
    return VTraceRun(**base)


def test_resume_continues_the_same_curve(tmp_path):
    first = train(prepared(_tiny(tmp_path)))
    state = checkpoint.load(tmp_path / "tiny")
    assert state["counters"]["steps"] == first["steps"] > 0
    # The first run's last loss point: at its checkpoint's step when it updated after its last regular log,
    # before that step when its last interval only stepped (CI saw 3,064 with the checkpoint at 3,104).
    last = max(s for s, _ in scalars(tmp_path / "tiny")[0]["losses/total_loss"])
    assert last <= first["steps"]
    second = train(prepared(_tiny(tmp_path, total_steps=first["steps"] + 3000, resume=str(tmp_path / "tiny"))))
    assert second["steps"] >= first["steps"] + 3000 - 200
    found, _ = scalars(tmp_path / "tiny")
    steps = [s for s, _ in found["charts/steps_per_s"]]
    assert max(steps) > first["steps"]  # the resumed run logged onto the same curve, further along
    # That point survives the resume's purge of the events after the checkpoint.
    assert last in [s for s, _ in found["losses/total_loss"]]
    assert len(checkpoint.all_checkpoints(tmp_path / "tiny" / "checkpoints")) == 2


def test_a_new_run_in_the_folder_of_one_that_saved_nothing_replaces_its_curve(tmp_path, capsys):
    """A run that died before its first checkpoint leaves its TensorBoard file; a new run of the same name was
    let in (only checkpoints refuse a name) and both curves showed as one. The new run's curve now replaces the
    dead one's points, whose file is kept."""
    from torch.utils.tensorboard import SummaryWriter

    dead = SummaryWriter(str(tmp_path / "tiny"))
    for step in (0, 1000, 2000, 3000):
        dead.add_scalar("charts/steps_per_s", -1.0, step)
    dead.close()
    older = set((tmp_path / "tiny").glob("events.out.tfevents.*"))
    train(prepared(_tiny(tmp_path)))
    assert "holds the TensorBoard files of a run that saved no checkpoint" in capsys.readouterr().out
    assert older <= set((tmp_path / "tiny").glob("events.out.tfevents.*"))  # kept
    found, _ = scalars(tmp_path / "tiny")
    assert found["charts/steps_per_s"] and all(v > 0 for _, v in found["charts/steps_per_s"])


def assert_same_state(a, b, path=""):
    """Bitwise equality of nested checkpoint contents (tensors, dicts, lists, numbers)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_same_state(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), (path, a, b)


def test_resume_restores_weights_optimizer_and_counters_bitwise(tmp_path):
    first = train(prepared(_tiny(tmp_path)))
    saved = checkpoint.load(tmp_path / "tiny")
    # A budget that is already spent: the run restores, does no update, saves again.
    again = train(prepared(_tiny(tmp_path, total_steps=first["steps"], resume=str(tmp_path / "tiny"))))
    assert again["updates"] == saved["counters"]["updates"]
    restored = checkpoint.load(tmp_path / "tiny")
    for key in ("model", "optimizer", "counters", "identity"):
        assert_same_state(saved[key], restored[key], key)


def test_cli_resume_keeps_the_saved_config_and_names_what_changed(tmp_path, capsys):
    from seedlocal.cli import main

    base = ["train", "vtrace", "--log-dir", str(tmp_path), "--run-name", "r", "--no-progress"]
    assert main(base + ["--total-steps", "2000", "--algo.batch-size", "8", "--algo.entropy-cost", "0.02"]) == 0
    capsys.readouterr()
    assert main(["train", "vtrace", "--resume", str(tmp_path / "r"), "--total-steps", "4000",
                 "--algo.learning-rate", "0.0005", "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if l.startswith("seedlocal: resuming")]
    assert len(lines) == 1, out
    assert "algo.learning_rate: 0.001 -> 0.0005" in lines[0] and "total_steps: 2000 -> 4000" in lines[0]
    assert "batch_size" not in lines[0] and "entropy_cost" not in lines[0]
    cfg = checkpoint.load(tmp_path / "r")["config"]
    assert cfg["algo"]["batch_size"] == 8 and cfg["algo"]["entropy_cost"] == 0.02  # kept from the saved run
    assert cfg["algo"]["learning_rate"] == 0.0005 and cfg["total_steps"] == 4000
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] >= 4000 and summary["status"] == "done"


def test_summary_json_is_written_at_every_end(tmp_path, capsys):
    s = train(prepared(_tiny(tmp_path, stop_at_return=15.0)))  # random CartPole play averages ~22
    assert s["return_at_target"] >= 15.0, s
    assert (f"seedlocal: done: reached the target return (mean {s['return_at_target']:.1f} over 20 episodes) at "
            f"{s['frames_to_target']:,d} frames;") in capsys.readouterr().out
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    for key in ("algo", "env", "steps", "frames", "seconds", "mean_return_last20", "steps_to_target",
                "return_at_target", "frames_to_target", "checkpoint", "status"):
        assert key in summary, key
    assert summary["algo"] == "vtrace" and summary["env"] == "CartPole-v1" and summary["status"] == "done"
    assert summary["steps_to_target"] == s["steps_to_target"] and summary["steps_to_target"] is not None
    assert summary["frames_to_target"] == summary["steps_to_target"]
    assert checkpoint.load(summary["checkpoint"])["counters"]["steps"] == summary["steps"]


def test_resume_refuses_another_algorithms_run_and_a_spent_budget(cartpole_run, capsys):
    """Both used to fail late or misleadingly: r2d2 on a V-trace run named an
    unrelated field, and a spent budget started the workers only to rewrite
    the summary with an empty one."""
    from seedlocal.cli import main

    _, _, run_dir, _ = cartpole_run
    before = (run_dir / "summary.json").read_text()
    assert main(["train", "r2d2", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a run of seedlocal train vtrace; resume it with seedlocal train vtrace --resume" in err
    assert main(["train", "vtrace", "--resume", str(run_dir), "--total-steps", "1000"]) == 2
    assert "total_steps=1000: the resumed run already has" in capsys.readouterr().err
    # A resumed run goes on in its own folder: another name or log dir would be ignored, so it is refused.
    assert main(["train", "vtrace", "--resume", str(run_dir), "--run-name", "other"]) == 2
    assert "run_name='other': a resumed run goes on in its own folder" in capsys.readouterr().err
    assert (run_dir / "summary.json").read_text() == before


def test_train_help_lists_the_algorithms():
    out = subprocess.run([sys.executable, "-m", "seedlocal", "train", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for algo in ("vtrace", "ga", "es", "random-search"):
        assert algo in out.stdout


def test_new_run_refuses_to_overwrite_checkpoints(tmp_path):
    train(prepared(_tiny(tmp_path)))
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        train(prepared(_tiny(tmp_path)))


def test_incompatible_and_corrupt_checkpoints_are_refused(tmp_path):
    train(prepared(_tiny(tmp_path)))
    cfg = _tiny(tmp_path, resume=str(tmp_path / "tiny"))
    cfg.network.hidden = (32,)
    with pytest.raises(CheckpointError, match=r"incompatible.*hidden: checkpoint has \[64, 64\], this run has \[32\]"):
        train(prepared(cfg))
    newest = checkpoint.resolve(tmp_path / "tiny")
    good = newest.read_bytes()
    newest.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="not a readable seedlocal checkpoint"):
        train(prepared(_tiny(tmp_path, resume=str(newest))))
    older = newest.parent / "ckpt_000000000001_1.pt"
    older.write_bytes(good)
    with pytest.raises(CheckpointError, match=rf"truncated or corrupt\); the run's next newest is {older}: pass"):
        evaluate(EvalConfig(checkpoint=str(tmp_path / "tiny")))  # a run folder: its newest file is the torn one
    older.unlink()
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        evaluate(EvalConfig(checkpoint=str(tmp_path / "nope.pt")))
    (tmp_path / "notes.pt").write_text('{"not": "a checkpoint"}')
    with pytest.raises(CheckpointError, match=r"notes.pt: not a readable seedlocal checkpoint \(not a file torch.save"):
        evaluate(EvalConfig(checkpoint=str(tmp_path / "notes.pt")))
    newest.write_bytes(good)  # nothing else was touched by the refusals
    assert checkpoint.load(newest)["counters"]["steps"] > 0
    partial = {k: v for k, v in checkpoint.load(newest).items() if k not in ("optimizer", "path")}
    torch.save(partial, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match=r"partial.pt: lacks optimizer, so it cannot be resumed"):
        train(prepared(_tiny(tmp_path, resume=str(tmp_path / "partial.pt"))))


def test_eval_refuses_a_checkpoint_whose_env_has_changed(tmp_path):
    """A user's env may change between training and eval: the network is not
    loaded into a mismatched shape, the difference is named."""
    train(prepared(_tiny(tmp_path)))
    newest = checkpoint.resolve(tmp_path / "tiny")
    state = checkpoint.load(newest)
    state["identity"]["obs"] = {"": [5]}  # as if CartPole had observed 5 numbers in training
    torch.save({k: v for k, v in state.items() if k != "path"}, newest)
    with pytest.raises(CheckpointError, match=r"incompatible.*obs: checkpoint has \{'': \[5\]\}, this run has "
                                              r"\{'': \[4\]\}"):
        evaluate(EvalConfig(checkpoint=str(newest)))


def test_diverged_weights_are_not_saved_over_good_ones(tmp_path):
    """NaN or inf in a checkpoint's tensors (a diverged run) is refused by
    save(), naming them and the last good checkpoint; summary.json stays
    strict JSON (NaN written as null)."""
    train(prepared(_tiny(tmp_path)))
    run = tmp_path / "tiny"
    good = checkpoint.all_checkpoints(run / "checkpoints")
    state = checkpoint.load(good[-1])
    state["model"] = {k: v.clone() for k, v in state["model"].items()}
    next(iter(state["model"].values()))[0] = float("nan")
    with pytest.raises(checkpoint.Diverged, match=rf"NaN or inf in model\..*; not saved, the last good checkpoint "
                                                  rf"is {good[-1]}"):
        checkpoint.save(run, state, 10**9, 10**9)
    assert checkpoint.all_checkpoints(run / "checkpoints") == good
    checkpoint.write_json(run / "summary.json", {"mean": float("nan"), "n": [1, float("inf")], "ok": 1.5})
    assert json.loads((run / "summary.json").read_text()) == {"mean": None, "n": [1, None], "ok": 1.5}


def test_a_checkpoint_copied_elsewhere_resumes_beside_itself(tmp_path):
    """--resume of a checkpoint file outside <run>/checkpoints writes the
    continued run next to that file, never into the folders above it."""
    train(prepared(_tiny(tmp_path)))
    elsewhere = tmp_path / "kept" / "best.pt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(checkpoint.resolve(tmp_path / "tiny").read_bytes())
    train(prepared(_tiny(tmp_path, resume=str(elsewhere), total_steps=6000)))
    assert checkpoint.all_checkpoints(tmp_path / "kept" / "checkpoints")
    assert (tmp_path / "kept" / "summary.json").exists() and not (tmp_path / "summary.json").exists()


def test_one_run_per_folder_at_a_time(tmp_path):
    """A second run (or resume) of a folder a live run holds is refused,
    naming the holder; the lock is freed when the holder ends."""
    (tmp_path / "tiny").mkdir()
    in_use = rf"tiny is in use by another seedlocal run \(pid {os.getpid()}\)"
    held = checkpoint.lock_run(tmp_path / "tiny")  # as a live run holds it
    with pytest.raises(ConfigError, match=in_use):
        train(prepared(_tiny(tmp_path)))
    with pytest.raises(CheckpointError, match=rf"no checkpoint yet: this run is still going \(pid {os.getpid()}\)"):
        train(prepared(_tiny(tmp_path, resume=str(tmp_path / "tiny"))))
    held.close()
    train(prepared(_tiny(tmp_path)))
    held = checkpoint.lock_run(tmp_path / "tiny")
    with pytest.raises(ConfigError, match=in_use):
        train(prepared(_tiny(tmp_path, resume=str(tmp_path / "tiny"), total_steps=6000)))
    held.close()


@pytest.mark.parametrize("when", ["periodic", "at_exit"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys, when):
    """torch.save on a full disk raises a RuntimeError while handling the
    OSError; the user gets the OSError, with the file and the newest good
    checkpoint, in one line, and nothing half-written is left. A periodic
    save that fails ends the run without trying again at exit (which would
    fail the same way and hide the first error)."""
    import errno

    from seedlocal.cli import main

    train(prepared(_tiny(tmp_path)))
    good = checkpoint.newest(tmp_path / "tiny")

    def full_disk(obj, f):
        try:
            f.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 7872 vs 7824")

    monkeypatch.setattr(torch, "save", full_disk)
    capsys.readouterr()
    every = ["--checkpoint-every-min", "0.0001"] if when == "periodic" else []
    rc = main(["train", "vtrace", "--resume", str(tmp_path / "tiny"), "--total-steps", "6000", "--no-progress", *every])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"seedlocal: error: {tmp_path / 'tiny' / 'checkpoints'}/ckpt_") and (
        f"No space left on device; checkpoint not saved (the newest one is {good})" in err[0]), err
    assert checkpoint.newest(tmp_path / "tiny") == good and checkpoint.load(good)
    assert not list((tmp_path / "tiny" / "checkpoints").glob(".tmp-*"))


def test_a_signal_during_a_checkpoint_write_acts_after_it(tmp_path, monkeypatch):
    """SIGTERM (or Ctrl-C) arriving inside torch.save is acted on once the
    checkpoint is complete, instead of tearing it; the file gets the mode the
    user's umask gives files (not mkstemp's 0600)."""
    real_save = torch.save

    def save_interrupted(obj, f):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler would run here, mid-write
        real_save(obj, f)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    monkeypatch.setattr(checkpoint.torch, "save", save_interrupted)
    try:
        with pytest.raises(SystemExit):
            checkpoint.save(tmp_path, {"model": {"w": torch.ones(3)}}, 5, 5)
    finally:
        signal.signal(signal.SIGTERM, previous)
    [path] = checkpoint.all_checkpoints(tmp_path / "checkpoints")
    assert torch.equal(checkpoint.load(path)["model"]["w"], torch.ones(3))
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_the_time_budget_holds_while_a_large_batch_fills(tmp_path, capsys):
    """A synchronous learner collecting a batch of many unrolls still stops at
    --seconds: here one batch needs 640k steps, far more than 1 s makes; the
    last line says why nothing was learned."""
    cfg = _tiny(tmp_path, total_steps=0, seconds=1.0)
    cfg.algo.batch_size = 40_000  # 10,000 unrolls of 16 steps x 4 envs
    summary = train(prepared(cfg))
    # The steps a loaded machine makes in 1 s are its own affair: not asserted beyond the batch they stayed below.
    assert summary["stopped_by"] == "seconds" and summary["updates"] == 0, summary
    assert summary["steps"] < 40_000 * cfg.pipeline.unroll_length, summary
    assert ("0 updates (the budget ended before a first batch of algo.batch_size x pipeline.unroll_length = "
            f"{40_000 * cfg.pipeline.unroll_length:,d} steps was learned from)") in capsys.readouterr().out


def test_bad_training_config_is_refused_before_start(tmp_path):
    with pytest.raises(ConfigError, match=r"algo.batch_size=6: must be a positive multiple of the envs per group \(4, half "
                                          r"of pipeline.envs_per_worker=8\)"):
        cfg = _tiny(tmp_path)
        cfg.algo.batch_size = 6
        train(prepared(cfg))
    with pytest.raises(ConfigError, match=r"total_steps=0: with seconds=0"):
        train(prepared(_tiny(tmp_path, total_steps=0)))
    assert not (tmp_path / "tiny").exists()


def test_atari_preset_trains_and_records_a_video(tmp_path):
    cfg = PRESETS["atari"]
    # One pass of one minibatch per batch: the point is the checkpoint and its video, not the 16 updates a batch
    # the preset makes (a copy: the batch size was once set on the preset's own algo, for every later test).
    algo = dataclasses.replace(cfg.algo, batch_size=8, echo=1, minibatches=1)
    cfg = VTraceRun(env=cfg.env, frame_stack=cfg.frame_stack, algo=algo, total_steps=400, log_dir=str(tmp_path),
                    run_name="pong",
                    progress=False, pipeline=PipelineConfig(num_workers=1, envs_per_worker=16, unroll_length=5))
    summary = train(prepared(cfg))
    assert summary["updates"] >= 1 and summary["frames"] == 4 * summary["steps"]
    gif = tmp_path / "pong.gif"
    out = evaluate(EvalConfig(checkpoint=str(tmp_path / "pong"), episodes=1, video=str(gif), video_max_steps=50,
                              max_steps=50))
    assert gif.read_bytes()[:6] == b"GIF89a"
    from PIL import Image

    assert Image.open(gif).n_frames >= 10
    assert "eval/episode" in scalars(tmp_path / "pong")[1].Tags()["images"]
    assert math.isfinite(out["mean"])


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGHUP, 129)], ids=["ctrl-c", "hangup"])
def test_cli_trains_and_ctrl_c_saves_a_checkpoint(tmp_path, sig, code):
    """Ctrl-C, or the terminal closing (SIGHUP to the whole process group, the
    resource tracker included), ends a run cleanly: a checkpoint, an
    interrupted summary, no segments and no complaints from the tracker."""
    cmd = [sys.executable, "-m", "seedlocal", "train", "vtrace", "--total-steps", "10000000", "--log-dir",
           str(tmp_path), "--run-name", "cli", "--no-progress", "--log-every-s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=terminal_like)
    try:
        # Interrupt only once training has provably run (a logged scalar),
        # however slowly this machine starts the workers.
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if (tmp_path / "cli").exists() and "charts/steps_per_s" in scalars(tmp_path / "cli")[0]:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        else:
            raise AssertionError("training logged nothing within 120 s")
        os.killpg(proc.pid, sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed assertion above must not leave a 10M-step run behind
            os.killpg(proc.pid, signal.SIGTERM)  # its own clean shutdown first: segments unlinked
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert proc.returncode == code, out
    assert "tensorboard --logdir" in out
    assert "Traceback" not in out, out
    if sig == signal.SIGINT:
        assert f"stopped cleanly (checkpoint and summary in {tmp_path / 'cli'})" in out, out
        # ... and what to type next (issue 35, item 5).
        for command in (f"seedlocal eval --checkpoint {tmp_path / 'cli'}",
                        f"seedlocal train vtrace --resume {tmp_path / 'cli'}", f"tensorboard --logdir {tmp_path}"):
            assert command in out, out
    state = checkpoint.load(tmp_path / "cli")
    assert state["counters"]["steps"] > 0
    assert not seedlocal_segments(proc.pid)
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == state["counters"]["steps"]


@pytest.mark.slow
def test_vtrace_lstm_learns_cartpole(tmp_path):
    # An LSTM core shares its torso with the critic: it needs a higher learning
    # rate and more steps than the feed-forward default (measured: 450 at 784k).
    cfg = VTraceRun(total_steps=1_500_000, stop_at_return=450, log_dir=str(tmp_path), run_name="lstm",
                    progress=False)
    cfg.network.lstm_size = 64
    cfg.algo.learning_rate = 3e-3
    summary = train(prepared(cfg))
    assert summary["steps_to_target"] is not None, summary


def test_the_learning_rhythm_is_the_same_on_every_device(tmp_path, capsys):
    """Actors wait for each update unless the user says otherwise: a GPU does
    not silently switch the presets (tuned in that rhythm) to running ahead,
    and the run's first line names the rhythm."""
    from seedlocal.algos.vtrace import VTraceParams
    from seedlocal.trainers.vtrace_interval import actors_wait

    for name, preset in PRESETS.items():
        assert actors_wait(preset.algo), name
    assert actors_wait(VTraceParams(sync="auto")) and not actors_wait(VTraceParams(sync="off"))
    train(prepared(VTraceRun(total_steps=600, log_dir=str(tmp_path), progress=False)))
    assert "actors wait for each update, algo.sync on" in capsys.readouterr().out


def test_resume_continues_the_generators_instead_of_replaying_the_seed(tmp_path, monkeypatch):
    """A checkpoint holds torch's, numpy's and Python's generators; a resumed
    run() restores them, so its first draws are not the run's first draws
    again (before, it seeded them again and replayed the start's action noise)."""
    import random

    from seedlocal.trainers import run as run_module

    train(prepared(_tiny(tmp_path, total_steps=1500)))
    saved = checkpoint.load(tmp_path / "tiny")
    restored, restore = {}, run_module.restore_generators

    def restore_and_look(state):
        restore(state)
        restored.update(torch=torch.get_rng_state(), numpy=np.random.get_state()[1].copy(),
                        python=random.getstate())

    monkeypatch.setattr(run_module, "restore_generators", restore_and_look)
    train(prepared(_tiny(tmp_path, total_steps=3000, resume=str(tmp_path / "tiny"))))
    assert torch.equal(restored["torch"], saved["rng"]["torch"])
    assert (restored["numpy"] == saved["rng"]["numpy"]["key"].numpy()).all()
    assert restored["python"] == saved["rng"]["python"]
    # Acting drew from torch's generator (numpy's and Python's are there for users' code): from the
    # restored state the first draw is not the seed's first draw.
    torch.manual_seed(1)
    fresh = torch.rand(8)
    g = torch.Generator()
    g.set_state(saved["rng"]["torch"])
    assert not torch.equal(torch.rand(8, generator=g), fresh)


def test_resume_refuses_another_optimizer_and_takes_another_env_count(tmp_path, capsys):
    """Another optimizer than the checkpoint's is refused in one line naming it,
    before any worker starts and with the run's files untouched (it failed
    mid-run with a KeyError); a reward-scaled run resumes with another number of
    envs (a ValueError traceback): its envs start fresh episodes anyway."""
    from seedlocal.cli import main

    base = ["train", "vtrace", "--log-dir", str(tmp_path), "--no-progress", "--algo.reward-scale"]
    assert main(base + ["--run-name", "r", "--total-steps", "1500", "--pipeline.envs-per-worker", "4"]) == 0
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "r").rglob("*")}
    capsys.readouterr()
    assert main(["train", "vtrace", "--resume", str(tmp_path / "r"), "--algo.optimizer", "rmsprop",
                 "--total-steps", "3000", "--no-progress"]) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("seedlocal: error:")]
    assert len(errors) == 1 and "optimizer: checkpoint has 'adam', this run has 'rmsprop'" in errors[0], err
    assert "Traceback" not in err and "training V-trace" not in out, out + err
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "r").rglob("*")} == files
    assert main(["train", "vtrace", "--resume", str(tmp_path / "r"), "--pipeline.envs-per-worker", "8",
                 "--total-steps", "3000", "--no-progress"]) == 0, capsys.readouterr().err
    assert checkpoint.load(tmp_path / "r")["counters"]["steps"] >= 3000


def test_a_resumes_event_file_sorts_after_the_runs_older_ones(tmp_path):
    """TensorBoard reads a run's event files in name order; names hold the second they were made in and
    then a counter that sorts as text (".10" before ".9"), so a resume's file made in the same second as
    the last one could be read first, its steps then purged by the older ones (a flaky resume test)."""
    from seedlocal.monitor import RunMonitor

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now}.host.1.9").write_bytes(b"")
    mon = RunMonitor(tmp_path, purge_step=3, progress=False, lock=False)
    mon.close()
    names = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert len(names) == 2 and names[0].endswith(".host.1.9") and int(names[1].split(".")[3]) > now, names


def test_a_sync_learner_recomputes_the_policy_the_actors_acted_with(tmp_path):
    """With observation statistics and actors that wait for each update, the
    learner's first pass over a batch sees pi = mu: the statistics take the
    batch in after its updates, not before (then mean_rho, the rho-clipped
    pi/mu of that pass, sat at 0.989-0.994 on HalfCheetah; docs/mujoco.md)."""
    from seedlocal.algos.vtrace import VTraceParams

    # A batch of every env: no group acts on while the learner works (that would be ordinary policy lag).
    train(prepared(_tiny(tmp_path, total_steps=4000, algo=dataclasses.replace(VTraceParams(), batch_size=8), network=NetworkConfig(obs_norm=True),
                pipeline=PipelineConfig(num_workers=1, envs_per_worker=8))))
    rho = [v for _, v in scalars(tmp_path / "tiny")[0]["losses/mean_rho"]]
    assert rho and min(rho) > 0.99999, rho
