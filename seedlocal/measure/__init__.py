"""Measurement: what the pipeline costs on this machine, as ratios taken in one run (``seedlocal bench``: ``main``;
its files are listed in docs/architecture.md)."""

from __future__ import annotations


def main(cfg) -> dict:
    """Run the mode ``cfg`` asks for; its result is also the last line printed, as JSON."""
    import json

    import torch

    from seedlocal.measure.autotune import autotune
    from seedlocal.measure.bench import check, run, run_ceiling
    from seedlocal.measure.bridge import run_bridge_bench

    torch.set_num_threads(1)
    spec, pipe_cfg = check(cfg)
    if cfg.autotune:
        result = autotune(cfg, spec)
    elif cfg.raw_ceiling:
        result = run_ceiling(cfg, spec, pipe_cfg)
    elif cfg.bridge:
        result = run_bridge_bench(cfg, pipe_cfg.num_workers, pipe_cfg.envs_per_worker)
    else:
        result = run(cfg, spec, pipe_cfg)
    print(json.dumps(result, default=float))
    return result
