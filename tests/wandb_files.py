"""What an offline W&B run wrote, read back from its ``run-<id>.wandb`` file (no W&B server, no mock).

The file is W&B's transaction log: a 7-byte header (``:W&B``, a magic number, a version), then 32 KiB blocks
of LevelDB-log chunks (a 4-byte checksum, a 2-byte length, a 1-byte kind: 1 whole, 2 first, 3 middle, 4 last),
each record a ``wandb_internal_pb2.Record``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, out, buf = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _checksum, n, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        buf += data[pos + HEADER:pos + HEADER + n]
        pos += HEADER + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
            buf = b""
    return out


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


class OfflineRun:
    """One offline run folder (``<run>/wandb/offline-run-<time>-<id>``): its id, config, history and summary."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        (log,) = self.folder.glob("run-*.wandb")
        rs = records(log)
        kinds = {}
        for r in rs:
            kinds.setdefault(r.WhichOneof("record_type"), []).append(r)
        run = kinds["run"][0].run
        self.id, self.project = run.run_id, run.project
        self.config = {_key(i): json.loads(i.value_json) for i in run.config.update}
        self.history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in kinds.get("history", [])]
        self.summary = {}
        for r in kinds.get("summary", []):
            self.summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
        self.exit_code = kinds["exit"][0].exit.exit_code if "exit" in kinds else None
        self.metrics = [r.metric for r in kinds.get("metric", [])]


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """Every offline W&B run of a seedlocal run folder, oldest first (a resume adds one)."""
    return [OfflineRun(p) for p in sorted(Path(run_dir, "wandb").glob("offline-run-*"))]
