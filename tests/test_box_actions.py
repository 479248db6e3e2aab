"""Box action spaces of any shape: the networks emit flat vectors, the
pipeline stores, ships and scores them flat, and the env receives its own
shape (``faulty_envs.BoxShaped`` raises on any other), in training under
every algorithm, in eval and through the bridge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seedlocal.cli import main
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.evaluate import EvalConfig
from seedlocal.evaluate import main as evaluate

ENVS = {"faulty_envs:BoxShaped-v0": (2, 3), "faulty_envs:BoxScalar-v0": ()}
BUDGETS = {"vtrace": ["--total-steps", "400", "--preset", "cartpole"], "ga": ["--generations", "2"], "es": ["--generations", "2"],
           "ars": ["--generations", "2"], "random-search": ["--generations", "2"]}


def test_the_pipeline_acts_flat_and_the_env_keeps_its_shape():
    for env_id, shape in ENVS.items():
        spec = validate_env(EnvConfig(id=env_id))
        assert spec.box_shape == shape and spec.action.shape == (int(np.prod(shape)),)


@pytest.mark.parametrize("env_id", list(ENVS))
def test_every_algorithm_trains_and_evals_in_a_shaped_box(env_id, tmp_path, capsys):
    for algo, budget in BUDGETS.items():
        assert main(["train", algo, "--env.id", env_id, *budget, "--log-dir", str(tmp_path),
                     "--run-name", algo, "--no-progress"]) == 0, capsys.readouterr().err
        summary = json.loads((tmp_path / algo / "summary.json").read_text())
        assert summary.get("steps", summary.get("frames", 0)) > 0, summary
        scored = evaluate(EvalConfig(checkpoint=str(tmp_path / algo), episodes=2, max_steps=50))
        # BoxShaped's reward is minus the mean distance to a target in [-0.5, 0.5]: in [-1.5, 0] a step.
        assert all(-30 <= r <= 0 for r in scored["returns"]), (algo, scored)


def test_a_shaped_box_acts_through_the_bridge(tmp_path):
    """ES with every env on an actor host: flat actions on the wire, the
    host's env gets its (2, 3) shape, and the run ends on its budget."""
    from test_bridge import actors, finish, free_port

    from seedlocal.config.schema import BridgeConfig, PipelineConfig
    from seedlocal.trainers.neuroevolution import ESRun, train

    port = free_port()
    host = actors(port, "--allow-module", "faulty_envs", "--retry-s", "60")
    try:
        cfg = ESRun(env=EnvConfig(id="faulty_envs:BoxShaped-v0"),
                    pipeline=PipelineConfig(num_workers=0, envs_per_worker=8, unroll_length=8),
                    bridge=BridgeConfig(listen=f"127.0.0.1:{port}", remote_envs=16),
                    generations=2, log_dir=str(tmp_path), run_name="es", progress=False)
        summary = train(cfg)
    finally:
        out = finish(host)
    assert summary["generations"] == 2 and summary["frames"] > 0, summary
    assert host.returncode == 0 and "AssertionError" not in out, out
