"""scripts/gpu_suite.py, the GPU checklist: its refusal without CUDA, its step
runner (timeouts, JSON lines, the budget) and a CPU dry run of every step."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "scripts" / "gpu_suite.py"
KEYS = {"name", "command", "status", "rc", "seconds", "timeout_s", "figures", "targets", "suite_elapsed_s"}
STATUSES = {"ok", "failed", "timeout", "skipped"}


def _suite_module():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_suite"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _records(out: Path) -> list[dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        assert KEYS <= set(r), f"{r['name']}: missing {KEYS - set(r)}"
        assert r["status"] in STATUSES, r
    return records


def _run(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(SUITE), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_without_cuda_the_suite_checks_imports_then_refuses_in_one_line(tmp_path):
    # CUDA_VISIBLE_DEVICES hides any GPU, so this holds on a GPU machine too.
    r = _run(str(tmp_path), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "refused: no CUDA device" in r.stderr
    (env,) = _records(tmp_path)
    assert env["name"] == "env" and env["figures"]["cuda_available"] is False
    assert isinstance(env["figures"]["missing"], list)
    assert env["json"][-1]["versions"]["seedlocal"]  # the import checks ran, seedlocal among them
    assert "torch" in env["figures"] and "cudnn" in env["json"][-1]


def test_runner_records_each_outcome_as_one_json_line(tmp_path):
    m = _suite_module()
    py = sys.executable
    run_dir = tmp_path / "out" / "runs" / "fake"
    trainer = ("import json, pathlib, sys; d = pathlib.Path(sys.argv[1]) / 'r1'; d.mkdir(parents=True); "
               "(d / 'summary.json').write_text(json.dumps({'status': 'done', 'steps': 7, 'frames': 28, 'seconds': 2.0})); "
               "print('steps      1,000  frames/s  9  return(20) 1.0', file=sys.stderr); print('done')")
    steps = [
        m.Step("prints", lambda t: [py, "-c", "import json; print('hi'); print(json.dumps({'x': 1.5}))"], 20, 1,
               figures=lambda rec, ctx: {"x": rec["json"][-1]["x"]}, targets=[("x", ">=", 1.0)]),
        m.Step("fails", lambda t: [py, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], 20, 1),
        m.Step("hangs", lambda t: [py, "-c", "import time; time.sleep(60)"], 1.0, 0.5),
        # a shell ignores SIGTERM from its first line (a Python child's handler came after its 1.5 s on a loaded box)
        m.Step("ignores_sigterm", lambda t: ["sh", "-c", "trap '' TERM; echo up; exec sleep 60"], 1.5, 0.5),
        m.Step("trainer", lambda t: [py, "-c", trainer, str(run_dir)], 20, 1, figures=m.train_figures,
               run_dir=run_dir),
        m.Step("too_big", lambda t: [py, "-c", "pass"], 20, 1000),
    ]
    runner = m.Runner(tmp_path / "out", budget=120, grace=1.0, echo=lambda *a, **k: None)
    t0 = time.monotonic()
    try:
        for i, s in enumerate(steps):
            runner.run(s, i + 1, len(steps), steps[i + 1:], m.subprocess_env())
    finally:
        runner.close()
    assert time.monotonic() - t0 < 30
    recs = {r["name"]: r for r in _records(tmp_path / "out")}
    assert list(recs) == [s.name for s in steps]
    assert recs["prints"]["status"] == "ok" and recs["prints"]["json"] == [{"x": 1.5}]
    assert recs["prints"]["targets"] == [{"figure": "x", "target": ">= 1", "value": 1.5, "met": True}]
    assert recs["fails"]["status"] == "failed" and recs["fails"]["rc"] == 3 and "boom" in recs["fails"]["tail"]
    assert recs["hangs"]["status"] == "timeout" and recs["hangs"]["rc"] == -15  # SIGTERM was enough
    assert recs["ignores_sigterm"]["status"] == "timeout" and recs["ignores_sigterm"]["rc"] == -9  # then SIGKILL
    assert recs["ignores_sigterm"]["seconds"] < 6
    t = recs["trainer"]
    assert t["status"] == "ok" and t["summary"]["steps"] == 7 and t["figures"]["frames_per_s"] == 14
    assert t["progress"].startswith("steps      1,000")
    assert recs["too_big"]["status"] == "skipped" and recs["too_big"]["rc"] is None
    log = (tmp_path / "out" / "suite.log").read_text()
    assert "boom" in log and "==== hangs: timeout" in log


# Issue 33: with no GPU lent, the suite's steps are dry-run on the CPU, every one of them (about 90 s on 2 cores).
@pytest.mark.slow  # 13 steps' processes, 86 s of the default suite: run it before a GPU session (docs/gpu.md)
def test_cpu_dry_run_runs_every_step_and_parses_what_it_prints(tmp_path):
    listed = _run("--cpu-dry-run", "--print-steps", str(tmp_path / "unused"))
    names = [json.loads(line)["name"] for line in listed.stdout.splitlines()]
    assert names[:2] == ["env", "pytest_cuda"] and "train_ga" in names, listed.stdout
    budget = 400  # room for a loaded CI box: no step may be skipped here
    r = _run("--cpu-dry-run", "--budget", str(budget), str(tmp_path), timeout=budget + 60)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: CPU figures miss the GPU targets
    records = _records(tmp_path)
    assert [rec["name"] for rec in records] == names  # one line per step
    assert [rec["name"] for rec in records if rec["status"] != "ok"] == [], r.stdout
    assert records[-1]["suite_elapsed_s"] <= budget
    recs = {rec["name"]: rec for rec in records}
    assert recs["env"]["figures"]["missing"] == [] and recs["pytest_cuda"]["figures"]["collected"] > 0
    for rec in records:
        if rec["name"].startswith("bench_"):
            assert rec["json"] and rec["targets"][0]["value"] is not None, rec
            assert rec["targets"][0]["met"] in (True, False)
    ceiling = recs["raw_ceiling"]["figures"]  # issue 33, item 4: envpool's own best against the bench's limit
    assert ceiling["ceiling_steps_per_s"] > 0 and ceiling["bench_best_over_ceiling"] > 0
    assert {"best_steps_per_s_1t", "best_steps_per_s_2t"} <= set(ceiling)
    precision = recs["learner_precision"]["figures"]  # what decides --algo.precision auto on a GPU
    assert set(precision["learn_s"]) == {"fp32", "bf16"} and precision["fastest"] in precision["learn_s"]
    assert all(v > 0 for v in precision["learn_s"].values())
    assert recs["bench_transport"]["targets"][0]["figure"] == "transport_steps_per_s"
    assert recs["population_forward"]["figures"]["forward_steps_per_s"] > 0
    pop_argv = shlex.split(recs["population_train"]["command"])  # its generations, whatever the time (issue 44)
    assert recs["population_train"]["figures"]["ga_generations"] == int(pop_argv[pop_argv.index("--generations") + 1])
    learners = recs["population_learners"]["figures"]  # issue 46: P learners in one run against one
    assert learners["members"] == 2 and learners["population_over_single"] > 0
    for algo in ("vtrace", "r2d2", "ga"):
        t = recs[f"train_{algo}"]
        assert t["summary"]["status"] == "done" and t["summary"]["algo"] == algo, t
        assert t["figures"]["frames_per_s"] > 0 and t["figures"]["over_raw"] > 0, t["figures"]
    ga = recs["train_ga"]
    assert ga["progress"].startswith("gen") and ga["figures"]["generations"] >= 1
    assert ga["figures"]["population"] == ga["summary"]["population"] >= 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "suite.log"]  # run folders pruned
    assert "==== summary" in r.stdout


def test_the_dry_run_bounds_its_runs_by_work_not_by_seconds(tmp_path):
    """Issue 44, item 1: the dry run's population_train ran for 2 seconds and its test asked for a generation; under
    two pytest processes it made none. Every run the dry run's test counts the work of ends at a work bound."""
    import argparse

    suite = _suite_module()
    a = argparse.Namespace(curve=False, peer=False, cpu_dry_run=True, env="", bench_args="", curve_target=18.0)
    steps = {s.name: s for s in suite.build_steps(a, tmp_path)}

    def value(cmd, flag):
        return float(cmd[cmd.index(flag) + 1])

    pop = steps["population_train"].argv(60.0)
    assert value(pop, "--generations") >= 2 and value(pop, "--seconds") == 0  # the first one is left out of its rate
    for algo, flag in (("vtrace", "--total-steps"), ("r2d2", "--total-steps"), ("ga", "--generations")):
        assert value(steps[f"train_{algo}"].argv(60.0), flag) > 0, algo


def test_bench_population_runs_the_generations_asked_with_no_time_budget():
    """What population_train's figures come from: --generations N runs N generations, no more, no fewer,
    however long they take (--seconds 0: no time budget)."""
    spec = importlib.util.spec_from_file_location("bench_population", ROOT / "scripts" / "bench_population.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_population"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    import torch

    a = bench.Args(part="train", algos=("ga",), population=8, generations=2, seconds=0.0, raw_seconds=0.05,
                   num_workers=1, envs_per_worker=8, device="cpu")
    (out,) = bench.train_part(a, torch.device("cpu"))
    assert out["generations"] == 2 and out["eval_frames_per_s"] > 0, out


def test_the_gpu_curve_is_the_command_a_user_types(tmp_path):
    """Issue 33: the suite's Pong curve is `seedlocal train vtrace --env.id Pong-v5` with only a time budget and a
    log folder added: the preset and its machine sizing are picked by themselves, not given."""
    import argparse

    suite = _suite_module()
    a = argparse.Namespace(curve=True, cpu_dry_run=False, env="", curve_seconds=300.0, curve_target=18.0)
    step = next(s for s in suite.build_steps(a, tmp_path) if s.name == "curve_train")
    cmd = step.argv(400.0)
    i = cmd.index("train")
    assert cmd[i:i + 4] == ["train", "vtrace", "--env.id", "Pong-v5"]
    assert [c for c in cmd[i + 4:] if c.startswith("--")] == ["--seconds", "--log-dir"], cmd


def test_the_trainers_frames_per_s_are_compared_with_raw_envpool_on_the_same_box(tmp_path):
    """Issue 33's throughput targets: each trainer's frames/s over bench_model's raw envpool frames/s."""
    import argparse

    suite = _suite_module()
    a = argparse.Namespace(curve=False, peer=False, cpu_dry_run=False, env="", bench_args="", curve_target=18.0)
    steps = {s.name: s for s in suite.build_steps(a, tmp_path)}
    assert "raw_ceiling" in steps and "--raw-ceiling" in steps["raw_ceiling"].argv(100)
    ctx = {"bench_model": {"json": [{"raw_best_steps_per_s": 20_000.0, "frames_per_step": 4}]}}
    rec = {"summary": {"status": "done", "frames": 3_000_000, "seconds": 60.0, "population": 256}}
    f = steps["train_ga"].figures(rec, ctx)
    assert f["frames_per_s"] == 50_000 and f["raw_best_frames_per_s"] == 80_000 and f["over_raw"] == 0.625
    assert f["population"] == 256
    assert {t[0] for t in steps["train_vtrace"].targets} == {"over_raw", "frames_per_s"}
    assert steps["train_r2d2"].targets == [("over_raw", ">=", 0.5)]


def test_the_peer_is_cleanrls_script_for_the_curves_seconds(tmp_path):
    import argparse

    suite = _suite_module()
    a = argparse.Namespace(curve=False, peer=True, cpu_dry_run=False, env="", curve_seconds=240.0, curve_target=18.0)
    steps = suite.build_steps(a, tmp_path)
    assert [s.name for s in steps] == ["env", "peer_cleanrl"]
    cmd = steps[1].argv(400.0)
    assert cmd[1] == "scripts/peer_cleanrl_atari.py" and cmd[cmd.index("--seconds") + 1] == "240"
    assert cmd[cmd.index("--") + 1:] == ["--env-id", "Pong-v5"]  # CleanRL's own defaults otherwise


def test_the_peer_without_cleanrls_script_says_how_to_get_it(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_cleanrl_atari.py"), "--seconds", "5",
                        "--script", str(tmp_path / "absent.py")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "scripts/peer_cleanrl_prepare.sh" in r.stderr


def test_the_peer_shim_gives_envpool_1x_pools_the_old_gym_api():
    """What CleanRL's script calls, on a real envpool pool through the shim: reset -> observations,
    step -> four values, gym.Wrapper passing calls and attributes through, gym.spaces = Gymnasium's."""
    import envpool
    import numpy as np

    spec = importlib.util.spec_from_file_location("peer_cleanrl_atari", ROOT / "scripts" / "peer_cleanrl_atari.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    make = envpool.make
    saved_gym = sys.modules.get("gym")
    try:
        peer.install_shim()
        import gym

        env = envpool.make("CartPole-v1", env_type="gym", num_envs=3)
        wrapped = gym.Wrapper(env)
        obs = wrapped.reset()
        assert obs.shape == (3, 4)
        out = wrapped.step(np.zeros(3, int))
        assert len(out) == 4 and out[2].dtype == bool and "env_id" in out[3]
        assert isinstance(wrapped.action_space, gym.spaces.Discrete)
        env.num_envs = 3  # the script sets attributes on the pool
        assert wrapped.num_envs == 3
        gymnasium_pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2)
        assert len(gymnasium_pool.step(np.zeros(2, int))) == 5  # other env types untouched
    finally:
        envpool.make = make
        if saved_gym is None:
            sys.modules.pop("gym", None)
        else:
            sys.modules["gym"] = saved_gym


def test_the_peer_reads_cleanrls_console_lines():
    spec = importlib.util.spec_from_file_location("peer_cleanrl_atari", ROOT / "scripts" / "peer_cleanrl_atari.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    import io

    watch = peer.Watch(io.StringIO(), frames_per_step=4, target=18.0, t0=time.monotonic())
    for i in range(25):
        watch.write(f"global_step={1000 * (i + 1)}, episodic_return={-21 if i < 5 else 19}\n")
    watch.write("SPS: 1")
    watch.write("234\n")
    r = watch.result("done")
    assert r["sps"] == 1234 and r["frames_per_s"] == 4936 and r["games"] == 25
    assert r["return_mean20"] == 19 and r["frames"] == 100_000
    assert r["reached_target_frames"] == 4 * 25_000  # 20 games of 19 first at the 25th
