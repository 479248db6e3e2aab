"""Pipeline efficiency benchmark; same as ``seedlocal bench``.

    python scripts/bench_pipeline.py --env Pong-v5 --num-workers 1 --envs-per-worker 16
    python scripts/bench_pipeline.py --env CartPole-v1 --envs-per-worker 1024
    python scripts/bench_pipeline.py --env CartPole-v1 --transport-only
"""

import tyro

from seedlocal.measure import main
from seedlocal.measure.bench import BenchConfig

if __name__ == "__main__":
    main(tyro.cli(BenchConfig))
