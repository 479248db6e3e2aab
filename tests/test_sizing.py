"""Sized to the machine (issue 33, item 1): a preset's sizes follow the machine's cores and whether the run's
device is a GPU (each recipe's ``sizing`` rule, applied by ``prepare``); what the user gives still wins, and what
follows from it is derived again (issue 44, item 8). No test here starts an env or needs a GPU."""

from __future__ import annotations

import dataclasses
import os

import pytest

from seedlocal.config.checks import usable_cores
from seedlocal.config.machine import Machine
from seedlocal.config.request import Request
from seedlocal.config.resume import config_changes
from seedlocal.families import TABLE, recipe
from seedlocal.prepare import prepare

CPU2, CPU16 = Machine(2, False), Machine(16, False)
GPU8, GPU16, GPU64 = Machine(8, True), Machine(16, True), Machine(64, True)


def _sized(name: str, preset: str, machine: Machine, **options):
    """The run ``seedlocal train <name> --preset <preset>`` with ``options`` prepares on ``machine``."""
    return prepare(Request(options, preset=preset), recipe(name), machine)


def _changes(name: str, preset: str, machine: Machine) -> dict:
    before = recipe(name).presets[preset]
    return {c.split(":")[0]: c.split(" -> ")[1] for c in config_changes(before, _sized(name, preset, machine).config)}


@pytest.mark.parametrize("machine", [CPU2, CPU16], ids=str)
def test_a_cpu_machine_keeps_every_preset(machine):
    """On a CPU the learner is the bottleneck (docs/tuning.md), and the 2-core presets' README curves were
    measured at their sizes: every preset of every family comes out equal to itself. A 16-core CPU without a
    GPU keeps them too: no CPU-only many-core run has been measured, so there is no sizing to give it."""
    for name in TABLE:
        for preset, cfg in recipe(name).presets.items():
            assert _sized(name, preset, machine).config == cfg, (name, preset)


VTRACE_ATARI = {
    GPU8: {"pipeline.num_workers": "2", "pipeline.envs_per_worker": "32", "algo.batch_size": "64",
           "algo.lr_decay": "False", "total_steps": "5000000"},  # minibatches 64 // 16 = 4, the preset's
    # issue 33's H200 run, the one measured sizing
    GPU16: {"pipeline.num_workers": "4", "pipeline.envs_per_worker": "32", "algo.batch_size": "128",
            "algo.minibatches": "8", "algo.lr_decay": "False", "total_steps": "5000000"},
    GPU64: {"pipeline.num_workers": "16", "pipeline.envs_per_worker": "32", "algo.batch_size": "512",
            "algo.minibatches": "32", "algo.lr_decay": "False", "total_steps": "5000000"},
}
EXPECTED = {
    ("vtrace", "atari"): VTRACE_ATARI,
    ("r2d2", "atari"): {m: {"pipeline.num_workers": str(m.cores // 2), "pipeline.min_batch_envs": str(4 * m.cores),
                            "algo.batch_size": "64"} for m in (GPU8, GPU16, GPU64)},
    ("ga", "atari"): {GPU8: {"algo.population_size": "256"},
                      GPU16: {"pipeline.num_workers": "4", "algo.population_size": "256"},
                      GPU64: {"pipeline.num_workers": "16", "algo.population_size": "512"}},
    # actors run ahead on a GPU (issue 33's rule, met by the 2-core MinAtar curves); sizes unchanged
    ("vtrace", "minatar"): {m: {"algo.sync": "'off'"} for m in (GPU8, GPU16, GPU64)},
    # never run on a GPU: unchanged
    ("vtrace", "mujoco"): {}, ("vtrace", "cartpole"): {},
}


@pytest.mark.parametrize("machine", [CPU2, GPU8, CPU16, GPU16, GPU64], ids=str)
@pytest.mark.parametrize("name,preset", list(EXPECTED), ids="-".join)
def test_the_sizing_of_each_preset(name, preset, machine):
    assert _changes(name, preset, machine) == EXPECTED[name, preset].get(machine, {})


def test_ars_on_image_frames_keeps_its_preset_on_a_gpu():
    """ARS's population is two sides of each direction, not an option: a GPU machine's sizing of Atari frames
    leaves its preset as docs/tuning.md says (it was a TypeError traceback: the sizing set a population size)."""
    pong = {"env.id": "Pong-v5"}
    assert _sized("ars", None, GPU16, **pong).config == _sized("ars", None, CPU16, **pong).config


@pytest.mark.parametrize("machine", [CPU2, GPU8, GPU16, GPU64, Machine(3, True), Machine(1000, True)], ids=str)
def test_every_sized_preset_keeps_a_valid_shape(machine):
    """Preparation builds and checks the sized run's shape and the family's checks (a V-trace batch of whole
    groups, R2D2's evaluation envs, a valid population) on every machine."""
    for name in TABLE:
        for preset in recipe(name).presets:
            _sized(name, preset, machine)


def test_remote_envs_stay_whole_workers():
    """bridge.remote_envs must be a multiple of a worker's envs: where the sized workers' 32 do not divide it,
    the preset's 16 stay (and the workers are counted in them)."""
    for remote, per_worker, workers in ((64, 32, 4), (48, 16, 8)):
        sized = _sized("vtrace", "atari", GPU16, **{"bridge.listen": ":1", "bridge.remote_envs": remote}).config
        assert (sized.pipeline.envs_per_worker, sized.pipeline.num_workers) == (per_worker, workers)


def test_a_size_given_is_kept_and_what_follows_from_it_is_derived_again():
    """Issue 44, item 8: ``--pipeline.num-workers 1`` on a sized GPU run kept the sized batch of 128 over its
    32 envs. The batch (all local envs) and its minibatches (16 unrolls each) follow the size that holds."""
    cfg = _sized("vtrace", "atari", GPU16, **{"pipeline.num_workers": 1}).config
    assert (cfg.pipeline.num_workers, cfg.pipeline.envs_per_worker, cfg.algo.batch_size, cfg.algo.minibatches) == (
        1, 32, 32, 2)
    # Workers of the 32 envs given fill the machine's 128; the min batch (the preset's 8, of the 32 envs given)
    # grows with them.
    cfg = _sized("r2d2", "atari", GPU16, **{"pipeline.envs_per_worker": 32}).config
    assert (cfg.pipeline.num_workers, cfg.pipeline.envs_per_worker, cfg.pipeline.min_batch_envs) == (4, 32, 32)
    cfg = _sized("vtrace", "atari", GPU16, **{"pipeline.num_workers": 4, "pipeline.envs_per_worker": 32}).config
    assert cfg.algo.batch_size == 16  # every size given: the machine sizes nothing, the preset's batch holds


def test_sizing_reads_the_env_given_not_the_presets():
    """Issue 44, item 8: the Atari preset run on a MinAtar game is sized as a MinAtar run (actors ahead on a GPU,
    no Atari widening), not as the preset's own Pong."""
    cfg = _sized("vtrace", "atari", GPU16, **{"env.id": "MinAtar/Breakout-v1", "env.frame_stack": 0,
                                              "frame_stack": 0, "network.encoder": "minatar"}).config
    preset = recipe("vtrace").presets["atari"]
    assert (cfg.algo.sync, cfg.pipeline.num_workers, cfg.algo.batch_size) == ("off", preset.pipeline.num_workers,
                                                                            preset.algo.batch_size)


def test_a_pipeline_file_is_given_options_and_its_device_is_the_one_sized_for(tmp_path, monkeypatch):
    """Issue 44, item 8: ``--pipeline-config`` was applied after sizing, and sizing read the preset's device.
    Its fields are given options (beneath the command line's): the machine sizes none of them (every size is
    given), the batch follows them (whole groups of its 12), and the machine is the one its device names."""
    import json

    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps({"pipeline": {"num_workers": 2, "envs_per_worker": 24, "device": "cuda"}}))
    asked = []
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, device: asked.append(device) or GPU16))
    import seedlocal.config.checks as checks

    monkeypatch.setattr(checks, "resolve_device", lambda value, field="device": __import__("torch").device("cpu"))
    prepared = prepare(Request({}, preset="atari", pipeline_config=str(path)), recipe("vtrace"))
    cfg = prepared.config
    assert asked == ["cuda"]
    assert (cfg.pipeline.num_workers, cfg.pipeline.envs_per_worker, cfg.algo.batch_size) == (2, 24, 24)
    assert "seedlocal: algo.batch_size 16 -> 24, to fit its groups" in prepared.notes, prepared.notes
    assert not any("sized for this machine" in n for n in prepared.notes), prepared.notes


def test_the_machine_is_read_from_this_process_and_the_device(monkeypatch):
    import os

    import seedlocal.config.checks as checks

    assert usable_cores() == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    assert Machine.detect("cpu") == Machine(usable_cores(), False)
    monkeypatch.setattr(checks, "resolve_device", lambda value, field="device": __import__("torch").device("cuda"))
    assert Machine.detect("auto").accelerator
    monkeypatch.undo()
    # CUDA asked for on a machine without it: no GPU to size for (validation names the device later).
    assert Machine.detect("cuda:99") == Machine(usable_cores(), False)


# -- the command line ------------------------------------------------------------------------------------------

@pytest.fixture
def gpu16(monkeypatch):
    """A 16-core GPU machine, as far as sizing sees (the checks see this machine's CPU)."""
    import seedlocal.config.checks as checks

    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, device: GPU16))
    monkeypatch.setattr(checks, "resolve_device", lambda value, field="device": __import__("torch").device("cpu"))


def _parse(args: list[str]):
    from seedlocal.cli import _parse

    return _parse(["train", *args])[1].config

def test_threads_count_the_cores_this_process_may_use(monkeypatch):
    """A run confined to one core of a 64-core machine (taskset, a container's or a batch system's cpuset): its
    envpool threads, its learners' torch threads and the thread limit count that core, not os.cpu_count()'s 64
    (64 OpenMP threads of a learner on one core wait on each other)."""
    import torch

    from seedlocal.errors import ConfigError
    from seedlocal.trainers.r2d2 import R2D2Trainer
    from seedlocal.trainers.vtrace import VTraceTrainer

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert _sized("vtrace", "atari", CPU16).shape.threads_per_group == 1
    assert VTraceTrainer(_sized("vtrace", "atari", CPU16), torch.device("cpu")).learner_threads() == 1
    assert R2D2Trainer(_sized("r2d2", "atari", CPU16), torch.device("cpu")).learner_threads() == 1
    with pytest.raises(ConfigError, match=r"pipeline.env_threads=9: more than 8 per core of the 1 this process"):
        _sized("vtrace", "cartpole", CPU16, **{"pipeline.env_threads": 9})


def test_the_cli_sizes_the_preset_and_says_so_in_one_line(gpu16, capsys):
    cfg = _parse(["vtrace", "--preset", "atari"])
    assert (cfg.pipeline.num_workers, cfg.pipeline.envs_per_worker, cfg.algo.batch_size, cfg.algo.minibatches) == (
        4, 32, 128, 8)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "sized for this machine" in ln]
    assert lines == ["seedlocal: sized for this machine (16 cores, cuda): pipeline.num_workers 1 -> 4, "
                     "pipeline.envs_per_worker 16 -> 32, total_steps 2500000 -> 5000000, algo.batch_size 16 -> 128, "
                     "algo.lr_decay True -> False, algo.minibatches 4 -> 8; --no-machine-sizing keeps the preset's"]


def test_the_cli_sizes_the_preset_an_env_picks(gpu16, capsys):
    cfg = _parse(["r2d2", "--env.id", "Breakout-v5"])
    assert (cfg.pipeline.num_workers, cfg.algo.batch_size) == (8, 64)


def test_options_given_win_over_the_sizing(gpu16, capsys):
    cfg = _parse(["vtrace", "--preset", "atari", "--algo.batch-size", "32", "--algo.lr-decay", "--total-steps",
                  "100"])
    assert (cfg.algo.batch_size, cfg.algo.lr_decay, cfg.total_steps, cfg.pipeline.num_workers) == (32, True, 100, 4)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "sized for this machine" in ln)
    assert "batch_size" not in line and "lr_decay" not in line and "total_steps" not in line, line


def test_no_machine_sizing_keeps_the_preset(gpu16, capsys):
    cfg = _parse(["vtrace", "--preset", "atari", "--no-machine-sizing"])
    assert cfg == recipe("vtrace").presets["atari"]
    assert "sized for" not in capsys.readouterr().out


def test_a_remote_envs_option_keeps_the_presets_workers_and_says_so(gpu16, capsys):
    cfg = _parse(["vtrace", "--preset", "atari", "--bridge.listen", ":5555", "--bridge.remote-envs", "48"])
    assert (cfg.pipeline.envs_per_worker, cfg.pipeline.num_workers, cfg.bridge.remote_envs) == (16, 8, 48)
    assert ("(workers of the preset's size, so that --bridge.remote-envs 48 makes whole ones; without it "
            "pipeline.num_workers 8 -> 4, pipeline.envs_per_worker 16 -> 32)") in capsys.readouterr().out


def test_a_resumed_run_keeps_its_saved_sizes(gpu16, tmp_path, capsys):
    from seedlocal import checkpoint

    saved = recipe("vtrace").presets["atari"]
    run = tmp_path / "run"
    checkpoint.save(run, {"identity": {"algo": "vtrace"}, "config": dataclasses.asdict(saved),
                          "counters": {"steps": 10}}, 10, 40)
    cfg = _parse(["vtrace", "--resume", str(run)])
    assert (cfg.pipeline.num_workers, cfg.pipeline.envs_per_worker, cfg.algo.batch_size) == (1, 16, 16)
    assert "sized for" not in capsys.readouterr().out
