import os
import subprocess
import sys

import pytest
import torch

from seedlocal.errors import ConfigError
from seedlocal.config.schema import EnvConfig, PipelineConfig
from seedlocal.config.checks import validate_pipeline
from seedlocal.envs.spaces import validate_env
from seedlocal.policies import RandomPolicy


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_workers", 0, r"pipeline.num_workers=0: must be positive"),
        ("envs_per_worker", -4, r"pipeline.envs_per_worker=-4: must be positive"),
        ("envs_per_worker", 7, r"pipeline.envs_per_worker=7: must be even"),
        ("unroll_length", 0, r"pipeline.unroll_length=0: must be positive"),
        ("num_buffers", 1, r"pipeline.num_buffers=1: needs at least one unroll per group"),
        ("batch_timeout_ms", -1.0, r"pipeline.batch_timeout_ms=-1.0"),
        ("device", "tpu", r"pipeline.device='tpu'"),
    ],
)
def test_bad_pipeline_values_name_the_field(field, value, message):
    """Sizes are checked where the shape is made, the rest by validate_pipeline: a run does both."""
    from seedlocal.shape import pipeline_shape

    cfg = PipelineConfig(**{field: value})
    with pytest.raises(ConfigError, match=message):
        validate_pipeline(cfg)
        pipeline_shape(cfg)


def test_cuda_graphs_on_a_cpu_device_are_refused():
    with pytest.raises(ConfigError, match=r"pipeline.cuda_graphs=True: needs a CUDA device \(pipeline.device='cpu' is cpu\)"):
        validate_pipeline(PipelineConfig(device="cpu", cuda_graphs=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_cuda_is_refused():
    with pytest.raises(ConfigError, match=r"pipeline.device='cuda': CUDA is not available"):
        validate_pipeline(PipelineConfig(device="cuda"))


def test_unknown_env_id():
    with pytest.raises(ConfigError, match=r"env.id='NoSuchGame-v9': not an envpool id nor a registered Gymnasium id"):
        validate_env(EnvConfig(id="NoSuchGame-v9"))


def test_pipeline_refuses_before_starting_anything():
    from helpers import open_pipeline

    with pytest.raises(ConfigError, match="envs_per_worker=3"):
        open_pipeline(EnvConfig(), PipelineConfig(envs_per_worker=3), RandomPolicy)


def test_cli_module_loads_nothing_heavy():
    """The CLI catches Ctrl-C only once its module is loaded: torch (seconds to
    import) must load inside main, where an interrupt ends in one line."""
    code = "import sys, seedlocal.cli; print(sorted(m for m in ('torch', 'numpy', 'envpool') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_whole_numbers_in_e_notation_are_taken_for_integer_options(capsys):
    """`--total-steps 1e6`, as CleanRL's and SB3's users write step counts, was refused with tyro's box about
    int(): a whole number in e-notation is now read as one, for every integer option, nested ones included."""
    from seedlocal.cli import _parse

    v = _parse(["train", "vtrace", "--total-steps", "1e6", "--pipeline.num-workers=2E0", "--run-name", "1e6"])[1].config
    assert (v.total_steps, v.pipeline.num_workers, v.run_name) == (1_000_000, 2, "1e6")  # a name stays a name
    ga = _parse(["train", "ga", "--total-frames", "2.5e7", "--algo.population-size", "6.4e1"])[1].config
    assert (ga.total_frames, ga.algo.population_size) == (25_000_000, 64)
    _, b = _parse(["bench", "--envs-per-worker", "6.4e1", "--seconds", "1e0"])
    assert (b.envs_per_worker, b.seconds) == (64, 1.0)
    with pytest.raises(SystemExit) as e:  # not a whole number: tyro's own refusal, as before
        _parse(["train", "vtrace", "--env.seed", "1.5e0"])
    assert e.value.code == 2 and "--env.seed" in capsys.readouterr().err


def test_cli_is_quiet_and_errors_are_one_line(tmp_path, capsys):
    """A short run prints no Gymnasium float32 warnings (one per worker start
    before), and a corrupt checkpoint's error is one line with no torch advice."""
    from seedlocal.cli import main

    base = ["train", "vtrace", "--log-dir", str(tmp_path), "--no-progress"]
    # Its own interpreter: warnings are shown once per process, and pytest's filters would hide them here.
    out = subprocess.run([sys.executable, "-m", "seedlocal", *base, "--run-name", "q", "--total-steps", "1500"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "precision lowered" not in out.stderr and "Warning" not in out.stderr, out.stderr
    ckpt = sorted((tmp_path / "q" / "checkpoints").glob("ckpt_*.pt"))[-1]
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    assert main(base + ["--resume", str(ckpt), "--total-steps", "3000"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedlocal: error:") and "truncated or corrupt" in lines[0], lines
    assert "weights_only" not in err


@pytest.mark.parametrize("argv, message", [
    (["train", "vtrace", "--algo.learning-rate", "nan"], "algo.learning_rate=nan: must be a finite number"),
    (["train", "vtrace", "--seconds", "inf", "--total-steps", "0"], "seconds=inf: must be a finite number"),
    (["train", "es", "--algo.sigma", "inf"], "algo.sigma=inf: must be a finite number"),
    (["train", "vtrace", "--network.hidden", "-5"], "network.hidden=(-5,): MLP hidden sizes must be positive"),
    (["train", "vtrace", "--algo.proximal", "batch"], "algo.proximal='batch': keeps the clipped surrogate near"),
    (["train", "ga", "--network.hidden", "0"], "network.hidden=(0,): MLP hidden sizes must be positive"),
    (["train", "vtrace", "--algo.rmsprop-alpha", "5"], "algo.rmsprop_alpha=5.0: must be in (0, 1)"),
    (["train", "r2d2", "--algo.adam-eps", "0"], "algo.adam_eps=0.0: must be positive"),
    (["train", "r2d2", "--algo.learning-rate", "0", "--algo.replay-ratio", "-1"],
     "algo.learning_rate=0.0: must be positive"),  # named one field and showed the other's value
    (["train", "vtrace", "--run-name", "../escape"], "run_name='../escape': must be a folder name"),
    (["train", "vtrace", "--log-every-s", "0"], "log_every_s=0.0: must be positive"),
    (["bench", "--warmup", "-1"], "bench.warmup=-1.0: must be >= 0"),
    (["eval", "--checkpoint", "nowhere", "--max-steps", "0"], "max_steps=0: must be positive"),
    (["train", "vtrace", "--pipeline.env-threads", "100000"], "pipeline.env_threads=100000: more than 8 per core"),
    (["train", "r2d2", "--pipeline.learner-threads", "100000"], "pipeline.learner_threads=100000: more than 8"),
    (["train", "r2d2", "--algo.max-grad-norm", "-1"], "algo.max_grad_norm=-1.0: must be >= 0"),
    (["train", "vtrace", "--pipeline.max-restarts", "-1"], "pipeline.max_restarts=-1: must be >= 0"),
    (["train", "ga", "--pipeline.restart-window-s", "-1"], "pipeline.restart_window_s=-1.0: must be >= 0"),
    (["train", "ga", "--pipeline.stall-s", "0"], "pipeline.stall_s=0.0: must be positive"),
    (["train", "vtrace", "--log-dir", ""], "log_dir='': must name a folder"),
    (["train", "es", "--run-name", "x" * 300], "is 300 bytes long"),
    (["train", "vtrace", "--bridge.token-file", "/nonexistent"],
     "bridge.token_file='/nonexistent': needs bridge.listen"),
    (["train", "vtrace", "--bridge.listen", ":50071", "--bridge.remote-envs", "8",
      "--bridge.token-file", "/nonexistent"], "bridge.token_file='/nonexistent': cannot read it"),
    (["bench", "--bridge-delay-ms", "5"], "bench.bridge_delay_ms=5.0: only with --bridge"),
    (["bench", "--transport-only", "--learning"], "bench.transport_only measures the pipeline without envs or "
                                                  "model: drop --learning"),  # dropped --learning in silence
    (["bench", "--frame-stack", "-1"], "bench.frame_stack=-1: must be >= 0"),  # was named env.frame_stack
    (["actors", "--connect", "127.0.0.1:50999", "--retry-s", "nan"], "retry_s=nan: must be >= 0 and finite"),
    (["actors", "--connect", "127.0.0.1:50999", "--answer-timeout-s", "1"], "answer_timeout_s=1.0: must be at "
     "least 2 s (a learner says it lives each 1 s) and finite"),  # shorter than ALIVE's rhythm drops live learners
    (["train", "vtrace", "--bridge.listen", ":50071", "--bridge.remote-envs", "8", "--bridge.handshakes-per-peer",
      "0"], "bridge.handshakes_per_peer=0: must be >= 1: an actor host needs one"),
    (["train", "vtrace", "--bridge.handshakes-per-peer", "3"], "bridge.handshakes_per_peer=3: needs bridge.listen"),
    (["train", "vtrace", "--bridge.listen", "0.0.0.0:50071", "--bridge.remote-envs", "8"],
     "bridge.listen='0.0.0.0:50071': beyond loopback without TLS the bridge can be read and altered on the way: "
     "give bridge.tls_cert and bridge.tls_key, or pass --bridge.insecure if this network is trusted"),
    (["actors", "--connect", "192.0.2.1:50999"], "connect='192.0.2.1:50999': beyond loopback without TLS the "
     "bridge can be read and altered on the way: pass --tls-ca (the CA of the learner's --bridge.tls-cert), or "
     "--insecure if this network is trusted"),
    (["bench", "--envs-per-worker", "3"], "bench.envs_per_worker=3: must be even"),
    (["bench", "--env", "Nope-v0"], "bench.env='Nope-v0': not an envpool id"),
    (["bench", "--device", "cuda:7"], "bench.device='cuda:7'"),
    (["bench", "--seconds", "0"], "bench.seconds=0.0: must be positive"),
    (["bench", "--device", "cpu", "--cuda-graphs"], "bench.cuda_graphs=True: needs a CUDA device"),
    (["train", "ga", "--algo.truncation", "80"], "algo.truncation=80: must be <= algo.population_size (64)"),
    (["train", "es", "--algo.population-size", "7"], "algo.population_size=7: must be even"),
    (["train", "es", "--algo.sigma", "0"], "algo.sigma=0.0"),
    (["train", "ga", "--algo.sigma", "-1"], "algo.sigma=-1.0"),
    (["train", "es", "--forward", "loop"], "forward='loop': expected one of auto, bmm, mulsum, vmap for a mlp network"),
    (["train", "vtrace", "--env.seed", "-1"], "env.seed=-1: must be >= 0"),  # was said after the run's first line
    (["train", "ga", "--env.seed", "-1"], "env.seed=-1: must be >= 0"),
])
def test_values_that_would_fail_mid_run_are_refused_first(argv, message, tmp_path, capsys, monkeypatch):
    """Values that used to crash a run (NaN, inf, empty or negative layer
    sizes) or write outside the log folder get one line naming the field,
    and nothing is created."""
    from seedlocal.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    text = capsys.readouterr().err
    err = text.strip().splitlines()
    assert err and err[-1].startswith("seedlocal: error:") and message in err[-1], err
    assert [line for line in err if line.startswith("seedlocal: error:")] == [err[-1]] and "Traceback" not in text
    assert not list(tmp_path.iterdir())  # no runs/ folder for a refused config


@pytest.mark.parametrize("argv, option", [(["train", "vtrace", "--preset", "--log-dir", "x"], "--preset"),
                                          (["train", "ga", "--pipeline-config", "--log-dir", "x"], "--pipeline-config")])
def test_the_commands_own_options_are_parsed_with_the_rest(argv, option, tmp_path, capsys, monkeypatch):
    """--preset and --pipeline-config are options of the train command that tyro parses with the run's (no scan
    of the command line beside it): one without its value is tyro's refusal, naming it, status 2."""
    from seedlocal.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and option in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_misspelled_algorithm_gets_the_one_meant(capsys):
    from seedlocal.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "vtrase"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "seedlocal: error: train needs an algorithm (vtrace, r2d2, ga, es, ars, random-search), got vtrase "
        "(did you mean vtrace?)")


def test_a_log_dir_that_is_a_file_is_refused(tmp_path, capsys):
    from seedlocal.cli import main

    blocker = tmp_path / "afile"
    blocker.write_text("")
    assert main(["train", "ga", "--log-dir", str(blocker)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["train", "vtrace", "--log-dir", str(blocker / "sub")]) == 2
    assert "cannot be created" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--pipeline.num-workers", "100"], "100 env workers (~100 MB each)"),
    (["--pipeline.unroll-length", "10000000"], "an unroll store of 4 unrolls x 10,000,001 steps x 4 envs"),
    (["--env.seed", "2147483640"], "env.seed=2147483640: envpool seeds are int32, and this run uses 16 seeds"),
])
def test_sizes_the_machine_cannot_hold_are_refused_before_workers_start(argv, message, tmp_path, capsys,
                                                                       monkeypatch):
    """Memory (workers, unroll store; here against 8 GB available, whatever
    this machine has) and seed ranges are checked once the store's layout is
    known, before any worker process or segment exists; the refused run frees
    its folder, so the same name runs at once with sane values."""
    from conftest import seedlocal_segments
    from seedlocal.cli import main
    from seedlocal.config import checks

    monkeypatch.setattr(checks, "available_bytes", lambda: 8e9)
    base = ["train", "vtrace", "--log-dir", str(tmp_path), "--run-name", "big", "--no-progress"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("seedlocal: error:") and message in err[-1], err
    # This process's segments (the refusal runs here): another run on the machine may hold its own.
    assert not seedlocal_segments(os.getpid()) and not (tmp_path / "big").exists()  # no empty run for TensorBoard
    assert main(base + ["--total-steps", "500"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["vtrace", "--network.hidden", "100000", "100000"], "network.hidden, network.lstm_size: the network has 20,001,"),
    (["r2d2", "--network.lstm-size", "200000"], "network.hidden, network.lstm_size: the network has 240,"),
    (["ga", "--network.hidden", "100000", "100000"], "network.hidden: the network has 10,000,"),
])
def test_networks_the_machine_cannot_hold_are_refused_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    """Counted on the meta device, before anything is allocated: torch's own
    failure is a traceback from inside its allocator."""
    from seedlocal.config import checks
    from seedlocal.cli import main

    monkeypatch.setattr(checks, "available_bytes", lambda: 8e9)
    assert main(["train", *argv, "--log-dir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("seedlocal: error: " + message) and "make it smaller" in err[0], err
    assert not list(tmp_path.iterdir())


def test_gymnasium_envs_take_seeds_beyond_int32(tmp_path):
    from seedlocal.cli import main

    assert main(["train", "vtrace", "--env.backend", "gymnasium", "--env.seed", "3000000000", "--total-steps", "500",
                 "--log-dir", str(tmp_path), "--no-progress"]) == 0


def test_precision_means_one_arithmetic_per_device():
    """auto: tf32 on CUDA (cuDNN's convolutions are TF32 by torch's default;
    the matmuls now match), bf16 CNNs only on CPUs with native bf16; fp32 on
    CUDA turns TF32 off for convolutions too; tf32 on a CPU is fp32."""
    import torch

    from seedlocal.arithmetic import apply_precision, cpu_has_bf16_matmul, resolve_precision

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_precision("auto", "nature", cuda) == "tf32" == resolve_precision("auto", "mlp", cuda)
    assert resolve_precision("auto", "mlp", cpu) == "fp32"
    assert resolve_precision("auto", "nature", cpu) == ("bf16" if cpu_has_bf16_matmul() else "fp32")
    assert resolve_precision("tf32", "nature", cpu) == "fp32"
    with pytest.raises(ValueError, match="precision='fp16'"):
        resolve_precision("fp16", "mlp", cpu)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        apply_precision("fp32", cuda)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        apply_precision("tf32", cuda)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        apply_precision("fp32", cpu)  # a CPU run leaves the CUDA flags alone
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("argv, preset", [
    (["train", "vtrace", "--env.id", "Hopper-v5"], "mujoco"),
    (["train", "vtrace", "--env.id", "box_envs:EchoAction-v0"], "mujoco"),
    (["train", "vtrace", "--env.id", "image_catch:ImageCatch-v0"], "atari"),
    (["train", "vtrace", "--env.id", "Acrobot-v1"], "cartpole"),
    (["train", "vtrace", "--env.id", "grid_envs:BoolGrid-v0"], "minatar"),  # a small 0/1 grid, like MinAtar's
    (["train", "r2d2", "--env.id", "grid_envs:BoolGrid-v0"], "minatar"),
    (["train", "vtrace", "--env.id", "gfootball/academy_corner-v1"], "football"),
    (["train", "r2d2", "--env.id", "gfootball/academy_corner-v1"], "cartpole"),  # R2D2 has no football preset
    (["train", "vtrace", "--env.id", "Hopper-v5", "--preset", "cartpole"], "cartpole"),
    (["train", "r2d2", "--env.id", "Breakout-v5"], "atari"),
    # The Atari presets' envpool single frames do not fit a Gymnasium image env: it keeps its own frames.
    (["train", "r2d2", "--env.id", "image_catch:ImageCatch-v0"], "atari"),
    (["train", "vtrace", "--env.id", "image_catch:ImageCatch1-v0"], "atari"),
    (["train", "es", "--env.id", "Hopper-v5"], "mujoco"),
    (["train", "ars", "--env.id", "InvertedPendulum-v5"], "mujoco"),
    (["train", "ga", "--env.id", "image_catch:ImageCatch-v0"], "atari"),  # Uber's Atari settings, any image env
    (["train", "es", "--env.id", "Breakout-v5"], "atari"),
    (["train", "es", "--env.id", "grid_envs:BoolGrid-v0"], "minatar"),
    (["train", "random-search", "--env.id", "Hopper-v5"], "cartpole"),  # nor random search a MuJoCo one
])
def test_without_a_preset_the_env_kind_picks_one(argv, preset, capsys, monkeypatch):
    """A new task of a kind seedlocal has a preset for starts from that
    preset (a MuJoCo body from the MuJoCo preset, not CartPole's settings),
    said in one line; an explicit --preset always wins; the chosen preset's
    other fields arrive intact while --env.id stays the user's (on a 2-core
    CPU, so that a GPU box's sizing, tests/test_sizing.py, leaves them as they are)."""
    from seedlocal.cli import _parse
    from seedlocal.config.machine import Machine

    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, device: Machine(2, False)))
    from seedlocal.recipes import neuroevolution as ne
    from seedlocal.recipes.r2d2 import PRESETS as R2D2
    from seedlocal.recipes.vtrace import PRESETS as VTRACE

    cfg = _parse(argv)[1].config
    presets = {"vtrace": VTRACE, "r2d2": R2D2, "ga": ne.GA_PRESETS, "es": ne.ES_PRESETS, "ars": ne.ARS_PRESETS,
               "random-search": ne.RANDOM_SEARCH_PRESETS}[argv[1]]
    expected = presets[preset]
    env_id = argv[argv.index("--env.id") + 1]
    assert cfg.env.id == env_id
    assert cfg.algo == expected.algo and cfg.pipeline == expected.pipeline
    if env_id.startswith("image_catch:"):  # envpool's --env.frame-stack is not for a Gymnasium env
        single = env_id.endswith("ImageCatch1-v0")  # (1, 84, 84) frames: stacked beside the network
        assert cfg.env.frame_stack == 0 and getattr(cfg, "frame_stack", 0) == (4 if single else 0), cfg
    said = capsys.readouterr().out
    chosen = "--preset" not in argv  # a preset picked by itself is named, CartPole's defaults too
    assert (f"seedlocal: --preset {preset}, {'the plain defaults' if preset == 'cartpole' else 'made for'}"
            in said) == chosen, said


def test_an_unknown_env_without_a_preset_is_still_named_by_validation(tmp_path, capsys, monkeypatch):
    from seedlocal.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "vtrace", "--env.id", "Hoper-v5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("seedlocal: error: env.id='Hoper-v5'") and "Hopper-v5" in err[-1], err


@pytest.mark.parametrize("trainer", ["vtrace", "r2d2", "es", "ga", "ars", "random-search"])
def test_every_preset_passes_its_trainers_validation(trainer, tmp_path):
    """A preset is a config a new user runs as it is: each must pass the
    checks its trainer makes before any process starts (on its own env)."""
    import dataclasses
    import importlib.util

    from helpers import prepared
    from seedlocal.families import recipe

    for name, cfg in recipe(trainer).presets.items():
        if cfg.env.id.startswith("MinAtar/") and importlib.util.find_spec("minatar") is None:
            continue
        prepared(dataclasses.replace(cfg, log_dir=str(tmp_path)))
