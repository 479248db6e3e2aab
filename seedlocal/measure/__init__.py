"""Measurement: what the pipeline costs on this machine, as ratios taken in one run (``seedlocal bench``: ``main``;
its files are listed in docs/architecture.md)."""

from __future__ import annotations


def main(cfg) -> dict:
    import torch

    from seedlocal.measure.bench import check, run

    torch.set_num_threads(1)
    spec, pipe_cfg = check(cfg)
    if cfg.autotune:
        from seedlocal.measure.autotune import autotune

        return autotune(cfg, spec)
    if cfg.raw_ceiling:
        from seedlocal.measure.bench import run_ceiling

        return run_ceiling(cfg, spec, pipe_cfg)
    if cfg.bridge:
        from seedlocal.measure.bridge import run_bridge_bench

        return run_bridge_bench(cfg, pipe_cfg.num_workers, pipe_cfg.envs_per_worker)
    return run(cfg, spec, pipe_cfg)
