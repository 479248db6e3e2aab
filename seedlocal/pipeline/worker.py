"""The env worker process: steps environments, nothing else.

A worker holds two groups of environments, each driven by its own thread: while one group waits for its actions,
the other steps (envpool steps in its own threads, without the GIL). Results go into the rows of the unroll store
that the inference loop assigned (``target_buf``, ``target_row``). It never imports torch nor allocates shared memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

from seedlocal.errors import EnvContractError
from seedlocal.spec import EnvSpec
from seedlocal.envs.make import make_group
from seedlocal.shm.arrays import ArraySpec, SharedArrays
from seedlocal.shm.rollout import obs_key
from seedlocal.shm.slots import ACTION_READY, OBS_READY, RESET, STEPPING, UNBOUND, Signal, write_error, write_trace


CONTRACT_EXIT = 3  # exit code of a worker whose env broke its contract


@dataclass(frozen=True)
class WorkerArgs:
    index: int
    groups: tuple[int, ...]
    envs_per_group: int
    threads_per_group: int
    seed: int
    spec: EnvSpec
    control: tuple[str, list[ArraySpec]]
    rollout: tuple[str, list[ArraySpec]]
    wake: tuple[Signal, ...]  # per group, posted by the inference loop when its actions are in
    ready: tuple[Signal, ...]  # per group, posted by this worker when its observations are in
    obs_ready: Signal  # a wake-up hint for the inference loop (orders nothing)
    poll_s: float = 0.5
    parent_pid: int = 0  # the forkserver this worker is forked from (0: unknown, take the parent at start)
    errors_file: str = ""  # where its traceback goes if its env raises (the run's env_errors.log; "": stderr)


def _leave_forkserver() -> None:
    """Close this process's copy of the forkserver's keep-alive pipe, which every forked child inherits: held, it
    would keep the server, and so this worker, alive after the learner died (docs/architecture.md)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def die_with_parent() -> bool:
    """Ask Linux to SIGTERM us if our parent dies, even by SIGKILL; whether it could (not elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return False
    return True


class _GroupWriter:
    """Per-group bookkeeping the worker keeps between steps."""

    def __init__(self, n: int):
        self.ep_return, self.ep_length = np.zeros(n, np.float32), np.zeros(n, np.int32)
        # Envs whose last step ended an episode: their next action is ignored.
        self.was_done = np.zeros(n, bool)

    def write(self, store: SharedArrays, buf: int, row: int, result) -> int:
        """Store one step's results; returns the number of episodes it ended."""
        obs, reward, terminated, truncated = result
        for k, v in obs.items():
            store[obs_key(k)][buf, row] = v
        if row == 0:  # a fresh (re)start: observations of a reset, no step to record
            return 0
        ignored = self.was_done
        self.ep_return += reward
        self.ep_length += ~ignored
        for name, v in (("reward", reward), ("terminated", terminated), ("truncated", truncated),
                        ("ignored", ignored), ("ep_return", self.ep_return), ("ep_length", self.ep_length)):
            store[name][buf, row - 1] = v
        done = np.logical_or(terminated, truncated)
        self.ep_return[done] = 0.0
        self.ep_length[done] = 0
        self.was_done = done
        return int(done.sum())


def run_worker(args: WorkerArgs) -> None:
    # Ctrl-C and a closed terminal (SIGHUP) reach the whole process group; the learner decides how to stop (it
    # checkpoints, then stops the workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The parent is the learner's forkserver (actors.worker_context), which exits with the learner.
    _leave_forkserver()
    die_with_parent()
    # Compared with the pid the learner knew, not with the parent read here: a server that died before
    # PDEATHSIG was armed would leave this worker adopted, recording its new parent and never exiting.
    parent = args.parent_pid or os.getppid()
    if os.getppid() != parent:
        print(f"seedlocal env worker {args.index}: its forkserver (pid {parent}) was gone before it started; "
              "exiting", file=sys.stderr, flush=True)
        os._exit(1)
    control, store = SharedArrays.attach(*args.control), SharedArrays.attach(*args.rollout)
    code = 0
    try:
        envs = [make_group(args.spec, args.envs_per_group, args.threads_per_group, args.seed + i * args.envs_per_group)
                for i in range(len(args.groups))]
        threads = [threading.Thread(target=_run_group, args=(args, g, env, control, store), daemon=True,
                                    name=f"group-{g}") for g, env in zip(args.groups, envs)]
        for t in threads:
            t.start()
        # The main thread only watches: for the stop flag and for an orphaning.
        while not control["stop"][0] and any(t.is_alive() for t in threads) and os.getppid() == parent:
            threads[0].join(args.poll_s)
        for t in threads:
            t.join(args.poll_s * 2)
        if not any(t.is_alive() for t in threads):
            for env in envs:
                env.close()
    except BaseException as e:
        _report(args, control, args.groups[0], e)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown: destroying an env pool while one of its threads runs aborts (std::terminate).
        os._exit(code)


def _run_group(args: WorkerArgs, g: int, env, control: SharedArrays, store: SharedArrays) -> None:
    """One thread per group, so each blocks on its own env and its own slot: envpool releases the GIL while its
    threads step, so the other group's thread publishes and sends meanwhile (measured: two threads on two pools
    step Pong and CartPole as fast as raw envpool; one thread alternating ``recv`` calls halves Pong)."""
    try:
        _group_loop(args, g, env, control, store)
    except BaseException as e:
        _report(args, control, g, e)
        sys.stderr.flush()
        # A half-dead worker must look dead; a broken env contract says so by its exit code (no restart would help).
        os._exit(CONTRACT_EXIT if isinstance(e, EnvContractError) else 1)


def _report(args: WorkerArgs, control: SharedArrays, g: int, e: BaseException) -> None:
    """Why this worker dies, for the learner: the exception in one line and its env's own frames, in shared memory; the
    whole traceback to the run's ``errors_file``, or to stderr without one (a bench, an actor host) or if unwritable."""
    write_error(control, g, e)
    if isinstance(e, EnvContractError):  # its message is the whole story, and the learner prints it
        return
    whole = "".join(traceback.format_exception(e))
    if args.errors_file:
        write_trace(control, g, _env_traceback(e))
        head = (f"==== {time.strftime('%Y-%m-%d %H:%M:%S')}  env worker {args.index} (pid {os.getpid()}, group {g}, "
                f"env {args.spec.env_id})\n")
        try:
            with open(args.errors_file, "a") as f:  # one write: workers dying together do not interleave
                f.write(head + whole)
            return
        except OSError as err:
            whole += f"(not written to {args.errors_file}: {err.strerror})\n"
    sys.stderr.write(whole)


_SEEDLOCAL = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _env_traceback(e: BaseException) -> str:
    """``e``'s traceback from the env's own frames: seedlocal's (the worker's loop, the env backend) and Gymnasium's
    wrappers (time limit, checkers) left out, the raising frame always kept: it shows the user's file and line."""
    gym = sys.modules.get("gymnasium")
    passing = (_SEEDLOCAL,) + ((os.path.dirname(gym.__file__) + os.sep,) if gym and gym.__file__ else ())
    te = traceback.TracebackException.from_exception(e)
    last = len(te.stack) - 1
    te.stack = traceback.StackSummary.from_list(
        [f for i, f in enumerate(te.stack) if i == last or not f.filename.startswith(passing)])
    return "".join(te.format())


def _group_loop(args: WorkerArgs, g: int, env, control: SharedArrays, store: SharedArrays) -> None:
    state, target_buf, target_row = control["state"], control["target_buf"], control["target_row"]
    stop, wait_since, episodes = control["stop"], control["group_wait_since"], control["group_episodes"]
    wait_s, env_s, steps = control["group_wait_s"], control["group_env_s"], control["group_steps"]
    i = g - args.groups[0]
    wake, ready, n = args.wake[i], args.ready[i], args.envs_per_group
    writer = _GroupWriter(n)
    if state[g] == UNBOUND:  # restarted while every unroll was held: nowhere to write until the loop says RESET
        while not (wake.wait(args.poll_s) and state[g] == RESET):
            if stop[0]:
                return
        state[g] = STEPPING
    env.reset()
    while True:
        t0 = time.perf_counter()
        result = env.recv()
        env_s[g] += time.perf_counter() - t0
        episodes[g] += writer.write(store, target_buf[g], target_row[g], result)
        steps[g] += n
        state[g] = OBS_READY
        ready.post()  # release: publishes the rows above (see shm/slots.py)
        args.obs_ready.post()
        t0 = wait_since[g] = time.perf_counter()
        # Read the state and the action only after taking the token the loop posted once it wrote them (acquire);
        # never on the state alone.
        while not (wake.wait(args.poll_s) and state[g] in (ACTION_READY, RESET)):
            if stop[0]:
                return
        wait_since[g] = 0.0  # first: a reader between the two lines undercounts for a moment, never twice
        wait_s[g] += time.perf_counter() - t0
        if state[g] == RESET:
            state[g] = STEPPING
            writer = _GroupWriter(n)  # fresh episodes: nothing carries over
            env.reset()
            continue
        state[g] = STEPPING
        t0 = time.perf_counter()
        env.send(store["action"][target_buf[g], target_row[g] - 1])  # Gymnasium envs step here
        env_s[g] += time.perf_counter() - t0
