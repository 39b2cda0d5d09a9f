"""J-2, code-level: the frame-applying path never updates a count with ``+=`` / ``-=``.

Frames are absolute; a client that adds to a count double-counts on every redelivery. The check
walks the syntax tree of app/domain/client.py (not its text, so comments and strings cannot hide
or fake a hit) and a self-test proves the walker finds what it is meant to find.
"""

from __future__ import annotations

import ast
from pathlib import Path

import app.domain.client as client_module

CLIENT_SOURCE = Path(client_module.__file__)


def increments(source: str, filename: str = "<snippet>") -> list[str]:
    """Every augmented add or subtract (``x += …``, ``x -= …``) in ``source``, as file:line."""
    tree = ast.parse(source, filename=filename)
    return [
        f"{filename}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub)
    ]


def test_client_module_has_no_augmented_add_or_subtract() -> None:
    found = increments(CLIENT_SOURCE.read_text(encoding="utf-8"), str(CLIENT_SOURCE))
    assert found == [], "absolute frames: overwrite, never add\n" + "\n".join(found)


def test_walker_detects_increments_in_a_sample() -> None:
    sample = (
        "def apply(view, row):\n"
        "    view.unread_count += row['unread_count']\n"
        "    if row['read']:\n"
        "        view.rows[row['id']]['mention_count'] -= 1\n"
        "    view.total = view.total  # += in a comment is not code\n"
        "    note = 'x += 1'\n"
    )
    found = increments(sample)
    assert [line.split(":")[1] for line in found] == ["2", "4"]


def test_walker_ignores_other_augmented_operators_and_plain_assignment() -> None:
    sample = "x = 1\nx *= 2\nx |= 4\nx = x + 1\n"
    assert increments(sample) == []
