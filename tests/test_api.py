"""Training from Python (issue 35, item 4): ``seedlocal.train`` builds the config the command line builds from the
same options, refuses what it refuses with the same line as one exception type, and leaves no process or
shared-memory segment behind however a run in a notebook's cell ends."""

from __future__ import annotations

import _thread
import json
import math
import signal
import subprocess
import sys
import threading
import time

import pytest

import seedlocal
from conftest import leaked_segments, live_children
from seedlocal.config.machine import Machine


def test_import_seedlocal_loads_nothing_heavy():
    """A notebook's `import seedlocal` (and a look at its API) costs no torch: it loads with the first run."""
    code = ("import sys, seedlocal; seedlocal.train, seedlocal.run_config, seedlocal.Summary, seedlocal.SeedlocalError;"
            " print(sorted(m for m in ('torch', 'envpool', 'tyro') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.fixture
def gpu16(monkeypatch):
    """A 16-core GPU machine as sizing sees it, so that the preset is sized and options given must win over it."""
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, device: Machine(16, True)))


@pytest.mark.parametrize("argv, overrides", [
    (["vtrace"], {}),
    (["vtrace", "--preset", "atari", "--algo.batch-size", "32", "--network.hidden", "32", "--no-machine-sizing"],
     dict(preset="atari", algo={"batch_size": 32}, network={"hidden": (32,)}, machine_sizing=False)),
    (["vtrace", "--preset", "atari", "--algo.batch-size", "32", "--pipeline.num-workers", "3"],
     {"preset": "atari", "algo.batch_size": 32, "pipeline.num_workers": 3}),
    (["r2d2", "--env.id", "Breakout-v5", "--total-steps", "1000", "--network.hidden", "48"],
     dict(env={"id": "Breakout-v5"}, total_steps=1000, network={"hidden": (48,)})),
    (["es", "--env.id", "Hopper-v5", "--seconds", "5"], dict(env={"id": "Hopper-v5"}, seconds=5)),
])
def test_overrides_build_the_config_the_command_line_builds(argv, overrides, gpu16, capsys):
    """The preset an env's kind picks, the machine's sizing, and options given winning over both: the same
    dataclass from keywords as from the command line's options, and the same lines said."""
    from seedlocal.cli import _parse

    from_cli = _parse(["train", *argv])[1].config
    said = capsys.readouterr().out
    assert seedlocal.run_config(argv[0], **overrides) == from_cli
    assert capsys.readouterr().out == said


@pytest.mark.parametrize("argv, overrides", [
    (["--pipeline.envs-per-worker", "7"], dict(pipeline={"envs_per_worker": 7})),
    (["--algo.learning-rate", "nan"], dict(algo={"learning_rate": float("nan")})),
    (["--network.hidden", "-5"], dict(network={"hidden": (-5,)})),
    (["--preset", "atary"], dict(preset="atary")),
    (["--env.id", "Hoper-v5"], dict(env={"id": "Hoper-v5"})),
    (["--run-name", "../escape"], dict(run_name="../escape")),
])
def test_refusals_are_the_command_lines_line_as_one_exception_type(argv, overrides, tmp_path, capsys):
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--log-dir", str(tmp_path), *argv]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(seedlocal.SeedlocalError) as e:
        seedlocal.train("vtrace", log_dir=str(tmp_path), **overrides)
    assert line == f"seedlocal: error: {e.value}"
    assert not list(tmp_path.iterdir()) and not live_children() and not leaked_segments()


@pytest.mark.parametrize("family, overrides, message", [
    ("vtrase", {}, "vtrase: no such family; did you mean vtrace?"),
    ("vtrace", dict(pipeline={"num_workerz": 1}), "pipeline.num_workerz: no such option; did you mean "
                                                  "pipeline.num_workers?"),
    ("vtrace", dict(totl_steps=5), "totl_steps: no such option; did you mean total_steps?"),
    ("vtrace", dict(pipelin={"num_workers": 1}), "pipelin: no such option; did you mean pipeline?"),
    ("ga", dict(presett="atari"), "presett: no such option; did you mean preset?"),
    ("vtrace", dict(network={"hidden": "64"}), "network.hidden='64': expected a tuple of ints"),
    ("vtrace", dict(total_steps=1.5), "total_steps=1.5: expected an int"),
    ("vtrace", dict(network=64), "network=64: a group of options; give them as a dict"),
    ("vtrace", dict(algo={"optimizer": "sgd"}), "algo.optimizer='sgd': expected one of 'adam', 'rmsprop'"),
    ("vtrace", dict(machine_sizing="no"), "machine_sizing='no': expected True or False"),
])
def test_a_name_that_is_no_option_is_refused_with_the_nearest(family, overrides, message):
    with pytest.raises(seedlocal.ConfigError) as e:
        seedlocal.run_config(family, **overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), e.value


def test_train_then_read_the_returns_then_evaluate(tmp_path, capsys):
    """The README's example (without the plot): train CartPole, read the curve from the run's files, play
    the checkpoint."""
    summary = seedlocal.train("vtrace", total_steps=3000, log_dir=str(tmp_path), progress=False, log_every_s=0.2)
    assert summary.status == "done" and summary.stopped_by == "steps" and summary.steps >= 3000
    assert summary.run_dir.parent == tmp_path and summary.checkpoint.exists()
    on_disk = json.loads((summary.run_dir / "summary.json").read_text())
    assert summary.data == on_disk and summary["updates"] == on_disk["updates"] > 0
    assert summary.mean_return == on_disk["mean_return_last20"] and summary.algo == "vtrace"
    steps, returns = summary.scalars("charts/episode_return")
    assert len(steps) == len(returns) >= 2 and steps == sorted(steps) and all(math.isfinite(r) for r in returns)
    result = seedlocal.evaluate(summary.run_dir, episodes=3, device="cpu")
    assert len(result.returns) == 3 and result.mean == pytest.approx(sum(result.returns) / 3)
    assert result.policy == "sampled" and result.video is None
    with pytest.raises(seedlocal.ConfigError, match="episodez: no such option; did you mean episodes?"):
        seedlocal.evaluate(summary.run_dir, episodez=3)
    with pytest.raises(seedlocal.ConfigError, match="no such scalar in .*; did you mean charts/episode_return"):
        summary.scalars("charts/episode_retrun")
    # The summary's next step: go on with the same run, its saved config and a larger budget.
    more = seedlocal.train("vtrace", resume=summary.run_dir, total_steps=6000, progress=False)
    assert more.run_dir == summary.run_dir and more.steps >= 6000 and more["updates"] > summary["updates"]
    with pytest.raises(seedlocal.ConfigError, match="total_steps=6000: the resumed run already has"):
        seedlocal.train("vtrace", resume=summary.run_dir, total_steps=6000)


def test_evaluate_refuses_as_eval_does(tmp_path, capsys):
    from seedlocal.cli import main

    for argv, options in [(["--max-steps", "0"], dict(max_steps=0)), (["--video", "x.mp4"], dict(video="x.mp4")),
                          ([], {})]:
        assert main(["eval", "--checkpoint", str(tmp_path / "none"), *argv]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        with pytest.raises(seedlocal.SeedlocalError) as e:
            seedlocal.evaluate(tmp_path / "none", **options)
        assert line == f"seedlocal: error: {e.value}"


def test_the_readmes_example_runs_as_written_without_the_plot(tmp_path, monkeypatch, capsys):
    """README's "From Python" block, its plotting lines left out and its step budget cut for CI."""
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("### From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = "\n".join(line for line in block.splitlines() if "plt" not in line)
    assert "total_steps=300_000" in code
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(code.replace("total_steps=300_000", "total_steps=3_000"), names)
    assert names["summary"].status == "done" and names["summary"].run_dir.parent == Path("runs")
    assert len(names["steps"]) == len(names["returns"]) > 0 and len(names["result"].returns) == 10


def _training(run_dir) -> bool:
    """Whether the run in ``run_dir`` has logged a training rate: it is past its start, stepping and learning."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not list(run_dir.glob("events.out.tfevents.*")):
        return False
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return "charts/steps_per_s" in events.Tags()["scalars"]


def _nothing_left():
    assert not live_children(), "a process is left besides the forkserver and the resource tracker"
    assert not leaked_segments(), "a /dev/shm segment is left"


def test_an_env_failing_mid_run_raises_and_leaves_nothing(tmp_path):
    """As in a notebook's cell: the run's error is raised as a SeedlocalError with the command line's line,
    its summary says so, and nothing of the run is left running; the next cell trains again."""
    with pytest.raises(seedlocal.SeedlocalError, match="step\\(\\) returned the reward nan") as e:
        seedlocal.train("vtrace", env={"id": "faulty_envs:NaNReward-v0"}, total_steps=5000, log_dir=str(tmp_path),
                        progress=False)
    assert type(e.value).__name__ == "WorkerDied" and "\n" not in str(e.value)
    _nothing_left()
    assert seedlocal.Summary.read(e.value.seedlocal_run_dir).status == "error"
    assert seedlocal.train("vtrace", total_steps=1000, log_dir=str(tmp_path), progress=False).status == "done"
    _nothing_left()


def test_an_interrupt_mid_run_saves_and_leaves_nothing(tmp_path, capsys):
    """A notebook's interrupt button (KeyboardInterrupt in the main thread, once training has stepped): a
    checkpoint, an interrupted summary, the next commands said; no process and no segment left."""
    # Python's own SIGINT handler, as a notebook's kernel has: a pytest started in the background (nohup,
    # cmd &) ignores SIGINT, and interrupt_main() then does nothing (the run went on to the test's timeout).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_mid_run(tmp_path, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_mid_run(tmp_path, capsys):
    stop = threading.Event()

    def interrupt_once_stepping():
        while not stop.is_set():
            if _training(tmp_path / "r"):
                _thread.interrupt_main()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=interrupt_once_stepping, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            # A rate logged each 0.5 s (2 s by default): the interrupt comes at the first log after an update.
            seedlocal.train("vtrace", total_steps=10_000_000, log_dir=str(tmp_path), run_name="r", progress=False,
                            checkpoint_every_min=60.0, log_every_s=0.5)
    finally:
        stop.set()
        watcher.join()
    _nothing_left()
    assert e.value.seedlocal_run_dir == tmp_path / "r"
    summary = seedlocal.Summary.read(tmp_path / "r")
    assert summary.status == "interrupted" and summary.checkpoint.exists() and summary.steps > 0
    assert f"seedlocal train vtrace --resume {tmp_path / 'r'}" in capsys.readouterr().err


SCRIPT = """
import sys
import seedlocal

if __name__ == "__main__":
    seedlocal.train("vtrace", total_steps=10_000_000, log_dir=sys.argv[1], run_name="t", progress=False,
                    log_every_s=0.5)
"""


def test_a_script_that_trains_at_its_top_level_is_told_to_guard_it(tmp_path):
    """Every env worker imports the script again; a run started at its top level (directly or through a function
    it calls there) would start one in each, which multiprocessing refuses with a traceback per worker and
    seedlocal reported as an env that cannot start. It is refused first, in one line that says what to write."""
    body = SCRIPT.replace('if __name__ == "__main__":\n    ', "def job():\n    ") + "\njob()\n"
    (tmp_path / "job.py").write_text(body)
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and last == (
        f"seedlocal.errors.ConfigError: seedlocal.train('vtrace', ...) runs at the top level of {tmp_path / 'job.py'} "
        f"(line {body.splitlines().index('job()') + 1}), which every env worker imports again as it starts: put it "
        'under if __name__ == "__main__":'), out.stderr[-2000:]
    assert not (tmp_path / "t").exists() and "bootstrapping" not in out.stderr


def test_a_script_stopped_by_sigterm_saves_and_releases_its_memory(tmp_path):
    """A script (a scheduler's job) that calls seedlocal.train and gets SIGTERM ends as the command line does:
    checkpoint, interrupted summary, no segment left, exit status 143."""
    import os
    import signal

    from conftest import seedlocal_segments

    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not _training(tmp_path / "t"):
            assert proc.poll() is None and time.monotonic() < end, proc.stdout.read()
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 143, out
    assert "stopped by SIGTERM; stopped cleanly (checkpoint and summary" in out and "Traceback" not in out, out
    summary = seedlocal.Summary.read(tmp_path / "t")
    assert summary.status == "interrupted" and summary.steps > 0 and summary.checkpoint.exists()
    assert not seedlocal_segments(proc.pid)


def test_training_from_standard_input_starts_its_workers(tmp_path):
    """`python -` (a notebook kernel's or a pipe's code): multiprocessing had every worker run the parent's
    __main__ file again, "<stdin>", which none could open, and the run stopped with WorkerDied."""
    code = ("import sys, seedlocal\n"
            "s = seedlocal.train('vtrace', total_steps=2000, log_dir=sys.argv[1], run_name='s', progress=False)\n"
            "print('steps', s.steps)\n")
    out = subprocess.run([sys.executable, "-", str(tmp_path)], input=code, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "No such file or directory" not in out.stderr, out.stderr[-2000:]
    assert int(out.stdout.split("steps ")[-1]) >= 2000


def test_learner_ranks_from_python_and_a_resume_of_theirs(tmp_path, capfd):
    """seedlocal.train("vtrace", learners=2) raised "this process was not started as a rank", and so did a resume
    from Python of a run of 2 ranks (its saved config carries the count). The ranks now start as the command line
    starts them, and rank 0's summary comes back; the resume goes on with 2 ranks on the same curve. Nothing is
    left behind."""
    from seedlocal import checkpoint

    summary = seedlocal.train("vtrace", learners=2, total_steps=3000, log_dir=str(tmp_path), run_name="two",
                              progress=False, log_every_s=0.2)
    said = capfd.readouterr().out
    assert said.count("2 data-parallel learner ranks (each 1 worker of 8 envs, min batch 2)") == 1, said
    assert summary.status == "done" and summary.stopped_by == "steps" and summary.steps >= 3000
    assert summary.run_dir == tmp_path / "two" and summary["updates"] > 0
    assert checkpoint.load(summary.run_dir)["config"]["learners"] == 2
    more = seedlocal.train("vtrace", resume=summary.run_dir, total_steps=6000, progress=False)
    said = capfd.readouterr().out
    assert "2 data-parallel learner ranks" in said and more.run_dir == summary.run_dir, said
    assert more.steps >= 6000 and more["updates"] > summary["updates"] and more.status == "done"
    assert not live_children() and not leaked_segments()
