"""Checks on the shape of the code itself (issue 32's "done when" list)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "seedlocal"
SCRIPTS = PACKAGE.parent / "scripts"
MAX_FUNCTION_LINES = 60  # from the ``def`` line to the last, docstring included (decorators not)


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def _long_functions(paths) -> dict[tuple[str, str], int]:
    out = {}
    for path in sorted(paths):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), str(path))):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out[(rel, name)] = lines
    return out


def test_no_function_is_longer_than_a_screen():
    """A function a reader can hold in their head: at most 60 lines. A longer
    one is split by meaning, into helpers that each name a step. The scripts
    (benches, the GPU suite) are read and changed as often as the package."""
    too_long = _long_functions([*PACKAGE.rglob("*.py"), *SCRIPTS.glob("*.py")])
    assert not too_long, "over {} lines: {}".format(
        MAX_FUNCTION_LINES, ", ".join(f"{path}:{name} ({n})" for (path, name), n in sorted(too_long.items())))


def test_the_line_count_matches_a_known_function():
    """The checker measures what it says: a function's lines, docstring included."""
    source = 'def f():\n    """doc\n    more"""\n    return 1\n\n\nclass C:\n    def g(self):\n        pass\n'
    found = {name: node.end_lineno - node.lineno + 1 for name, node in _functions(ast.parse(source))}
    assert found == {"f": 4, "C.g": 2}


# -- the family table is the only place that chooses code by an algorithm's name ---------------------------------

def _names() -> set[str]:
    """Every family's command name and run configuration's class name."""
    from seedlocal.families import TABLE, family

    return set(TABLE) | {family(name).recipe.run.__name__ for name in TABLE}


def _branches_on_a_name(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that compare with, look up or match an algorithm's name (a string constant in ``names``), or
    compare a class's ``__name__``."""
    def named(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in names

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) or any(isinstance(s, ast.Attribute) and s.attr == "__name__"
                                                   for s in sides):
                lines.append(node.lineno)
            elif any(isinstance(s, (ast.Tuple, ast.List, ast.Set)) and any(map(named, s.elts)) for s in sides):
                lines.append(node.lineno)  # name in ("ga", "es")
        elif isinstance(node, ast.Dict) and any(named(k) for k in node.keys if k is not None):
            lines.append(node.lineno)  # {"ga": GARun, ...}: a second table
        elif isinstance(node, ast.Subscript) and named(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and named(node.value):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_family_table_branches_on_an_algorithm_name():
    """Adding a family is a trainer module and a line in families.py: no other code picks a family by its
    name or its config class's name (issue 32)."""
    names = _names()
    found = [f"seedlocal/{path.relative_to(PACKAGE).as_posix()}:{line}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "families.py"
             for line in _branches_on_a_name(ast.parse(path.read_text(), str(path)), names)]
    assert not found, "branches on an algorithm's name outside seedlocal/families.py: " + ", ".join(found)


def test_the_name_checker_finds_each_form_of_branch():
    names = {"vtrace", "ga", "VTraceRun"}
    for source in ('if type(cfg).__name__ == "VTraceRun": pass', 'x = algo == "vtrace"', 'y = name in ("ga", "es")',
                   'z = {"ga": 1}', 'w = PRESETS["ga"]', 'match a:\n    case "vtrace": pass',
                   'if cls.__name__ != other: pass'):
        assert len(_branches_on_a_name(ast.parse(source), names)) == 1, source
    assert _branches_on_a_name(ast.parse('t = Family("ga", GARun)\nalgo = "vtrace"'), names) == []


def test_docs_families_md_is_the_tables_own():
    from seedlocal.families import markdown

    path = PACKAGE.parent / "docs" / "families.md"
    assert path.read_text() == markdown(), "docs/families.md is out of step: python -m seedlocal.families > it"
