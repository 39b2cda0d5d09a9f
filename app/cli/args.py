"""Argument types shared by the `projector` subcommands: one wording for every bad value."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer in [low, high] (an argparse `type`)."""

    def parse(text: str) -> int:
        value = non_negative_int(text) if low >= 0 else _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value

    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0 or value != value:  # NaN compares unequal to itself
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def probability(text: str) -> float:
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a probability in 0..1, got {text}")
    return value


def scratch_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be a run's scratch state folder (--state-dir), or None. It must be new or
    empty: a folder left by another run would be read as this run's state."""
    if not path.exists():
        return None
    if not path.is_dir():
        return "not a folder"
    if any(path.iterdir()):
        return "not empty (a scratch folder for this run only: remove it or name a new one)"
    return None


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """`--progress {auto,always,never}` (default auto); read it with `progress_shown`."""
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress on stderr (auto: only when stderr is a terminal)",
    )


def progress_shown(choice: str, stream: IO[str] | None = None) -> bool:
    """Whether `--progress choice` shows progress on `stream` (default stderr): auto = a terminal."""
    return choice == "always" or (choice == "auto" and (stream or sys.stderr).isatty())
