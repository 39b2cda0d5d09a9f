"""The differential suite's two build processes, shared by the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import orjson
import pytest

from tests.support.build_diff import Differential, ensure_compiled_build
from tests.support.paths import ROOT

REPORT = ROOT / ".local" / "differential" / "last.json"


@pytest.fixture(scope="session")
def differential() -> Iterator[Differential]:
    both = Differential(ensure_compiled_build())
    yield both
    both.close()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_bytes(
        orjson.dumps(
            {
                "requests": both.requests,
                "lines": both.lines,
                "scale": os.environ.get("DIFF_SCALE", "1"),
                "pure": both.pure.line,
                "compiled": both.compiled.line,
            }
        )
    )
