"""What a new user meets first (issue 35, item 5): a line at once, before torch loads, naming the preset; the
commands that go on from a finished run; no traceback when a pipe closes early."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

# Runs ``python -m seedlocal ARGV`` as the entry point does; at the first text written to stdout or stderr it
# reports which heavy modules were loaded by then, then the text, and exits.
FIRST_WRITE = """
import os, runpy, sys
class FirstWrite:
    def write(self, text):
        if text.strip():
            loaded = sorted(m for m in ("torch", "envpool") if m in sys.modules)
            os.write(1, (repr(loaded) + "\\n" + text).encode())
            os._exit(0)
        return len(text)
    def flush(self):
        pass
sys.stdout = sys.stderr = FirstWrite()
sys.argv = ["seedlocal", *sys.argv[1:]]
runpy.run_module("seedlocal", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("argv, said", [
    (["train", "vtrace"], "seedlocal: train vtrace --preset cartpole: the defaults, on CartPole-v1"),
    (["train", "r2d2", "--preset", "atari"], "seedlocal: train r2d2 --preset atari"),
    (["train", "es", "--env.id", "Hopper-v5"], "seedlocal: train es on Hopper-v5: the env's kind picks the preset"),
])
def test_the_first_line_comes_before_torch_loads_and_names_the_preset(argv, said, tmp_path):
    """Loading torch takes seconds on a busy 2-core machine (8 s was seen): a run says what it starts first."""
    out = subprocess.run([sys.executable, "-c", FIRST_WRITE, *argv, "--log-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    loaded, first = out.stdout.split("\n", 2)[:2]
    assert loaded == "[]", (loaded, first)
    assert first.startswith(said), first


@pytest.mark.parametrize("argv", [["--help"], ["train", "vtrace", "--help"], ["eval", "--help"]])
def test_help_into_a_closed_pipe_ends_quietly(argv):
    """``seedlocal train vtrace --help | head -40``: head may close the pipe before the help is written; that
    ends the command as SIGPIPE would, with no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "seedlocal", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before a byte is written
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_a_finished_run_says_the_commands_that_go_on_from_it(tmp_path, capsys):
    """The closing lines give the next commands, and each works as printed: eval plays the checkpoint, the
    resume (with the budget it spent, doubled) goes on."""
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--total-steps", "1500", "--log-dir", str(tmp_path), "--run-name", "r",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "r"
    commands = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in out.splitlines()
                if line.startswith("  ")}
    assert commands == {"play it": f"seedlocal eval --checkpoint {run}",
                        "go on": f"seedlocal train vtrace --resume {run} --total-steps 3000",
                        "its curves": f"tensorboard --logdir {tmp_path}"}, out
    assert main(shlex.split(commands["play it"])[1:] + ["--episodes", "2"]) == 0
    assert main(shlex.split(commands["go on"])[1:] + ["--no-progress"]) == 0
    assert "seedlocal: done: step budget spent; 3," in capsys.readouterr().out


def test_a_resume_from_another_folder_names_the_runs_tensorboard_folder(tmp_path, capsys, monkeypatch):
    """A run's saved --log-dir is relative to the folder it started in: the resume's start line names the folder
    that holds the run, from wherever it is resumed."""
    from seedlocal.cli import main

    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", "vtrace", "--total-steps", "600", "--log-dir", "runs", "--run-name", "r",
                 "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["train", "vtrace", "--resume", "a/runs/r", "--total-steps", "1200", "--no-progress"]) == 0
    start, = [ln for ln in capsys.readouterr().out.splitlines() if "TensorBoard: tensorboard --logdir" in ln]
    logdir = start.split("--logdir ", 1)[1].split(" (run ", 1)[0]
    assert Path(logdir).resolve() == (tmp_path / "a" / "runs").resolve(), start
