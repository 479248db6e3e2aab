"""--track: Weights & Biases, run offline against the real wandb package (no server, no mock)."""

import subprocess
import sys

import psutil
import pytest

pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'seedlocal[wandb]')")

from seedlocal.config.schema import EnvConfig  # noqa: E402
from seedlocal.recipes.vtrace import VTraceRun
from seedlocal.trainers.vtrace import train  # noqa: E402
from helpers import prepared
from test_train_vtrace import scalars  # noqa: E402
from wandb_files import offline_runs  # noqa: E402


def _wandb_processes() -> list[psutil.Process]:
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if "wandb" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _cartpole(tmp_path, steps: int, **kw) -> VTraceRun:
    return VTraceRun(total_steps=steps, log_dir=str(tmp_path), run_name="tracked", progress=False, log_every_s=0.5,
                     track=True, wandb_project_name="seedlocal-tests", env=EnvConfig(seed=3), **kw)


def test_a_tracked_run_sends_every_scalar_its_config_and_summary_and_a_resume_continues_it(tmp_path, monkeypatch,
                                                                                            capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    summary = train(prepared(_cartpole(tmp_path, 15_000)))
    run_dir = tmp_path / "tracked"
    out = capsys.readouterr().out
    assert f"offline in {run_dir}/wandb/offline-run-" in out and "wandb sync" in out  # where the files went
    assert not _wandb_processes(), "W&B's service process outlived the run"
    (first,) = offline_runs(run_dir)
    assert first.project == "seedlocal-tests" and first.exit_code == 0
    assert first.config["total_steps"] == 15_000 and first.config["pipeline"]["num_workers"] == 2  # the full config
    tb, _ = scalars(run_dir)
    logged = set().union(*first.history)
    assert set(tb) <= logged, f"TensorBoard scalars missing in W&B: {sorted(set(tb) - logged)}"
    steps = [row["steps"] for row in first.history]  # the x axis is the run's step counter
    assert steps == sorted(steps) and steps[-1] == tb["charts/episodes"][-1][0]
    last = next(row for row in reversed(first.history) if "charts/episodes" in row)
    assert last["charts/episodes"] == tb["charts/episodes"][-1][1]
    assert first.summary["status"] == "done" and first.summary["steps"] == summary["steps"]
    assert first.summary["mean_return_last20"] == pytest.approx(summary["mean_return_last20"])

    train(prepared(_cartpole(tmp_path, 30_000, resume=str(run_dir))))
    assert "continues W&B run " + first.id in capsys.readouterr().out
    assert not _wandb_processes()
    first_again, second = offline_runs(run_dir)
    assert second.id == first.id  # the same W&B run, continued
    assert min(row["steps"] for row in second.history) > 0 and second.summary["steps"] > summary["steps"]


def test_track_without_wandb_stops_before_the_run_starts_and_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['wandb'] = None; from seedlocal.cli import main; "
            f"sys.exit(main(['train', 'vtrace', '--track', '--log-dir', {str(tmp_path)!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line == ("seedlocal: error: track=True: the wandb package is not installed; "
                    "pip install 'seedlocal[wandb]'")
    assert not list(tmp_path.iterdir())  # no run folder: nothing started


@pytest.mark.parametrize("algo", ["vtrace", "r2d2", "ga", "es", "ars", "random-search"])
def test_every_family_takes_cleanrls_tracking_flags(algo):
    from seedlocal.cli import _parse

    cfg = _parse(["train", algo, "--track", "--wandb-project-name", "p", "--wandb-entity", "me",
                  "--video-every-min", "2.5"])[1].config
    assert (cfg.track, cfg.wandb_project_name, cfg.wandb_entity, cfg.video_every_min) == (True, "p", "me", 2.5)


def test_the_learners_log_call_does_not_wait_while_a_video_is_prepared_for_wandb(tmp_path, monkeypatch):
    """The video thread (nice 19) prepares W&B's copy of a video (wandb.Video reads and hashes the file) outside
    the lock the learner's scalars take: held up there, as a loaded machine may hold it, it keeps no log waiting."""
    import threading

    import numpy as np
    import wandb

    from seedlocal.tracking import Tracker
    from seedlocal.trainers.videos import TAG
    from seedlocal.video import encode_gif

    monkeypatch.setenv("WANDB_MODE", "offline")
    gif, _, _ = encode_gif([np.full((8, 8, 3), v, np.uint8) for v in (0, 255)])
    path = tmp_path / "episode.gif"
    path.write_bytes(gif)
    entered, release, real = threading.Event(), threading.Event(), wandb.Video

    def held_up_video(*args, **kw):
        entered.set()
        release.wait(timeout=120)
        return real(*args, **kw)

    monkeypatch.setattr(wandb, "Video", held_up_video)
    tracker = Tracker(tmp_path, {"seed": 1}, "seedlocal-tests", "", "steps")
    maker = threading.Thread(target=tracker.video, args=(TAG, path, 10))
    try:
        maker.start()
        assert entered.wait(timeout=120)
        log = threading.Thread(target=tracker.scalars, args=(11, {"losses/total_loss": 0.5}))
        log.start()
        log.join(timeout=60)  # a guard against a hang, not a time measured: it returns at once or never
        assert not log.is_alive(), "the learner's log call waited behind the video"
    finally:
        release.set()
        maker.join()
        tracker.finish(failed=False)
    (run,) = offline_runs(tmp_path)
    assert [row["steps"] for row in run.history if "losses/total_loss" in row] == [11]
    assert [row["steps"] for row in run.history if f"{TAG}/_type" in row] == [10]


def test_track_without_a_login_stops_in_one_line(tmp_path, monkeypatch):
    """A batch job that never ran ``wandb login``: W&B refuses the run, which seedlocal says in one line (it was a
    30-line traceback) with the way to keep the run offline."""
    pytest.importorskip("wandb")
    from seedlocal.errors import ConfigError
    from seedlocal.tracking import Tracker

    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no saved key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(ConfigError) as e:
        Tracker(tmp_path, {"seed": 1}, "seedlocal-tests", "", "steps")
    assert str(e.value).startswith("track=True: W&B did not start the run: ") and "\n" not in str(e.value)
    assert "WANDB_MODE=offline" in str(e.value)
    # What the line says works in the same process (the Python API): W&B does not keep the refused settings.
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = Tracker(tmp_path, {"seed": 1}, "seedlocal-tests", "", "steps")
    tracker.finish(failed=False)
    assert len(offline_runs(tmp_path)) == 1
