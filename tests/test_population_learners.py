"""A population of learners in one batched call: the members' stacked tensors (MemberStack), one forward for every
member's rows (MembersForward) and one V-trace update for every member (population_learner_step), each against the
members' own networks and P separate learner_step calls."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from seedlocal.algos.member_stack import MemberStack
from seedlocal.algos.pbt import copy_member
from seedlocal.algos.population_vtrace import population_learner_step
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.errors import ConfigError
from seedlocal.networks import ActorCritic
from seedlocal.policies.members import MembersForward, row_layout
from seedlocal.spec import EnvSpec, TensorSpec

SPECS = {
    "mlp": EnvSpec("vec", "gymnasium", {"": TensorSpec((6,), "float32")}, TensorSpec((), "int64"), 3, None, None, 1),
    "minatar": EnvSpec("grid", "gymnasium", {"": TensorSpec((10, 10, 4), "bool")}, TensorSpec((), "int64"), 6, None,
                       None, 1),
    "nature": EnvSpec("atari", "gymnasium", {"": TensorSpec((4, 84, 84), "uint8")}, TensorSpec((), "int64"), 4, None,
                      None, 1),
    "box": EnvSpec("box", "gymnasium", {"": TensorSpec((5,), "float32")}, TensorSpec((2,), "float32"), None,
                   (-1.0, -1.0), (1.0, 1.0), 1),
}


def random_obs(spec: EnvSpec, shape: tuple[int, ...], g: torch.Generator) -> dict[str, torch.Tensor]:
    s = spec.obs[""]
    if s.dtype == "bool":
        return {"": torch.rand(shape + s.shape, generator=g) > 0.6}
    if s.dtype == "uint8":
        return {"": torch.randint(0, 256, shape + s.shape, generator=g, dtype=torch.uint8)}
    return {"": torch.randn(shape + s.shape, generator=g)}


def members(kind: str, n: int, seed: int = 0, **kw) -> list[ActorCritic]:
    torch.manual_seed(seed)
    return [ActorCritic(SPECS[kind], **kw) for _ in range(n)]  # torch's init: orthogonal's QR is seconds for Nature


# -- the stack -------------------------------------------------------------------------------------------------------


def test_a_members_tensors_are_its_rows_of_the_stack_and_keep_their_layout():
    nets = members("minatar", 3)
    before = [(n.encoder.conv[0].weight.stride(), copy.deepcopy(n.state_dict())) for n in nets]
    optimizers = [make_optimizer(n.parameters(), VTraceParams()) for n in nets]  # made before: still theirs
    stack = MemberStack(nets)
    stack.check()
    for i, (net, (stride, state)) in enumerate(zip(nets, before)):
        assert net.encoder.conv[0].weight.stride() == stride  # channels last, as ActorCritic made it
        for name, t in net.state_dict().items():
            assert torch.equal(t, state[name]) and torch.equal(stack.tensors()[name][i], state[name])
        assert optimizers[i].param_groups[0]["params"][0] is next(net.parameters())
    with torch.no_grad():
        nets[1].value.bias.add_(1.0)  # an in-place write (an optimizer step's kind) reaches the stack
    assert torch.equal(stack.params["value.bias"][1], nets[1].value.bias)
    nets[2].value.bias = torch.nn.Parameter(nets[2].value.bias.detach().clone())  # a replaced tensor does not
    with pytest.raises(RuntimeError, match="member 2's value.bias is no longer its row"):
        stack.check()


def test_two_threads_calling_the_stack_at_once_each_run_their_own_tensors():
    """The inference thread's forward and the learner's update both run the architecture through functional_call,
    which puts the tensors it is given into the module for the length of a call. Here one thread is held halfway
    through its call (after the torso, before the heads) while another thread's call runs: each must still
    compute with its own member's tensors."""
    import threading

    nets = members("mlp", 2)
    stack = MemberStack(nets)
    reached, other_inside, first_done = threading.Event(), threading.Event(), threading.Event()

    def hold(module, args):
        if threading.current_thread().name == "first":
            reached.set()
            other_inside.wait(10)
        else:
            other_inside.set()
            first_done.wait(10)

    stack.template.policy.register_forward_pre_hook(hold)  # every thread's copy of the template has it
    obs = {"": torch.randn(3, 6)}
    out = {}

    def run(member: int) -> None:
        tensors = {k: v[member] for k, v in stack.tensors().items()}
        with torch.no_grad():
            out[member] = stack.call(tensors, "forward", obs)
        if member == 0:
            first_done.set()

    first = threading.Thread(target=run, args=(0,), name="first")
    second = threading.Thread(target=run, args=(1,), name="second")
    first.start()
    assert reached.wait(10)
    second.start()
    first.join(20)
    second.join(20)
    for m in (0, 1):
        with torch.no_grad():
            want = nets[m](obs)
        assert torch.allclose(out[m][0], want[0], atol=1e-6) and torch.allclose(out[m][1], want[1], atol=1e-6)


def test_members_of_different_architectures_are_refused():
    # LSTM cores: the recipe refuses them (test_population_train.py's refusals), before any stack is built.
    with pytest.raises(ValueError, match="member 1's network differs"):
        MemberStack([ActorCritic(SPECS["mlp"]), ActorCritic(SPECS["mlp"], hidden=(32,))])


# -- one forward for every member's rows ------------------------------------------------------------------------------


def test_row_layout_groups_rows_per_member_and_skips_the_gather_when_already_grouped():
    present, per, src, pos = row_layout(np.array([0, 0, 1, 1, 2, 2]), 3)
    assert (present.tolist(), per, src, pos) == ([0, 1, 2], 2, None, None)
    present, per, src, pos = row_layout(np.array([3, 1, 3, 3]), 4)
    assert present.tolist() == [1, 3] and per == 3
    assert src.tolist() == [1, 1, 1, 0, 2, 3]  # member 1's padding rereads its first row
    assert pos.tolist() == [3, 0, 4, 5]
    with pytest.raises(ValueError, match=r"one index in \[0, 4\)"):
        row_layout(np.array([0, 4]), 4)


@pytest.mark.parametrize("kind, kw", [("mlp", {}), ("mlp", {"separate_critic": True, "obs_norm": True}),
                                      ("minatar", {}), ("nature", {}), ("box", {"separate_critic": True})])
def test_one_call_serves_every_members_rows_as_its_own_network_would(kind, kw):
    """Rows in contiguous runs, in a shuffled order, with a member absent, and one member's alone (its own network's
    path): each row's logits and value are its own member's (members never see each other's rows)."""
    nets = members(kind, 4, **kw)
    if kw.get("obs_norm"):
        for i, n in enumerate(nets):  # different statistics per member: the stacked buffers are read too
            n.update_obs_norm({"": torch.randn(5, 3, SPECS[kind].obs[""].shape[0]) * (i + 1) + i})
    own = [copy.deepcopy(n) for n in nets]
    forward = MembersForward(MemberStack(nets))
    g = torch.Generator().manual_seed(1)
    runs = np.repeat(np.arange(4), 3)
    rng = np.random.default_rng(0)
    for rows in (runs, rng.permutation(runs), np.array([2, 0, 2, 2, 0, 3]), np.full(5, 1)):
        obs = random_obs(SPECS[kind], (len(rows),), g)
        logits, values = forward(rows, obs)
        assert logits.shape == (len(rows), SPECS[kind].num_actions or 4) and values.shape == (len(rows),)
        for m in range(4):
            mine = np.flatnonzero(rows == m)
            if not len(mine):
                continue
            with torch.no_grad():
                ref_logits, ref_values = own[m]({"": obs[""][mine]})
            assert torch.allclose(logits[mine], ref_logits, rtol=1e-5, atol=1e-5)
            assert torch.allclose(values[mine], ref_values, rtol=1e-5, atol=1e-5)


def test_the_stacked_weights_follow_a_members_update_and_a_pbt_copy():
    """Member 1 learns one batch on its own (learner_step, its own optimizer) and member 3 takes member 0's
    weights (copy_member): the next batched forward serves both as they are now, with no re-stacking."""
    nets = members("minatar", 4)
    p = VTraceParams(learning_rate=0.05)
    optimizers = [make_optimizer(n.parameters(), p) for n in nets]
    forward = MembersForward(MemberStack(nets))
    g = torch.Generator().manual_seed(2)
    rows = np.repeat(np.arange(4), 2)
    obs = random_obs(SPECS["minatar"], (8,), g)
    before, _ = forward(rows, obs)
    learner_step(nets[1], optimizers[1], make_batch("minatar", 4, 2, g), p)
    copy_member(nets[0], optimizers[0], nets[3], optimizers[3])
    after, values = forward(rows, obs)
    with torch.no_grad():
        for m in range(4):
            ref_logits, ref_values = nets[m]({"": obs[""][2 * m:2 * m + 2]})
            assert torch.allclose(after[2 * m:2 * m + 2], ref_logits, atol=1e-5)
            assert torch.allclose(values[2 * m:2 * m + 2], ref_values, atol=1e-5)
        copied, _ = nets[0]({"": obs[""][6:8]})  # member 3 is member 0 now: 0's network on 3's rows
    assert torch.allclose(after[6:8], copied, atol=1e-5) and not torch.allclose(after[6:8], before[6:8], atol=1e-4)
    assert not torch.allclose(after[2:4], before[2:4], atol=1e-4)  # member 1 moved
    assert torch.equal(after[4:6], before[4:6])  # member 2 untouched


# -- one update for every member ----------------------------------------------------------------------------------


def make_batch(kind: str, T: int, B: int, g: torch.Generator) -> dict:
    """A learner batch in learner_step's layout: some episodes end (terminated), some rows are auto-reset rows;
    Box actions with a Gaussian's behaviour parameters (mean, log-std)."""
    L, A = T + 1, SPECS[kind].num_actions
    out = {"obs": random_obs(SPECS[kind], (L, B), g), "reward": torch.randn(L, B, generator=g),
           "terminated": torch.rand(L, B, generator=g) < 0.1, "ignored": torch.rand(L, B, generator=g) < 0.1,
           "core_state": None}
    if A is None:
        return {**out, "action": torch.randn(L, B, 2, generator=g),
                "behaviour_gaussian": torch.cat([torch.randn(L, B, 2, generator=g), torch.full((L, B, 2), -0.5)], -1)}
    return {**out, "action": torch.randint(0, A, (L, B), generator=g),
            "behaviour_logits": torch.randn(L, B, A, generator=g)}


CASES = {
    # IMPALA: one update per batch, the policy gradient unclipped; 656 rows of 64 units, enough for the MLP's tanh
    # to take arithmetic.Tanh's sigmoid form (from 8,192 elements, where the CPU's tanh measures slow).
    "impala": dict(kind="mlp", kw={}, shape=(40, 16), shared=dict(), per=[dict(learning_rate=3e-3, entropy_cost=0.01),
                                                          dict(learning_rate=1e-3, entropy_cost=0.03),
                                                          dict(learning_rate=1e-2, entropy_cost=0.0)]),
    # The MinAtar preset's rhythm: 2 passes of 4 minibatches, clipped surrogate, normalised advantages.
    "minatar": dict(kind="minatar", kw={}, shared=dict(echo=2, minibatches=4, normalize_advantages=True, lam=0.95,
                                                      max_grad_norm=0.5),
                    per=[dict(learning_rate=1e-3, entropy_cost=0.01, clip=0.2),
                         dict(learning_rate=3e-3, entropy_cost=0.03, clip=0.1, discount=0.9, baseline_cost=1.0),
                         dict(learning_rate=3e-4, entropy_cost=0.001, clip=0.3, max_grad_norm=0.0)]),
    # A separate critic and observation statistics per member, decoupled PPO, RMSProp.
    "mlp-critic": dict(kind="mlp", kw=dict(separate_critic=True, obs_norm=True),
                       shared=dict(echo=2, minibatches=3, proximal="batch", optimizer="rmsprop", reward_clip=1.0),
                       per=[dict(learning_rate=1e-3, entropy_cost=0.01, clip=0.2),
                            dict(learning_rate=5e-3, entropy_cost=0.02, clip=0.1, max_grad_norm=1.0),
                            dict(learning_rate=2e-3, entropy_cost=0.0, clip=0.25)]),
    # Box actions: a diagonal Gaussian with a learned log-std, the MuJoCo preset's rhythm in small.
    "box": dict(kind="box", kw=dict(separate_critic=True, obs_norm=True),
                shared=dict(echo=2, minibatches=2, normalize_advantages=True, lam=0.95, max_grad_norm=0.5),
                per=[dict(learning_rate=3e-4, entropy_cost=0.0, clip=0.2),
                     dict(learning_rate=1e-3, entropy_cost=0.01, clip=0.2),
                     dict(learning_rate=3e-3, entropy_cost=0.0, clip=0.1)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_batched_update_equals_each_members_own_learner_step(case):
    c = CASES[case]
    params = [VTraceParams(**{**c["shared"], **per}) for per in c["per"]]
    nets = members(c["kind"], 3, **c["kw"])
    g = torch.Generator().manual_seed(5)
    if c["kw"].get("obs_norm"):
        for n in nets:
            n.update_obs_norm(random_obs(SPECS[c["kind"]], (4, 3), g))
    own = [copy.deepcopy(n) for n in nets]
    own_opts = [make_optimizer(n.parameters(), p) for n, p in zip(own, params)]
    optimizers = [make_optimizer(n.parameters(), p) for n, p in zip(nets, params)]
    stack = MemberStack(nets)
    for _ in range(2):  # two batches: the optimizers' state carries over
        batches = [make_batch(c["kind"], *c.get("shape", (5, 4)), g) for _ in range(3)]
        seeds = [int(torch.randint(0, 1000, (), generator=g)) for _ in range(3)]
        want = [learner_step(own[i], own_opts[i], batches[i], params[i], shuffle=torch.Generator().manual_seed(s))
                for i, s in enumerate(seeds)]
        got = population_learner_step(stack, optimizers, batches, params,
                                      shuffles=[torch.Generator().manual_seed(s) for s in seeds])
        assert got["updates"] == want[0]["updates"] == params[0].echo * params[0].minibatches
        for i in range(3):
            for key in want[i]:
                if key != "updates":
                    assert got[key][i].item() == pytest.approx(want[i][key].item(), rel=1e-4, abs=1e-5), (i, key)
    for i in range(3):
        for (name, a), b in zip(own[i].named_parameters(), nets[i].parameters()):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (i, name, (a - b).abs().max().item())
        for sa, sb in zip(own_opts[i].state.values(), optimizers[i].state.values()):
            assert all(torch.allclose(sa[k], sb[k], rtol=1e-3, atol=1e-7) for k in sa)
    stack.check()


def test_a_batched_update_refuses_members_that_do_not_share_the_updates_shape():
    nets = members("mlp", 2)
    stack = MemberStack(nets)
    opts = [make_optimizer(n.parameters(), VTraceParams()) for n in nets]
    g = torch.Generator().manual_seed(0)
    batches = [make_batch("mlp", 3, 2, g) for _ in range(2)]
    with pytest.raises(ConfigError, match=r"algo.echo=\[1, 2\]: members of a batched update take one value"):
        population_learner_step(stack, opts, batches, [VTraceParams(), VTraceParams(echo=2)])
    with pytest.raises(ConfigError, match="clip all"):
        population_learner_step(stack, opts, batches, [VTraceParams(clip=0.1), VTraceParams()])
