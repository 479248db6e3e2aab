"""A user's own Gymnasium env, by its ``module:EnvId`` id, through the CLI:
train (worker processes import the module), eval, and clear errors."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_a_module_that_cannot_be_imported_or_registers_nothing_is_named(capsys):
    # Both are refused while the command is parsed, before anything starts: the command's own main in this
    # process (what `seedlocal` runs), without two more interpreters' start-up.
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--env.id", "no_such_module:Thing-v0"]) == 2
    assert "env.id='no_such_module:Thing-v0': cannot import module 'no_such_module'" in capsys.readouterr().err
    assert main(["train", "vtrace", "--env.id", "corridor:Other-v0"]) == 2
    assert "did not register 'Other-v0'" in capsys.readouterr().err


def test_an_env_that_cannot_start_stops_the_run_with_its_own_error(tmp_path, capsys):
    """A reset that always raises would fail the same way on every restart:
    the run stops at once, with one line naming the worker and the env's
    exception (the env's traceback is above it, shown once)."""
    out, aborts = seedlocal_all([
        ("train", "vtrace", "--env.id", "faulty_envs:ResetRaises-v0", "--total-steps", "2000",
         "--log-dir", str(tmp_path), "--run-name", "r", "--no-progress"),
        ("train", "vtrace", "--env.id", "faulty_envs:ResetAborts-v0", "--total-steps", "2000",
         "--log-dir", str(tmp_path), "--run-name", "a", "--no-progress")])
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("seedlocal: error: env worker"), last
    assert "RuntimeError: boom in reset" in last and "not restarting" in last, last
    assert "restarted it" not in out.stdout + out.stderr
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs
    # A run that never stepped leaves no checkpoint, so the same name can be used again once the env is fixed.
    assert not list((tmp_path / "r").glob("checkpoints/ckpt_*.pt"))
    # (The command's main in this process, without a second interpreter's start-up.)
    from seedlocal.cli import main

    capsys.readouterr()
    assert main(["train", "vtrace", "--env.id", "faulty_envs:ResetRaises-v0", "--total-steps", "2000",
                 "--log-dir", str(tmp_path), "--run-name", "r", "--no-progress"]) == 1
    again = capsys.readouterr().err
    assert "boom in reset" in again.strip().splitlines()[-1] and "already holds" not in again
    # Native code aborting while the env starts is no different.
    last = aborts.stderr.strip().splitlines()[-1]
    assert aborts.returncode == 1 and "killed by signal 6 before its envs produced a first step" in last, last
    assert "not restarting" in last and "restarted it" not in aborts.stdout + aborts.stderr


def test_an_env_that_raises_in_step_shows_its_traceback_once_and_keeps_every_one_in_the_run_folder(tmp_path):
    """Issue 44, item 15: every worker death printed the env's whole traceback (6 of them in 134 lines). The
    env's traceback is shown once, from the user's own frames (its file and line); each later death is one line;
    every traceback, whole, is in the run folder's env_errors.log, which the terminal names; the last line names
    the error and the restart budget, as before. The restart budget ends the run (--pipeline.max-restarts 2)."""
    import inspect
    import faulty_envs

    out = seedlocal("train", "vtrace", "--env.id", "faulty_envs:StepRaises-v0", "--total-steps", "100000000",
                    "--pipeline.max-restarts", "2", "--log-dir", str(tmp_path), "--run-name", "s", "--no-progress")
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    err = out.stderr.strip().splitlines()
    log = tmp_path / "s" / "env_errors.log"
    # The first death: its env's traceback, the user's frame in it and none of seedlocal's or Gymnasium's wrappers'.
    assert re.fullmatch(rf"seedlocal: env worker \d+'s env raised \(every worker's whole traceback goes to "
                        rf"{re.escape(str(log))}\):", err[0]), err
    lines, start = inspect.getsourcelines(faulty_envs.StepRaises.step)
    line = start + next(i for i, text in enumerate(lines) if "raise ValueError" in text)
    assert err[1:5] == ["Traceback (most recent call last):",
                        f'  File "{inspect.getsourcefile(faulty_envs)}", line {line}, in step',
                        '    raise ValueError(f"bad state after {self.steps - 1} steps")',
                        "ValueError: bad state after 40 steps"], err
    # Then one line a death, the last one the error naming the budget; nothing else.
    deaths, last = err[5:-1], err[-1]
    assert deaths and all(d.startswith("seedlocal: env worker") and d.endswith(
        "(ValueError: bad state after 40 steps); restarted it on fresh episodes") for d in deaths), err
    assert last.startswith("seedlocal: error: env worker") and last.endswith(
        "(ValueError: bad state after 40 steps); restarted 2 times already in the last 600 s "
        "(pipeline.max_restarts=2 per pipeline.restart_window_s=600), stopping"), last
    assert out.stderr.count("Traceback") == 1 and "restarted it" not in out.stdout
    # Every death's whole traceback in the file, seedlocal's frames too.
    kept = log.read_text()
    for death in deaths + [last]:
        pid = re.search(r"\(pid (\d+), env", death).group(1)
        assert f"(pid {pid}, group" in kept, (death, kept[-2000:])
    records = kept.count("Traceback (most recent call last):")
    assert records == kept.count("\n==== ") + 1 >= len(deaths) + 1 and kept.count("ValueError: bad state") == records
    assert "seedlocal/pipeline/worker.py" in kept and "faulty_envs.py" in kept
    assert not leaked_segments()  # the run above has exited; another test run's segments are not its


def test_discrete_actions_that_start_above_zero_reach_the_env_offset(tmp_path, capsys):
    """``Discrete(2, start=1)``: the network picks 0 or 1, the env gets 1 or 2
    (in training, in eval, in an eval video)."""
    # The command's main in this process (what `seedlocal` runs), without two interpreters' start-up: the env
    # workers that step the env are their own processes either way, and eval plays it here either way.
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--env.id", "faulty_envs:ActionStart-v0", "--total-steps", "3000",
                 "--log-dir", str(tmp_path), "--run-name", "s", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "s"), "--episodes", "2", "--video",
                 str(tmp_path / "v.gif")]) == 0
    out = capsys.readouterr().out
    assert "faulty_envs:ActionStart-v0: 2 episodes" in out and (tmp_path / "v.gif").exists(), out


def test_bad_rewards_observations_and_constructors_are_named(tmp_path):
    """A NaN reward or a wrong-shaped observation stops the run with one line
    naming it (not NaN weights, not a silent broadcast, not Gymnasium's checker's
    AssertionError and restarts); a constructor that raises is named before
    anything starts."""
    cases = [("NaNReward-v0", "step() returned the reward nan; rewards must be finite numbers"),
             ("BroadcastObs-v0", "observation has shape (1,), its space says (3,)"),
             ("DictBare-v0", "observation is of type ndarray; its space is a Dict with keys 'pos'"),  # 1st step
             ("OldGymStep-v0", "step() returned a tuple of 4; Gymnasium envs return (observation, "
                               "reward, terminated, truncated, info)")]
    *outs, ga = seedlocal_all([("train", "vtrace", "--env.id", f"faulty_envs:{env}", "--total-steps", "5000",
                                "--log-dir", str(tmp_path), "--run-name", env, "--no-progress") for env, _ in cases]
                              + [("train", "ga", "--env.id", "faulty_envs:InitRaises-v0", "--log-dir", str(tmp_path))])
    for (env, message), out in zip(cases, outs):
        assert out.returncode == 1, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("seedlocal: error: env worker") and message in last, last
        assert "not restarting it" in last and "restarted it" not in out.stdout + out.stderr  # it would fail alike
        assert "Traceback" not in out.stderr, out.stderr[-2000:]  # our own check's stack says nothing
    assert ga.returncode == 2
    assert ga.stderr.strip().splitlines() == [
        "seedlocal: error: env.id='faulty_envs:InitRaises-v0': making the env raised FileNotFoundError: "
        "level file missing"], ga.stderr
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


def test_neuroevolution_stops_at_its_time_budget_inside_endless_episodes(tmp_path):
    """Members are scored on whole episodes; episodes that never end must not
    keep a run past --seconds (the last whole generation is what is kept)."""
    # Any budget shows it (no episode ever ends); 3 s, so that the members' episodes have started (the clock
    # starts before the workers do: at 1 s a loaded machine may still be starting them).
    out = seedlocal("train", "ga", "--env.id", "faulty_envs:Endless-v0", "--seconds", "3",
                    "--algo.population-size", "8", "--log-dir", str(tmp_path), "--run-name", "e", "--no-progress",
                    timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seedlocal: stopped before the first generation ended; 0 generations" in out.stdout, out.stdout[-2000:]
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


@pytest.mark.parametrize("algo", ["vtrace", pytest.param("ga", marks=pytest.mark.slow)])
def test_a_hung_env_is_named_and_the_run_ends_at_its_time_budget(tmp_path, algo):
    """An env stuck inside step(): the trainers say which workers hang and
    stop at --seconds instead of waiting for ever."""
    # --pipeline.stall-s 0.5: the run says so after 0.5 s without a step (10 s by default). The budget's clock starts
    # before the workers do, so it leaves a slow or busy machine 7.5 s to start them before the stall must be seen.
    out = seedlocal("train", algo, "--env.id", "faulty_envs:StepHangs-v0", "--seconds", "8",
                    "--pipeline.stall-s", "0.5", "--log-dir", str(tmp_path), "--run-name", algo, "--no-progress",
                    timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seedlocal: no env steps for" in out.stdout and "still inside an env's step or reset" in out.stdout, (
        out.stdout[-2000:])
    assert "seedlocal: done: time budget spent;" in out.stdout or "stopped before the first" in out.stdout, (
        out.stdout[-2000:])
    assert not leaked_segments()  # the runs above have exited; another test run's segments are not theirs


def test_channels_last_images_get_the_cnn_torso(tmp_path):
    """Gymnasium's (H, W, C) images train with the Nature CNN, as (C, H, W) ones do."""
    out, refused = seedlocal_all([
        ("train", "vtrace", "--env.id", "faulty_envs:ImageHWC-v0", "--total-steps", "300", "--algo.echo", "1",
         "--algo.minibatches", "1", "--log-dir", str(tmp_path), "--run-name", "img", "--no-progress"),
        ("train", "r2d2", "--env.id", "faulty_envs:ImageHWC-v0", "--frame-stack", "4", "--log-dir", str(tmp_path))])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(nature torso" in out.stdout, out.stdout[:500]
    # R2D2 stacks single-channel frames only, and says so before starting.
    out = refused
    assert out.returncode == 2
    assert "frame_stack=4: stacks single-channel (1, H, W) image frames" in out.stderr
    assert "observes (48, 48, 3)" in out.stderr


def _group(env_id: str, n: int = 2):
    """The Gymnasium fallback worker's own group of ``n`` envs (what a worker steps), with the run's spec."""
    from seedlocal.envs.gymnasium_group import GymnasiumGroup
    from seedlocal.envs.spaces import describe

    spec = describe(f"faulty_envs:{env_id}")  # imports the module, which registers the ids
    return GymnasiumGroup(spec, n, 1, 0), spec


@pytest.mark.parametrize("env_id, message", [
    ("LaterBareArray-v0", "LaterBareArray-v0: observation is of type ndarray; its space is a Dict with keys 'a', 'b'"),
    ("DiscreteObsOutOfRange-v0", "DiscreteObsOutOfRange-v0: observation is 7, outside its Discrete space's 0..3"),
    ("HugeReward-v0", "HugeReward-v0: step() returned the reward 1e+39, beyond float32's range"),
])
def test_contract_breaks_after_the_first_step_are_named(env_id, message):
    """Gymnasium's passive checker sees an env's first reset and step only. Later, a bare array under a Dict
    space was copied into every field, a Discrete observation out of range became an all-zero one-hot, and a
    float64 reward beyond float32 became inf in storage: each now stops the worker with one line."""
    from seedlocal.errors import EnvContractError

    group, spec = _group(env_id)
    group.reset()
    actions = np.zeros((2,) + spec.action.shape, spec.action.dtype)
    with pytest.raises(EnvContractError) as e:
        for _ in range(5):
            group.send(actions)
            group.recv()
    assert str(e.value).startswith(f"faulty_envs:{message}"), e.value  # the id as the run names it


def test_integer_box_actions_reach_the_env_rounded_in_its_dtype():
    """The policy's actions are float32 vectors; an env with Box(0, 10, (2,), int64) checks each action is in
    its space, dtype included, and got fractions (0.226) until actions were rounded and cast. They are
    rescaled first: -0.26 is 3.7 in [0, 10], 0.49 is 7.45."""
    group, spec = _group("IntBoxAction-v0")
    assert spec.box_dtype == "int64"
    group.reset()
    group.send(np.array([[-0.26, 12.4], [-1.0, 0.49]], np.float32))
    sent = [env.unwrapped.last_action for env in group._envs]
    assert [a.tolist() for a in sent] == [[4, 10], [0, 7]] and all(a.dtype == np.int64 for a in sent), sent
    group.close()


def test_an_env_keeps_the_actions_it_was_sent():
    """An env may keep an action past its step (an action-rate penalty compares it with the next one): each env
    gets an array of its own, not a view of a buffer that the next step's actions overwrite."""
    group, _ = _group("KeepsAction-v0")
    group.reset()
    sent = [np.array([[0.5, -0.5], [0.25, 0.75]], np.float32), np.array([[-1, 1], [0, 0]], np.float32)]
    for actions in sent:
        group.send(actions.copy())
        group.recv()
    for i, env in enumerate(group._envs):
        assert [a.tolist() for a in env.unwrapped.kept] == [s[i].tolist() for s in sent]
    group.close()


def test_a_float32_box_action_is_sent_as_before():
    from seedlocal.envs.bounds import ActionBounds
    from seedlocal.envs.spaces import describe

    bounds = ActionBounds(describe("faulty_envs:BoxShaped-v0"))
    out = bounds(np.full((2, 6), 0.25, np.float32))
    assert out.dtype == np.float32 and out.shape == (2, 2, 3) and np.all(out == 0.25)


def test_an_env_whose_close_raises_is_named_once_and_the_others_are_closed(capsys):
    import faulty_envs

    group, _ = _group("CloseRaises-v0", n=3)
    faulty_envs.CloseRaises.closed = 0
    group.close()
    assert faulty_envs.CloseRaises.closed == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["seedlocal: faulty_envs:CloseRaises-v0: close() raised in 3 of 3 envs (RuntimeError: close failed); "
                   "ignored"], err


def test_spaces_that_hold_nothing_or_images_in_a_dict_are_said(tmp_path, capsys):
    """A zero-size Box inside a Dict failed with a reshape traceback after training began; an image inside
    a Dict gets a CNN beside the MLP (it entered the MLP flattened before), which the first lines say."""
    from seedlocal.cli import main
    from seedlocal.envs.spaces import describe

    with pytest.raises(ValueError, match=r"a Box of shape \(0,\), which holds nothing"):
        describe("faulty_envs:EmptyField-v0")
    # The command's main in this process (what `seedlocal` runs), without a second interpreter's start-up.
    capsys.readouterr()
    assert main(["train", "vtrace", "--env.id", "faulty_envs:ImageInDict-v0", "--total-steps", "64",
                 "--log-dir", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "the Dict's image field 'img' gets a CNN of its own beside the MLP" in out.err + out.out, out.err
    assert "multi torso" in out.err + out.out, out.out


_MAIN_ENV = """
import sys
import gymnasium as gym
import numpy as np
import seedlocal


class Mine(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, True, False, {}

"""


def test_an_env_registered_where_workers_cannot_see_it_is_named(tmp_path):
    """An env class registered by a notebook's or `python -`'s code lives in __main__, which the env workers
    cannot run: every worker died with Gymnasium's NameNotFound. It is now refused before any worker starts.
    One registered under a script's __main__ guard is named when the workers cannot make it."""
    train = ("seedlocal.train('vtrace', env={'id': 'Mine-v0'}, total_steps=2000, log_dir=sys.argv[1], "
             "run_name='m', progress=False)\n")
    stdin = subprocess.run([sys.executable, "-", str(tmp_path)], input=_MAIN_ENV + "gym.register('Mine-v0', "
                           "entry_point=Mine)\n" + train, capture_output=True, text=True, timeout=240)
    assert stdin.returncode == 1, stdin.stdout[-2000:] + stdin.stderr[-2000:]
    assert ("ConfigError: env.id='Mine-v0' is registered by code in __main__ (a notebook, `python -c` or standard "
            "input), which the env worker processes cannot run") in stdin.stderr, stdin.stderr[-2000:]
    assert "env.id='<module>:Mine-v0'" in stdin.stderr and "WorkerDied" not in stdin.stderr
    script = tmp_path / "guarded.py"
    script.write_text(_MAIN_ENV + "if __name__ == '__main__':\n    gym.register('Mine-v0', entry_point=Mine)\n"
                      "    " + train)
    guarded = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                             timeout=240)
    assert guarded.returncode == 1, guarded.stdout[-2000:] + guarded.stderr[-2000:]
    assert "WorkerDied" in guarded.stderr and ("'Mine-v0' is registered in __main__; a worker runs that file again "
                                               "without its `if __name__ == \"__main__\":` block") in guarded.stderr
    assert not leaked_segments()
