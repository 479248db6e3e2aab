"""How much memory R2D2's replay takes, measured on real env steps.

    python scripts/bench_replay.py --env Pong-v5
    python scripts/bench_replay.py --env Pong-v5 --sequences 4000 --envs 32

Fills two replays (frames stored raw, and lz4-compressed) with the same
random-policy steps of ``--env`` (single 84x84 frames: envpool's
stack_num=1, as the R2D2 Atari preset runs it), in SEED's Atari geometry
(burn-in 40 + unroll 80 + 1 rows per sequence, a new sequence every 80
steps), and prints one JSON line:

- ``bytes_per_stored_step``: every byte the replay holds (frames, actions,
  rewards, flags, episode starts, recurrent states, the sum tree) over the
  steps it holds, raw and lz4;
- ``projected_gb``: that, scaled to SEED's configuration of 100,000
  sequences (each adds 80 new steps; their 40 burn-in rows are the previous
  sequence's, stored once) with 512-unit LSTM states, raw and lz4;
- ``seed_layout_gb``: the same 100,000 sequences stored SEED's way, each
  sequence's 121 frames on its own;
- ``sample_us`` / ``update_us``: a batch of 64 sequences sampled from, and
  their priorities written back to, a sum tree of 100,000 sequences; and
  ``gather_ms_per_batch``: building that batch's [121, 64, 4, 84, 84]
  stacked frames from the filled replay (decompression included).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seedlocal.trainers.replay import SequenceReplay, SumTree  # noqa: E402

BURN_IN, UNROLL, LSTM = 40, 80, 512
LENGTH = BURN_IN + UNROLL + 1
SEED_SEQUENCES = 100_000


@dataclass
class Args:
    env: str = "Pong-v5"
    """envpool Atari id"""
    sequences: int = 2000
    """sequences to fill each replay with"""
    envs: int = 16
    """envs stepped (one stream each)"""


def fill(args: Args) -> tuple[dict[str, SequenceReplay], int]:
    import envpool

    env = envpool.make(args.env, env_type="gymnasium", num_envs=args.envs, stack_num=1, seed=1)
    frame = env.observation_space.shape
    fields = {"obs": (frame, "uint8"), "action": ((), "int64"), "reward": ((), "float32"),
              "terminated": ((), "bool"), "truncated": ((), "bool"), "ignored": ((), "bool")}
    replays = {kind: SequenceReplay(args.envs, args.sequences, LENGTH, UNROLL, fields, (2, LSTM),
                                    stack=4, compress=kind == "lz4") for kind in ("raw", "lz4")}
    rng = np.random.default_rng(0)
    obs, _ = env.reset()
    buf = {k: np.zeros((UNROLL, args.envs) + tuple(s), d) for k, (s, d) in fields.items()}
    was_done = np.zeros(args.envs, bool)
    core = np.zeros((2, LSTM), np.float32)
    steps = 0
    while replays["raw"].added < args.sequences:
        for t in range(UNROLL):
            a = rng.integers(0, env.action_space.n, args.envs)
            buf["obs"][t], buf["action"][t], buf["ignored"][t] = obs, a, was_done
            obs, r, te, tr, _ = env.step(a)
            buf["reward"][t], buf["terminated"][t], buf["truncated"][t] = r, te, tr
            was_done = te | tr
        steps += UNROLL * args.envs
        for e in range(args.envs):
            rows = {k: v[:, e] for k, v in buf.items()}
            for rep in replays.values():
                rep.set_core(e, int(rep.count[e]), core)
                rep.append(e, rows)
    return replays, steps


def tree_timing(batch: int = 64) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    tree = SumTree(SEED_SEQUENCES)
    tree.update(np.arange(SEED_SEQUENCES), rng.random(SEED_SEQUENCES))
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        idx = tree.sample(batch, rng)
    t1 = time.perf_counter()
    for _ in range(n):
        tree.update(idx, rng.random(batch))
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def main(args: Args) -> dict:
    replays, steps = fill(args)
    out = {"env": args.env, "sequences": args.sequences, "envs": args.envs, "steps_stepped": steps,
           "geometry": {"burn_in": BURN_IN, "unroll": UNROLL, "length": LENGTH, "lstm": LSTM}}
    per_step, projected = {}, {}
    for kind, rep in replays.items():
        stored = int(np.minimum(rep.count, rep.cap).sum())
        per_step[kind] = rep.nbytes() / stored
        # Each of SEED's sequences adds UNROLL new steps; plus its recurrent state (kept once per sequence).
        core_bytes = 2 * LSTM * 4
        per_step_no_core = (rep.nbytes() - rep.core.nbytes) / stored
        projected[kind] = (SEED_SEQUENCES * UNROLL * per_step_no_core + SEED_SEQUENCES * core_bytes) / 1e9
    frame_bytes = 84 * 84
    seed_step = frame_bytes + 8 + 4 + 3  # a frame plus action, reward and flags
    out.update({
        "steps_stored": int(np.minimum(replays["raw"].count, replays["raw"].cap).sum()),
        "bytes_per_stored_step": per_step,
        "projected_gb": projected,
        "seed_layout_gb": SEED_SEQUENCES * (LENGTH * seed_step + 2 * LSTM * 4) / 1e9,
        "compression_ratio": per_step["raw"] / per_step["lz4"],
    })
    sample_us, update_us = tree_timing()
    rep = replays["lz4"]
    t0 = time.perf_counter()
    for _ in range(5):
        rows, *_ = rep.sample(64, 0.6)
    out.update({"sample_us": sample_us, "update_us": update_us,
                "gather_ms_per_batch": (time.perf_counter() - t0) / 5 * 1e3,
                "batch_obs_shape": list(rows["obs"].shape)})
    print(json.dumps(out, default=float))
    return out


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
