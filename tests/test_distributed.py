"""Data-parallel learners (issue 34, pipeline/ranks.py): two gloo ranks in separate processes, each with half a
batch, against one process with the whole of it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import torch

import dist_ranks
from conftest import seedlocal_segments
from test_train_vtrace import scalars
from seedlocal import checkpoint
from seedlocal.pipeline.ranks import Solo, free_port


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What each of 2 gloo ranks computed from its half of ``dist_ranks.batch()`` (one group for both tests)."""
    out = tmp_path_factory.mktemp("ranks")
    return dist_ranks.ranks(2, free_port(), str(out))


@pytest.mark.parametrize("kind", ["plain", "normalized"])
def test_a_data_parallel_step_equals_one_process_step_over_the_whole_batch(two_ranks, kind):
    """echo 1, minibatches 1: two ranks' update from half a batch each (different numbers of valid rows; rank 1
    starting from other weights, which the broadcast replaces) is one process's update from the whole batch,
    gradient clipping included; with advantage normalisation too, its moments taken over both halves."""
    whole = dist_ranks.step(dist_ranks.batch(), kind == "normalized")
    start = torch.nn.utils.parameters_to_vector(dist_ranks.model_and_params(False)[0].parameters()).detach()
    assert not torch.allclose(whole, start)  # the step moved the weights
    for r in range(2):
        torch.testing.assert_close(two_ranks[r][kind], whole, rtol=1e-5, atol=1e-6)
    assert torch.equal(two_ranks[0][kind], two_ranks[1][kind])  # the ranks stay identical, bit for bit


def _on_gpu(tmp_path, backend: str) -> list[dict]:
    return dist_ranks.ranks(2, free_port(), str(tmp_path), "cuda", backend)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_ranks_sharing_one_gpu_over_gloo_equal_one_process(tmp_path):
    """Two ranks on one GPU (gloo all-reduces CUDA tensors): the update is one CPU process's over the whole batch
    (a correctness check, not a speed figure)."""
    got = _on_gpu(tmp_path, "gloo")
    for kind in ("plain", "normalized"):
        whole = dist_ranks.step(dist_ranks.batch(), kind == "normalized")
        for r in range(2):
            torch.testing.assert_close(got[r][kind], whole, rtol=1e-4, atol=1e-5)
        assert torch.equal(got[0][kind], got[1][kind])


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL: one GPU per rank, needs 2")
def test_two_ranks_on_two_gpus_over_nccl_equal_one_process(tmp_path):
    got = _on_gpu(tmp_path, "nccl")
    for kind in ("plain", "normalized"):
        whole = dist_ranks.step(dist_ranks.batch(), kind == "normalized")
        for r in range(2):
            torch.testing.assert_close(got[r][kind], whole, rtol=1e-4, atol=1e-5)


def test_ranks_gather_any_number_of_values_and_split_any_count(two_ranks):
    """Ranks.gather (a split population's scores): every rank's values in rank order, whatever their numbers,
    none included; Ranks.part: contiguous shares in rank order that cover the count once."""
    for r in range(2):
        assert two_ranks[r]["gather"] == [[], [1.5]] and two_ranks[r]["gather_none"] == [[], []]
    for i, n in enumerate((1, 5, 64)):
        assert two_ranks[0]["part"][i] + two_ranks[1]["part"][i] == list(range(n))
    assert [len(two_ranks[r]["part"][1]) for r in range(2)] == [2, 3]
    assert Solo().gather([1.0, 2.0]) == [[1.0, 2.0]] and Solo().part(5) == range(5)


def test_pooled_statistics_equal_the_whole_batch(two_ranks):
    """Observation normalisation, the reward scaler and advantage normalisation, pooled over the ranks' halves,
    are the whole batch's statistics."""
    b = dist_ranks.batch()
    whole = dist_ranks.statistics(b)
    L, B = dist_ranks.L, dist_ranks.B
    adv = torch.randn(L - 1, B, generator=torch.Generator().manual_seed(1))
    mean, std = Solo().masked_moments(adv, ~b["ignored"][:L - 1])
    for r in range(2):
        got = two_ranks[r]["stats"]
        assert got["obs_count"] == whole["obs_count"] == L * B
        torch.testing.assert_close(got["obs_mean"], whole["obs_mean"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["obs_var"], whole["obs_var"], rtol=1e-12, atol=1e-12)
        assert got["reward"] == pytest.approx(whole["reward"], rel=1e-12)
        assert two_ranks[r]["adv_moments"] == pytest.approx((float(mean), float(std)), rel=1e-6)


@pytest.fixture
def one_rank_group(tmp_path):
    """torch.distributed's default group as a gloo group of this process alone, for what Ranks builds on it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _spy(monkeypatch, dist, name: str) -> list:
    """Every call of ``dist.<name>`` from now on: (its tensors, its group); the tensors are kept alive."""
    calls, real = [], getattr(dist, name)

    def spy(*args, **kw):
        tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if torch.is_tensor(t)]
        calls.append((tensors, kw.get("group")))
        return real(*args, **kw)

    monkeypatch.setattr(dist, name, spy)
    return calls


def test_with_nccl_the_scalars_travel_on_a_cpu_group_of_their_own(one_rank_group, monkeypatch):
    """Ranks joined over NCCL (a GPU each) put the stop decision's all-reduce on the GPU and read it back with
    .cpu() every update, so the host waited for each update to finish. Host numbers (the stop decision, a
    population's scores, pooled statistics) now travel as CPU tensors on a gloo group beside NCCL
    (``scalar_group``); NCCL keeps what lives on the GPU. Checked on the CPU: the group made for an NCCL backend,
    and the collectives of a Ranks whose device is cuda (no CUDA tensor can be made here)."""
    from datetime import timedelta

    from seedlocal.pipeline.ranks import Ranks, scalar_group

    dist = one_rank_group
    assert scalar_group("gloo", timedelta(seconds=60)) is None  # the default group is a CPU one already
    group = scalar_group("nccl", timedelta(seconds=60))
    assert group is not None and dist.get_backend(group) == "gloo"
    calls = _spy(monkeypatch, dist, "all_reduce")
    gathers = _spy(monkeypatch, dist, "all_gather")
    ranks = Ranks(0, 1, 0, 60.0, "cuda", scalars=group)
    assert ranks.sum([3.0, 4.5]) == [3.0, 4.5]
    assert ranks.gather([1.5, 2.5]) == [[1.5, 2.5]]
    n, mean, var = ranks.pool_moments(2.0, torch.tensor([1.0], dtype=torch.float64),
                                      torch.tensor([0.5], dtype=torch.float64))
    assert n == 2.0 and mean.tolist() == [1.0] and var.tolist() == [0.5]
    assert len(calls) == 1 and len(gathers) == 3
    for tensors, used in calls + gathers:
        assert used is group and {t.device.type for t in tensors} == {"cpu"}


def test_the_gradients_all_reduce_buffer_is_allocated_once(one_rank_group, monkeypatch):
    """Ranks.average_gradients reduced a new flat tensor of the model's size every update (torch.cat); it now
    fills the one allocated at the first update (every tensor reduced is kept alive here, so a new one could not
    reuse a freed block's address). The gradients come back as the weighted mean (one rank: unchanged)."""
    from seedlocal.pipeline.ranks import Ranks

    reduced = _spy(monkeypatch, one_rank_group, "all_reduce")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    ranks = Ranks(0, 1, 0, 60.0)
    for weight in (3, torch.tensor(5.0), 1.0):
        model.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        ranks.average_gradients(model.parameters(), weight)
        for p, g in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, g)
    assert len(reduced) == 3 and len({tensors[0].data_ptr() for tensors, _ in reduced}) == 1


def test_every_ranks_env_seeds_are_its_own_over_restarts_and_assignments():
    """Rank r's envs were seeded from env.seed + r x (its envs), and a worker's k-th restart from k x (its envs)
    further: rank 0's first restart took rank 1's seeds (and actor hosts' blocks overlapped across ranks). With
    the production functions, every env of every rank, at every restart of its worker and every assignment of
    its actor hosts (each remote group seen as a host of its own), now gets seeds no other env, rank or start
    has (``PipelineShape.seed_block``)."""
    from seedlocal.config.schema import BridgeConfig, PipelineConfig
    from seedlocal.pipeline.actors import local_seed
    from seedlocal.pipeline.bridge.server import remote_seed
    from seedlocal.shape import pipeline_shape

    for p, bridge, world in [(PipelineConfig(num_workers=2, envs_per_worker=8), None, 2),
                             (PipelineConfig(num_workers=2, envs_per_worker=8), None, 4),
                             (PipelineConfig(num_workers=4, envs_per_worker=16), BridgeConfig(listen=":0", remote_envs=32), 4)]:
        seeds = []
        for r in range(world):
            s = pipeline_shape(p, bridge, rank=r, ranks=world)
            for start in range(6):
                for w in range(s.num_workers):
                    seeds += range(local_seed(1, w, start, s), local_seed(1, w, start, s) + s.envs_per_worker)
                for g in range(s.num_remote_groups):
                    first = remote_seed(1, start + 1, g, s)
                    seeds += range(first, first + s.envs_per_group)
        assert len(seeds) == len(set(seeds)) == 6 * world * s.num_envs, (p, bridge, world)


def test_ranks_sample_and_explore_from_streams_of_their_own():
    """R2D2's replay sampler and epsilon draws (and V-trace's minibatch order) were seeded with env.seed on every
    rank: the ranks sampled their replays and explored alike. Each rank's streams, as its trainer seeds them, are
    its own, and so are a resumed session's (``stream_seed``: by seed, rank, purpose and the step it starts
    from); one process's first session keeps env.seed, as before."""
    from helpers import prepared
    from seedlocal.pipeline.ranks import Ranks
    from seedlocal.prepare import for_rank
    from seedlocal.recipes import r2d2 as r2d2_recipe
    from seedlocal.recipes import vtrace as vtrace_recipe
    from seedlocal.trainers import r2d2, vtrace
    from seedlocal.trainers.run import stream_seed

    cpu = torch.device("cpu")
    q, a = prepared(r2d2_recipe.PRESETS["cartpole"]), prepared(vtrace_recipe.PRESETS["cartpole"])
    draws = []
    for r in range(2):
        ranks = Ranks(r, 2, r, 60.0)
        t = r2d2.R2D2Trainer(for_rank(q, r, 2, ranks.share(q.config)), cpu, ranks)
        v = vtrace.VTraceTrainer(for_rank(a, r, 2, ranks.share(a.config)), cpu, ranks)
        draws.append((t.replay.rng.integers(1 << 30, size=8).tolist(),
                      torch.rand(8, generator=t.policy().generator).tolist(), torch.randperm(64, generator=v.shuffle).tolist()))
    assert all(a != b for a, b in zip(*draws)), draws
    solo = r2d2.R2D2Trainer(q, cpu)
    first = np.random.default_rng(q.config.env.seed).integers(1 << 30, size=8).tolist()
    assert solo.replay.rng.integers(1 << 30, size=8).tolist() == first
    purposes = ("process", "replay", "epsilon", "shuffle")
    seeds = {stream_seed(1, r, what, start) for r in range(4) for what in purposes for start in (0, 5_000, 10_000)}
    assert len(seeds) == 4 * 4 * 3 - 3  # rank 0's first session: env.seed itself, whatever the purpose


def test_a_run_its_ranks_cannot_divide_is_refused_before_any_rank_starts():
    """What preparation asks of a run of ranks (``prepare.prepare_run``), before the command line or seedlocal.train
    starts any: the run's envs divided among the ranks, and for R2D2 an env left to fill each rank's replay."""
    from helpers import prepared
    from seedlocal.errors import ConfigError
    from seedlocal.recipes.r2d2 import R2D2Run
    from seedlocal.recipes.vtrace import VTraceRun

    prepared(VTraceRun(learners=4))  # 2 workers of 8: 1 worker of 4 a rank
    with pytest.raises(ConfigError, match=r"^pipeline.num_workers=2: 2 workers of 8 envs cannot be divided among 3 "):
        prepared(VTraceRun(learners=3))
    with pytest.raises(ConfigError) as e:
        prepared(R2D2Run(learners=4))
    assert str(e.value) == "algo.eval_envs=4: leaves no env of a learner rank's 4 to fill its replay (4 ranks)"


# -- whole runs on the command line: 2 ranks of 1 worker each (the CPU machine's test bed) -------------------------


def _train(tmp_path, *args: str, timeout: float = 240, launcher=("-m", "seedlocal")):
    cmd = [sys.executable, *launcher, "train", "vtrace", "--log-dir", str(tmp_path), "--no-progress", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _folders(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.is_dir())


def _training(proc: subprocess.Popen, run_dir, ready=None, what: str = "training logged nothing") -> None:
    """Wait until the run has provably trained (a logged rate; or ``ready()``), however slowly this machine
    starts it."""
    ready = ready or (lambda: run_dir.exists() and "charts/steps_per_s" in scalars(run_dir)[0])
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if ready():
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    raise AssertionError(f"{what} within 120 s")


def _kill_rank_1(cmd: list[str], run_dir, timeout_s: float, ready=None, what: str = "training logged nothing"):
    """Start ``cmd`` (2 ranks), SIGKILL rank 1 once it has trained, and check that the run ends within
    2 x ``timeout_s`` naming rank 1, with no process and no segment left. Returns its output."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks = {}
    try:
        _training(proc, run_dir, ready, what)
        ranks = {r: p.pid for r, p in _ranks(proc).items()}
        os.kill(ranks[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=2 * timeout_s)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert f"learner rank 1 (pid {ranks[1]}) was killed by SIGKILL" in out, out
    assert "learner rank 0: rank 1 stopped answering" in out, out
    assert "Traceback" not in out and "leaked" not in out, out
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in ranks.values())
    assert not seedlocal_segments(ranks[0]) and not seedlocal_segments(ranks[1])
    return out


def _ranks(launcher: subprocess.Popen) -> dict[int, psutil.Process]:
    """The launcher's rank processes, by rank."""
    return {int(c.environ()["RANK"]): psutil.Process(c.pid) for c in psutil.Process(launcher.pid).children()}


# CartPole's 475 with two ranks took 36 s of the default suite; 150 tests the same stop, folder and summary in
# about a third of the steps, and the full target runs with -m slow.
@pytest.mark.parametrize("target", [150, pytest.param(475, marks=pytest.mark.slow)])
def test_two_ranks_reach_a_cartpole_target_and_rank_0_alone_writes(tmp_path, target):
    """seedlocal train vtrace --learners 2: both ranks stop together at the target; one run folder, one
    summary with both ranks' steps and episodes, a checkpoint that loads."""
    out = _train(tmp_path, "--learners", "2", "--stop-at-return", str(target), "--total-steps", "1000000",
                 "--run-name", "dp")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 data-parallel learner ranks" in out.stdout
    assert out.stdout.count("TensorBoard: tensorboard --logdir") == 1 and out.stdout.count("seedlocal: done") == 1
    # The command's own lines once, from the launcher: its ranks take the run it prepared and parse nothing.
    assert out.stdout.count("seedlocal: train vtrace --preset cartpole") == 1, out.stdout
    assert _folders(tmp_path) == ["dp"]
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert summary["stopped_by"] == "target" and summary["steps_to_target"] is not None, summary
    state = checkpoint.load(tmp_path / "dp")
    assert state["counters"]["steps"] == summary["steps"] and state["config"]["learners"] == 2
    assert state["config"]["pipeline"]["num_workers"] == 2  # the run's config, not one rank's share of it
    curve = scalars(tmp_path / "dp")[0]
    assert curve["charts/return_mean20"][-1][1] >= target  # the ranks' mean, as the target compared it
    assert curve["charts/episodes"][-1][1] == summary["episodes"]
    assert "Traceback" not in out.stderr, out.stderr


def test_a_target_met_by_an_all_reduce_after_the_last_log_gets_its_last_point():
    """CI once saw a run stop at its target with its curve's last return_mean20 at 473.8: the loop logs, then
    spent() all-reduces the ranks' means and meets 475 with no update or episode of rank 0's since that log.
    The final log must still be written, or the curve ends below the value that stopped the run."""
    from types import SimpleNamespace

    from helpers import prepared
    from seedlocal.recipes.vtrace import PRESETS
    from seedlocal.trainers import vtrace
    from seedlocal.trainers.vtrace_interval import Interval

    t = vtrace.VTraceTrainer(prepared(PRESETS["cartpole"]), torch.device("cpu"))
    stats = SimpleNamespace(forward_s=0.0, batches=0, batch_envs=0)
    t.iv = Interval(0, stats, {"threads": 1, "wait_s": 0.0, "env_s": 0.0})
    assert not t.has_last_log()  # nothing since the last log: no final point
    t.all_ranks = {"sums": (40, 19000.0, 19000.0), "mean20": 473.8}
    assert t._all_ranks_episodes()["charts/return_mean20"] == 473.8  # the periodic log
    assert not t.has_last_log()
    t.all_ranks = {"sums": (41, 19500.0, 19500.0), "mean20": 475.2}  # spent()'s all-reduce after that log
    assert t.has_last_log()
    assert t._all_ranks_episodes()["charts/return_mean20"] == 475.2


def test_r2d2_ranks_write_the_mean_over_ranks_of_their_returns():
    """R2D2 with ranks: rank 0's curve and summary carry the mean over the ranks of their last 20 training and
    evaluation returns (as the target judges them), not rank 0's own; and a mean moved by the all-reduce after
    the last log gets a last point."""
    from types import SimpleNamespace

    from helpers import prepared
    from seedlocal.recipes.r2d2 import PRESETS
    from seedlocal.trainers import r2d2

    t = r2d2.R2D2Trainer(prepared(PRESETS["cartpole"]), torch.device("cpu"))
    t.feeder.recent_train.extend([10.0, 20.0])
    assert t._returns() == (15.0, None)  # one process: its own
    t.ranks = SimpleNamespace(world=2)
    t.all_ranks = {"train": 40.0, "eval": 55.0}  # what spent()'s all-reduce found
    assert t.has_last_log()
    assert t._returns() == (40.0, 55.0)
    t.logged_ranks = dict(t.all_ranks)
    assert not t.has_last_log()


@pytest.mark.slow  # 15 s: the ranks --learners starts are the default suite's; torchrun only launches them
def test_torchrun_starts_the_same_ranks_and_they_end_their_step_budget_together(tmp_path):
    """Under torchrun --nproc-per-node 2 the ranks come from its environment variables. The step budget is judged
    on the all-reduced count: a rank that re-read its own counter (which its inference thread moves on meanwhile)
    once stopped alone, and the other failed in its next all-reduce."""
    out = _train(tmp_path, "--total-steps", "12000", "--run-name", "tr",
                 launcher=("-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "seedlocal"))
    assert out.returncode == 0 and "step budget spent" in out.stdout, out.stdout + out.stderr
    assert out.stdout.count("2 data-parallel learner ranks") == 1
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert summary["stopped_by"] == "steps" and summary["steps"] >= 12000 and summary["updates"] > 0, summary


def test_a_killed_rank_ends_the_run_and_its_checkpoint_resumes(tmp_path):
    """SIGKILL to rank 1: rank 0's next collective fails; the run ends within 2 x --dist-timeout-s with a line
    naming rank 1, no process and no segment left, rank 0's checkpoint saved; a resume with 2 ranks goes on
    from it on the same curve."""
    timeout_s = 10
    cmd = [sys.executable, "-m", "seedlocal", "train", "vtrace", "--learners", "2", "--dist-timeout-s",
           str(timeout_s), "--total-steps", "10000000", "--log-dir", str(tmp_path), "--run-name", "k",
           "--no-progress", "--log-every-s", "0.5"]
    _kill_rank_1(cmd, tmp_path / "k", timeout_s)
    state = checkpoint.load(tmp_path / "k")
    steps = state["counters"]["steps"]
    assert steps > 0
    # The resume (2 ranks, from the saved config): the command's main in this process launches them, as
    # seedlocal.train does (test_api.py), without a launcher interpreter's start-up before theirs.
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--log-dir", str(tmp_path), "--no-progress", "--resume", str(tmp_path / "k"),
                 "--total-steps", str(steps + 4000)]) == 0
    summary = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert summary["steps"] >= steps + 4000 and summary["status"] == "done"
    assert checkpoint.load(tmp_path / "k")["counters"]["updates"] > state["counters"]["updates"]


def test_each_rank_takes_its_share_of_workers_cores_and_its_own_bridge_port():
    """A rank's config: its cores, the batch its own, and bridge.listen's port + RANK, so that every rank can
    serve remote envs; its shape (the trainer's, from that config) the run's divided: 3 workers of 8 envs on 2
    ranks are 12 envs a rank, in 3 workers of 4 (whose groups of 2 divide the run's of 4). One process's config
    is left as it is."""
    from helpers import prepared
    from seedlocal.config.schema import BridgeConfig, PipelineConfig
    from seedlocal.pipeline.ranks import Ranks
    from seedlocal.prepare import for_rank
    from seedlocal.recipes.vtrace import PRESETS, VTraceRun

    def rank(r: int, cfg):
        run = prepared(cfg)
        return for_rank(run, r, 2, Ranks(r, 2, r, 60.0).share(run.config))

    cfg = VTraceRun(pipeline=PipelineConfig(num_workers=3, envs_per_worker=8, device="cpu"),
                    bridge=BridgeConfig(listen="127.0.0.1:50051", remote_envs=8))
    assert Solo().share(cfg) is cfg
    one = rank(1, cfg)
    cores = max(1, len(os.sched_getaffinity(0)) // 2)
    assert one.config.pipeline.learner_threads == cores
    assert one.config.bridge.listen == "127.0.0.1:50052" and one.config.bridge.remote_envs == 8
    shape = one.shape
    assert (shape.num_workers, shape.envs_per_worker, shape.num_local_envs, shape.num_envs) == (3, 4, 12, 20)
    assert cfg.pipeline.num_workers == 3 and cfg.algo.batch_size == 4  # the run's own config is untouched
    assert one.config.algo.batch_size == 2  # the run's batch of one group of 4, split: a rank's group of 2

    minatar = rank(0, PRESETS["minatar"])  # 2 workers of 32 envs (groups of 16), batch 32
    assert minatar.shape.num_workers == 1
    assert minatar.config.algo.batch_size == 16  # the run's batch, split
    assert rank(0, PRESETS["cartpole"]).config.algo.batch_size == 4  # 2 is no whole group of 4
    remote_only = VTraceRun(pipeline=PipelineConfig(num_workers=0, envs_per_worker=8, device="cpu"),
                            bridge=BridgeConfig(listen=":0", remote_envs=32))
    shared = rank(0, remote_only).config
    assert shared.pipeline.num_workers == 0 and shared.bridge.listen == ":0"


def test_a_hung_rank_is_named_and_stopped(tmp_path):
    """SIGSTOP to rank 1 (a hung rank): rank 0's next collective times out after --dist-timeout-s and it stops,
    naming rank 1, within 2 x --dist-timeout-s; the launcher then stops rank 1 (SIGTERM, which a stopped process
    takes once continued), and nothing is left behind."""
    # The test waits 3 x this (rank 0's timeout, then the launcher's 2 x for rank 1) once rank 1 is stopped. Not
    # less: every collective of the run waits this long for a peer's update, which a busy machine can slow for seconds.
    timeout_s = 5
    cmd = [sys.executable, "-m", "seedlocal", "train", "vtrace", "--learners", "2", "--dist-timeout-s",
           str(timeout_s), "--total-steps", "10000000", "--log-dir", str(tmp_path), "--run-name", "h",
           "--no-progress", "--log-every-s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks = {}
    try:
        _training(proc, tmp_path / "h")
        ranks = _ranks(proc)
        os.kill(ranks[1].pid, signal.SIGSTOP)
        gone, alive = psutil.wait_procs([ranks[0]], timeout=2 * timeout_s)
        assert gone, "rank 0 still running 2 x --dist-timeout-s after rank 1 hung"
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            for p in ranks.values():
                p.kill()
            proc.kill()
            proc.communicate(timeout=30)
    assert "learner rank 0: rank 1 stopped answering" in out, out
    assert f"stopping learner rank 1 (pid {ranks[1].pid}), still running" in out, out
    assert "Traceback" not in out and "leaked" not in out, out
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks.values())
    assert not seedlocal_segments(ranks[0].pid) and not seedlocal_segments(ranks[1].pid)
    assert checkpoint.load(tmp_path / "h")["counters"]["steps"] > 0


def test_ctrl_c_stops_every_rank_together_with_one_checkpoint(tmp_path):
    """Ctrl-C in the terminal reaches the launcher and every rank (one process group): the ranks stop together,
    rank 0 writes the checkpoint and an interrupted summary, the command exits 130 with the lines a user types
    next, and nothing is left behind."""
    from helpers import terminal_like

    cmd = [sys.executable, "-m", "seedlocal", "train", "vtrace", "--learners", "2", "--total-steps", "10000000",
           "--log-dir", str(tmp_path), "--run-name", "c", "--no-progress", "--log-every-s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=terminal_like)
    ranks = {}
    try:
        _training(proc, tmp_path / "c")
        ranks = _ranks(proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "leaked" not in out, out
    assert out.count(f"stopped cleanly (checkpoint and summary in {tmp_path / 'c'})") == 1, out
    assert out.count("stopped cleanly") == 1, out  # rank 1 said "(nothing written)" beside it
    assert f"seedlocal train vtrace --resume {tmp_path / 'c'}" in out, out
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks.values())
    assert not seedlocal_segments(ranks[0].pid) and not seedlocal_segments(ranks[1].pid)
    state = checkpoint.load(tmp_path / "c")
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == state["counters"]["steps"] > 0, summary
    assert checkpoint.load(tmp_path / "c")["counters"]["steps"] == summary["steps"]  # (resumes: the killed test)


PYTHON_RANKS = """
import sys, seedlocal
try:
    seedlocal.train("vtrace", learners=2, total_steps=10_000_000, log_dir=sys.argv[1], run_name="p", progress=False,
                    log_every_s=0.5)
except KeyboardInterrupt as e:
    print("raised KeyboardInterrupt in", e.seedlocal_run_dir, flush=True)
    sys.exit(130)
"""


# Two runs of 2 ranks until they have trained (~60 s on 2 cores): -m slow; the default run trains ranks from Python
# to their budget (test_api.py).
@pytest.mark.slow
def test_ranks_started_from_python_stop_with_their_caller(tmp_path):
    """seedlocal.train(learners=2): a notebook's interrupt reaches the calling process alone, which sends its
    ranks SIGTERM: they save and stop, and KeyboardInterrupt is raised with the run folder on it. A caller killed
    outright (SIGKILL: a kernel restarted) takes its ranks with it (PR_SET_PDEATHSIG: SIGTERM, a clean stop),
    where they trained on to their budget before. Nothing is left behind either way."""
    from helpers import terminal_like

    for how in (signal.SIGINT, signal.SIGKILL):
        run_dir = tmp_path / how.name / "p"
        proc = subprocess.Popen([sys.executable, "-c", PYTHON_RANKS, str(run_dir.parent)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=terminal_like)
        ranks, alive = {}, []
        try:
            _training(proc, run_dir)
            ranks = _ranks(proc)
            os.kill(proc.pid, how)
            gone, alive = psutil.wait_procs(list(ranks.values()), timeout=60)
        finally:
            for p in alive:  # what the test failed on: stopped cleanly, so that it leaves no segment either
                p.terminate()
            psutil.wait_procs(alive, timeout=30)
            if not ranks and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # it never trained: the caller and anything it started
            out, _ = proc.communicate(timeout=60)  # the ranks share its output: it ends once they have
        assert not alive, f"ranks {[p.pid for p in alive]} still running a minute after their caller was stopped"
        assert "Traceback" not in out, out
        if how == signal.SIGINT:
            assert proc.returncode == 130 and f"raised KeyboardInterrupt in {run_dir}" in out, out
            assert f"stopped cleanly (checkpoint and summary in {run_dir})" in out, out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["steps"] > 0, summary
        assert checkpoint.load(run_dir)["counters"]["steps"] == summary["steps"]
        assert not seedlocal_segments(ranks[0].pid) and not seedlocal_segments(ranks[1].pid)


# ~40 s on 2 cores (2 ranks and 2 actor hosts): -m slow. The default run checks each rank's port.
@pytest.mark.slow
def test_every_rank_serves_an_actor_host_of_its_own(tmp_path):
    """Ranks and the bridge together (docs/multihost.md): 2 ranks at --bridge.listen's port and the next, one
    actor host on each; both hosts are served envs of the run's own env, rank 0's curve shows its host, and
    both hosts exit on their own when the run ends."""
    from test_bridge import actors, finish

    while True:  # two free ports in a row: rank r listens at the given one + r
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                continue
    hosts = [actors(port + r, "--retry-s", "60") for r in range(2)]
    try:
        # Every step from the hosts, and a step budget: the run cannot end before both hosts have served it (30 s
        # beside local workers left that to the machine's load).
        out = _train(tmp_path, "--learners", "2", "--pipeline.num-workers", "0", "--bridge.listen",
                     f"127.0.0.1:{port}", "--bridge.remote-envs", "8", "--total-steps", "12000",
                     "--log-every-s", "0.5", "--run-name", "b")
    finally:
        said = [finish(h, timeout=30) for h in hosts]
    assert out.returncode == 0, out.stdout + out.stderr
    for r, text in enumerate(said):
        assert f"connected to 127.0.0.1:{port + r}: 8 envs of CartPole-v1" in text, text
        assert f"the learner at 127.0.0.1:{port + r} stopped; exiting" in text, text
    assert [h.returncode for h in hosts] == [0, 0]
    assert "bridge/host0/steps_per_s" in scalars(tmp_path / "b")[0]


@pytest.mark.slow
def test_two_ranks_reach_minatar_breakout_10(tmp_path):
    """--preset minatar (picked by itself for the id) with 2 ranks: each rank 1 worker of 32 envs and a batch of
    32 unrolls of its own, to a 20-episode mean of 10 (one process: 1.07-2.08M steps, docs/minatar.md)."""
    out = _train(tmp_path, "--env.id", "MinAtar/Breakout-v1", "--learners", "2", "--stop-at-return", "10",
                 "--total-steps", "4000000", "--run-name", "b", timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["stopped_by"] == "target", summary


# -- split populations: GA, ES, ARS and random search over ranks ------------------------------------------------


def _evolve(tmp_path, algo: str, name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "seedlocal", "train", algo, "--log-dir", str(tmp_path), "--run-name", name,
            "--no-progress", *args]


# One family in the default suite (the split is the neuroevolution trainer's, shared by all four); the others
# run with -m slow (10 s each here).
@pytest.mark.parametrize("algo", ["ga", *(pytest.param(a, marks=pytest.mark.slow) for a in ("es", "ars", "random-search"))])
def test_a_split_population_equals_one_process(tmp_path, algo):
    """--learners 2: each rank evaluates half of every population and the fitness is all-gathered, so the two
    ranks tell the algorithm what one process does. On an env whose episodes depend on the actions alone
    (steady_envs.Slope: CartPole's resets follow each env's seed, which follows the rank and the slot a member
    gets, so its members' scores would not), with the forward fixed (auto would time the strategies), 4
    generations of one process and of 2 ranks have the same fitness curves, the same final state and the same
    best member. (The ranks also compare a checksum of their states every generation: a run whose ranks
    differed would have stopped with an error.)"""
    from helpers import seedlocal_runs
    from test_train_vtrace import assert_same_state

    common = ("train", algo, "--env.id", "steady_envs:Slope-v0", "--forward", "bmm", "--generations", "4",
              "--log-dir", str(tmp_path), "--no-progress")
    one, two = seedlocal_runs([((*common, "--run-name", "one"), {}),
                               ((*common, "--run-name", "two", "--learners", "2"), {})])
    for out in (one, two):
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "2 data-parallel learner ranks" in two.stdout and two.stdout.count("seedlocal: done") == 1
    assert _folders(tmp_path) == ["one", "two"]
    curves = [scalars(tmp_path / name)[0] for name in ("one", "two")]
    for tag in ("charts/best_fitness", "charts/mean_fitness", "charts/median_fitness", "charts/best_member_return"):
        assert [s for s, _ in curves[0][tag]] == [1, 2, 3, 4], tag
        assert [v for _, v in curves[1][tag]] == pytest.approx([v for _, v in curves[0][tag]], rel=1e-6), tag
    assert len({v for _, v in curves[0]["charts/mean_fitness"]}) > 1  # the population changed: a real test
    saved = [checkpoint.load(tmp_path / name) for name in ("one", "two")]
    assert saved[1]["config"]["learners"] == 2 and saved[1]["counters"]["generation"] == 4
    state = [{k: v for k, v in s["algo_state"].items() if not torch.is_tensor(v)} for s in saved]
    assert_same_state(state[0], state[1], "algo_state")  # GA's genomes, random search's best seed, counters
    for key, value in saved[0]["algo_state"].items():
        if torch.is_tensor(value):  # the ES and ARS centre, Adam's moments
            torch.testing.assert_close(saved[1]["algo_state"][key], value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(saved[1]["best_params"], saved[0]["best_params"], rtol=1e-6, atol=1e-7)
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two")]
    # Rank 0's summary counts both ranks' evaluation episodes: at least every member's, in every generation.
    members = 4 * (16 if algo == "ars" else 64)
    assert summaries[1]["episodes"] >= members and summaries[1]["frames"] >= 20 * members, summaries[1]


# A learning run (~15 s): -m slow; the default run has the split populations' equality with one process.
@pytest.mark.slow
def test_two_ranks_learn_cartpole_with_es(tmp_path):
    """ES with its population split over 2 ranks reaches the CartPole target within the frame budget of the
    one-process test (test_neuroevolution_train.py: ES_FRAME_BUDGET); the ranks stop together at it."""
    from test_neuroevolution_train import ES_FRAME_BUDGET

    out = subprocess.run(_evolve(tmp_path, "es", "l", "--learners", "2", "--generations", "0", "--total-frames",
                                 str(ES_FRAME_BUDGET), "--stop-at-return", "475"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    summary = json.loads((tmp_path / "l" / "summary.json").read_text())
    assert summary["stopped_by"] == "target" and summary["best_member_return"] >= 475, summary
    assert summary["frames_to_target"] <= ES_FRAME_BUDGET
    assert scalars(tmp_path / "l")[0]["charts/best_member_return"][-1][1] >= 475


def test_a_rank_count_a_population_cannot_be_split_into_is_refused_before_any_rank_starts(tmp_path, capsys):
    # The command's own main in this process (what `seedlocal` runs, without a second interpreter's start-up): the
    # refusal comes from parsing, before the launcher would start any rank.
    from seedlocal.cli import main

    assert main(_evolve(tmp_path, "ars", "x", "--learners", "17")[3:]) == 2
    assert capsys.readouterr().err.strip() == ("seedlocal: error: learners=17: each rank evaluates a part of the "
                                               "population of 16: give at most that many ranks")
    assert not list(tmp_path.iterdir())


def test_ranks_whose_states_differ_stop_the_run():
    """The checksum the ranks compare after every generation: equal states pass, a difference is one line."""
    from seedlocal.algos.neuroevo import ParamSpace
    from seedlocal.envs.spaces import describe
    from seedlocal.networks import PolicyNet
    from seedlocal.trainers.evolvers import ESEvolver, RanksDiverged
    from seedlocal.recipes.neuroevolution import ESRun

    evolver = ESEvolver(ESRun(), ParamSpace(PolicyNet(describe("CartPole-v1"))))
    twin = ESEvolver(ESRun(), ParamSpace(PolicyNet(describe("CartPole-v1"))))
    assert evolver.checksum() == twin.checksum()  # the same seed: the same state on every rank

    class Ranks(Solo):
        rank, world = 0, 2

        def __init__(self, other: int):
            self.other = other

        def gather(self, values):
            return [list(values), [float(self.other)]]

    evolver.ranks = Ranks(twin.checksum())
    evolver._same_everywhere()
    twin.state = dataclasses.replace(twin.state, theta=twin.state.theta + 1e-7)
    evolver.ranks = Ranks(twin.checksum())
    with pytest.raises(RanksDiverged, match="learner rank 0: the ranks' ES states differ after the same generation"):
        evolver._same_everywhere()


# V-trace's killed rank is the default run's; this one (~15 s) is -m slow.
@pytest.mark.slow
def test_a_killed_rank_ends_a_split_population_and_its_checkpoint_resumes_on_one(tmp_path):
    """SIGKILL to rank 1 of a GA run: rank 0's next all-gather fails at once; the run ends naming rank 1, with
    nothing left behind and rank 0's checkpoint saved. A resume with another rank count (1) continues the curve:
    the state is the whole population's, the same on every rank."""
    timeout_s = 10
    cmd = _evolve(tmp_path, "ga", "k", "--learners", "2", "--dist-timeout-s", str(timeout_s), "--generations", "0",
                  "--seconds", "600")
    _kill_rank_1(cmd, tmp_path / "k", timeout_s, ready=lambda: (tmp_path / "k").exists() and checkpoint.newest(
        tmp_path / "k"), what="no generation saved")
    state = checkpoint.load(tmp_path / "k")
    done = state["counters"]["generation"]
    assert done > 0 and state["config"]["learners"] == 2
    out = subprocess.run([sys.executable, "-m", "seedlocal", "train", "ga", "--resume", str(tmp_path / "k"),
                          "--learners", "1", "--generations", str(done + 2), "--seconds", "0", "--no-progress"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert summary["generations"] == done + 2 and summary["status"] == "done", summary
    steps = [s for s, _ in scalars(tmp_path / "k")[0]["charts/best_fitness"]]
    assert steps == list(range(1, done + 3)), steps  # one curve: the resume's points follow the checkpoint's
    after = checkpoint.load(tmp_path / "k")["algo_state"]["genomes"]
    parents = {tuple(g) for g in state["algo_state"]["genomes"]}
    assert all(tuple(g)[:-2] in parents or tuple(g)[:-1] in parents or tuple(g) in parents for g in after)


# -- a resume with another rank count (issue 34, item 4) -----------------------------------------------------------


def test_a_vtrace_run_resumes_on_another_rank_count(tmp_path):
    """V-trace's checkpoint holds the run's config, parameters and optimiser, the same on every rank: one
    process's run resumed with 2 ranks goes on (rank 0's parameters broadcast, the batch per rank split where it
    can be) on the same curve."""
    from seedlocal.cli import main

    # Rates every 0.2 s: a resumed run of 4,000 steps on 2 ranks may end inside one 2 s interval (CI saw its
    # curve without a point past the checkpoint). The one process's run is the command's main in this process
    # (what `seedlocal` runs), without a second interpreter's start-up.
    assert main(["train", "vtrace", "--log-dir", str(tmp_path), "--no-progress", "--total-steps", "4000",
                 "--run-name", "v", "--log-every-s", "0.2"]) == 0
    steps = checkpoint.load(tmp_path / "v")["counters"]["steps"]
    out = _train(tmp_path, "--resume", str(tmp_path / "v"), "--learners", "2", "--total-steps", str(steps + 4000),
                 "--log-every-s", "0.2")
    assert out.returncode == 0 and "learners: 1 -> 2" in out.stdout, out.stdout + out.stderr
    assert "2 data-parallel learner ranks" in out.stdout
    summary = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert summary["steps"] >= steps + 4000 and summary["status"] == "done", summary
    state = checkpoint.load(tmp_path / "v")
    assert state["config"]["learners"] == 2 and state["counters"]["steps"] == summary["steps"]
    curve = [s for s, _ in scalars(tmp_path / "v")[0]["charts/steps_per_s"]]
    assert curve == sorted(curve) and curve[-1] > steps  # one curve, going on past the checkpoint


def test_r2d2_ranks_refuse_one_replay_in_checkpoints_and_learn_together_on_empty_ones(tmp_path, capsys):
    """A checkpoint holds one replay; ranks keep one each. --checkpoint-replay with 2 ranks (here: from a resumed
    run's saved config) is refused in one line before any rank starts; with --no-checkpoint-replay the ranks
    resume the checkpoint with empty replays, say so once, and learn together."""
    from seedlocal.cli import main

    base = [sys.executable, "-m", "seedlocal", "train", "r2d2", "--log-dir", str(tmp_path), "--no-progress"]
    # The one process's run and the refusal: the command's main in this process (what `seedlocal` runs), without
    # a second interpreter's start-up.
    assert main(base[3:] + ["--checkpoint-replay", "--algo.min-replay", "50", "--total-steps", "2000",
                            "--run-name", "r"]) == 0
    state = checkpoint.load(tmp_path / "r")
    assert "replay" in state
    updates = state["counters"]["updates"]
    resume = ["--resume", str(tmp_path / "r"), "--learners", "2", "--total-steps", "8000"]
    # The refusal comes from the command's parsing, before the launcher would start a rank.
    capsys.readouterr()
    assert main(base[3:] + resume) == 2
    said = capsys.readouterr()
    assert said.err.strip() == ("seedlocal: error: checkpoint_replay=True: with 2 learner ranks each rank keeps "
                                "its own replay and a checkpoint holds one: give --no-checkpoint-replay (a "
                                "resumed run's ranks start with empty replays)")
    assert "data-parallel learner ranks" not in said.out  # no rank started
    out = subprocess.run(base + resume + ["--no-checkpoint-replay"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("the checkpoint's replay is one process's: each learner rank starts with an empty "
                            "replay") == 1, out.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] >= 8000 and summary["status"] == "done", summary
    # Each rank refilled its own replay and the ranks updated together (one all-reduce per update) until the
    # step budget, counted over both, ended; rank 0 alone wrote.
    assert checkpoint.load(tmp_path / "r")["counters"]["updates"] > updates, summary
    assert _folders(tmp_path) == ["r"]
