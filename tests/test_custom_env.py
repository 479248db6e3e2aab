"""A user's own Gymnasium env, by its ``module:EnvId`` id, through the CLI:
train (worker processes import the module), eval, and clear errors."""

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def seedlocal(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "seedlocal", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=TESTS.parent)


def test_readme_example_is_this_env():
    readme = (TESTS.parent / "README.md").read_text()
    block = re.search(r"```python\n(# corridor\.py.*?)```", readme, re.S)
    assert block, "README lacks the corridor.py example"
    example = block.group(1).splitlines()[1:]
    source = [l for l in (TESTS / "corridor.py").read_text().splitlines()
              if l and not l.startswith(('"""', "with it", "walk right"))]
    assert [l for l in example if l] == source


def test_train_and_eval_a_custom_env_by_module_id(tmp_path):
    out = seedlocal("train", "vtrace", "--env.id", "corridor:Corridor-v0", "--total-steps", "30000",
                    "--stop-at-return", "0.9", "--log-dir", str(tmp_path), "--run-name", "c", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    ev = seedlocal("eval", "--checkpoint", str(tmp_path / "c"), "--episodes", "4")
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "corridor:Corridor-v0: 4 episodes" in ev.stdout


def test_a_module_that_cannot_be_imported_or_registers_nothing_is_named():
    out = seedlocal("train", "vtrace", "--env.id", "no_such_module:Thing-v0")
    assert out.returncode == 2
    assert "env.id='no_such_module:Thing-v0': cannot import module 'no_such_module'" in out.stderr
    out = seedlocal("train", "vtrace", "--env.id", "corridor:Other-v0")
    assert out.returncode == 2
    assert "did not register 'Other-v0'" in out.stderr
