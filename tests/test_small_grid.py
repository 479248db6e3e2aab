"""The small-grid torso (MinAtar's one 3x3 convolution): what ``auto`` picks
by image size, 0/1 grids read unscaled, both layouts, the population
forward, both learners' steps, and checkpoints from before it existed.
No ``minatar`` package needed: specs are made here, envs in grid_envs.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seedlocal import checkpoint
from seedlocal.networks import (ActorCritic, MinAtarCNN, PolicyNet, RecurrentQNet, auto_encoder, build_encoder,
                                checkpoint_encoder, conv_features, encoder_identity, flatten_obs, image_layout)
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.policies.population_forward import PopulationForward
from seedlocal.shm.rollout import TensorSpec
from seedlocal.spec import EnvSpec
from helpers import prepared


def grid_spec(shape=(10, 10, 4), dtype="bool", actions=3, **obs) -> EnvSpec:
    fields = obs or {"": TensorSpec(tuple(shape), dtype)}
    return EnvSpec("fake-grid", "gymnasium", fields, TensorSpec((), "int64"), actions, None, None, 1)


def random_grid(n: int, shape=(10, 10, 4), seed: int = 0) -> torch.Tensor:
    return torch.rand((n, *shape), generator=torch.Generator().manual_seed(seed)) < 0.2


@pytest.mark.parametrize("shape, dtype, kind, layout", [
    ((10, 10, 4), "bool", "minatar", "hwc"),  # MinAtar Breakout as minatar 1.0.15 declares it
    ((10, 10, 4), "uint8", "minatar", "hwc"),  # as MinAtar's master declares it (Box 0..1, uint8)
    ((10, 10, 10), "bool", "minatar", "hwc"),  # Seaquest: a cube, read channels last as MinAtar sends it
    ((4, 10, 10), "uint8", "minatar", "chw"),
    ((7, 7, 3), "uint8", "minatar", "hwc"),
    ((35, 35, 3), "uint8", "minatar", "hwc"),  # below the Nature CNN's 36 x 36
    ((4, 84, 84), "uint8", "nature", "chw"),  # envpool's Atari
    ((84, 84, 3), "uint8", "nature", "hwc"),
    ((1, 36, 36), "uint8", "nature", "chw"),
    ((4,), "float32", "mlp", None),
    ((3, 3, 3), "float32", "mlp", None),  # too small for a grid: a vector
    ((20, 20, 20), "bool", "mlp", None),  # more than 16 channels, first or last
    ((10, 10, 20), "bool", "minatar", "chw"),  # 10 channels of 10 x 20 cells
])
def test_auto_picks_the_torso_by_image_size(shape, dtype, kind, layout):
    spec = grid_spec(shape, dtype)
    assert auto_encoder(spec) == kind
    assert image_layout(spec.obs[""]) == layout
    assert build_encoder(spec, "auto", (64, 64))[0] == kind


def test_several_fields_get_the_mlp_and_a_grid_among_them_its_own_torso():
    """A Dict of vectors gets the MLP; a grid field beside them gets MinAtar's torso (tests/test_dict_images.py),
    as a float cube does not; a convolutional torso asked for a Dict without an image is refused by name."""
    vectors = grid_spec(pos=TensorSpec((2,), "float32"), cube=TensorSpec((10, 10, 4), "float32"))
    assert auto_encoder(vectors) == "mlp"
    with pytest.raises(ValueError, match="encoder=minatar needs an image observation"):
        build_encoder(vectors, "minatar", (64,))
    dict_spec = grid_spec(grid=TensorSpec((10, 10, 4), "bool"), pos=TensorSpec((2,), "float32"))
    assert auto_encoder(dict_spec) == "multi"
    for encoder in ("auto", "minatar"):
        kind, torso = build_encoder(dict_spec, encoder, (64,))
        assert kind == "multi" and torso.image_keys == ["grid"] and isinstance(torso.convs[0], MinAtarCNN)


def test_the_minatar_torso_is_the_papers():
    """One 3x3 convolution, 16 filters, stride 1, no padding, ReLU; 128 ReLU units."""
    kind, torso = build_encoder(grid_spec(), "auto", (64, 64))
    assert kind == "minatar" and isinstance(torso, MinAtarCNN) and torso.hwc
    conv = [m for m in torso.modules() if isinstance(m, torch.nn.Conv2d)]
    fcs = [m for m in torso.modules() if isinstance(m, torch.nn.Linear)]
    assert len(conv) == 1 and conv[0].in_channels == 4 and conv[0].out_channels == 16
    assert conv[0].kernel_size == (3, 3) and conv[0].stride == (1, 1) and conv[0].padding == (0, 0)
    assert len(fcs) == 1 and (fcs[0].in_features, fcs[0].out_features) == (8 * 8 * 16, 128)
    assert torso.out_dim == 128 and sum(isinstance(m, torch.nn.ReLU) for m in torso.modules()) == 2


def test_explicit_encoders_on_a_small_grid():
    spec = grid_spec()
    with pytest.raises(ValueError, match="encoder=nature needs images of at least 36 x 36.*use encoder minatar"):
        build_encoder(spec, "nature", (64,))
    assert build_encoder(spec, "impala", (64,))[0] == "impala"  # on request: its pooling fits 10 x 10
    assert build_encoder(spec, "mlp", (64,))[0] == "mlp"
    assert build_encoder(grid_spec((4, 84, 84), "uint8"), "minatar", (64,))[0] == "minatar"


def test_a_bool_grid_is_not_scaled_and_uint8_pixels_are():
    x = random_grid(3)
    assert torch.equal(flatten_obs([""], {"": x}, {}), x.reshape(3, -1).float())  # the MLP's input
    pixels = torch.tensor([[0, 128, 255]], dtype=torch.uint8)
    torch.testing.assert_close(flatten_obs([""], {"": pixels}, {}), pixels.float() / 255)
    # Through the conv torso: a bool grid gives what its 0/1 floats give.
    _, torso = build_encoder(grid_spec(), "minatar", ())
    with torch.no_grad():
        out = conv_features(torso, x)
        assert torch.equal(out, torso(x.permute(0, 3, 1, 2).float()))
    # Under CPU autocast a bool grid converts straight to bf16, unscaled.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        as_read = flatten_obs([""], {"": x}, {})
    assert as_read.dtype == torch.bfloat16 and torch.equal(as_read.float(), x.reshape(3, -1).float())


def test_a_uint8_box_of_0s_and_1s_is_read_as_a_bool_grid():
    """MinAtar's master declares its grids as a uint8 Box with high 1 (1.0.15:
    bool). Read as pixels they would enter the network as 1/255; the spec
    calls them bool, and a group stores the env's 0/1 bytes as True/False."""
    import grid_envs  # noqa: F401

    from seedlocal.envs.spaces import describe
    from seedlocal.envs.make import make_group

    spec = describe("grid_envs:Uint8Grid-v0")
    assert spec.obs[""].dtype == "bool" and auto_encoder(spec) == "minatar"
    assert describe("Pong-v5").obs[""].dtype == "uint8"  # pixels (high 255) stay pixels
    group = make_group(spec, 2, 1, 0)
    try:
        group.reset()
        obs = group.recv()[0][""]
        assert obs.dtype == bool and obs.shape == (2, 10, 10, 4) and obs.sum() == 2  # one lit cell each
    finally:
        group.close()


def test_chw_and_hwc_grids_give_the_same_output():
    torch.manual_seed(0)
    hwc = ActorCritic(grid_spec((10, 10, 4)))
    chw = ActorCritic(grid_spec((4, 10, 10)))
    chw.load_state_dict(hwc.state_dict())
    x = random_grid(5)
    with torch.no_grad():
        logits, value = hwc({"": x})
        assert logits.shape == (5, 3) and value.shape == (5,)
        for a, b in zip(chw({"": x.permute(0, 3, 1, 2).contiguous()}), (logits, value)):
            torch.testing.assert_close(a, b)
    q = RecurrentQNet(grid_spec((4, 10, 10), "uint8"), lstm_size=16)
    out, core = q.step({"": (x.permute(0, 3, 1, 2) * 255).to(torch.uint8)}, torch.zeros(5, 2, 16))
    assert out.shape == (5, 3) and core.shape == (5, 2, 16)


def _flats(nets):
    return torch.stack([torch.nn.utils.parameters_to_vector(n.parameters()) for n in nets])


@pytest.mark.parametrize("strategy", ["vmap", "loop", "auto"])
def test_population_forward_of_the_small_torso_equals_each_network_alone(strategy):
    """Per-slot members through the batched forward (runs of consecutive slots,
    and fragmented batches that gather their rows) against each network alone."""
    spec = grid_spec()
    torch.manual_seed(1)
    nets = [PolicyNet(spec) for _ in range(3)]
    assert nets[0].kind == "minatar"
    fwd = PopulationForward(nets[0], num_slots=10, strategy=strategy)
    members = torch.tensor([2, 0, 1, 1, 2, 0, 0, 1, 2, 1])
    fwd.load(torch.arange(10), _flats(nets), members)
    obs = random_grid(10, seed=2)
    batches = [np.arange(10), np.arange(2, 9), np.array([0, 1, 3, 5, 7, 9]), np.arange(8)]
    for _ in range(2 if strategy == "auto" else 1):
        for slots in batches:
            out = fwd(slots, {"": obs[slots]})
            with torch.no_grad():
                ref = torch.cat([nets[members[s]]({"": obs[s:s + 1]}) for s in slots.tolist()])
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _learner_batch(L: int, B: int, spec: EnvSpec, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"obs": {"": torch.rand((L, B, *spec.obs[""].shape), generator=g) < 0.2},
            "action": torch.randint(0, spec.num_actions, (L, B), generator=g),
            "reward": torch.randn(L, B, generator=g), "terminated": torch.zeros(L, B, dtype=torch.bool),
            "truncated": torch.zeros(L, B, dtype=torch.bool), "ignored": torch.zeros(L, B, dtype=torch.bool)}


def test_vtrace_learns_from_a_bool_grid():
    from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer

    spec = grid_spec()
    torch.manual_seed(0)
    model = ActorCritic(spec, init="orthogonal")
    assert model.kind == "minatar"
    batch = _learner_batch(9, 4, spec)
    batch.update(behaviour_logits=torch.zeros(9, 4, 3), core_state=None)
    conv = model.encoder.conv[0].weight
    before = conv.detach().clone()
    p = VTraceParams()
    stats = learner_step(model, make_optimizer(model.parameters(), p), batch, p)
    assert math.isfinite(float(stats["total_loss"])) and not torch.equal(conv, before)


def test_r2d2_learns_from_a_bool_grid():
    from seedlocal.algos.r2d2 import R2D2Params, learner_step

    spec = grid_spec()
    torch.manual_seed(0)
    online, target = RecurrentQNet(spec, lstm_size=16), RecurrentQNet(spec, lstm_size=16)
    target.load_state_dict(online.state_dict())
    assert online.kind == "minatar"
    batch = {**_learner_batch(11, 3, spec), "core_state": torch.zeros(3, 2, 16)}
    batch["ignored_host"] = batch["ignored"].numpy()
    conv = online.encoder.conv[0].weight
    before = conv.detach().clone()
    p = R2D2Params(burn_in=4, unroll_length=6, n_step=2, batch_size=3)
    stats, prio = learner_step(online, target, torch.optim.Adam(online.parameters(), lr=1e-3), batch,
                               torch.ones(3), p, WeightLock())
    assert prio.shape == (3,) and math.isfinite(float(stats["loss"])) and not torch.equal(conv, before)


def test_r2d2_stacks_single_channel_bool_frames_as_bool():
    """R2D2's acting-side frame stack keeps the frames' dtype: stacked as
    uint8, a 0/1 grid would be read as pixels and scaled by 1/255."""
    from seedlocal.pipeline.cuda import WeightLock
    from seedlocal.policies.q_greedy import R2D2Policy
    from seedlocal.algos.frames import net_spec

    spec = grid_spec((1, 10, 10))
    net = RecurrentQNet(net_spec(spec, 4), lstm_size=8)
    assert net.kind == "minatar" and net.encoder.conv[0].in_channels == 4
    policy = R2D2Policy(net, spec, torch.zeros(2), WeightLock(torch.device("cpu")), "cpu", stack=4, seed=0)
    frames = torch.ones(2, 1, 10, 10, dtype=torch.bool)
    stacked = policy.frames(frames, torch.arange(2), torch.ones(2, dtype=torch.bool), 2)
    assert stacked.dtype == torch.bool and bool(stacked.all())
    actions, _, core = policy.act({"": frames}, torch.zeros(2, 2, 8), np.arange(2), np.ones(2, bool))
    assert actions.shape == (2,) and core.shape == (2, 2, 8)


def test_checkpoint_identity_names_the_small_torso_and_old_checkpoints_rebuild():
    grid, atari, vector = grid_spec(), grid_spec((4, 84, 84), "uint8"), grid_spec((4,), "float32")
    # Choices auto made before are recorded as before: Atari and MLP checkpoints still match.
    assert encoder_identity(atari, "auto") == {"encoder": "auto"}
    assert encoder_identity(vector, "auto") == {"encoder": "auto"}
    assert encoder_identity(grid, "mlp") == {"encoder": "mlp"}
    new = encoder_identity(grid, "auto")
    assert new == {"encoder": "auto", "torso": "minatar"}
    assert checkpoint_encoder(new, grid) == "minatar"
    # Written when auto gave a grid an MLP: rebuilt as that MLP.
    assert checkpoint_encoder({"encoder": "auto"}, grid) == "mlp"
    assert checkpoint_encoder({"encoder": "auto"}, atari) == "auto"
    assert checkpoint_encoder({"encoder": "nature"}, atari) == "nature"


def test_a_checkpoint_from_before_the_torso_evaluates_with_its_mlp(tmp_path):
    """An auto/MLP V-trace checkpoint on a grid env, as written before auto
    picked the small torso, still rebuilds and loads in ``seedlocal eval``;
    a resumed run is refused by name."""
    import grid_envs  # noqa: F401  (registers BoolGrid-v0)

    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.evaluate import policy_of
    from seedlocal.recipes.vtrace import VTraceRun, identity

    cfg = VTraceRun(env=EnvConfig(id="grid_envs:BoolGrid-v0"))
    spec = validate_env(cfg.env)
    old = ActorCritic(spec, encoder="mlp", separate_critic=True)
    ident = {**identity(cfg, spec), "encoder": "auto"}
    assert ident.pop("torso") == "minatar"
    checkpoint.save(tmp_path, {"identity": ident, "model": old.state_dict()}, 10, 10)
    assert policy_of(checkpoint.load(tmp_path), torch.device("cpu")).model.kind == "mlp"
    with pytest.raises(checkpoint.CheckpointError, match="torso: checkpoint has None, this run has 'minatar'"):
        checkpoint.check_compatible(checkpoint.load(tmp_path), identity(cfg, spec))


def test_vtrace_trains_on_a_bool_grid_env_through_the_pipeline(tmp_path):
    """Bool observations through shared memory to the small torso, end to end."""
    import grid_envs  # noqa: F401

    from seedlocal.algos.vtrace import VTraceParams
    from seedlocal.config.schema import EnvConfig, PipelineConfig
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.trainers.vtrace import train

    cfg = VTraceRun(env=EnvConfig(id="grid_envs:BoolGrid-v0"), total_steps=600, log_dir=str(tmp_path),
                    run_name="grid", progress=False,
                    pipeline=PipelineConfig(num_workers=1, envs_per_worker=4, unroll_length=16),
                    algo=VTraceParams(batch_size=4))
    summary = train(prepared(cfg))
    assert summary["steps"] >= 600
    state = checkpoint.load(tmp_path / "grid")
    assert state["identity"]["encoder"] == "auto" and state["identity"]["torso"] == "minatar"
    assert "encoder.conv.0.weight" in state["model"]


def test_r2d2_and_ga_run_on_a_bool_grid_env(tmp_path):
    """R2D2 (replay of bool frames) and a GA generation (the population's
    batched conv forward inside the inference loop) on the small torso."""
    import grid_envs  # noqa: F401

    from seedlocal.algos.ga import GAParams
    from seedlocal.algos.r2d2 import R2D2Params
    from seedlocal.config.schema import EnvConfig, NetworkConfig, PipelineConfig
    from seedlocal.trainers import neuroevolution, r2d2

    env = EnvConfig(id="grid_envs:BoolGrid-v0")
    cfg = r2d2.R2D2Run(env=env, total_steps=800, log_dir=str(tmp_path), run_name="r2d2", progress=False,
                       pipeline=PipelineConfig(num_workers=1, envs_per_worker=4, min_batch_envs=2, unroll_length=0),
                       algo=R2D2Params(batch_size=4, burn_in=2, unroll_length=8, n_step=2, min_replay=8,
                                       replay_size=64, eval_envs=1), network=NetworkConfig(lstm_size=16))
    assert r2d2.train(prepared(cfg))["steps"] >= 800
    assert checkpoint.load(tmp_path / "r2d2")["identity"]["torso"] == "minatar"
    ga = neuroevolution.GARun(env=env, generations=1, log_dir=str(tmp_path), run_name="ga", progress=False,
                              best_episodes=1, algo=GAParams(population_size=8, truncation=4),
                              pipeline=PipelineConfig(num_workers=1, envs_per_worker=8))
    neuroevolution.train(prepared(ga))
    state = checkpoint.load(tmp_path / "ga")
    assert state["identity"]["torso"] == "minatar" and state["counters"]["generation"] >= 1
