"""seedlocal: SEED-RL-style central inference and GPU neuroevolution on one workstation.

From Python (README, "From Python"; ``api.py``): ``seedlocal.train("vtrace", total_steps=30_000) -> Summary``,
``seedlocal.evaluate(summary.run_dir, episodes=5) -> Evaluation``; refusals and failures raise
``seedlocal.SeedlocalError``. Importing seedlocal loads nothing heavy: torch loads with the first call.
"""

__version__ = "0.1.0"
__all__ = ["train", "run_config", "evaluate", "Summary", "Evaluation", "SeedlocalError", "ConfigError"]


_HOMES = {"train": "api", "run_config": "api", "Summary": "api", "evaluate": "evaluate", "Evaluation": "evaluate",
          "SeedlocalError": "errors", "ConfigError": "errors"}


def __getattr__(name: str):
    # Loaded on first use: `import seedlocal` stays as quick as the command line's first line.
    if name not in _HOMES:
        raise AttributeError(f"module 'seedlocal' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"seedlocal.{_HOMES[name]}")
    return module if name == "evaluate" else getattr(module, name)  # the module is callable: evaluate.py's end
