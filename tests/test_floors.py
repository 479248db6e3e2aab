"""The house's floors: every module under seedlocal/ imports only from its own
floor or below, imports inside functions included. docs/architecture.md draws
the same list; a new module must be given a floor here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "seedlocal"

# Lowest first. A unit is a top-level module or a folder.
FLOORS = [
    ["spec", "errors", "dtypes", "arithmetic", "normalize"],  # the words and the arithmetic every floor shares
    ["checkpoint", "networks", "shm", "config"],  # files, networks, shared memory, the config's schema and checks
    ["shape", "monitor", "tracking", "algos", "envs"],  # the pipeline's sizes, TensorBoard, W&B, each algorithm's
    # math, the env backends
    ["pipeline"],  # every process and every wait
    ["policies", "video"],  # how the inference loop acts; frames of an episode
    ["trainers"],  # one run's life and each trainer on it
    ["measure", "evaluate", "families"],  # seedlocal bench, seedlocal eval, the table of algorithm families
    ["cli", "__main__", "api"],  # the commands, and the same from Python (seedlocal.train)
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}

# Imports that go up, each with why it is still here. The list only shrinks (checked below).
UPWARD: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "seedlocal"


def _imports() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, where) for every import of seedlocal code, at any depth."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        unit = rel.parts[1] if len(rel.parts) > 1 else "seedlocal"
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "seedlocal":
                names = ([f"seedlocal.{a.name}" for a in node.names] if node.module == "seedlocal"
                         else [node.module])
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "seedlocal"]
            out += [(unit, _unit(n), f"{path.relative_to(PACKAGE.parent)}:{node.lineno}") for n in names]
    return out


def test_every_module_has_a_floor():
    units = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.iterdir()
             if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())} - {"__init__"}
    assert units <= set(FLOOR), f"give these a floor in tests/test_floors.py: {sorted(units - set(FLOOR))}"


def test_no_module_imports_from_a_floor_above_its_own():
    upward = [(a, b, where) for a, b, where in _imports()
              if b in FLOOR and FLOOR[b] > FLOOR.get(a, len(FLOORS)) and (a, b) not in UPWARD]
    assert not upward, "imports from a higher floor:\n" + "\n".join(f"  {w}: {a} -> {b}" for a, b, w in upward)


def test_the_list_of_upward_imports_only_shrinks():
    found = {(a, b) for a, b, _ in _imports() if b in FLOOR and FLOOR[b] > FLOOR.get(a, len(FLOORS))}
    assert set(UPWARD) <= found, f"no longer imported upward, take them off UPWARD: {sorted(set(UPWARD) - found)}"


@pytest.mark.parametrize("line, expected", [
    ("from seedlocal.envs.spaces import describe", ("envs",)),
    ("import seedlocal.trainers.run", ("trainers",)),
    ("from seedlocal import checkpoint, video", ("checkpoint", "video")),
])
def test_the_checker_reads_every_form_of_import(line, expected, tmp_path, monkeypatch):
    """The checker itself: each import form names the unit imported (inside a function too)."""
    pkg = tmp_path / "seedlocal"
    (pkg / "algos").mkdir(parents=True)
    (pkg / "algos" / "x.py").write_text(f"def f():\n    {line}\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    assert tuple(b for _, b, _ in _imports()) == expected
