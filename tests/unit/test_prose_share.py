"""Prose stays a minority of the worker's code (issue 36): in `app/worker`, `agents` and `tables`,
lines of comments and docstrings are under 15% of all lines. A module's docs state its contract,
its invariant and the why in a sentence or two; the story of how a rule was found belongs in
docs/decisions/ (see docs/decisions/README.md).

A line counts as prose when it holds a comment (on its own or after code) or belongs to a module,
class or function docstring; the share is over every line of the package's `.py` files.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app/worker", "agents", "tables")
MAX_PROSE_SHARE = 0.15


def prose_lines(source: str) -> set[int]:
    """The line numbers of `source` holding a comment or part of a docstring."""
    lines = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def prose_share(package: Path) -> tuple[int, int]:
    """(prose lines, all lines) over the package's Python files."""
    prose = total = 0
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        prose += len(prose_lines(source))
        total += len(source.splitlines())
    return prose, total


def test_prose_lines_counts_comments_and_docstrings_only() -> None:
    source = (
        '"""Module doc,\n'
        'two lines."""\n'
        "x = 1  # trailing comment\n"
        "# a comment line\n"
        "def f() -> str:\n"
        '    """Function doc."""\n'
        '    return "# not a comment"\n'
        "class C:\n"
        '    y = """not a docstring"""\n'
    )
    assert prose_lines(source) == {1, 2, 3, 4, 6}


@pytest.mark.parametrize("package", PACKAGES)
def test_prose_is_under_the_share_of_the_package(package: str) -> None:
    prose, total = prose_share(ROOT / package)
    assert total > 0, f"{package} has no Python lines: the path moved?"
    assert prose / total < MAX_PROSE_SHARE, (
        f"{package}: {prose} of {total} lines are comments or docstrings ({prose / total:.1%}); "
        f"keep the contract in the code, move the story to docs/decisions/"
    )
