"""What each rank of tests/test_distributed.py's gloo groups runs: ``python tests/dist_ranks.py RANK WORLD PORT OUT
[DEVICE BACKEND]``, one interpreter a rank, as seedlocal's launcher and torchrun start them (``ranks()`` below),
ending as a seedlocal rank does (``cli.exit_now``).

Ranks that ended with the interpreter's teardown sometimes died of SIGABRT ("terminate called without an active
exception") after writing their results, destroying their group and running the exit handlers (faulthandler: no
Python frame): 3 pairs in 120 under torch.multiprocessing.spawn, and started as commands, 1 fixture in a CI run
whose two pytest processes loaded both cores. exit_now skips that teardown. (Beside two busy loops, 40 pairs ended
by exit_now and about 35 ended by the teardown all ended cleanly: the rate is too low to show the difference.)"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from datetime import timedelta

import numpy as np
import torch

L, B = 9, 4  # a batch of 4 unrolls of 8 steps (+ the bootstrap row); the 2 ranks take 2 unrolls each


def batch() -> dict:
    """A CartPole-shaped batch with auto-reset rows, so that the two halves hold different numbers of valid rows."""
    g = torch.Generator().manual_seed(0)
    ignored = torch.zeros(L, B, dtype=torch.bool)
    ignored[3, 0] = ignored[5, 0] = ignored[2, 1] = True  # the first half: 3 ignored rows, the second: none
    terminated = torch.zeros(L, B, dtype=torch.bool)
    terminated[2, 0] = terminated[4, 0] = terminated[1, 1] = True
    return {"obs": {"": torch.randn(L, B, 4, generator=g)}, "action": torch.randint(0, 2, (L, B), generator=g),
            "reward": torch.rand(L, B, generator=g), "terminated": terminated, "ignored": ignored,
            "behaviour_logits": torch.randn(L, B, 2, generator=g), "core_state": None}


def half(b: dict, rank: int, world: int) -> dict:
    cols = slice(rank * B // world, (rank + 1) * B // world)
    return {k: ({kk: vv[:, cols] for kk, vv in v.items()} if isinstance(v, dict) else
                None if v is None else v[:, cols]) for k, v in b.items()}


def model_and_params(normalize: bool):
    from seedlocal.algos.vtrace import VTraceParams
    from seedlocal.config.schema import EnvConfig
    from seedlocal.envs.spaces import validate_env
    from seedlocal.networks import ActorCritic

    spec = validate_env(EnvConfig(id="CartPole-v1"))
    torch.manual_seed(0)
    model = ActorCritic(spec, obs_norm=True)
    p = VTraceParams(echo=1, minibatches=1, clip=0.2, learning_rate=1e-2, max_grad_norm=0.5,
                     normalize_advantages=normalize)
    return model, p


def to(b: dict, device: str) -> dict:
    return {k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else
                None if v is None else v.to(device)) for k, v in b.items()}


def step(b: dict, normalize: bool, ranks=None, device: str = "cpu"):
    """One production learner step (algos/vtrace.learner_step) from the same start; the parameters after it."""
    from seedlocal.algos.vtrace import learner_step, make_optimizer

    model, p = model_and_params(normalize)
    model, b = copy.deepcopy(model).to(device), to(b, device)
    if ranks is not None and ranks.rank:
        torch.nn.init.normal_(next(model.parameters()))  # rank 1 starts elsewhere: the broadcast must fix it
    if ranks is not None:
        ranks.broadcast_(model)
    learner_step(model, make_optimizer(model.parameters(), p), b, p, ranks=ranks)
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def statistics(b: dict, pool=None) -> dict:
    """Observation statistics and the reward scaler's, after one batch (two batches: the merge path too)."""
    from seedlocal.normalize import RewardScaler, RunningNorm

    norm = RunningNorm(4)
    obs = b["obs"][""]
    norm.update(obs[:4].reshape(-1, 4), pool=pool)
    norm.update(obs[4:].reshape(-1, 4), pool=pool)
    width = b["reward"].shape[1]
    scaler = RewardScaler(width, 0.99)
    for rows in (slice(0, 4), slice(4, L)):
        scaler.update(b["reward"][rows].numpy(), b["terminated"][rows].numpy(), np.arange(width),
                      ~b["ignored"][rows].numpy(), pool=pool)
    return {"obs_count": float(norm.count), "obs_mean": norm.mean.clone(), "obs_var": norm.var.clone(),
            "reward": (scaler.count, scaler.mean, scaler.var)}


def rank_main(rank: int, world: int, port: int, out: str, device: str = "cpu", backend: str = "gloo") -> None:
    """One rank: a data-parallel step on its half of the batch, pooled statistics, written to ``out``; on
    ``device`` (cuda: rank r on GPU r, wrapping round) over ``backend``."""
    import torch.distributed as dist

    from seedlocal.pipeline.ranks import Ranks, scalar_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    ranks = Ranks(rank, world, rank, 60.0, "cuda" if backend == "nccl" else "cpu",
                  scalars=scalar_group(backend, timedelta(seconds=60)))  # as ranks.join makes them
    try:
        b, mine = batch(), half(batch(), rank, world)
        adv = torch.randn(L - 1, B, generator=torch.Generator().manual_seed(1))
        valid = ~b["ignored"][:L - 1]
        mean, std = ranks.masked_moments(half({"a": adv}, rank, world)["a"], half({"v": valid}, rank, world)["v"])
        result = {"plain": step(mine, False, ranks, device), "normalized": step(mine, True, ranks, device),
                  "adv_moments": (float(mean), float(std)), "stats": statistics(mine, ranks.pool_moments),
                  # a split population's scores: rank r sends r values (rank 0 none), then none at all
                  "gather": ranks.gather([rank + 0.5] * rank), "gather_none": ranks.gather([]),
                  "part": [list(ranks.part(n)) for n in (1, 5, 64)]}
        torch.save(result, f"{out}/rank{rank}.pt")
    finally:
        ranks.close()


def ranks(world: int, port: int, out: str, device: str = "cpu", backend: str = "gloo", timeout: float = 180) -> list:
    """Run ``world`` ranks of ``rank_main`` as processes of their own; what each wrote to ``out``."""
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(world), str(port), out, device, backend],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, text) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{text[-3000:]}"
    return [torch.load(f"{out}/rank{r}.pt", weights_only=False) for r in range(world)]


if __name__ == "__main__":
    from seedlocal.cli import exit_now

    rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    exit_now(0)  # as a seedlocal rank ends (see the module's docstring)
