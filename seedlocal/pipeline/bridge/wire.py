"""The bridge's wire format: one group's step per message, as raw bytes.

Every message is a fixed 24-byte header followed by a payload whose layout both ends derive from the same
:class:`GroupLayout` (sent by the learner when a host connects), so no field names or per-env framing travel:

    magic "SL" | version u8 | kind u8 | group u32 | epoch u32 | seq u64 | length u32

``group`` is the learner's group id, ``epoch`` counts how often that group was handed to a host (a message of an
older epoch is stale and refused), ``seq`` is the group's step counter on the sending side.

Host to learner:
    FIRST    the observations of a fresh (re)start: obs fields only
    STEP     one step: obs fields, then reward, terminated, truncated, ignored, ep_return, ep_length of the step
             that produced them
Learner to host:
    ACTION   the actions for the group's last observations
    RESET    restart the group's envs on fresh episodes (no payload)
    ALIVE    nothing else went out for ALIVE_S (no payload): the learner lives while it holds the host's groups
             (parked, or between generations), so a host can tell it from one that never answers

Each array is the numpy buffer as is (native byte order, little-endian on every platform seedlocal runs on); nothing
is compressed.

Handshake messages (HELLO, CHALLENGE, PROOF, ASSIGN, REFUSE, STATS) carry UTF-8 JSON in the payload instead. A
learner with a token and its host prove to each other that they hold it, and neither sends the token itself:

    host     HELLO      {nonce: Nh, ...}
    learner  CHALLENGE  {nonce: Nl}
    host     PROOF      {proof: HMAC(token, "host" Nh Nl)}     learner checks it
    learner  ASSIGN     {proof: HMAC(token, "learner" Nh Nl D), ...}  host checks it

where D is :func:`assign_digest` of the ASSIGN's other fields. Each proof covers the nonce the other side just drew
(a recorded exchange proves nothing later) and its role (one cannot be replayed as the other); why the host proves
first, and what this does without TLS: docs/multihost.md, "Trust". A learner without a token answers HELLO with
ASSIGN at once (no proof: a host that has a token refuses it).
"""

from __future__ import annotations

import hashlib
import hmac
import functools
import json
import math
import re
import secrets
import struct
from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from seedlocal.shm.rollout import STEP_FIELDS, TensorSpec

MAGIC = b"SL"
# Each bump makes an older peer say "version" at the handshake, not misread the new messages: 2 proves the token
# by HMAC over nonces, 3 covers the ASSIGN in the learner's proof, 4 adds ALIVE, 5 the ASSIGN's ``box_actions``.
VERSION = 5
HEADER = struct.Struct("<2sBBIIQI")
HEADER_SIZE = HEADER.size  # 24

FIRST, STEP, ACTION, RESET, HELLO, ASSIGN, REFUSE, STATS, CHALLENGE, PROOF, ALIVE = range(11)
KIND_NAMES = "FIRST STEP ACTION RESET HELLO ASSIGN REFUSE STATS CHALLENGE PROOF ALIVE".split()
# The step fields of a STEP message, in order (the unroll store's names).
STEP_ORDER = ("reward", "terminated", "truncated", "ignored", "ep_return", "ep_length")
# A host's HELLO, PROOF and STATS are a few hundred bytes at most, and it cuts its REFUSE to fit: the learner
# refuses a bigger handshake message before it parses it, and gRPC any message over ``largest_from_host``.
HANDSHAKE_BYTES = 4096
# How long the learner's end stays silent to a host at most: it sends ALIVE when nothing else went out.
ALIVE_S = 1.0


class WireError(ValueError):
    """A message that does not follow the protocol."""


Header = namedtuple("Header", "kind group epoch seq length")


def pack(kind: int, group: int = 0, epoch: int = 0, seq: int = 0, payload: bytes | bytearray | memoryview = b"") -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, group, epoch, seq, len(payload)) + bytes(payload)


def unpack(msg: bytes) -> tuple[Header, memoryview]:
    if len(msg) < HEADER_SIZE:
        raise WireError(f"message of {len(msg)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, kind, group, epoch, seq, length = HEADER.unpack_from(msg)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r} (not a seedlocal bridge message)")
    if version != VERSION:
        raise WireError(f"protocol version {version}, this end speaks {VERSION}")
    if kind >= len(KIND_NAMES):
        raise WireError(f"unknown message kind {kind}")
    if len(msg) != HEADER_SIZE + length:
        raise WireError(f"{KIND_NAMES[kind]} message says {length} payload bytes but carries {len(msg) - HEADER_SIZE}")
    return Header(kind, group, epoch, seq, length), memoryview(msg)[HEADER_SIZE:]


def pack_json(kind: int, obj: dict) -> bytes:
    return pack(kind, payload=json.dumps(obj).encode())


def unpack_json(payload: memoryview) -> dict:
    try:
        obj = json.loads(bytes(payload).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(f"handshake payload is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise WireError("handshake payload is not a JSON object")
    return obj


_NONCE = re.compile(r"[0-9a-f]{32}")


def new_nonce() -> str:
    """128 random bits: fresh for every handshake, so no recorded proof answers it."""
    return secrets.token_hex(16)


def check_nonce(nonce) -> str:
    """The peer's nonce, if it has the one form a proof's message allows (no separator tricks)."""
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise WireError("handshake without a valid nonce (32 lowercase hex digits)")
    return nonce


def assign_digest(fields: dict) -> str:
    """sha256 of an ASSIGN's fields but its proof, as JSON in one canonical form. Both ends digest the parsed
    fields, not the bytes received, so what the host checks is exactly what it then uses."""
    body = {k: v for k, v in fields.items() if k != "proof"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def token_proof(token: str, role: str, host_nonce: str, learner_nonce: str, assign: dict | None = None) -> str:
    """What ``role`` ("host" or "learner") sends to show it holds ``token``;
    the learner's also vouches for the ``assign`` fields it comes with."""
    msg = f"seedlocal-bridge/{VERSION} {role} {host_nonce} {learner_nonce}"
    if assign is not None:
        msg += " " + assign_digest(assign)
    return hmac.new(token.encode(), msg.encode(), hashlib.sha256).hexdigest()


def proof_ok(token: str, role: str, host_nonce: str, learner_nonce: str, proof, assign: dict | None = None) -> bool:
    """Whether ``proof`` shows that the peer in ``role`` holds ``token`` (and,
    for the learner, sent ``assign`` as it is): constant time."""
    return isinstance(proof, str) and hmac.compare_digest(
        proof.encode(), token_proof(token, role, host_nonce, learner_nonce, assign).encode())


@dataclass(frozen=True)
class GroupLayout:
    """Shapes of one group's step on the wire: ``envs`` envs of ``obs`` and ``action``."""

    envs: int
    obs: dict[str, TensorSpec]
    action: TensorSpec

    @functools.cached_property
    def _plans(self) -> dict[int, tuple[list[tuple[str, tuple[int, ...], np.dtype, int, int]], int]]:
        """Per payload kind (FIRST, STEP, ACTION), built once (a host and the learner's bridge code every group step by
        it): its arrays in order as (name, shape, dtype, byte offset, element count), and its size in bytes."""
        obs = [(k, s.shape, s.dtype) for k, s in self.obs.items()]
        kinds = {FIRST: obs, STEP: obs + [(k, (), STEP_FIELDS[k]) for k in STEP_ORDER],
                 ACTION: [("action", self.action.shape, self.action.dtype)]}
        plans = {}
        for kind, arrays in kinds.items():
            fields, offset = [], 0
            for k, shape, dtype in arrays:
                shape, dtype = (self.envs,) + shape, np.dtype(dtype)
                fields.append((k, shape, dtype, offset, math.prod(shape)))
                offset += math.prod(shape) * dtype.itemsize
            plans[kind] = (fields, offset)
        return plans

    def size(self, kind: int) -> int:
        return self._plans[kind][1]

    def encode(self, kind: int, arrays: dict[str, np.ndarray]) -> bytes:
        """FIRST/STEP/ACTION payload from arrays keyed by obs key, step field names and "action"."""
        return b"".join(np.ascontiguousarray(arrays[k], dtype=d).tobytes() for k, _, d, _, _ in self._plans[kind][0])

    def decode(self, kind: int, payload: memoryview) -> dict[str, np.ndarray]:
        """Zero-copy views of a FIRST/STEP/ACTION payload; checks its size."""
        fields, want = self._plans[kind]
        if len(payload) != want:
            raise WireError(f"{KIND_NAMES[kind]} payload of {len(payload)} bytes, expected {want}")
        return {k: np.frombuffer(payload, dtype, count=n, offset=offset).reshape(shape)
                for k, shape, dtype, offset, n in fields}

    def to_json(self) -> dict:
        return {"envs": self.envs, "obs": {k: [list(s.shape), s.dtype] for k, s in self.obs.items()},
                "action": [list(self.action.shape), self.action.dtype]}

    @classmethod
    def from_json(cls, d: dict) -> "GroupLayout":
        try:
            return cls(int(d["envs"]), {k: TensorSpec(tuple(v[0]), str(v[1])) for k, v in d["obs"].items()},
                       TensorSpec(tuple(d["action"][0]), str(d["action"][1])))
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise WireError(f"malformed group layout: {e!r}") from None


def largest_from_host(layout: GroupLayout) -> int:
    """The largest message an actor host sends in a run of ``layout``: a STEP (a FIRST is smaller), or a
    handshake, STATS or REFUSE message. Exact, not padded: every message's size is fixed by its header, and
    any slack would only let a peer make the learner hold more."""
    return max(HEADER_SIZE + layout.size(STEP), HANDSHAKE_BYTES)


def check_finite(arrays: dict[str, np.ndarray]) -> str | None:
    """The name of the first float array holding NaN or inf, or None."""
    return next((k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()), None)
