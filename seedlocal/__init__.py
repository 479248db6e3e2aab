"""seedlocal: SEED-RL-style central inference and GPU neuroevolution on one workstation.

From Python (README, "From Python"):

    import seedlocal

    summary = seedlocal.train("vtrace", total_steps=30_000)   # -> seedlocal.Summary
    result = seedlocal.evaluate(summary.run_dir, episodes=5)  # -> seedlocal.Evaluation

Refusals and failures raise ``seedlocal.SeedlocalError``. Importing seedlocal
loads nothing heavy: torch loads with the first call.
"""

__version__ = "0.1.0"
__all__ = ["train", "run_config", "evaluate", "Summary", "Evaluation", "SeedlocalError", "ConfigError"]


def __getattr__(name: str):
    # Loaded on first use: `import seedlocal` stays as quick as the command line's first line.
    if name in ("train", "run_config", "Summary"):
        from seedlocal import api

        return getattr(api, name)
    if name in ("evaluate", "Evaluation"):
        import importlib

        module = importlib.import_module("seedlocal.evaluate")  # callable: seedlocal.evaluate(checkpoint, ...)
        return module if name == "evaluate" else module.Evaluation
    if name in ("SeedlocalError", "ConfigError"):
        from seedlocal import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'seedlocal' has no attribute {name!r}")
