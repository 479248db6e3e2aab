"""The house's floors: every module under seedlocal/ imports only from its own
floor or below, imports inside functions included, and no modules import each
other in a circle. docs/architecture.md draws the same list (checked here); a
new module must be given a floor here and there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "seedlocal"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# Lowest first. A unit is a top-level module or a folder.
FLOORS = [
    ["spec", "errors", "dtypes", "arithmetic", "normalize"],  # the words and the arithmetic every floor shares
    ["checkpoint", "networks", "shm", "config"],  # files, networks, shared memory, the config's schema and checks
    ["shape", "monitor", "tracking", "algos", "envs"],  # the pipeline's sizes, TensorBoard, W&B, each algorithm's
    # math, the env backends
    ["pipeline"],  # every process and every wait
    ["policies", "video", "recipes", "prepare"],  # how the inference loop acts; frames of an episode; each family's
    # options, presets and rules, and the one preparation of a run
    ["trainers"],  # one run's life and each trainer on it
    ["measure", "evaluate", "families"],  # seedlocal bench, seedlocal eval, the table of algorithm families
    ["cli", "__main__", "api"],  # the commands, and the same from Python (seedlocal.train)
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}



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
    upward = [(a, b, where) for a, b, where in _imports() if b in FLOOR and FLOOR[b] > FLOOR.get(a, len(FLOORS))]
    assert not upward, "imports from a higher floor:\n" + "\n".join(f"  {w}: {a} -> {b}" for a, b, w in upward)


def test_the_docs_floor_table_is_this_one():
    """docs/architecture.md's table of floors names the same units on the same floors."""
    drawn = {}
    for floor, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", ARCHITECTURE.read_text(), re.M):
        for unit in re.findall(r"`([\w.]+?)(?:\.py|/)?`", cell):
            drawn[unit] = int(floor)
    assert drawn == FLOOR, (f"docs/architecture.md's floors differ from FLOORS here: "
                            f"{sorted(set(drawn.items()) ^ set(FLOOR.items()))}")


def _module_graph(package: Path) -> dict[str, dict[str, str]]:
    """{module: {module it imports: where}} over every module under ``package``, imports inside functions and
    under TYPE_CHECKING included; ``from seedlocal.x import y`` imports module ``seedlocal.x.y`` where there is
    one, else ``seedlocal.x``."""
    paths = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {m: {} for m in paths}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == package.name]
            else:
                continue
            for t in targets:
                while t not in paths:
                    t = t.rpartition(".")[0]
                if t != module:
                    graph[module].setdefault(t, f"{path.relative_to(package.parent)}:{node.lineno}")
    return graph


def _circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(graph[w])))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_no_modules_import_each_other_in_a_circle():
    graph = _module_graph(PACKAGE)
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(
        "  " + "; ".join(f"{m} -> {t} ({graph[m][t]})" for m in c for t in graph[m] if t in c) for c in circles)


def test_the_circle_checker_finds_a_circle(tmp_path):
    """The checker itself: three modules in a loop (one of the imports inside a function) are one circle; a
    module that only imports them is not in it."""
    pkg = tmp_path / "seedlocal"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "config" / "a.py").write_text("from seedlocal.config import b\n")
    (pkg / "config" / "b.py").write_text("def f():\n    from seedlocal import c\n")
    (pkg / "c.py").write_text("import seedlocal.config.a\n")
    (pkg / "d.py").write_text("from seedlocal.config.a import x\n")
    assert _circles(_module_graph(pkg)) == [["seedlocal.c", "seedlocal.config.a", "seedlocal.config.b"]]


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
