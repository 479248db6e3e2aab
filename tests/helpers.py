"""Small runners shared by the pipeline tests."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from pathlib import Path

import numpy as np

from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.pipeline.pipeline import Pipeline

FIELDS = ("obs", "action", "reward", "terminated", "truncated", "ignored", "ep_return", "ep_length",
          "out.logits", "out.gaussian", "out.value", "policy_version")


def open_pipeline(env: EnvConfig, pipe: PipelineConfig, make_policy, consume=False, bridge=None) -> Pipeline:
    """A pipeline as a command without a family opens one: prepared (``prepare_pipeline``: checked, the env
    described, the shape built), then started."""
    from seedlocal.prepare import prepare_pipeline

    spec, shape = prepare_pipeline(env, pipe, bridge)
    return Pipeline(env, pipe, make_policy, spec, shape, consume=consume, bridge=bridge)


def prepared(cfg):
    """A run configuration built whole in a test, prepared as ``prepare_run`` takes one (checked, described,
    shaped), for its family's ``train``."""
    from seedlocal.families import TABLE, recipe
    from seedlocal.prepare import prepare_run

    return prepare_run(cfg, next(r for r in map(recipe, TABLE) if type(cfg) is r.run))


def tiny_pipeline(make_policy, env="CartPole-v1", backend="auto", consume=True, bridge=None, **pipe) -> Pipeline:
    """consume=True: the test must take and release completed unrolls (take_unrolls does)."""
    cfg = dict(num_workers=1, envs_per_worker=4, unroll_length=8, env_threads=1, batch_timeout_ms=1.0)
    cfg.update(pipe)
    return open_pipeline(EnvConfig(id=env, backend=backend), PipelineConfig(**cfg), make_policy, consume=consume,
                         bridge=bridge)


def collect_unrolls(pipe: Pipeline, done, seconds: float = 60.0) -> list[dict]:
    """Serve batches, taking copies of completed unrolls (fields, ``group``,
    ``epoch``) and releasing them, until ``done(unrolls)`` holds."""
    import time

    out = []
    store = pipe.store
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pipe.loop.step()
        while True:
            try:
                b = pipe.loop.completed.get_nowait()
            except queue.Empty:
                break
            u = {k: np.array(store[k][b]) for k in store.arrays if k.startswith(FIELDS)}
            u["group"] = int(store["unroll_group"][b])
            u["epoch"] = int(store["unroll_epoch"][b])
            out.append(u)
            pipe.loop.release(b)
        if done(out):
            return out
    per_group = np.bincount([u["group"] for u in out], minlength=pipe.loop.G).tolist()
    c = pipe.pool.control
    raise AssertionError(f"gave up after {seconds} s with {len(out)} unrolls (per group {per_group}); "
                         f"slot states {c['state'].tolist()}, unroll states {pipe.loop.unrolls.state.tolist()}, "
                         f"steps {c['group_steps'].tolist()}, connected {c['group_connected'].tolist()}")


def take_unrolls(pipe: Pipeline, n: int, seconds: float = 120.0) -> list[dict]:
    """Serve batches until ``n`` unrolls completed; return copies of them."""
    return collect_unrolls(pipe, lambda us: len(us) >= n, seconds)


def check_autoreset_rows(u: dict, is_reset_obs=None) -> int:
    """Assert the stored rows never credit an ignored action; returns #episodes checked."""
    T = u["reward"].shape[0] - 1
    done = u["terminated"][:T] | u["truncated"][:T]
    ign = u["ignored"][:T]
    rew = u["reward"][:T]
    checked = 0
    for e in range(rew.shape[1]):
        start = None  # row of the first real step of an episode that began in this unroll
        for t in range(T):
            if ign[t, e]:
                assert rew[t, e] == 0.0, "an ignored action was credited a reward"
                assert not done[t, e], "an ignored action ended an episode"
                assert t == 0 or done[t - 1, e], "ignored row not preceded by an episode end"
                if is_reset_obs is not None:
                    assert is_reset_obs(u["obs"][t + 1, e]), "row after an ignored action is not a reset"
                start = t + 1
            elif t > 0:
                assert not done[t - 1, e], "the step after an episode end was not marked ignored"
            if done[t, e] and start is not None:
                assert u["ep_length"][t, e] == t - start + 1
                np.testing.assert_allclose(u["ep_return"][t, e], rew[start:t + 1, e].sum(), rtol=1e-5)
                checked += 1
    return checked


def terminal_like() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C (or hang up on): SIGINT
    and SIGHUP as a terminal gives them. A pytest started as a background job of a non-interactive shell
    (``cmd &``, ``nohup``) ignores SIGINT, its children inherit that, and
    Python then installs no KeyboardInterrupt handler."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # nohup ignores it; a terminal's child does not


TESTS = Path(__file__).parent


def seedlocal_runs(runs: list[tuple[tuple[str, ...], dict]], timeout: int = 240) -> list[subprocess.CompletedProcess]:
    """Independent ``python -m seedlocal ARGS`` runs at the same time, each ``(args, extra environment)``, with
    tests/ on PYTHONPATH (the envs registered there): each mostly waits on its start-up and its env, so
    together they take about as long as one. None is left running, whatever happens."""
    base = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-m", "seedlocal", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**base, **extra}, cwd=TESTS.parent)
             for args, extra in runs]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return done
