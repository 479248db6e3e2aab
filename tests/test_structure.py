"""Checks on the shape of the code itself (issue 32's "done when" list)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "seedlocal"
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


def _long_functions() -> dict[tuple[str, str], int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), str(path))):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out[(rel, name)] = lines
    return out


def test_no_function_is_longer_than_a_screen():
    """A function a reader can hold in their head: at most 60 lines. A longer
    one is split by meaning, into helpers that each name a step."""
    too_long = _long_functions()
    assert not too_long, "over {} lines: {}".format(
        MAX_FUNCTION_LINES, ", ".join(f"seedlocal/{path}:{name} ({n})" for (path, name), n in sorted(too_long.items())))


def test_the_line_count_matches_a_known_function():
    """The checker measures what it says: a function's lines, docstring included."""
    source = 'def f():\n    """doc\n    more"""\n    return 1\n\n\nclass C:\n    def g(self):\n        pass\n'
    found = {name: node.end_lineno - node.lineno + 1 for name, node in _functions(ast.parse(source))}
    assert found == {"f": 4, "C.g": 2}
