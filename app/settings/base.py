"""What every settings section shares: bounded fields, the value parser, the error that lists
every problem, and the rewrite of field names into the ``PROJECTOR_*`` names an operator sets.

A section is a frozen dataclass of fields named as their variables (``kafka_bootstrap`` is set by
``PROJECTOR_KAFKA_BOOTSTRAP``); building one checks its bounds and its own rules, and refuses
with a :class:`SettingsError` naming the variables.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Iterable
from typing import Any

from app.redis_url import parse_bool

ENV_PREFIX = "PROJECTOR_"

# Kafka's legal topic characters; the length bound leaves room for the changelog topic's suffix.
TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")

_T = typing.TypeVar("_T", int, float)


def bounded(default: _T, low: int | float, high: int | float | None = None) -> _T:
    """A numeric field and its range, declared together (checked with every other problem)."""
    return dataclasses.field(default=default, metadata={"range": (low, high)})


class SettingsError(ValueError):
    """The environment does not describe a valid configuration; the message lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:  # one mistake, one line
            super().__init__(f"invalid settings: {self.problems[0]}")
        else:
            super().__init__("invalid settings:\n  - " + "\n  - ".join(self.problems))


class Section:
    """The validation every section runs when built: its fields' bounds, then `_problems()`.

    Subclasses are frozen slotted dataclasses; every message names the environment variables."""

    __slots__ = ()

    def __post_init__(self) -> None:
        problems = bound_problems(self) + self._problems()
        if problems:
            raise SettingsError(with_env_names(problems, field_names(type(self))))

    def _problems(self) -> list[str]:
        """The section's own rules beyond the bounds, written with field names."""
        return []


def field_names(*sections: type[Any]) -> frozenset[str]:
    return frozenset(f.name for section in sections for f in dataclasses.fields(section))


def bound_problems(section: Any) -> list[str]:
    """Every `bounded` field outside its range."""
    p: list[str] = []
    for f in dataclasses.fields(section):
        bounds = f.metadata.get("range")
        if bounds is None:
            continue
        low, high = bounds
        value = getattr(section, f.name)
        if high is None and not value >= low:
            p.append(f"{f.name}: {value} must be >= {low}")
        elif high is not None and not low <= value <= high:  # also refuses nan
            p.append(f"{f.name}: {value} is not in {low}..{high}")
    return p


def port_problem(name: str, port: int, lowest: int = 1) -> list[str]:
    return [] if lowest <= port < 65536 else [f"{name}: {port} is not a TCP port ({lowest}..65535)"]


def choice_problem(name: str, value: str, allowed: Iterable[str]) -> list[str]:
    allowed = tuple(allowed)
    return [] if value in allowed else [f"{name}: {value!r} is not one of {', '.join(allowed)}"]


# A field name (or a `prefix_*` family of them) in a problem message, outside quoted values.
_MESSAGE_WORD_RE = re.compile(r"'[^']*'|\"[^\"]*\"|\b[a-z][a-z0-9_]*\*?")


def with_env_names(problems: list[str], fields: frozenset[str]) -> list[str]:
    """``kafka_bootstrap: ...`` -> ``PROJECTOR_KAFKA_BOOTSTRAP: ...``: the problems are written
    with field names (short, next to the code); the operator reads the variables they set.
    Quoted values are left alone (a topic may be called like a field)."""

    def name(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in fields:
            return ENV_PREFIX + word.upper()
        if word.endswith("_*") and any(f.startswith(word[:-1]) for f in fields):
            return ENV_PREFIX + word.upper()
        return word

    return [_MESSAGE_WORD_RE.sub(name, problem) for problem in problems]


def parse(hint: Any, text: str) -> Any:
    """Turn one environment string into the field's type (ValueError with a reason otherwise)."""
    if hint is bool:
        return parse_bool(text)
    if hint is int:
        try:
            return int(text.strip(), 10)
        except ValueError:
            raise ValueError("expected a decimal integer") from None
    if hint is float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError("expected a decimal number") from None
        if not math.isfinite(value):  # "nan" and "inf" parse, but are never a setting
            raise ValueError("expected a finite decimal number")
        return value
    if typing.get_origin(hint) is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if hint is str:
        return text.strip()
    raise TypeError(f"unsupported settings type {hint!r}")  # a new field needs a parser here


def env_text(value: Any) -> str:
    """A field's value as its environment variable spells it (the inverse of `parse`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)
