"""What a chaos scenario measured, handed to the report (`make chaos`, tests/chaos/run_all.py).

A scenario (a pytest test marked `chaos`) calls :func:`record` with its numbers; when the runner
started it, CHAOS_OUT names a directory and the numbers land there as ``<scenario>.json``; when
the test runs on its own (plain pytest) nothing is written. The runner adds the outcome (passed,
failed, not run) and the duration itself, so a scenario never reports its own verdict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson


def record(scenario: str, **numbers: Any) -> None:
    """Merge `numbers` into the scenario's result file (a scenario may record in steps, so a
    failure half-way still leaves what was measured before it)."""
    out = os.environ.get("CHAOS_OUT")
    if not out:
        return
    path = Path(out) / f"{scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    current: dict[str, Any] = orjson.loads(path.read_bytes()) if path.exists() else {}
    current.update(numbers)
    path.write_bytes(orjson.dumps(current, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def scale() -> float:
    """CHAOS_SCALE (default 1): the share of the full size a scenario runs at; below 1 only to
    try a scenario out quickly (the report shows the scale each result was measured at)."""
    value = float(os.environ.get("CHAOS_SCALE", "1"))
    if not 0 < value <= 1:
        raise ValueError(f"CHAOS_SCALE must be in (0, 1], got {value}")
    return value


def scaled(full: int, least: int = 1) -> int:
    return max(least, round(full * scale()))
