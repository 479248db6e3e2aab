"""``seedlocal actors``: an actor host, stepping envs for a learner elsewhere.

To its local env workers this process is the inference loop: it owns a small shared-memory store of its own (two
rows per group: the step being written and its action), takes each group's ready token, ships the group's
observations and step fields to the learner in one message, and writes the actions that come back into the group's
slot. Workers, slots and the publication order are exactly those of a single-host run (``shm/slots.py``); only the
policy is across the network.

The learner decides what runs here (env id, backend, group size, seeds) in its answer to HELLO; a host whose env
cannot produce the learner's spaces refuses the assignment. A learner that goes away without a word, or says nothing
for ``--answer-timeout-s``, is retried for ``--retry-s``; one that ends its run on purpose says so, and the host
exits at once, status 0 (docs/multihost.md, "Faults"). What the learner sends is used only once it is verified as
far as this host can, by TLS or the token; a ``module:EnvId`` env id runs only if ``--allow-module`` names the
module (docs/multihost.md, "Trust").
"""

from __future__ import annotations

import math
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import tyro

from seedlocal.errors import ConfigError, fail, fail_if
from seedlocal.config.checks import bridge_token, is_loopback, split_address
from seedlocal.pipeline.bridge import wire
from seedlocal.pipeline.bridge.server import CHANNEL_OPTIONS, METHOD
from seedlocal.shape import actor_host_shape, worker_groups
from seedlocal.shm.arrays import sweep_once
from seedlocal.shm.rollout import RolloutLayout, obs_key
from seedlocal.shm.slots import ACTION_READY, OBS_READY, RESET, STEPPING


@dataclass
class ActorsConfig:
    connect: str
    """HOST:PORT of the learner's bridge (its --bridge.listen)"""
    num_workers: int = 0
    """env worker processes here (two groups each); 0 = as many as the learner has free envs for"""
    envs_per_worker: int = 0
    """must match the learner's pipeline.envs_per_worker; 0 = take the learner's"""
    env_threads: int = 0
    """envpool threads over all workers; 0 = one per CPU core"""
    token_file: str = ""
    """file holding the shared secret (default: the SEEDLOCAL_BRIDGE_TOKEN environment variable)"""
    tls_ca: str = ""
    """PEM CA certificate that signed the learner's --bridge.tls-cert (enables TLS)"""
    insecure: bool = False
    """connect beyond loopback without TLS: the network is trusted (traffic can be read and altered on the way)"""
    allow_module: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """a module this host may import to run a learner's module:EnvId env id (repeat for more); registered
    ids (envpool, Gymnasium, MinAtar/...) need none"""
    retry_s: float = 60.0
    """how long to keep retrying an unreachable learner before giving up"""
    answer_timeout_s: float = 30.0
    """how long the learner may say nothing (to the handshake; then no actions, resets or the sign of life it
    sends each second) before this host drops the connection and retries"""
    progress: bool = True
    """a status line every 10 s"""
    delay_ms: float = 0.0
    """emulate network latency for measurements: hold every message to the learner this long (adds it to the
    round trip; for machines where tc netem is unavailable)"""


class HostStopped(Exception):
    """The session ended for a reason that retrying cannot fix, or the learner stopped."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class _Lost(Exception):
    """The connection broke; retrying may help."""


def _unreachable(code: str, details: str, tls: bool) -> str:
    """gRPC's reason for a failed first exchange, with the likely cause
    where it is a known one (TLS on one side only, nothing listening)."""
    detail = details.split("last error: ")[-1]
    if "Connection refused" in detail:
        return f"nothing listens there (is the learner running with --bridge.listen?): {detail}"
    if tls and "handshake failed" in detail.lower():
        return ("the TLS handshake failed: the learner may not use TLS (then drop --tls-ca), or --tls-ca is not "
                f"the CA that signed its --bridge.tls-cert ({detail})")
    if not tls and "Socket closed" in detail:
        return ("the learner closed the connection at once: if it uses TLS (--bridge.tls-cert), pass the CA "
                f"with --tls-ca ({detail})")
    if "Concurrent RPC limit" in detail:
        return ("the learner has as many streams as it takes (its remote groups + bridge.handshakes_per_peer) "
                f"({code}: {detail})")
    return detail if detail.startswith(code) else f"{code}: {detail}"  # gRPC's details may begin with the code


def _channel(cfg: ActorsConfig):
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # a failed handshake is reported once, by _unreachable
    import grpc

    host, port = split_address("connect", cfg.connect)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if cfg.tls_ca:
        try:
            with open(cfg.tls_ca, "rb") as f:
                ca = f.read()
        except OSError as e:
            raise ConfigError(f"tls_ca={cfg.tls_ca!r}: cannot read it ({e.strerror})") from None
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca), CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, CHANNEL_OPTIONS)


class _Session:
    """One connection: a local ActorPool served over one gRPC stream."""

    def __init__(self, cfg: ActorsConfig, token: str, describe):
        self.cfg, self.token, self.describe = cfg, token, describe
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.pool = None
        self.ended: HostStopped | _Lost | None = None  # why the stream ended, as run() raises it
        self.rtts: deque[float] = deque(maxlen=4096)
        self.heard: float | None = None  # when the learner last spoke after its ASSIGN (monotonic): it was up
        self.timed_out = False  # the handshake's deadline cancelled the call
        self.reader: threading.Thread | None = None  # reads the learner's answers once workers run

    def _put(self, msg: bytes) -> None:
        self.out.put((time.perf_counter(), msg))

    def _requests(self):
        delay = self.cfg.delay_ms / 1e3
        for sent, msg in iter(self.out.get, None):
            if delay:  # a constant delay keeps the order, so waiting for the head of the queue is enough
                time.sleep(max(0.0, sent + delay - time.perf_counter()))
            yield msg

    def run(self) -> None:
        """Connect, take the learner's assignment, and step its envs until the stream ends; always raises
        (HostStopped: exit; _Lost: retry)."""
        channel = _channel(self.cfg)
        try:
            call, answer = self._handshake(channel)
            self._start_workers(answer)
            self._step_loop(call)
            raise self.ended
        finally:
            self.out.put(None)
            channel.close()  # ends the reader's read: it writes into the pool's memory, which close() unmaps
            if self.reader is not None:
                self.reader.join(5.0)
            if self.pool is not None:
                self.pool.close()

    def _handshake(self, channel) -> tuple[object, dict]:
        """HELLO, the token exchange where the learner asks for it (its CHALLENGE, this host's PROOF), and its ASSIGN,
        within answer_timeout_s: the call and the assignment, verified as far as this host can before anything in it
        is used."""
        cfg, nonce = self.cfg, wire.new_nonce()
        self._put(wire.pack_json(wire.HELLO, {
            "version": wire.VERSION, "groups": worker_groups(cfg.num_workers),
            "envs_per_worker": cfg.envs_per_worker, "host": socket.gethostname(), "nonce": nonce}))
        call = channel.stream_stream(METHOD)(self._requests())
        # gRPC would wait for good on a connection that never sets up, or a learner that never answers.
        deadline = threading.Timer(cfg.answer_timeout_s, self._time_out, args=(call,))
        deadline.daemon = True
        deadline.start()
        try:
            h, answer = self._next(call)
            learner_nonce = None
            if h.kind == wire.CHALLENGE:
                learner_nonce = wire.check_nonce(answer.get("nonce"))
                # Without a token this host cannot prove anything: the learner refuses it, and says so.
                proof = wire.token_proof(self.token, "host", nonce, learner_nonce) if self.token else ""
                self._put(wire.pack_json(wire.PROOF, {"proof": proof}))
                h, answer = self._next(call)
        except wire.WireError as e:  # a message, or the nonce in one, that breaks the protocol
            raise HostStopped(f"the learner at {cfg.connect} broke the handshake: {e}", 2) from None
        finally:
            deadline.cancel()
        if h.kind == wire.REFUSE:
            # Never status 0, even if it says it is final: before its ASSIGN nothing the learner says is
            # proven, and a stranger at the address must not pass for a learner that stopped cleanly (a
            # supervisor would not restart this host). A real learner says goodbye only after an ASSIGN.
            unverified = "" if cfg.tls_ca else ", not yet verified,"
            raise HostStopped(f"the learner at {cfg.connect}{unverified} refused this host: "
                              f"{answer.get('reason')}", 2)
        if h.kind != wire.ASSIGN:
            raise HostStopped(f"the learner sent {wire.KIND_NAMES[h.kind]} instead of an assignment", 2)
        if self.token and not (learner_nonce and wire.proof_ok(self.token, "learner", nonce, learner_nonce,
                                                                answer.get("proof"), answer)):
            # Before anything it sent is used: it may be someone else's learner (or no learner), or someone
            # on the path may have changed the assignment.
            self._refuse("the learner did not prove that it holds this host's bridge token and sent this "
                         "assignment (the tokens differ, the learner has none, or the assignment was altered "
                         "on the way)")
        return call, answer

    def _time_out(self, call) -> None:
        self.timed_out = True
        call.cancel()  # ends the read under way in _next

    def _start_workers(self, answer: dict) -> None:
        """The local store and env workers for the learner's (verified) env and groups, each group set to step first,
        and where each one's exchange stands; or a refusal: a module this host does not allow is never imported, and
        an env whose spaces differ from the learner's is not run."""
        from seedlocal.envs.spaces import with_box_actions
        from seedlocal.pipeline.actors import ActorPool

        cfg, env_id = self.cfg, str(answer.get("env_id", ""))
        module = env_id.partition(":")[0] if ":" in env_id else ""  # '' for a registered id
        if module and module not in cfg.allow_module:
            self._refuse(f"the learner's env {env_id!r} imports the module {module!r}, which this host "
                         f"imports only if allowed: pass --allow-module {module} to seedlocal actors")
        try:
            spec = self.describe(env_id, str(answer.get("backend", "")), int(answer.get("frame_stack", 0)))
            spec = with_box_actions(spec, str(answer.get("box_actions")))
        except ValueError as e:
            self._refuse(f"cannot run {env_id!r} here: {e}")
        self.layout = want = wire.GroupLayout.from_json(answer["layout"])
        if dict(want.obs) != dict(spec.obs):
            self._refuse(f"observations here are {spec.obs}, the learner's are {want.obs}")
        if want.action != spec.action:
            self._refuse(f"actions here are {spec.action}, the learner's are {want.action}")
        G, E = len(answer["groups"]), want.envs
        self.ids, self.epochs = list(answer["groups"]), list(answer["epochs"])  # the learner's, by local index
        self.seqs = np.zeros(G, np.int64)  # messages sent per group
        self.sent_at = np.zeros(G)  # when each group's last message left (perf_counter), for the round trip
        self.in_flight = np.zeros(G, bool)  # a message sent, its answer not yet back
        shape = actor_host_shape(G, E, cfg.env_threads)
        store_layout = RolloutLayout(num_buffers=G, length=2, envs=E, obs=spec.obs, action=spec.action)
        self.pool = pool = ActorPool(spec, store_layout, shape, int(answer["seed"]), max_restarts=0)
        ctl = pool.control
        ctl["state"][:G], ctl["target_buf"][:G], ctl["target_row"][:G] = STEPPING, np.arange(G), 0
        pool.start()
        if cfg.progress:
            print(f"seedlocal actors: connected to {cfg.connect}: {G * E} envs of {spec.env_id} "
                  f"({shape.num_workers} worker{'s' if shape.num_workers > 1 else ''})", flush=True)

    def _step_loop(self, call) -> None:
        """Until the stream ends (the reader thread says why) or the learner is silent for answer_timeout_s:
        ship each group whose observations are ready, report the round trip each second (and stop if a worker
        died), a status line each 10 s."""
        self.reader = threading.Thread(target=self._read, args=(call,), daemon=True)
        start = t_stats = t_line = time.monotonic()  # silence counts from here: what came before is read now
        self.reader.start()
        steps = steps_line = 0
        while self.ended is None:
            self.pool.obs_ready.wait(0.1)
            steps += self._send_ready_groups()
            now = time.monotonic()
            if now - (self.heard or start) > self.cfg.answer_timeout_s:
                raise _Lost(f"the learner at {self.cfg.connect} said nothing for {self.cfg.answer_timeout_s:g} s "
                            "(--answer-timeout-s)")
            if now - t_stats >= 1.0:  # a dead worker stops this host (the learner restarts its envs elsewhere)
                t_stats = now
                if dead := self.pool.dead_workers():
                    raise HostStopped(f"{self.pool.describe_exit(dead[0])}; disconnecting so that the learner "
                                      "restarts these envs", 1)
                p50, p99 = self._rtt_ms()
                self._put(wire.pack_json(wire.STATS, {"rtt_ms_p50": p50, "rtt_ms_p99": p99}))
            if self.cfg.progress and now - t_line >= 10.0:
                p50, p99 = self._rtt_ms()
                print(f"seedlocal actors: {(steps - steps_line) / (now - t_line):,.0f} steps/s, round trip "
                      f"p50 {p50:.2f} ms, p99 {p99:.2f} ms", flush=True)
                t_line, steps_line = now, steps

    def _send_ready_groups(self) -> int:
        """Send the learner every group whose worker has published its observations (FIRST after a
        reset, else STEP); returns the env steps sent."""
        pool = self.pool
        state, trow, store = pool.control["state"], pool.control["target_row"], pool.store
        steps = 0
        for i in np.flatnonzero((state == OBS_READY) & ~self.in_flight).tolist():
            if not pool.ready[i].try_acquire():  # acquire: the worker's rows are ours now
                continue
            kind = wire.FIRST if trow[i] == 0 else wire.STEP
            arrays = {k: store[obs_key(k)][i, trow[i]] for k in self.layout.obs}
            if kind == wire.STEP:
                arrays.update({k: store[k][i, 0] for k in wire.STEP_ORDER})
                steps += self.layout.envs
            self.seqs[i] += 1
            msg = wire.pack(kind, self.ids[i], self.epochs[i], int(self.seqs[i]), self.layout.encode(kind, arrays))
            self.in_flight[i] = True
            self.sent_at[i] = time.perf_counter()
            self._put(msg)
        return steps

    def _rtt_ms(self) -> tuple[float, float]:
        """The round trip's p50 and p99 over the last 4,096 answers (0 before the first)."""
        rtt = np.array(self.rtts) if self.rtts else np.zeros(1)
        return float(np.percentile(rtt, 50)), float(np.percentile(rtt, 99))

    def _next(self, call) -> tuple[wire.Header, dict]:
        """The learner's next handshake message, or why there is none (a malformed one raises WireError)."""
        import grpc

        try:
            h, payload = wire.unpack(next(call))
            return h, wire.unpack_json(payload)
        except grpc.RpcError as e:
            if self.timed_out:
                raise _Lost(f"the learner at {self.cfg.connect} did not answer the handshake within "
                            f"{self.cfg.answer_timeout_s:g} s (--answer-timeout-s)") from None
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                # A learner of wire version 1 with a token wanted the token itself, in the call's metadata: it
                # refuses every later host so, before reading the HELLO that would show the version.
                raise HostStopped(f"the learner at {self.cfg.connect} refused this host: {e.details()} (check "
                                  "SEEDLOCAL_BRIDGE_TOKEN or --token-file; a learner of another seedlocal version, "
                                  f"with a wire version other than {wire.VERSION}, says this too)", 2) from None
            raise _Lost(_unreachable(e.code().name, e.details() or "", bool(self.cfg.tls_ca))) from None
        except StopIteration:
            raise _Lost("the learner closed the connection") from None

    def _refuse(self, why: str):
        """Turn the learner's assignment down: it logs ``why``, and this host exits saying it."""
        reason = why
        while len(msg := wire.pack_json(wire.REFUSE, {"reason": reason})) > wire.HANDSHAKE_BYTES:
            reason = why[: len(reason) // 2] + " ..."  # the learner takes no more; this end says it all
        self._put(msg)
        self.out.put(None)
        time.sleep(0.5)  # let the refusal reach the learner
        raise HostStopped(f"this host cannot serve the learner at {self.cfg.connect}: {why}", 2)

    def _read(self, call) -> None:
        pool, local = self.pool, {gid: i for i, gid in enumerate(self.ids)}
        state, trow, store = pool.control["state"], pool.control["target_row"], pool.store
        try:
            for msg in call:
                h, payload = wire.unpack(msg)
                self.heard = time.monotonic()
                if h.kind == wire.ALIVE:
                    continue
                if h.kind == wire.REFUSE:
                    info = wire.unpack_json(payload)
                    # A final one comes after an ASSIGN this host accepted: from a learner verified as far as it can be.
                    self.ended = (HostStopped(f"the learner at {self.cfg.connect} stopped; exiting", 0)
                                  if info.get("final") else _Lost(info.get("reason", "refused")))
                    return
                i = local.get(h.group)
                if i is None or h.kind not in (wire.ACTION, wire.RESET):
                    raise wire.WireError(f"unexpected {wire.KIND_NAMES[h.kind]} for group {h.group}")
                if h.kind == wire.ACTION:
                    store["action"][i, 0] = self.layout.decode(wire.ACTION, payload)["action"]
                trow[i], state[i] = (1, ACTION_READY) if h.kind == wire.ACTION else (0, RESET)
                self.rtts.append((time.perf_counter() - self.sent_at[i]) * 1e3)
                self.in_flight[i] = False
                pool.wake[i].post()  # release: publishes the action row and state
            self.ended = _Lost("the learner closed the stream")
        except wire.WireError as e:
            self.ended = _Lost(f"protocol error from the learner: {e}")
        except Exception as e:  # grpc.RpcError: the connection broke
            details = e.details() if callable(getattr(e, "details", None)) else str(e)
            self.ended = _Lost(f"connection lost ({details})")
        finally:
            pool.obs_ready.post()


def _checked(cfg: ActorsConfig) -> str:
    """The token, once every option is usable; else a ConfigError naming the option."""
    host, _ = split_address("connect", cfg.connect)
    token = bridge_token(cfg.token_file, "token_file")
    if not is_loopback(host) and not cfg.tls_ca:
        # As on the learner (bridge.insecure): this host would run whatever a stranger on the path sends.
        if not cfg.insecure:
            fail("connect", cfg.connect, "beyond loopback without TLS the bridge can be read and altered on the way: "
                 "pass --tls-ca (the CA of the learner's --bridge.tls-cert), or --insecure if this network is trusted")
        if not token:
            raise ConfigError(f"insecure={cfg.insecure!r}: without TLS only a token verifies the learner: set "
                              "SEEDLOCAL_BRIDGE_TOKEN or --token-file")
    fail_if(lambda v: v < 0, cfg, ("num_workers", "envs_per_worker"), "must be >= 0 (0 = as the learner asks)")
    fail_if(lambda v: v % 2, cfg, ("envs_per_worker",), "must be even (two groups per worker)")
    fail_if(lambda v: not v >= 0 or not math.isfinite(v), cfg, ("retry_s", "delay_ms"), "must be >= 0 and finite")
    fail_if(lambda v: not v >= 2 * wire.ALIVE_S or not math.isfinite(v), cfg, ("answer_timeout_s",),
            f"must be at least {2 * wire.ALIVE_S:g} s (a learner says it lives each {wire.ALIVE_S:g} s) and finite")
    return token


def run(cfg: ActorsConfig, describe) -> int:
    """Serve learners until one stops us; returns the process exit code. ``describe(env_id, backend,
    frame_stack)``: the learner's env as this host would run it (``prepare.host_env``), its spaces checked
    against the learner's before any worker starts."""
    token = _checked(cfg)
    # Now, not when a learner first answers (this host makes its segments
    # only then): a predecessor killed with its process group left its own.
    sweep_once()
    lost_since, backoff, why = None, 0.5, ""
    while True:
        session = _Session(cfg, token, describe)
        try:
            session.run()
        except (KeyboardInterrupt, SystemExit) as e:
            signum = getattr(e, "signum", None)  # SIGTERM or SIGHUP, raised as cli.Stopped
            if isinstance(e, SystemExit) and signum is None:
                raise
            how = "interrupted" if signum is None else f"stopped by {signal.Signals(signum).name}"
            print(f"\nseedlocal actors: {how}; disconnected (the learner restarts these envs elsewhere)",
                  file=sys.stderr, flush=True)
            return e.code if signum is not None else 130
        except HostStopped as e:
            print(f"seedlocal actors: {e}", file=sys.stderr if e.code else sys.stdout, flush=True)
            return e.code
        except _Lost as e:
            why = str(e)
        now = time.monotonic()
        if session.heard is not None:  # it was up: the retry budget starts now
            lost_since, backoff = None, 0.5
        lost_since = lost_since or now
        if now - lost_since >= cfg.retry_s:
            # The time it took, not the budget: one attempt at a silent listener takes gRPC's ~20 s handshake.
            print(f"seedlocal actors: no learner at {cfg.connect} for {now - lost_since:.0f} s (--retry-s "
                  f"{cfg.retry_s:g}; {why}); giving up", file=sys.stderr, flush=True)
            return 1
        # The last wait ends at the budget, not a doubled backoff past it (--retry-s 2 gave up after 3.5 s).
        wait = max(0.05, min(backoff, cfg.retry_s - (now - lost_since)))
        if cfg.progress:
            print(f"seedlocal actors: {why}; retrying in {wait:.1f} s", file=sys.stderr, flush=True)
        time.sleep(wait)
        backoff = min(8.0, backoff * 2)
