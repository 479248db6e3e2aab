"""One preparation (issue 45): the command line and the Python API make the same request, tyro parses the options
once, a run's shape is built once, and no module outside preparation's home describes an env, sizes a machine
or builds a shape."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from seedlocal.config.request import Request, from_command_line, from_keywords, is_given

PACKAGE = Path(__file__).parent.parent / "seedlocal"


def test_the_command_line_and_keywords_make_the_same_request():
    from seedlocal.recipes.vtrace import VTraceRun

    cli = from_command_line("vtrace", VTraceRun, [
        "--env.id", "Pong-v5", "--preset", "atari", "--no-machine-sizing", "--pipeline.num-workers", "1",
        "--algo.no-normalize-advantages", "--total-steps", "1e6", "--network.hidden", "32", "32"])
    api = from_keywords(VTraceRun, dict(
        env={"id": "Pong-v5"}, preset="atari", machine_sizing=False, pipeline={"num_workers": 1},
        algo={"normalize_advantages": False}, total_steps=1_000_000, network={"hidden": (32, 32)}))
    assert cli == api == Request({
        "env.id": "Pong-v5", "pipeline.num_workers": 1, "algo.normalize_advantages": False, "total_steps": 1_000_000,
        "network.hidden": (32, 32)}, preset="atari", machine_sizing=False)


def test_an_option_given_is_told_from_its_default_even_with_the_default_value():
    """The machine's sizes yield to what the user gave, also a value equal to the preset's (``--pipeline.num-workers
    1`` is the Atari preset's own): tyro returns values, so the request tells given from default by parsing twice."""
    from seedlocal.recipes.vtrace import VTraceRun

    r = from_command_line("vtrace", VTraceRun, ["--pipeline.num-workers", "2", "--algo.learning-rate", "nan",
                                                 "--env.backend", "auto", "--pipeline.no-cuda-graphs"])
    assert set(r.options) == {"pipeline.num_workers", "algo.learning_rate", "env.backend", "pipeline.cuda_graphs"}
    given = is_given(r.options)
    assert given("pipeline") and given("pipeline.num_workers") and not given("pipeline.envs_per_worker")
    assert from_command_line("vtrace", VTraceRun, []) == Request({})


@pytest.mark.parametrize("name, budget, counters, refused", [
    ("vtrace", {"total_steps": 5}, {"steps": 5}, "total_steps=5: the resumed run already has 5 steps"),
    ("ga", {"generations": 3}, {"generation": 3}, "generations=3: the resumed run already has 3 generations"),
    ("es", {"generations": 0, "total_frames": 10}, {"frames": 12}, "total_frames=10: the resumed run already has 12"),
    ("r2d2", {"total_steps": 5}, {"steps": 4}, None), ("ars", {"generations": 3}, {"generation": 2}, None)])
def test_a_resume_needs_budget_left(name, budget, counters, refused):
    """Each family's budgets (``RunConfig.budgets``) against the counters its checkpoint holds; 0 is no budget."""
    from seedlocal.config.overrides import apply
    from seedlocal.errors import ConfigError
    from seedlocal.families import recipe
    from seedlocal.prepare import Resumed, _check_resume

    cfg = apply(recipe(name).run(), budget)
    if refused is None:
        _check_resume(cfg, Resumed("run", None, counters))
    else:
        with pytest.raises(ConfigError, match=refused):
            _check_resume(cfg, Resumed("run", None, counters))


def test_an_old_spelling_is_said_once_and_taken(capsys):
    from seedlocal.recipes.vtrace import VTraceRun

    r = from_command_line("vtrace", VTraceRun, ["--algo.hidden", "16", "--algo.no-obs-norm"])
    assert dict(r.options) == {"network.hidden": (16,), "network.obs_norm": False}
    err = capsys.readouterr().err
    assert "--algo.hidden is now --network.hidden" in err and "--algo.no-obs-norm is now --network.no-obs-norm" in err


def _count_builds(monkeypatch) -> list:
    """Every call of the shape's builder from any module that imported it (by name or through the module)."""
    import seedlocal.shape as shape

    builds, original = [], shape.pipeline_shape

    def counted(*args, **kwargs):
        builds.append(kwargs.get("rank", 0))
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("seedlocal") and getattr(module, "pipeline_shape", None) \
                is original:
            monkeypatch.setattr(module, "pipeline_shape", counted)
    return builds


def test_a_run_builds_its_shape_once(tmp_path, monkeypatch):
    """``pipeline_shape`` ran about 5 times a run (the command line, each trainer's validate and config methods,
    the trainer, the pipeline). A real training run from the Python API now builds it once, in preparation."""
    import seedlocal
    import seedlocal.prepare  # noqa: F401  (imported before counting, as the run would)
    import seedlocal.trainers.vtrace  # noqa: F401

    builds = _count_builds(monkeypatch)
    summary = seedlocal.train("vtrace", total_steps=600, log_dir=str(tmp_path), progress=False)
    assert summary.steps >= 600
    assert builds == [0], builds


def _calls(path: Path, names: set[str]) -> list[str]:
    """Calls of ``names`` in a module: a function by its name (``describe(...)``, ``shape.pipeline_shape(...)``),
    ``Machine.detect``; not a method of the same name on something else (a trainer's ``describe()``, its first
    line's words)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            name = f.id
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in (
                "Machine", "shape", "spaces", "prepare", "recipes"):
            name = f.attr
        else:
            continue
        if name in names:
            out.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}: {name}")
    return out


# Preparation's home: the preparation itself, the families' rules it applies, and the definers of what it calls.
HOME = {"prepare.py", "recipes/__init__.py", "recipes/vtrace.py", "recipes/r2d2.py", "recipes/neuroevolution.py",
        "shape.py", "envs/spaces.py", "config/machine.py"}


def test_no_module_outside_preparation_describes_an_env_sizes_a_machine_or_builds_a_shape():
    names = {"describe", "validate_env", "pipeline_shape", "sized_pipeline", "detect", "kind_of"}
    found = [c for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).as_posix() not in HOME
             for c in _calls(path, names)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("spec = describe(env_id)", 1), ("shape = pipeline_shape(p)", 1), ("m = Machine.detect('cpu')", 1),
    ("k = kind_of(spec)", 1), ("line = t.describe()", 0),
])
def test_the_home_checker_sees_each_call(source, expected, tmp_path, monkeypatch):
    import test_prepare

    pkg = tmp_path / "seedlocal"
    pkg.mkdir()
    (pkg / "probe.py").write_text(source + "\n")
    monkeypatch.setattr(test_prepare, "PACKAGE", pkg)
    assert len(_calls(pkg / "probe.py", {"describe", "pipeline_shape", "detect", "kind_of"})) == expected
