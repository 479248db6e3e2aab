"""Starting, watching and stopping env worker processes.

``ActorPool`` owns a run's shared memory (control block, unroll store), its worker processes and, with a bridge, the
server process that serves the remote groups (numbered after the local ones). However the run ends, ``close()``
stops them within a few seconds, escalating to SIGKILL, and unlinks every segment.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from seedlocal.errors import ConfigError, WorkerDied
from seedlocal.pipeline.bridge.server import GOODBYE_S
from seedlocal.spec import EnvSpec
from seedlocal.envs.ids import main_registration_problem, registered_in_main
from seedlocal.envs.make import wrap_seed
from seedlocal.pipeline.worker import CONTRACT_EXIT, WorkerArgs, run_worker
from seedlocal.shape import PipelineShape
from seedlocal.shm.arrays import SharedArrays, record_semaphores
from seedlocal.shm.rollout import RolloutLayout, create_store
from seedlocal.shm.slots import STEPPING, Signal, create_control, read_text

_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}

# What every env worker imports before its first step (the worker module brings seedlocal/envs/), so that one forked
# from the server starts at once; forkserver_exit makes the server exit at once with its process (docs/architecture.md).
WORKER_PRELOAD = ["seedlocal.pipeline.forkserver_exit", "seedlocal.pipeline.worker"]


def worker_context(envpool: bool = True):
    """The multiprocessing context env workers start from: a forkserver (never a fork of the learner, whose threads
    and CUDA state a child must not inherit) with the workers' imports preloaded, envpool too with ``envpool`` (a
    Gymnasium env's workers never import it). The server's first start decides the preloads."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD + (["envpool"] if envpool else []))
    return ctx


def start_server(spec: EnvSpec) -> int:
    """Start the workers' forkserver if it is not running (early, so that its imports, about a second, run on another
    core while the learner builds its trainer; the first worker's start waits for it). Returns its pid (0 where
    multiprocessing does not say), which a worker checks is still its parent once it is set to die with it."""
    from multiprocessing import forkserver

    worker_context(spec.backend == "envpool")  # the server, if this starts it, preloads what the workers import
    forkserver.ensure_running()
    return int(getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", 0) or 0)


def _main_has_file() -> bool:
    """Whether ``__main__`` is a file a new process can run again (not a notebook, ``python -c`` or stdin)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is not None and os.path.isfile(path)


def refuse_unguarded_main(call: str) -> None:
    """A process a run starts imports the parent's ``__main__`` file again, so a script that calls ``call`` (a
    run) at its top level, outside ``if __name__ == "__main__":``, would start a run in every worker, which
    multiprocessing refuses there: say so now, in one line, before anything starts."""
    main = sys.modules.get("__main__")
    if not _main_has_file() or getattr(main.__spec__, "name", "").endswith("__main__"):
        return  # nothing to import again, or a package's __main__ (``python -m pkg``), which a child never runs
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None or _under_main_guard(main.__file__, frame.f_lineno):
        return
    raise ConfigError(f"{call} runs at the top level of {main.__file__} (line {frame.f_lineno}), which every env "
                      f"worker imports again as it starts: put it under if __name__ == \"__main__\":")


def _under_main_guard(path: str, line: int) -> bool:
    """Whether ``line`` of the file at ``path`` is inside an ``if __name__ == "__main__":`` block."""
    import ast

    return any(isinstance(node, ast.If) and node.body[0].lineno <= line <= node.end_lineno
               and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test)
               for node in ast.walk(ast.parse(Path(path).read_bytes())))


@contextmanager
def main_file_hidden_if_missing():
    """A child runs the parent's ``__main__`` file again; read from standard input (``python -``) that file is
    "<stdin>", which no child can open, so it is hidden while a process starts (as ``python -c`` has none)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def local_seed(base: int, worker: int, restarts: int, shape: PipelineShape) -> int:
    """The seed of local worker ``worker``'s envs at its ``restarts``-th restart (env j gets this + j): their place
    in this rank's and start's block (``PipelineShape.seed_block``), so that no restart of any rank's worker takes
    another's seeds. The blocks wrap below envpool's int32 end (restarts are a rate over a long run)."""
    offset = shape.groups_of(worker).start * shape.envs_per_group
    return wrap_seed(base + shape.seed_block(restarts) + offset, shape.num_envs)


class ActorPool:
    def __init__(self, spec: EnvSpec, layout: RolloutLayout, shape: PipelineShape, seed: int, max_restarts: int,
                 bridge=None, restart_window_s: float = 0.0, errors_file: str = ""):
        """``bridge``: where actor hosts connect, for ``shape``'s remote groups. ``errors_file``: where the
        workers append their tracebacks (the run's env_errors.log; "": each on the worker's stderr)."""
        self.spec, self.layout, self.shape = spec, layout, shape
        self.envs_per_group, num_workers = shape.envs_per_group, shape.num_workers
        self.num_local_groups, self.num_remote_groups = shape.num_local_groups, shape.num_remote_groups
        self.bridge = bridge if bridge is not None and bridge.listen else None
        self.server: mp.Process | None = None
        self.bridge_port: int | None = None
        self.seed, self.max_restarts, self.restart_window_s = seed, max_restarts, restart_window_s
        self.errors_file, self._shown_traceback = errors_file, False
        self._ctx = worker_context(spec.backend == "envpool")  # whether its forkserver preloads envpool (envs/make.py)
        self.control: SharedArrays | None = None  # each None once closed
        self.store: SharedArrays | None = None
        self.semaphores: SharedArrays | None = None
        self.procs: list[mp.Process | None] = [None] * num_workers
        self.restarts = [0] * num_workers
        self._restarted_at: list[list[float]] = [[] for _ in range(num_workers)]  # monotonic times, per worker
        self._steps_at_spawn = [0] * num_workers  # its groups' step count when a worker was (re)started
        self.obs_ready = Signal(self._ctx)  # a wake-up hint for the inference loop
        self.ready = [Signal(self._ctx) for _ in range(shape.num_groups)]  # per group: its rows are published
        self.wake = [Signal(self._ctx) for _ in range(shape.num_groups)]
        try:
            self.semaphores = record_semaphores([s.name for s in (self.obs_ready, *self.ready, *self.wake) if s.name])
            self.control = create_control(shape.num_groups)
            self.store = create_store(layout)
        except BaseException:
            self.close()
            raise

    def epoch_of(self, group: int) -> int:
        """How often the group's envs restarted from scratch (worker restarts; lost actor hosts)."""
        if group < self.num_local_groups:
            return self.restarts[self.shape.worker_of(group)]
        return int(self.control["group_lost"][group])

    def start(self) -> None:
        if self.shape.num_workers and registered_in_main(self.spec.env_id) and not _main_has_file():
            raise ConfigError("env.id=" + main_registration_problem(self.spec.env_id, False))
        for w in range(self.shape.num_workers):
            self.spawn(w)
        if self.bridge is not None:
            self._start_server()

    def _start_server(self) -> None:
        from seedlocal.config.checks import bridge_token, split_address
        from seedlocal.pipeline.bridge import wire
        from seedlocal.pipeline.bridge.server import ServerArgs, run_bridge_server

        b = self.bridge
        host, port = split_address("bridge.listen", b.listen, listen=True)
        groups = range(self.num_local_groups, self.shape.num_groups)  # the remote ones, numbered after the local
        recv, send = self._ctx.Pipe(duplex=False)
        args = ServerArgs(
            host=host, port=port, token=bridge_token(b.token_file), tls_cert=b.tls_cert, tls_key=b.tls_key,
            groups=tuple(groups), handshakes_per_peer=b.handshakes_per_peer, shape=self.shape,
            layout=wire.GroupLayout(self.envs_per_group, self.layout.obs, self.layout.action).to_json(),
            spec=self.spec, seed=self.seed,
            control=self.control.handle(), rollout=self.store.handle(),
            wake=tuple(self.wake[g] for g in groups), ready=tuple(self.ready[g] for g in groups),
            obs_ready=self.obs_ready, started=send, parent_pid=os.getpid())
        # Spawned, not forked from the workers' server: it imports grpc, which the workers never need.
        self.server = mp.get_context("spawn").Process(target=run_bridge_server, args=(args,), name="seedlocal-bridge",
                                                      daemon=True)
        with main_file_hidden_if_missing():
            self.server.start()
        send.close()
        if not recv.poll(30.0):
            raise ConfigError(f"bridge.listen={b.listen!r}: the bridge server did not start within 30 s")
        try:
            status, detail = recv.recv()
        except EOFError:
            status, detail = "error", f"the bridge server exited with code {self.server.exitcode}"
        if status != "ok":
            raise ConfigError(f"bridge.listen={b.listen!r}: {detail}")
        self.bridge_port = int(detail)

    def check_server(self) -> None:
        if self.server is not None and self.server.exitcode is not None and not self.control["stop"][0]:
            raise WorkerDied(f"the bridge server (pid {self.server.pid}) exited with code {self.server.exitcode}; "
                             "stopping (its actor hosts lost their connection)")

    def spawn(self, w: int) -> None:
        """Start worker ``w`` (again, after ``begin_restart``) on its groups."""
        groups = self.shape.groups_of(w)
        args = WorkerArgs(
            index=w, groups=tuple(groups), envs_per_group=self.envs_per_group,
            threads_per_group=self.shape.threads_per_group, seed=local_seed(self.seed, w, self.restarts[w], self.shape),
            spec=self.spec, control=self.control.handle(), rollout=self.store.handle(),
            wake=tuple(self.wake[g] for g in groups), ready=tuple(self.ready[g] for g in groups),
            obs_ready=self.obs_ready, parent_pid=start_server(self.spec), errors_file=self.errors_file)
        self.control["group_error"][groups.start:groups.stop] = 0
        self.control["group_trace"][groups.start:groups.stop] = 0
        self._steps_at_spawn[w] = self._group_steps(w)
        proc = self._ctx.Process(target=run_worker, args=(args,), name=f"seedlocal-env-{w}", daemon=True)
        with main_file_hidden_if_missing():
            proc.start()
        self.procs[w] = proc

    def _group_steps(self, w: int) -> int:
        groups = self.shape.groups_of(w)
        return int(self.control["group_steps"][groups.start:groups.stop].sum())

    def dead_workers(self) -> list[int]:
        return [w for w, p in enumerate(self.procs) if p is not None and p.exitcode is not None]

    def describe_exit(self, w: int, when: str = "") -> str:
        """One line: which worker, how it ended (``when``, e.g. "before ..."), and the exception it recorded."""
        p = self.procs[w]
        how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with code {p.exitcode}"
        errors = [e for e in (read_text(self.control, "group_error", g) for g in self.shape.groups_of(w)) if e]
        why = f" ({errors[0]})" if errors else ""
        return f"env worker {w} (pid {p.pid}, env {self.spec.env_id}) {how}{when}{why}"

    def show_traceback(self, w: int) -> None:
        """At the first worker that dies of its env's exception, that env's traceback (its own frames: the user's
        file and line) on stderr, naming the file that has every whole one; a later death is the caller's one line.
        Without a file the worker printed its traceback itself."""
        if not self.errors_file or self._shown_traceback:
            return
        trace = next((t for t in (read_text(self.control, "group_trace", g) for g in self.shape.groups_of(w)) if t), "")
        if trace:
            self._shown_traceback = True
            print(f"seedlocal: env worker {w}'s env raised (every worker's whole traceback goes to "
                  f"{self.errors_file}):\n{trace.rstrip()}", file=sys.stderr, flush=True)

    def begin_restart(self, w: int) -> None:
        """Take dead worker ``w``'s slots back, or raise ``WorkerDied``. The caller then rebinds its groups to fresh
        unrolls and calls ``spawn(w)``: the new worker sees only what was bound after this."""
        code = self.procs[w].exitcode
        if self._group_steps(w) == self._steps_at_spawn[w] and (code > 0 or -code in _CRASH_SIGNALS):
            # It failed before its envs' first step (an exception, or native code aborting or crashing, making or
            # resetting them): a restart would fail alike. A kill from outside (SIGKILL, SIGTERM) says nothing of it.
            hint = (f"; {main_registration_problem(self.spec.env_id, _main_has_file())}"
                    if registered_in_main(self.spec.env_id) else "")
            raise WorkerDied(f"{self.describe_exit(w, ' before its envs produced a first step')}; "
                             f"not restarting it: the env cannot start{hint}")
        if code == CONTRACT_EXIT:
            raise WorkerDied(f"{self.describe_exit(w)}; not restarting it: its env would do the same again")
        now, recent = time.monotonic(), self._restarted_at[w]
        if self.restart_window_s:
            recent[:] = [t for t in recent if now - t < self.restart_window_s]
        if len(recent) >= self.max_restarts:
            within = f" in the last {self.restart_window_s:g} s" if self.restart_window_s else ""
            raise WorkerDied(f"{self.describe_exit(w)}; restarted {len(recent)} times already{within} "
                             f"(pipeline.max_restarts={self.max_restarts} per pipeline.restart_window_s="
                             f"{self.restart_window_s:g}), stopping")
        recent.append(now)
        self.procs[w].join(0)
        self.restarts[w] += 1
        since = self.control["group_wait_since"]
        for g in self.shape.groups_of(w):
            if (began := since[g]) > 0:  # it died waiting: that wait ends now (nothing else writes these any more)
                since[g] = 0.0  # first, as the worker does (see worker_stats)
                self.control["group_wait_s"][g] += time.perf_counter() - began
            self.control["state"][g] = STEPPING
            self.wake[g].drain()
            self.ready[g].drain()

    def worker_stats(self) -> dict[str, float]:
        """Totals over the local groups' threads (remote hosts keep their own): seconds waiting for actions (a wait
        under way counted up to now), seconds in the env, steps; ``threads`` divides a span's seconds into shares."""
        c = self.control
        # The totals first, then one copy of the start times: a worker zeroes its start before it adds the wait to
        # its total, so this order never counts a wait twice, and the copy keeps mask and values from one read (the
        # live array could give a 0.0 written in between: ``now - 0.0``, the uptime).
        done = float(c["group_wait_s"].sum())
        since = c["group_wait_since"].copy()
        now = time.perf_counter()
        return {"wait_s": done + float((now - since[since > 0]).sum()), "env_s": float(c["group_env_s"].sum()),
                "steps": int(c["group_steps"].sum()), "threads": self.num_local_groups}

    def close(self, timeout: float = 3.0) -> None:
        """Stop every worker (gently, then by force) and unlink shared memory."""
        if self.control is not None:
            self.control["stop"][0] = 1
        for s in self.wake:
            s.post()
        deadline = time.monotonic() + timeout
        for p in self.procs:
            if p is not None:
                p.join(max(0.0, deadline - time.monotonic()))
        if self.server is not None:
            # Its own time, whatever the workers took: it tells each actor host the run ended (they exit, not retry) and
            # waits GOODBYE_S for them to read it; gRPC's half-second grace and its exit take the 2 s on top.
            self.server.join(max(GOODBYE_S + 2.0, deadline - time.monotonic()))
        for p in [p for p in self.procs + [self.server] if p is not None]:
            for end in (p.terminate, p.kill):
                if p.is_alive():
                    end()
                    p.join(1.0)
        self.procs, self.server = [None] * self.shape.num_workers, None
        for sig in (self.obs_ready, *self.ready, *self.wake):  # before the segment that records their names
            sig.close()
        for seg in (self.store, self.control, self.semaphores):
            if seg is not None:
                seg.close()
        self.store = self.control = self.semaphores = None
