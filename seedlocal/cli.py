"""Command line: ``seedlocal <command> [--options]`` (also ``python -m seedlocal``)."""

from __future__ import annotations

import signal
import sys

import tyro

from seedlocal.bench import BenchConfig
from seedlocal.config import ConfigError

COMMANDS = {
    "bench": BenchConfig,
}


def _sigterm_as_exit(signum, frame):
    # Unwind like Ctrl-C so every `with`/`finally` releases processes and memory.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.extras.subcommand_cli_from_dict(
        {name: cls for name, cls in COMMANDS.items()},
        args=argv,
        prog="seedlocal",
        description="SEED RL central inference and GPU neuroevolution on one workstation.",
    )
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    try:
        if isinstance(cfg, BenchConfig):
            from seedlocal.bench import main as bench

            bench(cfg)
    except ConfigError as e:
        print(f"seedlocal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seedlocal: interrupted, stopped cleanly", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
