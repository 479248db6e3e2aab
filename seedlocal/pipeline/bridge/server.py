"""The learner host's end of the bridge: to the unroll store, one more worker.

It runs in its own process (networking never takes the inference loop's time), attached to the learner's control
block and unroll store like an env worker, and owns the *remote groups*: slots reserved for envs that actor hosts
step (``seedlocal actors --connect``). For each group it does what a worker's group thread does, with the env
replaced by a network stream:

    host's FIRST/STEP message  ->  validate  ->  write obs and step rows;
                                   state = OBS_READY; post ready[g]
    wake[g] (loop answered)    ->  ACTION_READY: send the action row;
                                   RESET: send RESET

so the inference loop, the learners and the neuroevolution work queue cannot tell a remote slot from a local one.
Everything a host sends is checked before a byte reaches the store (kind, group ownership, epoch, turn, size, finite
floats); a host that breaks the protocol is logged with its address and disconnected.

When a host goes away, its groups are *lost*: the server bumps ``group_lost[g]`` and stops touching them; the
inference loop drops their partial unrolls, rebinds them fresh (recurrent state zeroed) and acknowledges with
``group_lost_ack[g]`` plus a wake token. Only then can another host take them, starting with fresh episodes, so no
step from before the loss is stitched to one after it.

A host is let in only once it has proven the learner's token, where there is one (``wire`` describes the exchange).
What a peer that has proven nothing can make the server hold is bounded (``_grpc_server``; docs/multihost.md,
"Limits", says why each limit is what it is).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
import traceback
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seedlocal.pipeline.bridge import wire
from seedlocal.envs.make import wrap_seed
from seedlocal.shape import PipelineShape
from seedlocal.shm.arrays import ArraySpec, SharedArrays
from seedlocal.shm.rollout import obs_key
from seedlocal.shm.slots import ACTION_READY, OBS_READY, RESET, STEPPING, Signal
from seedlocal.spec import EnvSpec

SERVICE = "seedlocal.Bridge"
METHOD = f"/{SERVICE}/Stream"
_KEEPALIVE = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
              ("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_permit_without_calls", 1)]
# An actor host's channel, one per session: its own connection (not one shared with a closed session's), no
# compression. What it receives is not capped: the channel is made before the learner says the layout, and
# the host connects only to the learner it was pointed at, verified by TLS or the token before it uses a word.
CHANNEL_OPTIONS = _KEEPALIVE + [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                                ("grpc.use_local_subchannel_pool", 1)]
# How long the goodbye waits for each host to close its side (it does once it has read the goodbye), so that the
# connection is not closed under a goodbye not yet read; ActorPool.close() gives the server this and more. A host
# answers in milliseconds, but 2 s proved too short on 2 busy cores (the host retried instead of exiting); only a
# host that never answers makes a stopping learner wait this long.
GOODBYE_S = 5.0
_GOODBYE = object()  # queued for a host's stream: the run ended on purpose
# A host's HELLO and PROOF take one round trip and an HMAC: seconds are plenty on any network, and a peer that has
# not proven itself by then is cut off (keepalive alone would keep a silent stream open for good).
HANDSHAKE_S = 5.0


def remote_seed(base: int, assignment: int, first_index: int, shape: PipelineShape) -> int:
    """The seed of a host's ``assignment``-th envs, whose first group is ``first_index`` among the remote groups:
    the host seeds its env j with this + j. They sit after the local envs in the block of seeds of this rank and
    start (``PipelineShape.seed_block``, the assignment counted as a start), at the offset of the host's first
    group, as a local worker's do: no two assignments, no local worker's restart and no other rank share a seed.
    The blocks wrap within [0, SEED_END - block), so seed + j always fits envpool's int32 however often hosts
    reconnect."""
    offset = shape.num_local_envs + first_index * shape.envs_per_group
    return wrap_seed(base + shape.seed_block(assignment) + offset, shape.num_envs)


@dataclass(frozen=True)
class ServerArgs:
    host: str
    port: int
    token: str
    tls_cert: str
    tls_key: str
    groups: tuple[int, ...]  # the learner's group ids reserved for remote envs
    handshakes_per_peer: int  # bridge.handshakes_per_peer
    shape: PipelineShape  # the learner's: actor hosts run workers of its size
    layout: dict  # wire.GroupLayout.to_json()
    spec: EnvSpec  # the learner's env, as its hosts run it (its id, backend, frames and Box bounds rule)
    seed: int
    control: tuple[str, list[ArraySpec]]
    rollout: tuple[str, list[ArraySpec]]
    wake: tuple[Signal, ...]  # per remote group, as for workers
    ready: tuple[Signal, ...]
    obs_ready: Signal
    started: object  # a multiprocessing Connection: ("ok", port) or ("error", message)
    parent_pid: int


def log(msg: str) -> None:
    # One write per line: print writes the newline apart, and the lines of streams cut off at once ran together.
    sys.stderr.write(f"seedlocal bridge: {msg}\n")
    sys.stderr.flush()


class _Host:
    """One connected actor host: its groups and the queue its responses go out of."""

    def __init__(self, slot: int, peer: str, groups: list[_Group]):
        self.slot, self.peer, self.groups = slot, peer, groups
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # its request stream ended: after a goodbye, the host has read it


class _Group:
    def __init__(self, gid: int, index: int):
        self.gid, self.index = gid, index  # learner group id, index among remote groups
        self.lock = threading.Lock()
        self.host: _Host | None = None
        self.epoch = 0
        self.expect: int | None = None  # FIRST or STEP while it is the host's turn
        self.lost = False  # waiting for the loop to acknowledge a loss
        self.seq = 0


class BridgeServer:
    def __init__(self, a: ServerArgs):
        self.a = a
        self.control = SharedArrays.attach(*a.control)
        self.store = SharedArrays.attach(*a.rollout)
        self.layout = wire.GroupLayout.from_json(a.layout)
        self.largest = wire.largest_from_host(self.layout)  # gRPC refuses a longer message before reading it
        self.groups = {gid: _Group(gid, i) for i, gid in enumerate(a.groups)}
        self.lock = threading.Lock()  # assignment of groups and host slots
        self.host_slots: list[_Host | None] = [None] * len(a.groups)  # each host holds a group at least
        self.handshaking: dict[str, int] = {}  # streams in the handshake, by peer address
        self.assignments = 0
        self.stopping = threading.Event()
        self.said_goodbye = threading.Event()
        self._state, self._tbuf, self._trow = (self.control[k] for k in ("state", "target_buf", "target_row"))

    # -- the per-group side facing the inference loop ---------------------------

    def group_thread(self, g: _Group) -> None:
        wake = self.a.wake[g.index]
        while not self.stopping.is_set():
            if not wake.wait(0.5):
                continue
            with g.lock:
                if g.lost:  # until the token that follows the loop's acknowledgement (acquire)
                    g.lost = bool(self.control["group_lost_ack"][g.gid] != self.control["group_lost"][g.gid])
                    continue
                host, state = g.host, int(self._state[g.gid])
                if host is None or g.expect is not None or state not in (ACTION_READY, RESET):
                    continue  # a stale token
                g.seq += 1
                if state == ACTION_READY:
                    action = {"action": self.store["action"][self._tbuf[g.gid], self._trow[g.gid] - 1]}
                    msg = wire.pack(wire.ACTION, g.gid, g.epoch, g.seq, self.layout.encode(wire.ACTION, action))
                    g.expect = wire.STEP
                else:
                    msg = wire.pack(wire.RESET, g.gid, g.epoch, g.seq)
                    g.expect = wire.FIRST
                self._state[g.gid] = STEPPING
            self.control["host_bytes"][host.slot] += len(msg)
            host.out.put(msg)

    # -- the side facing a host --------------------------------------------------

    def write_step(self, host: _Host, msg: bytes) -> None:
        """Validate a FIRST/STEP message completely, then write it like a worker would."""
        h, payload = wire.unpack(msg)
        if h.kind == wire.STATS:
            stats = wire.unpack_json(payload)
            self.control["host_rtt_ms"][host.slot] = [float(stats.get(k, 0.0)) for k in ("rtt_ms_p50", "rtt_ms_p99")]
            return
        if h.kind not in (wire.FIRST, wire.STEP):
            raise wire.WireError(f"a host may not send {wire.KIND_NAMES[h.kind]} messages")
        g = self.groups.get(h.group)
        if g is None or g.host is not host:
            raise wire.WireError(f"message for group {h.group}, which this host does not own")
        arrays = self.layout.decode(h.kind, payload)
        if (bad := wire.check_finite(arrays)) is not None:
            raise wire.WireError(f"non-finite values in {bad or 'obs'} of group {h.group}")
        with g.lock:
            if h.epoch != g.epoch:
                raise wire.WireError(f"stale message for group {h.group} (epoch {h.epoch}, now {g.epoch})")
            if g.expect != h.kind:
                raise wire.WireError(f"{wire.KIND_NAMES[h.kind]} for group {h.group} out of turn")
            buf, row = int(self._tbuf[g.gid]), int(self._trow[g.gid])
            if (row == 0) != (h.kind == wire.FIRST):
                raise wire.WireError(f"{wire.KIND_NAMES[h.kind]} for group {h.group} where the learner expects "
                                     f"{'FIRST' if row == 0 else 'STEP'}")
            for k in self.layout.obs:
                self.store[obs_key(k)][buf, row] = arrays[k]
            if h.kind == wire.STEP:
                for k in wire.STEP_ORDER:
                    self.store[k][buf, row - 1] = arrays[k]
                self.control["group_steps"][g.gid] += self.layout.envs
                self.control["host_steps"][host.slot] += self.layout.envs
                self.control["group_episodes"][g.gid] += int((arrays["terminated"] | arrays["truncated"]).sum())
            g.expect = None
            self._state[g.gid] = OBS_READY
        self.control["host_bytes"][host.slot] += len(msg)
        self.a.ready[g.index].post()  # release: publishes the rows above
        self.a.obs_ready.post()

    def assign(self, peer: str, hello: dict) -> tuple[_Host | None, dict]:
        """A new host holding free groups and its ASSIGN's fields, or None and why not (REFUSE's)."""
        want = int(hello.get("groups", 0) or 0)
        epw = int(hello.get("envs_per_worker", 0) or 0)
        group, shape = self.layout.envs, self.a.shape
        if epw and epw != shape.envs_per_worker:
            return None, {"reason": f"this learner runs groups of {group} envs: actor hosts need --envs-per-worker "
                                    f"{shape.envs_per_worker} (or leave it out), not {epw}"}
        with self.lock:
            free = [g for g in self.groups.values() if g.host is None and not g.lost]
            free = free[: shape.whole_workers(len(free))][: want or None]
            if not free:
                return None, {"reason": "this learner has no free remote env slots "
                                        "(all of bridge.remote_envs are in use)"}
            slot = self.host_slots.index(None)  # there are as many as groups, and one is free
            host = self.host_slots[slot] = _Host(slot, peer, free)
            self.assignments += 1
            for g in free:
                with g.lock:
                    g.host, g.epoch, g.expect, g.seq = host, g.epoch + 1, wire.FIRST, 0
                self.control["group_connected"][g.gid] = 1
            self.control["host_connected"][slot] = 1
        spec = self.a.spec
        return host, {"groups": [g.gid for g in free], "epochs": [g.epoch for g in free],
                      "env_id": spec.env_id, "backend": spec.backend, "frame_stack": spec.frame_stack,
                      "box_actions": spec.box_actions, "layout": self.a.layout,
                      "seed": remote_seed(self.a.seed, self.assignments, free[0].index, shape), "version": wire.VERSION}

    def drop(self, host: _Host, why: str) -> None:
        """The host is gone: its groups are lost until the loop acknowledges."""
        with self.lock:
            for g in host.groups:
                with g.lock:
                    g.host, g.expect, g.lost = None, None, True
                    self.control["group_connected"][g.gid] = 0
                    self.control["group_lost"][g.gid] += 1
            self.host_slots[host.slot] = None
            self.control["host_connected"][host.slot] = 0
            self.control["bridge_disconnects"][0] += 1
        self.a.obs_ready.post()  # the loop notices lost groups when it checks its workers
        host.out.put(None)
        if not self.said_goodbye.is_set():  # after the goodbye, hosts leave as told
            log(f"actor host {host.peer} disconnected ({why}); its {len(host.groups)} groups restart on fresh "
                "episodes when a host takes them")

    def stream(self, requests, context):
        """The one RPC: a bidirectional stream of raw messages with one actor host: its handshake, then its ASSIGN
        (proven where the host proved the token) and stream (``_serve``), or its refusal."""
        peer = context.peer()
        address = self._begin_handshake(peer, context)
        try:
            shaken = yield from self._handshake(requests, context, peer)
        finally:
            with self.lock:
                self.handshaking[address] -= 1
        if shaken is None:
            return
        hello, nonces = shaken
        try:
            host, answer = self.assign(peer, hello)
        except (ValueError, TypeError) as e:
            host, answer = None, {"reason": f"bad handshake: {e}"}
        if host is None:
            log(f"refused {peer}: {answer['reason']}")
            yield wire.pack_json(wire.REFUSE, answer)
            return
        log(f"actor host {peer} connected: {len(host.groups) * self.layout.envs} envs (groups {answer['groups']})")
        if nonces is not None:
            # Only to a host that has proven the token: a stranger learns nothing derived from it. It covers
            # every field, so that no one on the path can change what the host runs (env id, seeds, layout).
            answer["proof"] = wire.token_proof(self.a.token, "learner", *nonces, answer)
        yield from self._serve(requests, host, answer)

    def _begin_handshake(self, peer: str, context) -> str:
        """Count the stream against its address's handshakes (returned), or refuse it before reading a byte:
        without a bound per address, one peer could take every stream the server has and lock hosts out."""
        import grpc

        address, most = peer.rpartition(":")[0] or peer, self.a.handshakes_per_peer  # ipv4:ADDR:PORT, ipv6:[ADDR]:PORT
        with self.lock:
            under_way = self.handshaking.get(address, 0)
            if under_way < most:
                self.handshaking[address] = under_way + 1
                return address
        log(f"refused {peer}: {under_way} handshakes from that address under way (bridge.handshakes_per_peer="
            f"{most})")
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"this learner takes {most} handshakes at once from "
                      f"one address (bridge.handshakes_per_peer) and {address} has them: try again shortly")

    def _handshake(self, requests, context, peer: str):
        """The host's HELLO and, where the learner has a token, its proof, all within HANDSHAKE_S (each
        message at most wire.HANDSHAKE_BYTES): (hello, nonces or None), or None once the host is refused."""
        import grpc

        nonces: tuple[str, str] | None = None  # the host's and the learner's, once the host has proven the token
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            context.cancel()  # ends the read below and frees the stream's slot

        deadline = threading.Timer(HANDSHAKE_S, expire)
        deadline.daemon = True
        deadline.start()
        why = None  # why the handshake failed, if it did
        try:
            hello = _expect(requests, wire.HELLO)
            if self.a.token:
                host_nonce, nonce = wire.check_nonce(hello.get("nonce")), wire.new_nonce()
                yield wire.pack_json(wire.CHALLENGE, {"nonce": nonce})
                got = _expect(requests, wire.PROOF).get("proof")
                if not wire.proof_ok(self.a.token, "host", host_nonce, nonce, got):
                    log(f"refused {peer}: {'wrong' if got else 'no'} token")
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing bridge token")
                nonces = host_nonce, nonce
        except (grpc.RpcError, StopIteration):  # the stream ended: a read says so either way, in no set order
            why = (f"its stream ended: it closed it, went away, or sent a message over the {self.largest:,} bytes a "
                   "host sends at most in this run (which gRPC refuses)")
        except (wire.WireError, ValueError, TypeError) as e:
            why = str(e)
        finally:
            deadline.cancel()
        if expired.is_set():  # the deadline cancelled the call: that ended the read
            log(f"refused {peer}: no handshake within {HANDSHAKE_S:g} s")
            return None
        if why is not None:
            log(f"refused {peer}: bad handshake: {why}")
            if context.is_active():  # else nobody is there to tell
                yield wire.pack_json(wire.REFUSE, {"reason": f"bad handshake: {why}"})
            return None
        return hello, nonces

    def _serve(self, requests, host: _Host, answer: dict):
        """Send the ASSIGN, then the host's outgoing queue (the group threads' actions and resets) until
        the host is dropped or the learner says goodbye; its messages are read on a thread of their own."""
        threading.Thread(target=self._read, args=(host, requests), daemon=True, name=f"read-{host.slot}").start()
        yield wire.pack_json(wire.ASSIGN, answer)
        while True:
            try:
                msg = host.out.get(timeout=wire.ALIVE_S)
            except queue.Empty:  # its groups wait for the learner (parked, held): say it lives
                msg = wire.pack(wire.ALIVE)
            if msg is None:
                return
            if msg is _GOODBYE:
                yield wire.pack_json(wire.REFUSE, {"reason": "the learner stopped", "final": True})
                # Return (which ends the call) once the host has read it: it
                # closes its side then, and the server may close the connection.
                host.done.wait(GOODBYE_S)
                return
            yield msg

    def _read(self, host: _Host, requests) -> None:
        why = "stream ended"
        try:
            for msg in requests:
                if len(msg) >= wire.HEADER_SIZE and msg[3] == wire.REFUSE:
                    why = "it gave up: " + wire.unpack_json(wire.unpack(msg)[1]).get("reason", "?")
                    log(f"actor host {host.peer} refused the assignment: {why[12:]}")
                    break
                self.write_step(host, msg)
        except wire.WireError as e:
            why = f"protocol error: {e}"
            log(f"refused {host.peer}: {e}")
        except Exception as e:  # a broken stream: grpc raises its RpcError here
            why = type(e).__name__
        finally:
            host.done.set()
        self.drop(host, why)

    def say_goodbye(self) -> None:
        """Tell every host that the run ended on purpose: they exit rather than retry."""
        self.said_goodbye.set()
        with self.lock:
            hosts = [h for h in self.host_slots if h is not None]
        for h in hosts:
            h.out.put(_GOODBYE)


def _expect(requests, kind: int) -> dict:
    """The host's next handshake message, which must be ``kind``."""
    msg = next(requests)
    if len(msg) > wire.HANDSHAKE_BYTES:
        raise wire.WireError(f"a handshake message of {len(msg):,} bytes (at most {wire.HANDSHAKE_BYTES:,})")
    h, payload = wire.unpack(msg)
    if h.kind != kind:
        raise wire.WireError(f"expected {wire.KIND_NAMES[kind]}, got {wire.KIND_NAMES[h.kind]}")
    return wire.unpack_json(payload)


def _listen(server, a: ServerArgs) -> tuple[int, str]:
    """Open ``server``'s port where ``a`` says: (the port, "") or (0, why not). Where gRPC's own error says only
    "Failed to bind" (its reason going to its log), a plain socket's bind gives the system's reason."""
    import grpc
    import socket

    address = f"[{a.host}]:{a.port}" if ":" in a.host else f"{a.host}:{a.port}"
    creds = grpc.ssl_server_credentials([(Path(a.tls_key).read_bytes(), Path(a.tls_cert).read_bytes())]) \
        if a.tls_cert else None
    why = ""
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError as e:
        port, why = 0, str(e)
    if port:
        return port, why
    try:
        with socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET) as s:
            s.bind((a.host, a.port))
    except OSError as e:
        why = e.strerror or str(e)
    return 0, f"cannot listen on {address}: {why or 'address in use or not local'}"


def _grpc_server(srv: BridgeServer):
    """A gRPC server for ``srv``'s one RPC, with its limits (docs/multihost.md, "Limits"), not yet listening. Each
    handshake is held to HANDSHAKE_S by ``_handshake``, each of its messages to wire.HANDSHAKE_BYTES by ``_expect``."""
    import grpc

    handler = grpc.stream_stream_rpc_method_handler(srv.stream)
    # Each host takes a whole worker's groups, so remote groups cover every host and one old stream of each not
    # yet noticed gone; handshakes_per_peer more leave room for hosts beside one stranger's handshakes.
    streams = len(srv.a.groups) + srv.a.handshakes_per_peer
    ms = int(HANDSHAKE_S * 1000)
    options = _KEEPALIVE + [
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.max_receive_message_length", srv.largest),  # the longest message a host sends in the run
        ("grpc.max_send_message_length", -1),  # what the learner builds itself
        ("grpc.max_concurrent_streams", 1),  # an actor host opens one stream per connection
        ("grpc.so_reuseport", 0),  # gRPC's default lets a second learner listen on this port and take its hosts
        ("grpc.server_handshake_timeout_ms", ms), ("grpc.max_connection_idle_ms", ms)]
    return grpc.server(futures.ThreadPoolExecutor(max_workers=streams + 2),
                       handlers=[grpc.method_handlers_generic_handler(SERVICE, {"Stream": handler})],
                       options=options, maximum_concurrent_rpcs=streams)


def run_bridge_server(a: ServerArgs) -> None:
    """Entry point of the bridge server process (started by ActorPool)."""
    srv: BridgeServer | None = None

    def on_sigterm(signum, frame):
        # At once only when there is no goodbye left to say: the learner died (PR_SET_PDEATHSIG: a crash, so the
        # hosts wait for a resume), or the goodbye is out and ActorPool.close() escalates. Before the goodbye, while
        # the learner lives, SIGTERM was sent to its whole process group (a scheduler, systemd): the learner ends
        # its run cleanly, and this process must live to tell the hosts, even where the learner set ``stop``
        # first; the main loop says the goodbye at its next poll.
        if os.getppid() != a.parent_pid or (srv is not None and srv.said_goodbye.is_set()):
            sys.stderr.flush()
            os._exit(128 + signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides how to stop
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # (a closed terminal, too)
    signal.signal(signal.SIGTERM, on_sigterm)
    from seedlocal.pipeline.worker import die_with_parent

    die_with_parent()
    # gRPC core logs each failed handshake (a host without --tls-ca) on stderr; the hosts are told why.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    code = 0
    try:
        srv = BridgeServer(a)
        server = _grpc_server(srv)
        port, why = _listen(server, a)
        if not port:
            a.started.send(("error", why))
            return
        server.start()
        for g in srv.groups.values():
            threading.Thread(target=srv.group_thread, args=(g,), daemon=True, name=f"group-{g.gid}").start()
        a.started.send(("ok", port))
        stop = srv.control["stop"]
        while not stop[0] and os.getppid() == a.parent_pid:
            time.sleep(0.1)
        if stop[0]:  # the learner ended its run (budget, Ctrl-C, SIGTERM): its hosts exit rather than retry
            srv.say_goodbye()
        # else it died without a word (PDEATHSIG got here first, normally): its hosts wait for a resume
        srv.stopping.set()
        server.stop(grace=GOODBYE_S + 0.5).wait(GOODBYE_S + 1.0)
    except BaseException as e:
        code = 1
        with contextlib.suppress(Exception):
            a.started.send(("error", f"{type(e).__name__}: {e}"))
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class BridgeMeter:
    """The learner's ``bridge/`` scalars, read from the control block the server writes for its ``remote_groups``."""

    def __init__(self, control, remote_groups: int):
        self.c, self.t, self.remote_groups = control, time.monotonic(), remote_groups
        self.steps, self.bytes = control["host_steps"].copy(), control["host_bytes"].copy()

    def scalars(self) -> dict[str, float]:
        c, now = self.c, time.monotonic()
        dt = max(1e-9, now - self.t)
        steps, nbytes = c["host_steps"].copy(), c["host_bytes"].copy()
        out = {"bridge/hosts_connected": int(c["host_connected"].sum()),
               "bridge/disconnects": int(c["bridge_disconnects"][0])}
        for h in np.flatnonzero(c["host_connected"]).tolist():
            out[f"bridge/host{h}/steps_per_s"] = float(steps[h] - self.steps[h]) / dt
            out[f"bridge/host{h}/mb_per_s"] = float(nbytes[h] - self.bytes[h]) / dt / 1e6
            out[f"bridge/host{h}/rtt_ms_p50"] = float(c["host_rtt_ms"][h, 0])
            out[f"bridge/host{h}/rtt_ms_p99"] = float(c["host_rtt_ms"][h, 1])
        self.t, self.steps, self.bytes = now, steps, nbytes
        return out

    def waiting_line(self) -> str | None:
        """A status line while remote groups have no host, else None."""
        missing = self.remote_groups - int(self.c["group_connected"].sum())
        if missing <= 0:
            return None
        return f"seedlocal: waiting for actor hosts: {missing} of {self.remote_groups} remote groups have none"
