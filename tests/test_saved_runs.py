"""Checkpoints written by older code (``tests/fixtures/saved_runs``, before the network options moved under
``network.``) resume at their own sizes and evaluate: a renamed option must not resume silently at its
default, since a saved config's unknown keys are dropped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from seedlocal import checkpoint
from seedlocal.cli import main

SAVED = Path(__file__).parent / "fixtures" / "saved_runs"
# What each was saved with (tests/fixtures/saved_runs/README.md), and one more unit of budget.
NETWORK = {"vtrace": ((32,), 8, True), "r2d2": ((16,), 8, False), "es": ((8,), 0, True), "ga": ((8, 4), 0, False)}
MORE = {"vtrace": ["--total-steps", "4000"], "r2d2": ["--total-steps", "4000"], "es": ["--generations", "3"],
        "ga": ["--generations", "3"]}


def _copy(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    (run / "checkpoints").mkdir(parents=True)
    for f in (SAVED / name).glob("*.pt"):
        shutil.copy(f, run / "checkpoints" / f.name)
    return run


@pytest.mark.parametrize("name", list(NETWORK))
def test_an_older_checkpoint_resumes_at_its_own_sizes_and_evaluates(name, tmp_path, capsys):
    run = _copy(name, tmp_path)
    assert main(["train", name, "--resume", str(run), "--no-progress", *MORE[name]]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "network" not in out.split("resuming", 1)[1].split("\n", 1)[0]  # nothing changed
    state = checkpoint.load(run)
    hidden, lstm, obs_norm = NETWORK[name]
    assert state["config"]["network"] == {"encoder": "auto", "hidden": hidden, "lstm_size": lstm, "obs_norm": obs_norm}
    assert state["identity"]["hidden"] == list(hidden)
    assert state["counters"] != checkpoint.load(SAVED / name)["counters"]  # it went on
    assert main(["eval", "--checkpoint", str(run), "--episodes", "2", "--max-steps", "200"]) == 0
    assert "CartPole-v1: 2 episodes" in capsys.readouterr().out


def test_the_old_spellings_still_work_with_a_note(tmp_path, capsys):
    run = _copy("ga", tmp_path)
    assert main(["train", "ga", "--resume", str(run), "--no-progress", "--generations", "3", "--hidden", "8", "4",
                 "--no-obs-norm"]) == 0
    err = capsys.readouterr().err
    assert "--hidden is now --network.hidden" in err and "--no-obs-norm is now --network.no-obs-norm" in err
    assert checkpoint.load(run)["config"]["network"]["hidden"] == (8, 4)


def test_a_resume_from_an_older_checkpoint_sets_the_later_ones_aside(tmp_path, capsys):
    """Resuming a checkpoint older than the run's newest (the newest was corrupt, or the user went back) kept the
    abandoned later one as the run's newest: the summary, eval and the printed --resume named it, and rotation
    deleted the resumed run's own first save at once. The later ones now move aside, and nothing is deleted."""
    import json

    run = _copy("vtrace", tmp_path)
    older = run / "checkpoints" / "ckpt_000000003008_3008.pt"
    later = run / "checkpoints" / "ckpt_000000900000_900000.pt"  # an abandoned branch's save
    shutil.copy(older, later)
    assert main(["train", "vtrace", "--resume", str(older), "--no-progress", "--total-steps", "4000",
                 "--keep-checkpoints", "1"]) == 0
    out = capsys.readouterr().out
    aside = list((run / "checkpoints").glob("abandoned_after_000000003008_*"))
    assert len(aside) == 1 and [p.name for p in aside[0].iterdir()] == [later.name], out
    assert f"resumed from step 3,008, older than the run's newest checkpoint: its 1 later checkpoint moved to " \
           f"{aside[0]} (nothing deleted)" in out
    summary = json.loads((run / "summary.json").read_text())
    own = checkpoint.all_checkpoints(run / "checkpoints")
    assert len(own) == 1 and summary["checkpoint"] == str(own[0]) == checkpoint.newest(run)
    assert checkpoint.load(run)["counters"]["steps"] == summary["steps"] >= 4000
