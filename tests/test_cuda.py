"""The CUDA path: skipped where torch sees no GPU (run with -m cuda on a GPU machine)."""

import copy
import threading
import time

import numpy as np
import pytest
import torch

from helpers import prepared, take_unrolls, tiny_pipeline
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.config.schema import EnvConfig, NetworkConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.networks import ActorCritic, PolicyNet
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.pipeline.batches import Batcher, Prefetcher
from seedlocal.policies.population_forward import PopulationForward

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
CUDA = torch.device("cuda")


def test_pipeline_on_cuda_uses_pinned_staging_and_serves_the_model():
    def make(spec, device):
        return ModelPolicy(ActorCritic(spec).to(device), spec)

    with tiny_pipeline(make, device="cuda", num_workers=2, envs_per_worker=8) as pipe:
        assert pipe.loop.device.type == "cuda"
        assert all(t.is_pinned() for t in pipe.loop._staging.values())
        unrolls = take_unrolls(pipe, 8)
    for u in unrolls:
        assert np.isfinite(u["out.logits"]).all()
        assert ((u["action"] >= 0) & (u["action"] < 2)).all()


def _atari_batch(spec, L=9, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ignored = torch.zeros(L, B, dtype=torch.bool)
    ignored[4, 2] = True
    return {
        "obs": {"": torch.randint(0, 255, (L, B, 4, 84, 84), dtype=torch.uint8, generator=g)},
        "action": torch.randint(0, spec.num_actions, (L, B), generator=g),
        "reward": torch.randint(-1, 2, (L, B), generator=g).float(),
        "terminated": torch.zeros(L, B, dtype=torch.bool), "ignored": ignored,
        "behaviour_logits": torch.randn(L, B, spec.num_actions, generator=g), "core_state": None,
    }


def _to(batch, device):
    return {k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict)
                else None if v is None else v.to(device)) for k, v in batch.items()}


def test_vtrace_learner_step_on_cuda_matches_cpu():
    """fp32 on both (TF32 off): one update from the same weights and batch
    lands on the same weights."""
    spec = validate_env(EnvConfig(id="Pong-v5"))
    torch.manual_seed(0)
    cpu_model = ActorCritic(spec, init="orthogonal")
    gpu_model = copy.deepcopy(cpu_model).to(CUDA)
    p = VTraceParams(optimizer="adam", learning_rate=1e-3, optimizer_eps=1e-5, echo=2, minibatches=2, clip=0.1)
    batch = _atari_batch(spec)
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:  # the minibatch order comes from the same seeded CPU generator on both devices
        s_cpu = learner_step(cpu_model, make_optimizer(cpu_model.parameters(), p), batch, p, precision="fp32",
                             shuffle=torch.Generator().manual_seed(1))
        s_gpu = learner_step(gpu_model, make_optimizer(gpu_model.parameters(), p), _to(batch, CUDA), p,
                             precision="fp32", shuffle=torch.Generator().manual_seed(1))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    for (name, a), b in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=1e-5, msg=name)
    assert float(s_cpu["policy_loss"]) == pytest.approx(float(s_gpu["policy_loss"]), rel=1e-3, abs=1e-5)


def test_population_forward_on_cuda_matches_each_member_alone():
    for env_id, tol in (("CartPole-v1", 1e-5), ("Pong-v5", 1e-3)):
        spec = validate_env(EnvConfig(id=env_id))
        nets = [PolicyNet(spec).to(CUDA) for _ in range(3)]
        flats = torch.stack([torch.nn.utils.parameters_to_vector(n.parameters()) for n in nets])
        fwd = PopulationForward(copy.deepcopy(nets[0]), num_slots=6, device=CUDA)
        members = torch.tensor([2, 0, 1, 1, 0, 2], device=CUDA)
        fwd.load(torch.arange(6, device=CUDA), flats, members)
        shape = spec.obs[""].shape
        obs = (torch.randint(0, 255, (6,) + shape, dtype=torch.uint8, device=CUDA) if len(shape) == 3
               else torch.randn((6,) + shape, device=CUDA))
        for strategy in fwd.candidates:
            fwd.strategy = strategy
            for slots in (np.arange(6), np.array([0, 2, 3, 5])):
                out = fwd(slots, {"": obs[torch.from_numpy(slots).to(CUDA)]})
                for i, s in enumerate(slots.tolist()):
                    with torch.no_grad():
                        alone = nets[int(members[s])]({"": obs[s:s + 1]})[0]
                    torch.testing.assert_close(out[i], alone, rtol=tol, atol=tol)


def test_prefetched_batches_reach_the_device_intact():
    """Pinned host sets, a side-stream copy and the learner stream's wait: the
    device batch equals the host one."""
    def make(spec, device):
        return ModelPolicy(ActorCritic(spec, lstm_size=8).to(device), spec)

    with tiny_pipeline(make, device="cuda", num_workers=1, envs_per_worker=4, unroll_length=6) as pipe:
        batcher = Batcher(pipe.store, pipe.layout.obs_keys(), k=2, device=CUDA)
        assert all(t.is_pinned() for t in batcher.host_t[0].values())
        prefetch = Prefetcher(pipe.loop, batcher, release_early=False)
        stop = threading.Event()
        server = threading.Thread(target=lambda: [pipe.loop.step() for _ in iter(stop.is_set, True)], daemon=True)
        prefetch.start()
        server.start()
        try:
            for _ in range(4):
                fetched = None
                while fetched is None:
                    fetched = prefetch.next(timeout=0.5)
                batch = batcher.use(fetched)
                host = batcher.host[fetched.slot]
                np.testing.assert_array_equal(batch["obs"][""].cpu().numpy(), host["obs"])
                np.testing.assert_array_equal(batch["behaviour_logits"].cpu().numpy(), host["out.logits"])
                prefetch.done(fetched)
        finally:
            stop.set()
            prefetch.stop()
            server.join(10)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("lstm", [0, 64])
def test_graphed_inference_matches_eager_and_follows_weight_updates(precision, lstm):
    """--pipeline.cuda-graphs: ModelPolicy replayed from graphs gives the eager
    forward's logits, values and recurrent state at batch sizes that pad to a
    bucket and that fill one, and sees an optimiser step made in place."""
    spec = validate_env(EnvConfig(id="Pong-v5"))
    torch.manual_seed(0)
    model = ActorCritic(spec, lstm_size=lstm).to(CUDA)
    fence = WeightLock(CUDA)
    eager = ModelPolicy(model, spec, fence, precision=precision)
    graphed = ModelPolicy(model, spec, fence, precision=precision, cuda_graphs=True)
    tol = {"rtol": 1e-2, "atol": 1e-2} if precision == "bf16" else {"rtol": 1e-4, "atol": 1e-5}

    def both(n):
        obs = {"": torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8, device=CUDA)}
        core = torch.randn(n, 2, lstm, device=CUDA) if lstm else None
        _, e_out, e_core = eager.act(obs, core)
        _, g_out, g_core = graphed.act(obs, core)
        for k in ("logits", "value"):
            torch.testing.assert_close(g_out[k], e_out[k], **tol)
        if lstm:
            torch.testing.assert_close(g_core, e_core, **tol)
        return e_out

    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # padded and unpadded
    try:  # batches may pick different kernels: compare fp32 with fp32
        for n in (5, 8, 13, 5):  # 5 and 13 pad (to 8 and 16); the second 5 replays a captured graph
            both(n)
        assert sorted(graphed._step.graphs) == [8, 16]
        before = both(8)["logits"]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = sum(p.float().square().sum() for p in model.parameters())
        loss.backward()
        with fence:
            opt.step()
        after = both(8)["logits"]  # both() asserts the graph saw the update the eager forward sees
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    assert not torch.allclose(before, after)


def test_graphed_r2d2_acting_matches_eager():
    from seedlocal.networks import RecurrentQNet
    from seedlocal.policies.q_greedy import R2D2Policy
    from seedlocal.algos.frames import net_spec

    spec = validate_env(EnvConfig(id="Pong-v5", frame_stack=1))
    torch.manual_seed(0)
    net = RecurrentQNet(net_spec(spec, 4), "nature", lstm_size=64).to(CUDA)  # single frames in, 4 stacked
    eps = torch.zeros(16)  # greedy: actions are the argmax of Q
    fence = WeightLock(CUDA)
    eager = R2D2Policy(net, spec, eps, fence, CUDA, 4, 0)
    graphed = R2D2Policy(net, spec, eps, fence, CUDA, 4, 0, cuda_graphs=True)
    core = torch.zeros(16, 2, 64, device=CUDA)
    first = np.ones(16, bool)
    for step in range(6):
        frames = {"": torch.randint(0, 255, (16, 1, 84, 84), dtype=torch.uint8, device=CUDA)}
        ids = np.arange(16)
        a_e, _, c_e = eager.act(frames, core, ids, first)
        a_g, _, c_g = graphed.act(frames, core, ids, first)
        torch.testing.assert_close(c_g, c_e, rtol=1e-4, atol=1e-5)
        assert torch.equal(a_g, a_e), step
        core, first = c_e, np.zeros(16, bool)


def test_weight_fence_orders_a_side_stream_reader_against_the_writer():
    """The inference thread reads on its own stream, the learner writes on the
    default one: every read must see whole updates (20 kernels each), never a
    part of one, and no update may land under a read still queued."""
    from seedlocal.pipeline.cuda import WeightLock

    fence = WeightLock(CUDA)
    w = torch.zeros(1 << 22, device=CUDA)
    torch.cuda.synchronize()
    seen, done = [], threading.Event()

    def reader():
        with torch.cuda.stream(torch.cuda.Stream(CUDA)):
            while not done.is_set():
                with fence.reading():
                    lo, hi = w.min(), w.max()
                seen.append((lo.item(), hi.item()))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(50):
        with fence:
            for _ in range(20):
                torch.cuda._sleep(20_000)  # a slow write: a torn read would have time to happen
                w.add_(1.0)
        # Python's Lock is not fair: re-taken at once, the writer would keep it for all 50 updates and the
        # reader would only ever see 0 and 1000. A pause off the lock lets reads fall between updates.
        time.sleep(0.002)
    torch.cuda.synchronize()
    done.set()
    t.join(30)
    assert len(seen) > 5, f"only {len(seen)} reads"
    torn = [(lo, hi) for lo, hi in seen if not (lo == hi and lo % 20 == 0)]
    assert not torn, f"{len(torn)} of {len(seen)} reads saw part of an update, e.g. {torn[:5]}"
    assert any(0 < lo < 1000 for lo, _ in seen), f"no read landed between two updates: {sorted(set(seen))[:10]}"


def _r2d2_batch(L, B, H, A, g):
    ignored = torch.zeros(L, B, dtype=torch.bool)
    ignored[3, 1] = ignored[7, 0] = True
    return {"obs": {"": torch.randint(0, 255, (L, B, 4, 84, 84), dtype=torch.uint8, generator=g)},
            "action": torch.randint(0, A, (L, B), generator=g), "reward": torch.randn(L, B, generator=g),
            "terminated": torch.zeros(L, B, dtype=torch.bool), "truncated": torch.zeros(L, B, dtype=torch.bool),
            "ignored": ignored, "core_state": torch.randn(B, 2, H, generator=g)}


def test_r2d2_learner_step_on_cuda_matches_cpu_without_repacking_weights():
    """cuDNN's RNN gets contiguous states and the LSTM's flat weight buffer:
    no error, no per-call repacking warning, and the update (fp32, TF32 off)
    lands where the CPU's does."""
    import warnings

    from seedlocal.algos.r2d2 import R2D2Params, learner_step
    from seedlocal.networks import RecurrentQNet

    spec = validate_env(EnvConfig(id="Pong-v5"))
    torch.manual_seed(0)
    p = R2D2Params(burn_in=4, unroll_length=8, n_step=3)
    cpu_online = RecurrentQNet(spec, "nature", lstm_size=32)
    cpu_target = copy.deepcopy(cpu_online)
    gpu_online, gpu_target = copy.deepcopy(cpu_online).to(CUDA), copy.deepcopy(cpu_target).to(CUDA)
    batch = _r2d2_batch(p.burn_in + p.unroll_length + 1, 4, 32, spec.num_actions, torch.Generator().manual_seed(2))
    host = {"ignored_host": batch["ignored"].numpy()}
    weights = torch.rand(4, generator=torch.Generator().manual_seed(3)) + 0.5
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _, prio_cpu = learner_step(cpu_online, cpu_target, torch.optim.Adam(cpu_online.parameters(), lr=1e-4),
                                   batch | host, weights, p, WeightLock())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, prio_gpu = learner_step(gpu_online, gpu_target, torch.optim.Adam(gpu_online.parameters(), lr=1e-4),
                                       _to(batch, CUDA) | host, weights.to(CUDA), p, WeightLock(CUDA))
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    assert not [w for w in caught if "contiguous chunk" in str(w.message)], [str(w.message) for w in caught]
    torch.testing.assert_close(prio_gpu.cpu(), prio_cpu, rtol=1e-3, atol=1e-4)
    for (name, a), b in zip(cpu_online.named_parameters(), gpu_online.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-3, atol=1e-5, msg=name)


def test_lstm_vtrace_learner_step_on_cuda_matches_cpu():
    spec = validate_env(EnvConfig(id="Pong-v5"))
    torch.manual_seed(0)
    cpu_model = ActorCritic(spec, lstm_size=32, init="orthogonal")
    gpu_model = copy.deepcopy(cpu_model).to(CUDA)
    p = VTraceParams(echo=2, minibatches=2, clip=0.1, batch_size=8)
    batch = _atari_batch(spec)
    batch["core_state"] = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(4))
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        learner_step(cpu_model, make_optimizer(cpu_model.parameters(), p), batch, p, precision="fp32",
                     shuffle=torch.Generator().manual_seed(1))
        learner_step(gpu_model, make_optimizer(gpu_model.parameters(), p), _to(batch, CUDA), p, precision="fp32",
                     shuffle=torch.Generator().manual_seed(1))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    for (name, a), b in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_every_bucket_is_captured_at_start_up_before_any_batch():
    """--pipeline.cuda-graphs: the loop captures each batch size's graph when
    it starts (before a learner runs), so no capture (a device-wide sync and
    an emptied allocator cache) happens mid-run."""
    def make(spec, device):
        return ModelPolicy(ActorCritic(spec, lstm_size=16).to(device), spec, cuda_graphs=True)

    with tiny_pipeline(make, device="cuda", num_workers=2, envs_per_worker=4) as pipe:
        graphs = pipe.loop.policy._step.graphs
        assert sorted(graphs) == [2, 4, 8], "batches of 1 to 4 groups of 2 envs: buckets 2, 4, 8"
        captured = dict(graphs)
        take_unrolls(pipe, 4)
        assert graphs == captured, "a graph was captured mid-run"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_graphs_on_a_second_gpu():
    dev = torch.device("cuda:1")
    spec = validate_env(EnvConfig(id="CartPole-v1"))
    policy = ModelPolicy(ActorCritic(spec).to(dev), spec, cuda_graphs=True)
    policy.prepare([4, 8], {"": torch.zeros(1, 4, device=dev)})
    _, out, _ = policy.act({"": torch.randn(5, 4, device=dev)})
    assert out["logits"].device == dev


def test_graph_capture_while_the_learner_thread_is_busy():
    """A capture in one thread while another keeps launching learner work on
    the default stream (thread_local capture mode): both go on, and the
    graph replays the eager forward."""
    spec = validate_env(EnvConfig(id="Pong-v5"))
    torch.manual_seed(0)
    model = ActorCritic(spec).to(CUDA)
    learner = ActorCritic(spec).to(CUDA)
    opt = torch.optim.Adam(learner.parameters(), lr=1e-4)
    stop, steps = threading.Event(), [0]

    def learn():
        x = {"": torch.randint(0, 255, (32, 4, 84, 84), dtype=torch.uint8, device=CUDA)}
        while not stop.is_set():
            logits, value = learner(x)
            (logits.square().mean() + value.square().mean()).backward()
            opt.step()
            opt.zero_grad()
            steps[0] += 1

    t = threading.Thread(target=learn, daemon=True)
    t.start()
    try:
        while steps[0] < 3:
            pass
        policy = ModelPolicy(model, spec, cuda_graphs=True)
        policy.prepare([8, 16, 32], {"": torch.zeros(1, 4, 84, 84, dtype=torch.uint8, device=CUDA)})
        before = steps[0]
        obs = {"": torch.randint(0, 255, (13, 4, 84, 84), dtype=torch.uint8, device=CUDA)}
        _, g_out, _ = policy.act(obs)
        _, e_out, _ = ModelPolicy(model, spec).act(obs)
    finally:
        stop.set()
        t.join(30)
    assert sorted(policy._step.graphs) == [8, 16, 32]
    torch.testing.assert_close(g_out["logits"], e_out["logits"], rtol=1e-3, atol=1e-3)
    assert steps[0] > before, "the learner thread stalled"


def _gpu_run(tmp_path, algo, **kw):
    from seedlocal.config.schema import PipelineConfig
    from seedlocal.recipes.vtrace import VTraceRun
    from seedlocal.recipes.r2d2 import R2D2Run

    if algo == "vtrace":
        from seedlocal.algos.vtrace import VTraceParams as P

        return VTraceRun(pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, unroll_length=16, device="cuda"),
                         algo=P(batch_size=8, sync="off"), network=NetworkConfig(lstm_size=32), log_dir=str(tmp_path), run_name="v",
                         progress=False, log_every_s=0.5, **kw)
    from seedlocal.algos.r2d2 import R2D2Params as P

    return R2D2Run(pipeline=PipelineConfig(num_workers=2, envs_per_worker=8, min_batch_envs=4, unroll_length=0,
                                           device="cuda"),
                   algo=P(min_replay=40, replay_size=2000, replay_ratio=4.0), log_dir=str(tmp_path), run_name="r",
                   progress=False, log_every_s=0.5, **kw)


def test_r2d2_target_copy_keeps_cudnn_flat_weights():
    """The trainer's target network (``frozen_copy``) runs cuDNN's LSTM with
    no repacking: on the H200 a plain deepcopy warned on every unroll."""
    import warnings

    from seedlocal.networks import RecurrentQNet

    spec = validate_env(EnvConfig(id="CartPole-v1"))
    online = RecurrentQNet(spec, lstm_size=32).to(CUDA)
    target = online.frozen_copy()
    L, B = 6, 3
    obs = {"": torch.randn(L, B, 4, device=CUDA)}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="RNN module weights")
        q, _ = target.unroll(obs, torch.zeros(B, 2, 32, device=CUDA), torch.zeros(L, B, dtype=torch.bool, device=CUDA),
                             starts=[])
    # TORCH_WARN_ONCE: the warning comes once a process, so the storage is what the test rests on.
    assert len({p.untyped_storage().data_ptr() for p in target.lstm.parameters()}) == 1, "LSTM weights not flat"
    assert torch.equal(q, online.unroll(obs, torch.zeros(B, 2, 32, device=CUDA),
                                        torch.zeros(L, B, dtype=torch.bool, device=CUDA), starts=[])[0])


# cuDNN's repacking warning fails the run: the trainer's own networks must keep their LSTM weights flat.
@pytest.mark.filterwarnings("error:RNN module weights are not part of single contiguous chunk")
@pytest.mark.parametrize("algo", ["vtrace", "r2d2"])
def test_training_end_to_end_on_cuda_then_resumed(tmp_path, algo):
    """A few hundred updates with the inference thread on its own stream (and
    V-trace's prefetch thread, actors running ahead), a checkpoint written
    from the GPU, then resumed on it: weights, optimizer and counters back."""
    from seedlocal import checkpoint

    if algo == "vtrace":
        from seedlocal.trainers.vtrace import train
    else:
        from seedlocal.trainers.r2d2 import train
    # R2D2 learns from acting envs only (12 of 16 here) at 4 replayed steps per step, 512 rows an update:
    # ~234 updates in 40k steps would sit too close to the bar, so it gets more steps.
    steps = 40_000 if algo == "vtrace" else 60_000
    first = train(prepared(_gpu_run(tmp_path, algo, total_steps=steps)))
    assert first["status"] == "done" and first["updates"] >= 200, first
    saved = checkpoint.load(first["run_dir"])
    assert all(t.device.type == "cpu" for t in saved["model"].values())  # saved as CPU tensors, loadable anywhere
    cfg = _gpu_run(tmp_path, algo, total_steps=steps + 4_000)
    cfg = type(cfg)(**{**cfg.__dict__, "resume": first["run_dir"], "run_name": ""})
    second = train(prepared(cfg))
    assert second["status"] == "done" and second["updates"] > first["updates"]
    assert second["steps"] >= steps + 4_000


def test_r2d2_priorities_come_back_through_one_pinned_buffer_made_once():
    """Each update's priorities reach the host through pinned memory: one buffer, made at the first update and
    reused (the pinned allocator handed out a new block at every update before), read back intact each time."""
    from seedlocal.trainers.replay_feeder import BatchStager

    stager = BatchStager(CUDA, ["obs"])
    torch.cuda.synchronize()
    torch.cuda.reset_accumulated_host_memory_stats()
    pointers = []
    for i in range(4):
        prio = torch.rand(32, device=CUDA, generator=torch.Generator(CUDA).manual_seed(i))
        handle = stager.priorities_to_host(prio)
        pointers.append(handle[0].data_ptr())
        assert np.array_equal(stager.read(handle), prio.cpu().numpy())
    assert len(set(pointers)) == 1 and handle[0].is_pinned()
    assert torch.cuda.host_memory_stats()["active_requests.allocated"] == 1


def test_a_population_member_resumes_its_cuda_sampling_stream(tmp_path):
    """A member's action generator lives on the GPU; its state goes through a checkpoint (saved, loaded to the
    CPU as ``checkpoint`` loads) and back into a fresh member, whose draws then go on exactly where they left."""
    from seedlocal.trainers.population import Member

    spec = validate_env(EnvConfig(id="CartPole-v1"))

    def member():
        return Member(0, ActorCritic(spec).to(CUDA), VTraceParams(), [], seed=3, device=CUDA)

    first = member()
    torch.rand(5, device=CUDA, generator=first.sampling)
    torch.save(first.state(), tmp_path / "m.pt")
    expected = torch.rand(5, device=CUDA, generator=first.sampling)
    second = member()
    second.restore(torch.load(tmp_path / "m.pt", map_location="cpu", weights_only=True))
    assert torch.equal(torch.rand(5, device=CUDA, generator=second.sampling), expected)
