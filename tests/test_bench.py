"""Smoke tests of the benchmark's modes through the CLI: tiny sizes, short runs.

No wall-clock figure is asserted (these machines are shared): only that each
mode measures what it says and reports it with the documented keys. Each
measurement is a time window, and a loaded machine may step nothing in one of
the pipeline's: its rates are asserted >= 0, never > 0. What is bounded by work
is asserted: a raw envpool rate measures one step at least (``measure/raw.py``),
and a pipeline's warm-up lasts until its first batch.
"""

import contextlib
import io
import json

import pytest

from seedlocal import checkpoint
from seedlocal.cli import main

FAST = ["--seconds", "0.3", "--warmup", "0.2", "--rounds", "1"]


def bench(*args: str) -> tuple[dict, str]:
    """``seedlocal bench ARGS`` in this process (what the CLI runs, without a
    second interpreter's start-up): its JSON line and its printed table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", *args])
    assert code == 0, out.getvalue()[-3000:]
    return json.loads(out.getvalue().strip().splitlines()[-1]), out.getvalue()


def test_ratios_divide_by_the_best_raw_configuration():
    r, text = bench("--env", "CartPole-v1", "--envs-per-worker", "64", *FAST)
    raws = [r["raw_sync_steps_per_s"], r["raw_async_half_steps_per_s"], r["raw_two_groups_steps_per_s"]]
    assert all(v > 0 for v in raws)
    assert r["raw_best_steps_per_s"] == max(raws)
    # One round: the ratio is exactly that round's pipeline rate over its best raw rate.
    assert abs(r["ratio_random"] - r["random_policy_steps_per_s"] / r["raw_best_steps_per_s"]) < 1e-6
    assert r["ratio_model"] is not None and "training's network" in text


def test_learning_mode_runs_the_vtrace_learner():
    r, text = bench("--env", "CartPole-v1", "--learning", "--skip-model", *FAST)
    assert r["num_workers"] == 2 and r["envs_per_worker"] == 8  # the CartPole training preset's sizes
    assert r["learning_steps_per_s"] >= 0 and r["learning_detail"]["updates_per_s"] >= 0
    assert abs(r["ratio_learning"] - r["learning_steps_per_s"] / r["raw_best_steps_per_s"]) < 1e-6
    # The run is time-boxed: on a loaded box it can end before its workers step or its first full interval. Its
    # ratio is then 0.0 (it was None, and the subtraction above failed) and it may have no wait share to give.
    share = r["learning_detail"]["learner_wait_share"]
    assert share is None or 0.0 <= share <= 1.0
    assert "V-trace learner" in text
    assert r["learning_detail"]["batch_size"] == 4 and r["learning_detail"]["batch_size_why"] == "the preset's 4"


def test_learning_mode_sizes_its_batch_from_the_envs_it_is_given():
    """CartPole's preset learns from batches of 4 envs; 64 envs a worker make groups of 32, which the
    learner's batch must be whole groups of (it refused with algo.batch_size, which bench has no flag for)."""
    r, text = bench("--env", "CartPole-v1", "--num-workers", "1", "--envs-per-worker", "64", "--learning",
                    "--skip-model", *FAST)
    detail = r["learning_detail"]
    assert detail["batch_size"] == 32 and r["learning_steps_per_s"] >= 0, detail
    assert "1 whole group(s) of 32 envs" in detail["batch_size_why"] and detail["batch_size_why"] in text


def test_autotune_writes_settings_that_train_loads(tmp_path):
    out = tmp_path / "pipe.json"
    r, text = bench("--env", "CartPole-v1", "--autotune", "--pipeline-out", str(out), *FAST)
    assert {"num_workers", "envs_per_worker", "min_batch_envs", "ratio_random"} <= set(r)
    assert r["num_workers"] * r["envs_per_worker"] == 16  # the preset's env count, spread differently
    assert r["candidates"] >= 3 and r["ratio_random"] >= 0
    saved = json.loads(out.read_text())["pipeline"]
    assert saved == {k: r[k] for k in ("num_workers", "envs_per_worker", "min_batch_envs")}
    group = r["envs_per_worker"] // 2
    # As a new user runs it: the default batch is kept a multiple of whatever group size was chosen.
    assert main(["train", "vtrace", "--pipeline-config", str(out), "--total-steps", "1500", "--log-dir", str(tmp_path),
                 "--run-name", "t", "--no-progress"]) == 0
    cfg = checkpoint.load(tmp_path / "t")["config"]
    assert {k: cfg["pipeline"][k] for k in saved} == saved
    assert cfg["algo"]["batch_size"] % group == 0


def test_the_learning_bench_batch_is_whole_groups_and_enough_unrolls_for_an_lstms_minibatches():
    from seedlocal.algos.vtrace import VTraceParams
    from seedlocal.config.schema import PipelineConfig
    from seedlocal.measure.bench import learning_batch
    from seedlocal.shape import pipeline_shape

    pipe = pipeline_shape(PipelineConfig(num_workers=2, envs_per_worker=4))  # 4 groups of 2 envs
    assert learning_batch(VTraceParams(batch_size=4), pipe)[0] == 4  # the preset's own: whole groups
    assert learning_batch(VTraceParams(batch_size=5, minibatches=8), pipe)[0] == 4  # the nearest whole groups
    assert learning_batch(VTraceParams(batch_size=5, minibatches=8), pipe, lstm_size=16)[0] == 8  # 8 unrolls


def test_raw_ceiling_sweeps_envpools_own_settings_at_each_thread_count():
    from seedlocal.measure.raw import ceiling_grid

    r, text = bench("--env", "CartPole-v1", "--raw-ceiling", "--env-threads", "2", "--envs-per-worker", "16",
                    "--seconds", "0.05", "--warmup", "0.02")
    assert [p["threads"] for p in r["per_threads"]] == [1, 2]
    for p in r["per_threads"]:
        # Every setting of envpool's recipe at that thread count measured, best first.
        assert len(p["rows"]) == len(ceiling_grid(p["threads"]))
        assert p["best"] == max(p["rows"], key=lambda row: row["steps_per_s"])
        assert all(row["threads"] == p["threads"] for row in p["rows"])
        assert abs(p["bench_best_over_ceiling"] - max(p["bench_kinds"].values()) / p["best"]["steps_per_s"]) < 1e-9
    # One thread: the two half pools would run two threads, so they are not compared there.
    assert "two_groups" not in r["per_threads"][0]["bench_kinds"]
    assert "two_groups" in r["per_threads"][1]["bench_kinds"]
    assert r["ceiling_steps_per_s"] == r["per_threads"][-1]["best"]["steps_per_s"]
    assert "scaling from 1 to 2 threads" in text


def test_raw_ceiling_measures_only_the_thread_counts_asked(capsys):
    r, text = bench("--env", "CartPole-v1", "--raw-ceiling", "--ceiling-threads", "2", "--env-threads", "2",
                    "--envs-per-worker", "8", "--seconds", "0.05", "--warmup", "0.02")
    assert [p["threads"] for p in r["per_threads"]] == [2]
    assert r["ceiling_steps_per_s"] == r["per_threads"][0]["best"]["steps_per_s"] > 0
    assert r["scaling_efficiency"] is None and "scaling from" not in text  # one count: nothing to scale from
    assert main(["bench", "--env", "CartPole-v1", "--ceiling-threads", "2"]) == 2
    assert "bench.ceiling_threads=(2,): only with --raw-ceiling" in capsys.readouterr().err
    assert main(["bench", "--env", "CartPole-v1", "--raw-ceiling", "--ceiling-threads", "0"]) == 2
    assert "every thread count must be positive" in capsys.readouterr().err


def test_raw_ceiling_refuses_the_modes_that_measure_the_pipeline(capsys):
    code = main(["bench", "--env", "CartPole-v1", "--raw-ceiling", "--transport-only"])
    assert code == 2
    assert "drop --transport-only" in capsys.readouterr().err


@pytest.mark.slow  # 16 s: three Pong benches; the training-network row below runs single Pong frames by default
def test_frame_stack_sets_what_raw_envpool_and_the_transport_carry():
    """Issue 33, item 3: the transport's cost per batch with single Atari frames against envpool's stack of 4."""
    one, text = bench("--env", "Pong-v5", "--transport-only", "--envs-per-worker", "4", *FAST)  # as training
    four, _ = bench("--env", "Pong-v5", "--transport-only", "--frame-stack", "4", "--envs-per-worker", "4", *FAST)
    assert one["frame_stack"] == 1 and one["obs_bytes_per_env"] * 4 == four["obs_bytes_per_env"] == 4 * 84 * 84
    assert one["transport_steps_per_s"] >= 0
    raw, _ = bench("--env", "Pong-v5", "--raw-ceiling", "--frame-stack", "1", "--env-threads", "1",
                   "--envs-per-worker", "2", "--seconds", "0.05", "--warmup", "0.02")
    assert raw["ceiling_steps_per_s"] > 0


def test_frame_stack_is_refused_where_the_env_must_be_trainings(capsys):
    assert main(["bench", "--env", "Pong-v5", "--learning", "--frame-stack", "4"]) == 2
    err = capsys.readouterr().err
    assert "bench.frame_stack=4" in err and "as training does: 1" in err


def test_the_training_network_row_stacks_single_atari_frames_as_training_does():
    """The model row acts with training's network on training's frames: single Pong frames, stacked 4 deep
    beside the Nature CNN (a network built for 4 channels fed 1 would fail at its first batch)."""
    r, text = bench("--env", "Pong-v5", "--envs-per-worker", "2", "--num-workers", "1", "--env-threads", "1",
                    "--rounds", "1", "--seconds", "0.3", "--warmup", "0.2")
    # It acted: the warm-up lasts until a first batch, where a network built for 4 channels fed 1 would fail.
    assert r["frame_stack"] == 1 and r["ratio_model"] is not None and r["ratio_model"] >= 0, text
