"""A user's own Gymnasium env, by its ``module:EnvId`` id, through the CLI:
train (worker processes import the module), eval, and clear errors."""

import re
import subprocess
from pathlib import Path

import pytest
from conftest import leaked_segments
from helpers import seedlocal_runs

TESTS = Path(__file__).parent


def seedlocal(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return seedlocal_all([args], timeout=timeout)[0]


def seedlocal_all(runs: list[tuple[str, ...]], timeout: int = 240) -> list[subprocess.CompletedProcess]:
    """Independent CLI runs at the same time (``helpers.seedlocal_runs``)."""
    return seedlocal_runs([(args, {}) for args in runs], timeout=timeout)


def test_readme_example_is_this_env():
    readme = (TESTS.parent / "README.md").read_text()
    block = re.search(r"```python\n(# corridor\.py.*?)```", readme, re.S)
    assert block, "README lacks the corridor.py example"
    example = block.group(1).splitlines()[1:]
    source = [l for l in (TESTS / "corridor.py").read_text().splitlines()
              if l and not l.startswith(('"""', "with it", "walk right"))]
    assert [l for l in example if l] == source


def test_train_and_eval_a_custom_env_by_module_id(tmp_path):
    out = seedlocal("train", "vtrace", "--env.id", "corridor:Corridor-v0", "--total-steps", "30000",
                    "--stop-at-return", "0.9", "--log-dir", str(tmp_path), "--run-name", "c", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    ev = seedlocal("eval", "--checkpoint", str(tmp_path / "c"), "--episodes", "4")
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "corridor:Corridor-v0: 4 episodes" in ev.stdout


def test_a_module_that_cannot_be_imported_or_registers_nothing_is_named():
    out, other = seedlocal_all([("train", "vtrace", "--env.id", "no_such_module:Thing-v0"),
                                ("train", "vtrace", "--env.id", "corridor:Other-v0")])
    assert out.returncode == 2
    assert "env.id='no_such_module:Thing-v0': cannot import module 'no_such_module'" in out.stderr
    out = other
    assert out.returncode == 2
    assert "did not register 'Other-v0'" in out.stderr


def test_an_env_that_cannot_start_stops_the_run_with_its_own_error(tmp_path):
    """A reset that always raises would fail the same way on every restart:
    the run stops at once, with one line naming the worker and the env's
    exception (its traceback is above it, from the worker)."""
    out, aborts = seedlocal_all([
        ("train", "vtrace", "--env.id", "faulty_envs:ResetRaises-v0", "--total-steps", "2000",
         "--log-dir", str(tmp_path), "--run-name", "r", "--no-progress"),
        ("train", "vtrace", "--env.id", "faulty_envs:ResetAborts-v0", "--total-steps", "2000",
         "--log-dir", str(tmp_path), "--run-name", "a", "--no-progress")])
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("seedlocal: error: env worker"), last
    assert "RuntimeError: boom in reset" in last and "not restarting" in last, last
    assert "restarted it" not in out.stdout
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs
    # A run that never stepped leaves no checkpoint, so the same name can be used again once the env is fixed.
    assert not list((tmp_path / "r").glob("checkpoints/ckpt_*.pt"))
    again = seedlocal("train", "vtrace", "--env.id", "faulty_envs:ResetRaises-v0", "--total-steps", "2000",
                      "--log-dir", str(tmp_path), "--run-name", "r", "--no-progress")
    assert "boom in reset" in again.stderr.strip().splitlines()[-1] and "already holds" not in again.stderr
    # Native code aborting while the env starts is no different.
    last = aborts.stderr.strip().splitlines()[-1]
    assert aborts.returncode == 1 and "killed by signal 6 before its envs produced a first step" in last, last
    assert "not restarting" in last and "restarted it" not in aborts.stdout


def test_discrete_actions_that_start_above_zero_reach_the_env_offset(tmp_path):
    """``Discrete(2, start=1)``: the network picks 0 or 1, the env gets 1 or 2
    (in training, in eval, in an eval video)."""
    out = seedlocal("train", "vtrace", "--env.id", "faulty_envs:ActionStart-v0", "--total-steps", "3000",
                    "--log-dir", str(tmp_path), "--run-name", "s", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    ev = seedlocal("eval", "--checkpoint", str(tmp_path / "s"), "--episodes", "2", "--video", str(tmp_path / "v.gif"))
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "faulty_envs:ActionStart-v0: 2 episodes" in ev.stdout and (tmp_path / "v.gif").exists(), ev.stdout


def test_bad_rewards_observations_and_constructors_are_named(tmp_path):
    """A NaN reward or a wrong-shaped observation stops the run with one line
    naming it (not NaN weights, not a silent broadcast); a constructor that
    raises is named before anything starts."""
    cases = [("NaNReward-v0", "step() returned the reward nan; rewards must be finite numbers"),
             ("BroadcastObs-v0", "observation has shape (1,), its space says (3,)"),
             ("OldGymStep-v0", "step() returned a tuple of 4; Gymnasium envs return (observation, "
                               "reward, terminated, truncated, info)")]
    *outs, ga = seedlocal_all([("train", "vtrace", "--env.id", f"faulty_envs:{env}", "--total-steps", "5000",
                                "--log-dir", str(tmp_path), "--run-name", env, "--no-progress") for env, _ in cases]
                              + [("train", "ga", "--env.id", "faulty_envs:InitRaises-v0", "--log-dir", str(tmp_path))])
    for (env, message), out in zip(cases, outs):
        assert out.returncode == 1, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("seedlocal: error: env worker") and message in last, last
        assert "not restarting it" in last and "restarted it" not in out.stdout  # it would fail the same way
        assert "Traceback" not in out.stderr, out.stderr[-2000:]  # our own check's stack says nothing
    assert ga.returncode == 2
    assert ga.stderr.strip().splitlines() == [
        "seedlocal: error: env.id='faulty_envs:InitRaises-v0': making the env raised FileNotFoundError: "
        "level file missing"], ga.stderr
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


def test_neuroevolution_stops_at_its_time_budget_inside_endless_episodes(tmp_path):
    """Members are scored on whole episodes; episodes that never end must not
    keep a run past --seconds (the last whole generation is what is kept)."""
    out = seedlocal("train", "ga", "--env.id", "faulty_envs:Endless-v0", "--seconds", "4",
                    "--algo.population-size", "8", "--log-dir", str(tmp_path), "--run-name", "e", "--no-progress",
                    timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seedlocal: stopped before the first generation ended; 0 generations" in out.stdout, out.stdout[-2000:]
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


@pytest.mark.parametrize("algo", ["vtrace", pytest.param("ga", marks=pytest.mark.slow)])
def test_a_hung_env_is_named_and_the_run_ends_at_its_time_budget(tmp_path, algo):
    """An env stuck inside step(): the trainers say which workers hang and
    stop at --seconds instead of waiting for ever."""
    # --pipeline.stall-s 1.5: the run says so after 1.5 s without a step (10 s by default).
    out = seedlocal("train", algo, "--env.id", "faulty_envs:StepHangs-v0", "--seconds", "5", "--pipeline.stall-s", "1.5",
                    "--log-dir", str(tmp_path), "--run-name", algo, "--no-progress", timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seedlocal: no env steps for" in out.stdout and "still inside an env's step or reset" in out.stdout, (
        out.stdout[-2000:])
    assert "seedlocal: done: time budget spent;" in out.stdout or "stopped before the first" in out.stdout, (
        out.stdout[-2000:])
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


def test_channels_last_images_get_the_cnn_torso(tmp_path):
    """Gymnasium's (H, W, C) images train with the Nature CNN, as (C, H, W) ones do."""
    out, refused = seedlocal_all([
        ("train", "vtrace", "--env.id", "faulty_envs:ImageHWC-v0", "--total-steps", "300",
         "--log-dir", str(tmp_path), "--run-name", "img", "--no-progress"),
        ("train", "r2d2", "--env.id", "faulty_envs:ImageHWC-v0", "--frame-stack", "4", "--log-dir", str(tmp_path))])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(nature torso" in out.stdout, out.stdout[:500]
    # R2D2 stacks single-channel frames only, and says so before starting.
    out = refused
    assert out.returncode == 2
    assert "frame_stack=4: stacks single-channel (1, H, W) image frames" in out.stderr
    assert "observes (48, 48, 3)" in out.stderr
