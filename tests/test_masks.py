"""Action masks (Gymnasium's ``action_mask``, in a Dict observation or in
``info``): every way of acting chooses only legal actions, the learners'
log-probabilities, entropy and bootstrap see only legal ones, and a mask
that allows nothing stops the run in one line. The envs: tests/mask_envs.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import leaked_segments
from helpers import prepared, seedlocal_runs

from seedlocal.algos.distributions import Categorical
from seedlocal.algos.frames import net_spec
from seedlocal.algos.r2d2 import double_q_bootstrap, inverse_value_rescale
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import describe, validate_env
from seedlocal.errors import ConfigError
from seedlocal.networks import ILLEGAL, ActorCritic, PolicyNet, RecurrentQNet
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.policies import RandomPolicy
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.policies.population import PopulationPolicy
from seedlocal.policies.q_greedy import R2D2Policy
from seedlocal.spec import MASK_KEY, EnvSpec, TensorSpec

TESTS = Path(__file__).parent
PICK, PICK_INFO = "mask_envs:Pick-v0", "mask_envs:PickInfo-v0"


def random_batch(spec, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``n`` observations of ``spec`` with random masks, each allowing at least one action."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, spec.num_actions, generator=g) < 0.3
    mask[torch.arange(n), torch.randint(spec.num_actions, (n,), generator=g)] = True
    obs = {k: torch.rand((n,) + s.shape, generator=g) for k, s in spec.obs.items() if k != MASK_KEY}
    return {**obs, MASK_KEY: mask}


def test_both_conventions_give_one_bool_flag_per_action():
    for env_id in (PICK, PICK_INFO):
        spec = describe(env_id)
        assert spec.obs[MASK_KEY].shape == (8,) and spec.obs[MASK_KEY].dtype == "bool", spec.obs
        assert ActorCritic(spec).encoder.in_dim == 8  # the network reads the board, not the mask
    assert MASK_KEY not in describe("mask_envs:PickNoMask-v0").obs
    assert MASK_KEY not in describe("CartPole-v1").obs  # envpool: no mask, nothing stored
    with pytest.raises(ConfigError) as e:
        validate_env(EnvConfig(id="mask_envs:BadMask-v0"))
    assert str(e.value) == ("env.id='mask_envs:BadMask-v0': its action_mask has shape (9,); it must hold one flag "
                            "per action (8,)")


def test_every_policy_acts_legally():
    """Sampling (V-trace), epsilon-greedy at epsilon 1 and 0 (R2D2), a population member's argmax and sample,
    and random actions: none outside the mask, over 4096 rows of random masks."""
    torch.manual_seed(0)
    spec = describe(PICK)
    obs = random_batch(spec, 4096)
    mask = obs[MASK_KEY]
    net = RecurrentQNet(spec, lstm_size=16)
    core = torch.zeros(4096, 2, 16)
    policies = [ModelPolicy(ActorCritic(spec), spec), ModelPolicy(ActorCritic(spec), spec, greedy=True),
                R2D2Policy(net, spec, 1.0, WeightLock("cpu"), "cpu", stack=1, seed=0),
                R2D2Policy(net, spec, 0.0, WeightLock("cpu"), "cpu", stack=1, seed=0),
                PopulationPolicy.serving(PolicyNet(spec), spec, greedy=True),
                PopulationPolicy.serving(PolicyNet(spec), spec, greedy=False),
                RandomPolicy(spec, torch.device("cpu"))]
    for policy in policies:
        actions, out, _ = policy.act(obs, core if policy.core_state is not None else None)
        assert mask[torch.arange(4096), actions].all(), type(policy).__name__
    # Epsilon 1: uniform over the legal actions (each row's count of legal ones is known).
    actions, _, _ = policies[2].act(obs, core)
    only_two = mask.sum(1) == 2
    lowest = mask.float().argmax(1)
    share = (actions[only_two] == lowest[only_two]).float().mean()
    assert 0.45 < share < 0.55, share


def test_r2d2_acting_on_frames_stacked_beside_the_network_keeps_the_mask():
    """Single-channel image frames with a mask beside them (a Gymnasium env's Dict): the greedy action over stacks
    built on the device is still a legal one (the stack replaces the frame, not the observation)."""
    torch.manual_seed(0)
    spec = EnvSpec("frames-and-mask", "gymnasium", {"": TensorSpec((1, 12, 12), "uint8"),
                                                   MASK_KEY: TensorSpec((8,), "bool")},
                   TensorSpec((), "int64"), 8, None, None, 1)
    net = RecurrentQNet(net_spec(spec, 4), lstm_size=16)
    policy = R2D2Policy(net, spec, 0.0, WeightLock("cpu"), "cpu", stack=4, seed=0)
    mask = random_batch(spec, 512)[MASK_KEY]
    obs = {"": torch.randint(0, 256, (512, 1, 12, 12), dtype=torch.uint8), MASK_KEY: mask}
    actions, _, _ = policy.act(obs, torch.zeros(512, 2, 16), np.arange(512), np.ones(512, bool))
    assert mask[torch.arange(512), actions].all()


def test_the_learners_see_only_legal_actions():
    """The actor-critic's unrolled logits (feed-forward and LSTM) put probability 0 and entropy nothing on illegal actions, with finite
    gradients; R2D2's double-Q bootstrap takes the target's Q at the best legal action."""
    torch.manual_seed(0)
    spec = describe(PICK)
    T, B = 5, 64
    obs = {k: v.reshape(T, B, *v.shape[1:]) for k, v in random_batch(spec, T * B).items()}
    mask = obs[MASK_KEY]
    for model, core in ((ActorCritic(spec), None), (ActorCritic(spec, lstm_size=16), torch.zeros(B, 2, 16))):
        logits, _ = model.unroll(obs, core, torch.zeros(T, B, dtype=torch.bool))
        p = torch.softmax(logits, -1)
        assert (p[~mask] == 0).all() and torch.allclose(p.sum(-1), torch.ones(T, B))
        entropy = Categorical.entropy(logits)
        assert (entropy <= torch.log(mask.sum(-1).float()) + 1e-5).all()
        legal_actions = mask.float().argmax(-1)
        (Categorical.log_prob(logits, legal_actions).sum() + entropy.sum()).backward()
        assert all(torch.isfinite(w.grad).all() for w in model.parameters() if w.grad is not None)
    net = RecurrentQNet(spec, lstm_size=16)
    q, _ = net.unroll(obs, torch.zeros(B, 2, 16), torch.zeros(T, B, dtype=torch.bool), [])
    assert (q[~mask] == ILLEGAL).all() and (q[mask] > ILLEGAL / 2).all()
    target = torch.randn(T, B, spec.num_actions)
    boot = double_q_bootstrap(q, target)
    assert torch.isfinite(boot).all()
    best = torch.where(mask, q, -torch.inf).argmax(-1, keepdim=True)  # the max over legal actions only
    assert torch.equal(boot, inverse_value_rescale(target.gather(-1, best).squeeze(-1)))


def illegal_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_no_algorithm_takes_an_illegal_action_in_10k_steps(tmp_path):
    """V-trace (the mask in a Dict observation), R2D2 (in info) and the GA, 10k steps each, then eval and its
    video of the V-trace run: the env logs every illegal action, and logs none. The same game without a mask,
    under the same logging, shows the log works. A mask that allows nothing mid-episode stops its run in one
    line naming the env and the step."""
    common = ("--log-dir", str(tmp_path), "--no-progress")
    runs = {"vtrace": (("train", "vtrace", "--env.id", PICK, "--total-steps", "10000", "--run-name", "v"), {}),
            "r2d2": (("train", "r2d2", "--env.id", PICK_INFO, "--total-steps", "10000", "--run-name", "r",
                      "--algo.min-replay", "40", "--algo.replay-size", "400"), {}),
            "ga": (("train", "ga", "--env.id", PICK, "--total-frames", "10000", "--run-name", "g"), {}),
            "unmasked": (("train", "vtrace", "--env.id", "mask_envs:PickNoMask-v0", "--total-steps", "1000",
                          "--run-name", "u"), {}),
            "empty": (("train", "vtrace", "--env.id", "mask_envs:NoLegal-v0", "--total-steps", "5000",
                       "--run-name", "e"), {}),
            "hidden": (("train", "vtrace", "--env.id", "hidden_mask_env:Hidden-v0", "--total-steps", "1000",
                        "--run-name", "h", "--pipeline.num-workers", "1"), {})}
    logs = {name: tmp_path / f"{name}.illegal" for name in runs}
    outs = dict(zip(runs, seedlocal_runs([((*args, *common), {**extra, "MASK_ENVS_ILLEGAL_LOG": str(logs[name])})
                                   for name, (args, extra) in runs.items()])))
    for name in ("vtrace", "r2d2", "ga", "unmasked", "hidden"):
        assert outs[name].returncode == 0, (name, outs[name].stderr[-2000:])
    # A mask in info that describe() did not probe for: the worker says once that actions are not masked.
    said = [ln for ln in outs["hidden"].stderr.splitlines() if "its info gives 'action_mask'" in ln]
    assert len(said) == 1 and "not masked" in said[0], outs["hidden"].stderr[-2000:]
    for name in ("vtrace", "r2d2", "ga"):
        assert illegal_lines(logs[name]) == [], (name, illegal_lines(logs[name])[:5])
    assert len(illegal_lines(logs["unmasked"])) > 10
    last = outs["empty"].stderr.strip().splitlines()[-1]
    assert outs["empty"].returncode == 1 and "Traceback" not in outs["empty"].stderr, outs["empty"].stderr[-2000:]
    assert ("mask_envs:NoLegal-v0: env 0 of a group gave an action_mask that allows no action at step 3 of its "
            "episode") in last, last
    ev, = seedlocal_runs([(("eval", "--checkpoint", str(tmp_path / "v"), "--episodes", "20", "--video",
                     str(tmp_path / "v.gif")), {"MASK_ENVS_ILLEGAL_LOG": str(logs["vtrace"])})])
    assert ev.returncode == 0 and (tmp_path / "v.gif").exists(), ev.stderr[-2000:]
    assert illegal_lines(logs["vtrace"]) == []
    assert not leaked_segments()


MASKED_RETURN, MASKED_BUDGET = 15.0, 40_000


def test_vtrace_learns_the_masked_game_within_budget(tmp_path):
    """Pick's best return is 20 and a uniformly random legal policy earns about 5.4; with its mask V-trace's
    defaults reach a mean of 15 over 20 episodes within 40k steps (about 6k in the runs of docs/masks.md)."""
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.trainers.vtrace import train

    cfg = VTraceRun(env=EnvConfig(id=PICK), total_steps=MASKED_BUDGET, stop_at_return=MASKED_RETURN,
                    log_dir=str(tmp_path), run_name="m", progress=False)
    summary = train(prepared(cfg))
    assert summary["steps_to_target"] is not None and summary["steps_to_target"] <= MASKED_BUDGET, summary


def test_the_mask_travels_over_the_bridge(tmp_path, monkeypatch):
    """Every env behind the bridge: the rows the learner's store receives hold each step's mask (Pick's board
    shows the legal actions, so the two agree), and the actions chosen on those masks are legal on the host."""
    from test_bridge import actors, kill_host, learner, serve_until

    log = tmp_path / "remote.illegal"
    monkeypatch.setenv("MASK_ENVS_ILLEGAL_LOG", str(log))  # the actor host is a new process: it reads this
    with learner(env=PICK) as pipe:
        host = actors(pipe.pool.bridge_port, "--allow-module", "mask_envs")
        try:
            got = serve_until(pipe, lambda us: len(us) >= 8)
        finally:
            kill_host(host)
    for u in got:
        mask = u[f"obs.{MASK_KEY}"]
        assert mask.dtype == bool and mask.any(-1).all()
        np.testing.assert_array_equal(mask, u["obs.observation"] > 0.5)
        acted = ~u["ignored"][:-1]  # the last row's action belongs to the next unroll
        legal = np.take_along_axis(mask[:-1], u["action"][:-1, :, None], -1)[..., 0]
        assert legal[acted].all()
    assert illegal_lines(log) == []
