"""--progress, declared once for `projector replay` and `projector simulate` (app.cli.args)."""

from __future__ import annotations

import argparse
import io

import pytest

from app.cli.args import add_progress_argument, progress_shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("choice", "on_terminal", "on_pipe"),
    [("auto", True, False), ("always", True, True), ("never", False, False)],
)
def test_progress_is_shown_on_a_terminal_unless_always_or_never(
    choice: str, on_terminal: bool, on_pipe: bool
) -> None:
    assert progress_shown(choice, _Terminal()) is on_terminal
    assert progress_shown(choice, io.StringIO()) is on_pipe


def test_the_option_defaults_to_auto_and_refuses_other_values() -> None:
    parser = argparse.ArgumentParser()
    add_progress_argument(parser)
    assert parser.parse_args([]).progress == "auto"
    assert parser.parse_args(["--progress", "never"]).progress == "never"
    with pytest.raises(SystemExit):
        parser.parse_args(["--progress", "sometimes"])
