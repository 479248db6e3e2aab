"""Raw envpool, stepped with random actions and no model: the limit every
pipeline ratio divides by (``seedlocal bench``, ``--autotune``, the scripts)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time

import numpy as np


def _raw_actions(spec, n: int, rng: np.random.Generator, k: int = 64) -> list[np.ndarray]:
    if spec.num_actions is not None:
        return [rng.integers(0, spec.num_actions, n).astype(np.int32) for _ in range(k)]
    # Raw envpool is stepped directly: in the space's own shape, not the pipeline's flat one.
    low, high = (np.reshape(b, spec.box_shape) for b in (spec.action_low, spec.action_high))
    return [rng.uniform(low, high, (n,) + spec.box_shape).astype(np.float32) for _ in range(k)]


def _async_step(env, acts: list[np.ndarray], batch: int):
    """One step of an async pool: the batch that is ready, sent its actions back; ``batch`` env steps."""
    def one(i):
        *_, info = env.recv()
        env.send(acts[i % len(acts)], info["env_id"])
        return batch

    return one


def _timed(step, warmup: float, seconds: float) -> float:
    i, end = itertools.count(), time.perf_counter() + warmup
    while time.perf_counter() < end:
        step(next(i))
    steps, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while True:  # one step at least: a loaded machine can give a short window none, and 0 steps/s measures nothing
        steps += step(next(i))
        if time.perf_counter() >= end:
            return steps / (time.perf_counter() - t0)


class RawEnvpool:
    """The three ways to step ``n`` envpool envs with random actions and no model.

    The pools are built once and kept (idle pools sleep), so each round measures all three under the same machine
    conditions. ``close()`` (or leaving a ``with`` block) collects the steps left in flight and closes them: an
    envpool destroyed at interpreter exit with a step in flight can abort the process
    (``terminate called without an active exception``), e.g. when SIGTERM ends a bench.
    """

    KINDS = ("sync", "async_half", "two_groups")

    def __init__(self, spec, n: int, threads: int):
        import envpool

        from seedlocal.envs.envpool_group import stack_kw

        make = functools.partial(envpool.make, spec.env_id, env_type="gymnasium", **stack_kw(spec.frame_stack))
        self.n, self.half = n, n // 2
        self.sync = make(num_envs=n, num_threads=threads)
        self.sync.reset()
        self.async_env = make(num_envs=n, batch_size=self.half, num_threads=threads)
        self.groups = [make(num_envs=self.half, num_threads=max(1, threads // 2)) for _ in range(2)]
        # Every pool but the synchronous one has one batch in flight between measurements.
        self._in_flight = [self.async_env, *self.groups]
        for env in self._in_flight:
            env.async_reset()
        rng = np.random.default_rng(0)
        self.acts = _raw_actions(spec, n, rng)
        self.half_acts = _raw_actions(spec, self.half, rng)

    def close(self) -> None:
        pools, self._in_flight = self._in_flight, []
        for env in pools:
            with contextlib.suppress(Exception):
                env.recv()
        for env in [self.sync, *pools]:
            with contextlib.suppress(Exception):  # an envpool without close() too
                env.close()

    def __enter__(self) -> "RawEnvpool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _two_groups(self, warmup: float, seconds: float) -> float:
        """Two pools of n/2 envs, each driven by its own thread (the worker's way)."""
        counts, phase = [0, 0], {"measure": False, "stop": False}

        def drive(j):
            e, i = self.groups[j], 0
            while not phase["stop"]:
                e.recv()
                e.send(self.half_acts[i % len(self.half_acts)])
                i += 1
                if phase["measure"]:
                    counts[j] += self.half
            # One step stays in flight: the next measurement starts with recv().

        ts = [threading.Thread(target=drive, args=(j,), daemon=True) for j in range(2)]
        for t in ts:
            t.start()
        time.sleep(warmup)
        phase["measure"] = True
        t0 = time.perf_counter()
        time.sleep(seconds)
        while not sum(counts) and any(t.is_alive() for t in ts):  # one step at least, as _timed
            time.sleep(0.001)
        total, dt = sum(counts), time.perf_counter() - t0
        phase["stop"] = True
        for t in ts:
            t.join()
        return total / dt

    def measure(self, warmup: float, seconds: float) -> dict[str, float]:
        def sync(i):
            self.sync.step(self.acts[i % len(self.acts)])
            return self.n

        return {"sync": _timed(sync, warmup, seconds),
                "async_half": _timed(_async_step(self.async_env, self.half_acts, self.half), warmup, seconds),
                "two_groups": self._two_groups(warmup, seconds)}


# -- envpool's own best settings --------------------------------------------------------------------------------
# The neighbourhood of envpool's benchmark recipe (async, batch_size ~ threads, num_envs 2-3 x batch, pinned or
# not), against which the bench's three kinds are checked (docs/pipeline.md, "The raw limit is envpool's own").

def ceiling_grid(threads: int) -> list[tuple[int, int, int]]:
    """(num_envs, batch_size, thread_affinity_offset) around envpool's recipe for ``threads`` threads."""
    return [(factor * batch, batch, affinity)
            for batch in sorted({threads, 2 * threads, 4 * threads})
            for factor in (2, 3)
            for affinity in (-1, 0)]


def _async_rate(spec, num_envs: int, batch: int, threads: int, affinity: int, warmup: float, seconds: float) -> float:
    import envpool

    from seedlocal.envs.envpool_group import stack_kw

    env = envpool.make(spec.env_id, env_type="gymnasium", num_envs=num_envs, batch_size=batch, num_threads=threads,
                       thread_affinity_offset=affinity, **stack_kw(spec.frame_stack))
    acts = _raw_actions(spec, batch, np.random.default_rng(0))
    env.async_reset()
    try:
        return _timed(_async_step(env, acts, batch), warmup, seconds)
    finally:
        env.recv()  # the step in flight, before the pool goes (see RawEnvpool)
        env.close()


def ceiling(spec, threads: int, warmup: float, seconds: float) -> list[dict]:
    """Every setting of ``ceiling_grid(threads)`` measured in turn, best first."""
    rows = [{"num_envs": n, "batch_size": b, "thread_affinity_offset": a, "threads": threads,
             "steps_per_s": _async_rate(spec, n, b, threads, a, warmup, seconds)}
            for n, b, a in ceiling_grid(threads)]
    return sorted(rows, key=lambda r: -r["steps_per_s"])
