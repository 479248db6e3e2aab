"""Named, typed arrays packed into one shared-memory segment.

One process (the owner) creates a segment from a list of :class:`ArraySpec` and is the only one that unlinks it;
any other process attaches by the segment's name and the same specs. Every array is a zero-copy numpy view of the
segment (``torch.from_numpy`` on it is zero-copy too). No other module of seedlocal allocates or names shared memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

# Each array starts on a cache-line (and AVX-512) boundary so that two arrays never share a line two processes write.
_ALIGN = 64

SEGMENT_PREFIX = "seedlocal_"


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one named array inside a segment."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _layout(specs: list[ArraySpec]) -> tuple[dict[str, int], int]:
    offsets, cursor = {}, 0
    for spec in specs:
        if spec.name in offsets:
            raise ValueError(f"duplicate array name {spec.name!r} in one segment")
        offsets[spec.name] = cursor
        cursor += -(-spec.nbytes // _ALIGN) * _ALIGN
    return offsets, max(cursor, _ALIGN)


_SHM_DIR = "/dev/shm"
_swept = False
_CREATION_LOCK_WAIT_S = 2.0


@contextlib.contextmanager
def _creation_lock(exclusive: bool):
    """A ``flock`` on the /dev/shm folder, held shared by a creator from creating a segment until it holds the segment's
    own lock, and exclusively by the sweeper: while it looks, a segment without an owner's lock is one whose owner died,
    never one being born. Yields whether it is held: either side waits at most ``_CREATION_LOCK_WAIT_S`` (a process
    stopped holding it, Ctrl-Z, must not stall every seedlocal start), then a sweeper skips its sweep and a creator goes
    on unlocked (only a sweeper resumed in the microseconds between creating and locking a segment could catch that)."""
    try:
        fd = os.open(_SHM_DIR, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline, held = time.monotonic() + _CREATION_LOCK_WAIT_S, False
        while not held:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
        yield held
    finally:
        os.close(fd)  # releases the lock


def sweep_stale_segments() -> list[str]:
    """Unlink seedlocal segments that no live process owns; returns their names.

    Every owner holds a shared ``flock`` on its segment while it is open, which the kernel drops however the owner
    dies. The owner (or Python's resource tracker) unlinks on exit, but a SIGKILL of a whole process group (a job
    scheduler, ``killpg``) takes the tracker too, so each process that makes segments first sweeps those whose lock
    nobody holds (``sweep_once``). The lock, not the PID in the name, decides: containers that share ``/dev/shm``
    across PID namespaces cannot make a live segment look stale."""
    with _creation_lock(exclusive=True) as held:
        if not held:
            return []
        return [n for n in os.listdir(_SHM_DIR) if n.startswith(SEGMENT_PREFIX) and _unlink_if_orphaned(n)]


def sweep_once() -> None:
    """Sweep once per process: at its first segment, or as it starts where it makes segments only later (an actor
    host, once a learner answers), so that what a killed predecessor left does not wait for a learner."""
    global _swept
    if not _swept:
        _swept = True
        sweep_stale_segments()


def _unlink_if_orphaned(name: str) -> bool:
    path = os.path.join(_SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone already, or another user's
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if name.endswith("_" + SEMAPHORES_TAG):
            _unlink_recorded_semaphores(fd)
        os.unlink(path)
        return True
    except OSError:  # a live owner holds it, or it went meanwhile
        return False
    finally:
        os.close(fd)


SEMAPHORES_TAG = "semaphores"
_NAME_BYTES = 64


def record_semaphores(names: list[str]) -> "SharedArrays":
    """A segment listing the named POSIX semaphores a pipeline created (multiprocessing's, ``sem.mp-*`` in
    /dev/shm). They outlive a SIGKILL of the whole process group as the segments do, but carry no owner lock and no
    recognisable name; the sweep that removes this segment removes them."""
    seg = SharedArrays.create([ArraySpec("names", (max(1, len(names)), _NAME_BYTES), "uint8")], SEMAPHORES_TAG)
    for i, n in enumerate(names):
        raw = n.encode()[:_NAME_BYTES]
        seg["names"][i, :len(raw)] = np.frombuffer(raw, np.uint8)
    return seg


def _unlink_recorded_semaphores(fd: int) -> None:
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    for i in range(0, len(data) - _NAME_BYTES + 1, _NAME_BYTES):
        name = data[i:i + _NAME_BYTES].rstrip(b"\0").decode("ascii", "replace")
        if name.startswith("/mp-") and "/" not in name[1:]:  # multiprocessing's names; nothing else is touched
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(_SHM_DIR, "sem." + name[1:]))


class SharedArrays:
    """A shared-memory segment seen as a dict of numpy arrays: ``create(specs, tag)`` allocates (zeroed) and owns,
    ``attach(name, specs)`` maps an existing one; ``close()`` unmaps, and unlinks in the owner."""

    def __init__(self, shm: shared_memory.SharedMemory, specs: list[ArraySpec], owner: bool):
        self._shm, self.owner, self.specs = shm, owner, {s.name: s for s in specs}
        offsets, _ = _layout(specs)
        self.arrays: dict[str, np.ndarray] = {
            s.name: np.ndarray(s.shape, dtype=s.dtype, buffer=shm.buf, offset=offsets[s.name]) for s in specs}

    @classmethod
    def create(cls, specs: list[ArraySpec], tag: str) -> "SharedArrays":
        sweep_once()  # what crashed runs left behind goes before we add to it
        _, size = _layout(specs)
        with _creation_lock(exclusive=False):
            name = f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(4)}_{tag}"  # unique, recognisable in /dev/shm
            shm = shared_memory.SharedMemory(name=name, create=True, size=size)
            # Held until the segment is closed or this process dies: what tells sweep_stale_segments it is live.
            fcntl.flock(shm._fd, fcntl.LOCK_SH)
        return cls(shm, specs, owner=True)

    @classmethod
    def attach(cls, name: str, specs: list[ArraySpec]) -> "SharedArrays":
        return cls(shared_memory.SharedMemory(name=name, create=False), specs, owner=False)

    @property
    def name(self) -> str:
        return self._shm.name

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __contains__(self, key: str) -> bool:
        return key in self.arrays

    def handle(self) -> tuple[str, list[ArraySpec]]:
        """What another process needs to attach: picklable, a few hundred bytes."""
        return self.name, list(self.specs.values())

    def close(self) -> None:
        if self._shm is None:
            return
        # Views must go before the mapping can close (BufferError otherwise).
        self.arrays.clear()
        shm, self._shm = self._shm, None
        # BufferError: someone still holds a view (e.g. a torch tensor); the mapping is freed when that view dies,
        # and unlinking below still removes the name.
        with contextlib.suppress(BufferError):
            shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()

    def __del__(self) -> None:  # last resort; normal paths call close()
        with contextlib.suppress(Exception):
            self.close()
