"""``seedlocal eval`` acts through the policy its family's training serves
(``from_checkpoint``), calling its ``act`` as the inference loop does, on the
device it is given: observations and the recurrent core go to the policy's
device, actions come back to the host."""

from __future__ import annotations

import copy
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from seedlocal import checkpoint, families
from seedlocal.envs.envpool_group import EnvpoolGroup
from seedlocal.errors import ConfigError
from seedlocal.evaluate import Acting, play, policy_of
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.policies.population import PopulationPolicy
from seedlocal.policies.q_greedy import R2D2Policy

SAVED = Path(__file__).parent / "fixtures" / "saved_runs"  # one checkpoint per family, from older code
# The class each family's trainer serves to the inference loop (neuroevolution: its population, serving the
# checkpoint's member on every env slot).
SERVED = {"vtrace": ModelPolicy, "r2d2": R2D2Policy, "es": PopulationPolicy, "ga": PopulationPolicy}


def _state(name: str) -> dict:
    return checkpoint.load(SAVED / name)


@pytest.mark.parametrize("name", list(SERVED))
def test_each_family_plays_its_checkpoint_through_the_policy_training_serves(name, monkeypatch):
    """The family the checkpoint names makes the policy its training runs, and eval steps envs through its
    ``act`` as the loop calls it: env slot ids, each env's first step marked once, the core carried."""
    state = _state(name)
    assert families.of_checkpoint(state).name == name
    policy = policy_of(state, torch.device("cpu"))
    assert type(policy) is SERVED[name]
    calls = []
    act = type(policy).act

    def spying(self, obs, core=None, env_ids=None, first=None):
        calls.append((env_ids.tolist(), first.tolist(), None if core is None else core.shape))
        return act(self, obs, core, env_ids, first)

    monkeypatch.setattr(type(policy), "act", spying)
    returns, cut = play(policy, episodes=3, seed=1, max_steps=50)
    assert returns.shape == (3,) and np.isfinite(returns).all() and (returns >= 1).all()  # CartPole pays 1 a step
    assert calls[0][:2] == ([0, 1, 2], [True] * 3) and all(f == [False] * 3 for _, f, _ in calls[1:])
    assert calls[0][2] == (None if policy.core_state is None else (3,) + tuple(policy.core_state.shape))


def test_the_network_is_sized_by_the_checkpoint_not_by_todays_defaults():
    """The fixtures were saved with sizes unlike the defaults (tests/fixtures/saved_runs/README.md)."""
    vtrace = policy_of(_state("vtrace"), torch.device("cpu")).model
    assert vtrace.lstm is not None and vtrace.lstm.hidden_size == 8 and vtrace.obs_norm is not None
    r2d2 = policy_of(_state("r2d2"), torch.device("cpu")).net
    assert r2d2.lstm.hidden_size == 8
    ga = policy_of(_state("ga"), torch.device("cpu")).forward.template
    assert [m.out_features for m in ga.modules() if isinstance(m, torch.nn.Linear)] == [8, 4, 2]
    es = policy_of(_state("es"), torch.device("cpu")).forward.template
    assert es.obs_norm is not None and float(es.obs_norm.count) > 0  # the population's statistics came too


def test_each_family_acts_as_it_did_in_training_unless_asked():
    cpu = torch.device("cpu")
    assert policy_of(_state("vtrace"), cpu).acting == "sampled"
    assert policy_of(_state("vtrace"), cpu, greedy=True).acting == "argmax"
    assert policy_of(_state("r2d2"), cpu, epsilon=0.01).acting == "epsilon-greedy, epsilon 0.01"
    assert policy_of(_state("r2d2"), cpu, greedy=True).acting == "argmax"
    assert policy_of(_state("ga"), cpu).acting == "argmax"  # the run's greedy option (the deep-GA convention)
    assert policy_of(_state("ga"), cpu, greedy=False).acting == "sampled"
    with pytest.raises(ConfigError, match="policy=sample: R2D2 acts epsilon-greedily"):
        policy_of(_state("r2d2"), cpu, greedy=False)


def test_a_checkpoint_naming_no_algorithm_is_refused_by_name():
    state = {**_state("ga"), "identity": {**_state("ga")["identity"], "algo": "dqn"}}
    with pytest.raises(checkpoint.CheckpointError, match="written by no algorithm seedlocal has \\('dqn'\\)"):
        policy_of(state, torch.device("cpu"))


@pytest.mark.parametrize("name", list(SERVED))
def test_eval_runs_the_network_on_its_device(name):
    """On the meta device a forward computes shapes and no values, and any
    host tensor mixed into it is refused. So the first error is copying the
    action back out: the observations, the core and the forward were all on
    the policy's device."""
    policy = policy_of(_state(name), torch.device("meta"), greedy=True)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        Acting(policy, 2)({"": np.zeros((2, 4), np.float32)})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", list(SERVED))
def test_eval_on_cuda_plays_as_on_the_cpu(name):
    """The same checkpoint, greedy (R2D2 with epsilon, drawn on the host), on the same seeds: the same returns
    on the GPU as on the CPU."""
    eps = 0.05 if name == "r2d2" else 0.0
    cpu, _ = play(policy_of(_state(name), torch.device("cpu"), True, eps), episodes=3, seed=1, max_steps=300)
    gpu, _ = play(policy_of(_state(name), torch.device("cuda"), True, eps), episodes=3, seed=1, max_steps=300)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-2)


def test_eval_picks_its_device_as_train_does():
    """eval and train default to the same device rule (auto: CUDA where there is one): a checkpoint trained on
    a GPU plays there too, without --device."""
    from seedlocal.config.checks import resolve_device
    from seedlocal.config.schema import PipelineConfig
    from seedlocal.evaluate import EvalConfig

    assert EvalConfig(checkpoint="x").device == PipelineConfig().device == "auto"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_ctrl_c_in_a_long_eval_prints_and_saves_the_returns_so_far(tmp_path):
    """Issue 44, item 14: Ctrl-C in a long ``seedlocal eval`` lost every return played. Each return is said as its
    episode ends; stopped, eval says the returns that had ended, as a finished eval would but marked as
    interrupted, writes them to --out, exits 130, and leaves no process and no segment. Two of the four envs of
    EvenSeedsEnd (seeds 10 and 12) end at return 5, the other two never do: the eval is still playing, with two
    returns in, whenever the signal comes."""
    import json
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    import psutil
    from conftest import seedlocal_segments
    from helpers import prepared, TESTS, terminal_like

    from seedlocal.config.schema import EnvConfig, PipelineConfig
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.trainers.vtrace import train

    train(prepared(VTraceRun(env=EnvConfig(id="faulty_envs:EvenSeedsEnd-v0"), total_steps=200, log_dir=str(tmp_path),
                    run_name="e", progress=False, pipeline=PipelineConfig(num_workers=1, envs_per_worker=4))))
    out_file = tmp_path / "returns" / "eval.json"
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "seedlocal", "eval", "--checkpoint", str(tmp_path / "e"),
                             "--episodes", "4", "--seed", "10", "--max-steps", "1000000000", "--device", "cpu",
                             "--out", str(out_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=terminal_like, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    said = []
    try:
        while not any(line.startswith("episode 2 of 4:") for line in said):  # bounded by work: two episodes ended
            line = lines.get(timeout=120)  # a give-up limit only: the old eval never says an episode
            assert line is not None, "".join(said) + proc.stderr.read()
            said.append(line)
        kids = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read()
    while (line := lines.get(timeout=10)) is not None:
        said.append(line)
    out = "".join(said)
    assert proc.returncode == 130, out + err
    assert said[:2] == ["episode 1 of 4: return 5.00\n", "episode 2 of 4: return 5.00\n"], out
    assert ("faulty_envs:EvenSeedsEnd-v0: interrupted after 2 of 4 episodes (sampled actions), return mean 5.00 "
            "std 0.00 (min 5.0, max 5.0); checkpoint") in out, out
    saved = json.loads(out_file.read_text())
    assert saved["interrupted"] is True and saved["returns"] == [5.0, 5.0] and saved["mean"] == 5.0, saved
    assert saved["episodes"] == 2 and saved["episodes_asked"] == 4 and saved["env"] == "faulty_envs:EvenSeedsEnd-v0"
    assert f"seedlocal: interrupted; stopped cleanly (the returns of 2 episodes in {out_file})" in err, err
    assert "Traceback" not in err, err
    _, alive = psutil.wait_procs(kids, timeout=20)  # the resource tracker ends just after eval: a give-up limit
    assert not alive, alive
    assert not seedlocal_segments(proc.pid)


def _training_policy(evaluating: PopulationPolicy, params: torch.Tensor, n: int, greedy: bool,
                     noise: float) -> PopulationPolicy:
    """Training's policy on a copy of eval's network, as the trainer makes it, with the member's episodes
    queued and started on every slot of its one group of ``n`` envs (``plan``, as the loop calls it)."""
    template = copy.deepcopy(evaluating.forward.template)
    training = PopulationPolicy(template, n, 1, torch.device("cpu"), greedy=greedy,
                                strategy=evaluating.forward.strategy, action_noise=noise)
    training.submit(params.unsqueeze(0), episodes=n)
    nobody = np.zeros((1, n), bool)
    training.plan(np.array([0]), ~nobody, nobody, np.zeros((1, n), np.float32))
    assert (training.assign == 0).all()
    return training


@pytest.mark.parametrize("source, greedy, noise", [("ga", True, 0.0), ("ga", False, 0.0), ("es", True, 0.0),
                                                   ("Pendulum-v1", True, 0.0), ("Pendulum-v1", True, 0.3)])
def test_eval_and_training_act_by_one_rule(source, greedy, noise):
    """Issue 45: eval played a neuroevolution member through a class of its own beside training's. Now eval's
    policy is training's ``PopulationPolicy`` serving the member: on the same observations, with one member's
    episodes on every slot, training and eval choose the same argmax, the same sample from the same seed (with
    the population's observation statistics, ES), the same Box output, and training's action noise is drawn
    onto that same output."""
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.networks import PolicyNet

    if source in SERVED:  # a checkpoint, through seedlocal eval's door
        state = _state(source)
        evaluating = policy_of(state, torch.device("cpu"), greedy)
        params = state["best_params"].float()
    else:
        spec = validate_env(EnvConfig(id=source))
        torch.manual_seed(0)
        net = PolicyNet(spec)
        evaluating, params = PopulationPolicy.serving(net, spec, greedy), parameters_to_vector(net.parameters())
    n = 6
    training = _training_policy(evaluating, params, n, greedy, noise)
    obs = {"": torch.randn(n, *evaluating.spec.obs[""].shape, generator=torch.Generator().manual_seed(2))}
    torch.manual_seed(1)
    trained = training.act(obs, env_ids=np.arange(n))[0]
    torch.manual_seed(1)
    played = evaluating.act(obs, env_ids=np.arange(n))[0]
    if noise:
        assert evaluating.acting == "its output" and training.acting == f"its output plus noise of std {noise:g}"
        played = played + noise * torch.randn_like(played)
    torch.testing.assert_close(trained, played, rtol=0, atol=0)


def test_a_neuroevolution_checkpoint_plays_the_returns_it_played_before():
    """Issue 45 moved eval from the member's own network to training's batched forward: each fixture's member
    plays, argmax, the very returns it played through the old path (recorded at 4b9544c)."""
    before = {"ga": [9.0, 10.0, 8.0, 10.0, 9.0, 8.0, 10.0, 9.0],
              "es": [111.0, 12.0, 12.0, 11.0, 11.0, 109.0, 12.0, 10.0]}
    for name, returns in before.items():
        played, cut = play(policy_of(_state(name), torch.device("cpu"), greedy=True), episodes=8, seed=1,
                           max_steps=500)
        assert played.tolist() == returns and cut == 0, name


class _InterruptedPool(EnvpoolGroup):
    """envpool as eval steps it, with a Ctrl-C landing as its ``at``-th call (reset, send or recv) returns: where
    CPython runs the handler of a signal that came during a C call. It keeps whether a step is in flight."""

    def __init__(self, spec, envs: int, at: int):
        self.obs = {k: np.zeros((envs,) + s.shape, s.dtype) for k, s in spec.obs.items()}
        self.zeros, self.ended = np.zeros(envs, np.float32), np.zeros(envs, bool)
        self.at, self.calls, self.in_flight, self.closed_in_flight = at, 0, False, None

    def _called(self, in_flight: bool) -> None:
        self.in_flight, self.calls = in_flight, self.calls + 1
        if self.calls - 1 == self.at:
            signal.raise_signal(signal.SIGINT)

    def reset(self) -> None:
        self.send(None)

    def send(self, actions) -> None:
        assert not self.in_flight, "a second step sent"
        self._called(True)

    def recv(self):
        assert self.in_flight, "recv() with no step in flight: envpool would wait for ever"
        self._called(False)
        return self.obs, self.zeros, self.ended, self.ended

    def render(self) -> np.ndarray:
        return np.zeros((40, 40, 3), np.uint8)

    def close(self) -> None:
        self.closed_in_flight = self.in_flight


@pytest.mark.parametrize("at", range(4))  # the reset, its recv, a step's send, its recv
@pytest.mark.parametrize("recorded", [False, True])
def test_a_ctrl_c_as_an_envpool_call_returns_leaves_no_step_in_flight(at, recorded, monkeypatch):
    """envpool closed with a step in flight can abort the process, and a recv() with none waits for ever: a Ctrl-C
    between a call and eval's own note of it must not leave either to the cleanup, in the scored episodes
    (``play``) nor in the video's (``video.record``)."""
    from seedlocal import evaluate, video

    pools = []

    def make_group(spec, envs, threads, seed, render=False):
        pools.append(_InterruptedPool(spec, envs, at))
        return pools[-1]

    monkeypatch.setattr(video if recorded else evaluate, "make_group", make_group)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the CLI, whatever runs the tests
    policy = policy_of(_state("vtrace"), torch.device("cpu"))
    try:
        with pytest.raises(KeyboardInterrupt):
            if recorded:
                video.record(Acting(policy, 1), policy.spec, 1, 50)
            else:
                play(policy, episodes=3, seed=1, max_steps=50)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pools[0].closed_in_flight is False


def test_an_envpool_step_holds_only_the_signals_python_handles():
    """``video.step`` holds Ctrl-C over an envpool call, but a SIGTERM left to its default action (a library user's
    process) must still end the process at once: eval's recv can hang, and ``kill`` is how a user ends it."""
    from seedlocal.checkpoint import signals_held

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with signals_held(handled_only=True):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # left alone
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # held
        with signals_held():  # a checkpoint's write holds a default-action SIGTERM too (it is short)
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
