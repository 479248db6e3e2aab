import ast
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from conftest import seedlocal_segments
from helpers import check_autoreset_rows, take_unrolls, terminal_like, tiny_pipeline
from seedlocal.policies import RandomPolicy
from seedlocal.pipeline.actors import WorkerDied


def _wait_alive(pipe, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pipe.loop.step()
        if all(p is not None and p.is_alive() for p in pipe.pool.procs) and pipe.loop.stats.env_steps > 0:
            return
    raise AssertionError("workers did not start")


def test_killed_worker_is_restarted_on_fresh_episodes():
    with tiny_pipeline(RandomPolicy, num_workers=2, unroll_length=16, num_buffers=64) as pipe:
        take_unrolls(pipe, 8)
        victim = pipe.pool.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        # Keep serving: the other worker goes on; the dead one is noticed and replaced.
        end = time.monotonic() + 10
        while pipe.loop.stats.restarts == 0 and time.monotonic() < end:
            pipe.loop.step()
            while not pipe.loop.completed.empty():
                pipe.loop.release(pipe.loop.completed.get())
        assert pipe.loop.stats.restarts == 1
        fresh, end = [], time.monotonic() + 30
        while {u["group"] for u in fresh} != {2, 3} and time.monotonic() < end:
            fresh += [u for u in take_unrolls(pipe, 10) if u["group"] in (2, 3)]
        assert pipe.pool.procs[1].pid != victim.pid and pipe.pool.procs[1].is_alive()
    assert {u["group"] for u in fresh} == {2, 3}, "no unroll came from the restarted worker"
    assert all(u["epoch"] == 1 for u in fresh), "an unroll begun before the crash was delivered after it"
    for g in (2, 3):
        first = next(u for u in fresh if u["group"] == g)
        # Row 0 of its first unroll is a reset: every episode there began at row 0,
        # so an episode that ends at row t has exactly t + 1 steps.
        done = first["terminated"][:-1] | first["truncated"][:-1]
        for e in range(done.shape[1]):
            ends = np.flatnonzero(done[:, e])
            if len(ends):
                assert first["ep_length"][ends[0], e] == ends[0] + 1
        assert np.all(np.abs(first["obs"][0]) <= 0.05)
    for u in fresh:
        check_autoreset_rows(u)


def test_dead_worker_without_restarts_stops_with_a_clear_error():
    with tiny_pipeline(RandomPolicy, max_restarts=0) as pipe:
        _wait_alive(pipe)
        pid = pipe.pool.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied, match=rf"env worker 0 \(pid {pid}, env CartPole-v1\) was killed by signal 9"):
            for _ in range(100000):
                pipe.loop.step()


def _kill_and_serve(pipe, w: int) -> int:
    """SIGKILL worker ``w`` once it steps, then serve until it is restarted; its new pid."""
    _wait_alive(pipe)
    victim = pipe.pool.procs[w]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    restarts, end = pipe.loop.stats.restarts, time.monotonic() + 20
    while pipe.loop.stats.restarts == restarts and time.monotonic() < end:
        pipe.loop.step()
    assert pipe.loop.stats.restarts == restarts + 1
    return pipe.pool.procs[w].pid


def test_restarts_are_a_rate_a_long_run_can_live_with():
    """pipeline.max_restarts counts within pipeline.restart_window_s: a worker
    killed again after the window is restarted; killed again inside it, the
    run stops with a line naming both options. The window is 5 s: with 1.5 s, a loaded box once took longer than
    that to see the restarted worker step, its third death fell outside the window, and the test served batches
    for 10 minutes; the serving is now bounded in time too, so such a miss fails as DID NOT RAISE."""
    window = 5.0
    with tiny_pipeline(RandomPolicy, max_restarts=1, restart_window_s=window) as pipe:
        _kill_and_serve(pipe, 0)
        time.sleep(window + 0.1)  # the window has moved past the first restart
        pid = _kill_and_serve(pipe, 0)
        _wait_alive(pipe)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied, match=r"restarted 1 times already in the last 5 s "
                                             r"\(pipeline.max_restarts=1 per pipeline.restart_window_s=5\)"):
            end = time.monotonic() + 60
            while time.monotonic() < end:
                pipe.loop.step()
    assert pipe.loop.stats.restarts == 2


def _launch(*args):
    cmd = [sys.executable, "-m", "seedlocal", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=terminal_like)


def _workers_of(proc: subprocess.Popen, n: int, timeout: float = 60.0) -> list[psutil.Process]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kids = [c for c in psutil.Process(proc.pid).children(recursive=True)
                if "resource_tracker" not in " ".join(c.cmdline())]
        if len(kids) >= n and seedlocal_segments(proc.pid):
            time.sleep(1.0)  # let them get into the stepping loop
            return kids
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise AssertionError("run did not start its workers")


def _assert_gone(proc, kids, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and (any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
                                       or seedlocal_segments(proc.pid)):
        time.sleep(0.1)
    alive = [k.pid for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left behind: {alive}"
    assert not seedlocal_segments(proc.pid), f"segments left behind: {seedlocal_segments(proc.pid)}"


RUN = ("bench", "--env", "CartPole-v1", "--transport-only", "--num-workers", "2", "--envs-per-worker", "8",
       "--seconds", "120", "--warmup", "0.1")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_everything_quickly(sig):
    proc = _launch(*RUN)
    kids = _workers_of(proc, 2)
    t0 = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what a terminal does on Ctrl-C
    else:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10, "stopping took too long"
    assert proc.returncode == 128 + sig, out
    assert ("interrupted" if sig == signal.SIGINT else "stopped by SIGTERM") in out, out
    _assert_gone(proc, kids)


def test_killed_learner_takes_its_workers_and_memory_along():
    proc = _launch(*RUN)
    kids = _workers_of(proc, 2)
    proc.kill()
    proc.wait(10)
    # Workers die of PDEATHSIG; multiprocessing's resource tracker unlinks the segments.
    _assert_gone(proc, kids, timeout=20)
    proc.stdout.close()


def test_normal_end_leaves_nothing():
    proc = _launch("bench", "--env", "CartPole-v1", "--envs-per-worker", "8", "--seconds", "0.3",
                   "--warmup", "0.1", "--rounds", "1", "--skip-model")
    kids = _workers_of(proc, 1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert '"ratio_random"' in out.strip().splitlines()[-1]
    _assert_gone(proc, kids)


def test_a_closed_pipeline_unlinks_its_semaphores_before_its_process_ends():
    """multiprocessing unlinks a semaphore's name when the object is collected or the process exits; the pool
    kept its Signals after close(), and it unlinks the segment that records their names. An actor host that
    lost its learner closes its pool and retries: SIGKILLed then (with its group, so its resource tracker too),
    it left five ``sem.mp-*`` in /dev/shm that no later sweep could name."""
    with tiny_pipeline(RandomPolicy) as pipe:
        take_unrolls(pipe, 2)
        pool = pipe.pool
        names = [s.name for s in (pool.obs_ready, *pool.ready, *pool.wake)]
        assert len(names) == 5 and all(os.path.exists(f"/dev/shm/sem.{n[1:]}") for n in names), names
    left = [n for n in names if os.path.exists(f"/dev/shm/sem.{n[1:]}")]
    assert not left, f"semaphores still named after close: {left}"
    pool.wake[0].post()  # a late post (a learner releasing an unroll at teardown) does nothing
    assert not pool.obs_ready.wait(0.01)


def test_rows_are_read_only_after_the_acquiring_token():
    """Publication order for weakly ordered CPUs (shm/slots.py): a state store
    alone may become visible before the rows it guards, so neither side acts
    on it until it has taken the token the other side posted after writing.
    Here the test plays each side by hand against the production code."""
    import threading

    from seedlocal.config.schema import EnvConfig, PipelineConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.policies import RandomPolicy
    from seedlocal.pipeline.actors import ActorPool
    from seedlocal.envs.make import make_group
    from seedlocal.pipeline.inference import InferenceLoop
    from seedlocal.pipeline.worker import WorkerArgs, _group_loop
    from seedlocal.shape import pipeline_shape
    from seedlocal.shm.rollout import RolloutLayout
    from seedlocal.shm.slots import ACTION_READY, OBS_READY

    spec = validate_env(EnvConfig(id="CartPole-v1"))
    policy = RandomPolicy(spec, torch.device("cpu"))
    shape = pipeline_shape(PipelineConfig(num_workers=1, envs_per_worker=4, env_threads=1, unroll_length=4,
                                          num_buffers=8))
    layout = RolloutLayout(num_buffers=8, length=5, envs=2, obs=spec.obs, action=spec.action, outputs=policy.outputs)
    with contextlib.closing(ActorPool(spec, layout, shape, seed=0, max_restarts=0)) as pool:
        loop = InferenceLoop(pool, policy, torch.device("cpu"), batch_timeout_s=0.0)  # the shape's min batch: 2
        state = pool.control["state"]
        loop.unrolls.bind_all()  # as start() would, without spawning the worker
        # Loop side: a group whose state says OBS_READY but whose token is not posted is not served.
        state[0] = OBS_READY
        loop._claim()
        assert not loop._owned[0]
        pool.ready[0].post()
        loop._claim()
        assert loop._owned[0]
        assert loop.step() == 0 and state[0] == ACTION_READY  # served (row 0: a reset, no step counted)

        # Worker side: the group's thread must not step on ACTION_READY until it takes the wake token.
        env = make_group(spec, 2, 1, 0)
        args = WorkerArgs(index=0, groups=(0, 1), envs_per_group=2, threads_per_group=1, seed=0, spec=spec,
                          control=pool.control.handle(), rollout=pool.store.handle(), wake=(pool.wake[0], pool.wake[1]),
                          ready=(pool.ready[0], pool.ready[1]), obs_ready=pool.obs_ready,
                          poll_s=0.05)
        pool.wake[1].drain()
        state[1] = 0  # STEPPING: the thread below writes its first observations
        t = threading.Thread(target=_group_loop, args=(args, 1, env, pool.control, pool.store), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while state[1] != OBS_READY and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.ready[1].wait(5)  # the worker published its first step with a token
        steps = int(pool.control["group_steps"][1])
        state[1] = ACTION_READY  # visible, but no token yet
        time.sleep(0.3)
        assert int(pool.control["group_steps"][1]) == steps, "the worker acted on the state alone"
        pool.wake[1].post()
        assert pool.ready[1].wait(5)  # now it stepped and published again
        assert int(pool.control["group_steps"][1]) == steps + 2
        pool.control["stop"][0] = 1
        pool.wake[1].post()
        t.join(5)
        env.close()


def test_segments_of_a_group_killed_with_its_tracker_are_swept_live_ones_kept():
    """SIGKILL of a whole process group (a scheduler's kill, ``killpg``) takes
    Python's resource tracker along, so nothing unlinks the segments; the next
    pipeline to start sweeps them. A segment whose owner lives is never touched,
    whatever its age."""
    from seedlocal.shm.arrays import ArraySpec, SharedArrays, _creation_lock, sweep_stale_segments

    code = ("import sys, time, multiprocessing as mp; from seedlocal.shm.arrays import ArraySpec, SharedArrays, "
            "record_semaphores; from seedlocal.shm.slots import Signal; "
            "a = SharedArrays.create([ArraySpec('x', (8,), 'int64')], 'orphan'); "
            "s = [Signal(mp.get_context('spawn')) for _ in range(3)]; r = record_semaphores([x.name for x in s]); "
            "print(a.name, *[x.name for x in s], flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    orphan, *sems = proc.stdout.readline().split()
    sem_files = {"sem." + n[1:] for n in sems}
    live = SharedArrays.create([ArraySpec("x", (8,), "int64")], "live")
    try:
        # Held as a creator holds it, the creation lock keeps another seedlocal start's sweep (the other pytest
        # process's) from taking the orphan before it is seen; such a sweep may take it once the lock is let go.
        with _creation_lock(exclusive=False):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            time.sleep(0.2)
            assert orphan in os.listdir("/dev/shm")  # nothing cleaned it up
            assert sem_files <= set(os.listdir("/dev/shm"))  # multiprocessing's semaphores neither
        removed = sweep_stale_segments()
        assert orphan not in os.listdir("/dev/shm")
        assert not sem_files & set(os.listdir("/dev/shm")), "the recorded semaphores were left"
        assert live.name not in removed and live.name in os.listdir("/dev/shm")
    finally:
        live.close()


@pytest.mark.parametrize("held", ["exclusive", "shared"])
def test_a_process_stopped_holding_the_creation_lock_stalls_nobody(held, tmp_path, monkeypatch):
    """The creation lock on /dev/shm keeps the sweeper away from segments
    being born; a process stopped while holding it (Ctrl-Z in the middle of
    a sweep, or of a creation) must not stall every other seedlocal start:
    a creator goes on, a sweeper skips its sweep. (The lock is taken on a
    folder of this test's own, so that runs beside it are not held up.)"""
    from seedlocal.shm import arrays

    monkeypatch.setattr(arrays, "_SHM_DIR", str(tmp_path))
    monkeypatch.setattr(arrays, "_CREATION_LOCK_WAIT_S", 0.3)
    mode = "LOCK_EX" if held == "exclusive" else "LOCK_SH"
    code = (f"import fcntl, os, signal; fcntl.flock(os.open({str(tmp_path)!r}, os.O_RDONLY), fcntl.{mode}); "
            "print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    release = threading.Timer(10.0, proc.kill)  # so that code which waits for the holder fails rather than hangs
    try:
        assert proc.stdout.readline() == "held\n"
        release.start()
        t0 = time.monotonic()
        if held == "exclusive":  # a sweeper stopped mid-sweep: creators go on
            seg_specs = [arrays.ArraySpec("x", (8,), "int64")]
            with contextlib.closing(arrays.SharedArrays.create(seg_specs, "beside")) as seg:
                assert seg.name in os.listdir("/dev/shm")
        else:  # a creator stopped mid-creation: the sweeper skips
            (tmp_path / "seedlocal_1_0_orphan").touch()
            assert arrays.sweep_stale_segments() == []
            assert (tmp_path / "seedlocal_1_0_orphan").exists()
        assert time.monotonic() - t0 < 5, "it waited for the stopped holder"  # liveness: it gives up after 0.3 s
    finally:
        release.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()
    if held == "shared":  # the holder gone, the next sweep goes ahead
        assert arrays.sweep_stale_segments() == ["seedlocal_1_0_orphan"]


@pytest.mark.parametrize("remote_envs", [0, 2])
def test_a_worker_stuck_while_the_others_run_is_named(remote_envs, capsys):
    """One hung env holds up only its own worker: the run goes on with the
    others, and the stall watch names the stuck worker (thresholds shortened
    here from 10 s / 30 s). With remote envs behind a bridge (no actor host
    here) it did not watch the local workers at all."""
    from seedlocal.config.schema import BridgeConfig
    from seedlocal.pipeline.inference import InferenceThread, StallWatch

    bridge = BridgeConfig(listen="127.0.0.1:0", remote_envs=remote_envs) if remote_envs else None
    with tiny_pipeline(RandomPolicy, env="faulty_envs:OneHangs-v0", consume=False, num_workers=2,
                       envs_per_worker=2, unroll_length=4, bridge=bridge) as pipe:
        runner = InferenceThread(pipe.loop)
        runner.start()
        watch = StallWatch(pipe.loop, after=0.5, every=100.0)
        out, end = "", time.monotonic() + 60
        try:
            while "made no step" not in out and time.monotonic() < end:
                time.sleep(0.2)
                runner.check()
                watch.poll()
                out += capsys.readouterr().out
            steps = pipe.loop.stats.env_steps
            time.sleep(1.0)
            assert pipe.loop.stats.env_steps > steps  # the other worker still steps
            pid = pipe.pool.procs[0].pid
        finally:
            runner.stop()
    assert f"env worker 0 (pid {pid}) made no step for 2 s while the others run" in out, out
    assert "env worker 1" not in out


def test_a_whole_run_stall_names_the_workers_inside_their_envs(capsys):
    """Every env hangs in step() after 5 steps. The learner starts to wait (``start``) only once the run has
    stalled, as neuroevolution's does after a generation, and its first poll must name the workers still
    inside their envs. It said "no local env group is stepping": the per-group counts it compared were from
    its last poll before the stall, or none."""
    from seedlocal.pipeline.inference import InferenceThread, StallWatch

    with tiny_pipeline(RandomPolicy, env="faulty_envs:StepHangs-v0", consume=False, num_workers=2,
                       envs_per_worker=2, unroll_length=4) as pipe:
        runner = InferenceThread(pipe.loop)
        runner.start()
        watch = StallWatch(pipe.loop, after=0.5, every=100.0)
        try:
            steps, end = -1, time.monotonic() + 60
            while not 0 < steps == pipe.loop.stats.env_steps:  # until the envs have stepped, then 1 s without
                assert time.monotonic() < end, "the envs never stepped, or never hung"
                steps = pipe.loop.stats.env_steps
                time.sleep(1.0)
                runner.check()
            watch.start()
            time.sleep(0.7)
            watch.poll()
            pids = [pipe.pool.procs[w].pid for w in (0, 1)]
        finally:
            runner.stop()
    out = capsys.readouterr().out
    assert f"env workers 0 (pid {pids[0]}), 1 (pid {pids[1]}) still inside an env's step or reset" in out, out


def test_a_worker_whose_forkserver_died_before_it_was_armed_exits(monkeypatch):
    """A forkserver that dies between forking a worker and the worker's
    PR_SET_PDEATHSIG leaves it adopted: it must exit, not record its new
    parent and step forever. Here the pid the learner passes is one that is
    not the worker's parent (this test process), as it would be then."""
    from types import SimpleNamespace

    from seedlocal.pipeline import actors

    # multiprocessing's own record of its server (a private attribute): without it workers fall back to racing.
    assert actors.start_server(SimpleNamespace(backend="envpool")) > 0
    monkeypatch.setattr(actors, "start_server", lambda spec: os.getpid())
    # (Its own line goes to the forkserver's stderr, which an earlier test's server may hold.)
    with pytest.raises(WorkerDied, match="exited with code 1 before its envs produced a first step"):
        with tiny_pipeline(RandomPolicy) as pipe:
            take_unrolls(pipe, 1, seconds=30)


def test_the_forkserver_preloads_every_env_module_a_worker_steps_with_and_no_torch():
    """What the workers' forkserver imports (actors.WORKER_PRELOAD) covers the env backends a worker
    makes its groups from, so a forked worker steps at once; and env workers import no torch."""
    from seedlocal.pipeline.actors import WORKER_PRELOAD

    code = (f"import importlib, sys\nfor m in {WORKER_PRELOAD!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('seedlocal.envs.') or m == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    loaded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert "torch" not in loaded
    assert {"seedlocal.envs.make", "seedlocal.envs.envpool_group", "seedlocal.envs.gymnasium_group",
            "seedlocal.envs.bounds", "seedlocal.envs.ids"} <= set(loaded), loaded


def test_a_gymnasium_envs_run_imports_no_envpool_in_any_process(tmp_path):
    """A user's Gymnasium env: neither the learner nor the workers' forkserver imports envpool (its registry
    cost 1.0-1.4 s of a core at every such run's start, for nothing). -X importtime reaches every process."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "seedlocal", "train", "vtrace", "--env.id",
                          "mask_envs:PickNoMask-v0", "--total-steps", "500", "--log-dir", str(tmp_path),
                          "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert {"seedlocal.pipeline.worker", "seedlocal.pipeline.forkserver_exit"} <= imported  # the server's are here
    assert "envpool" not in imported, sorted(m for m in imported if "envpool" in m)


def test_the_forkserver_ignores_ctrl_c_and_sighup_from_its_first_preload(tmp_path):
    """multiprocessing's forkserver ignores SIGINT only once its preloads are imported, so a Ctrl-C in a run's
    first second printed a KeyboardInterrupt traceback from inside envpool's import. The first preload
    (forkserver_exit) now ignores it from there on; a later preload (tests/sigint_probe.py) records what it finds."""
    from seedlocal.pipeline.actors import WORKER_PRELOAD

    probe = tmp_path / "sigint"
    code = ("import multiprocessing as mp\nfrom multiprocessing import forkserver\n"
            f"mp.get_context('forkserver').set_forkserver_preload([{WORKER_PRELOAD[0]!r}, 'sigint_probe'])\n"
            "forkserver.ensure_running()\n")
    env = {**os.environ, "SIGINT_PROBE_FILE": str(probe),
           "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-1500:]
    deadline = time.monotonic() + 60  # the server imports its preloads after ensure_running returns
    while not (probe.exists() and probe.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probe.read_text() == "ignored ignored"  # SIGINT, SIGHUP (a closed terminal killed the server)


def test_restarted_workers_seeds_differ_and_stay_in_int32_over_many_restarts():
    from seedlocal.config.schema import PipelineConfig
    from seedlocal.pipeline.actors import local_seed
    from seedlocal.shape import pipeline_shape

    shape = pipeline_shape(PipelineConfig(num_workers=4, envs_per_worker=16))  # 8 groups of 8
    for base in (0, 1, 2**31 - 1 - 64, 2**31 - 10, 2**40):  # the last two: Gymnasium takes any seed
        seen = set()
        for r in range(10_000):
            for w in range(4):
                seed = local_seed(base, w, r * 100_003, shape)
                assert 0 <= seed and seed + 2 * 8 - 1 <= 2**31 - 1, (base, w, r, seed)
                seen.add(seed)
        assert len(seen) == 40_000  # no two starts share seeds
    assert local_seed(5, 1, 2, shape) == 5 + 16 + 128  # below the wrap: as before
