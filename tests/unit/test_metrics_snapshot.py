"""Every process exports the metrics it exported before they were declared as tables (issue 36):
the same families with the same names, types, help texts, label names and buckets, the same
label sets made at start, and the same metric objects under the same attribute names. The
fixture was written by `python -m tests.support.metrics_snapshot` from the code before the change;
the dashboard and the alert rules (deploy/) read these names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.metrics_snapshot import snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "metrics_snapshot.json"


@pytest.fixture(scope="module")
def before() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    # Through JSON, as the fixture was written (tuples become lists).
    made: dict[str, Any] = json.loads(json.dumps(snapshot()))
    return made


@pytest.mark.parametrize("process", ["worker", "api", "rebuild", "rebuild_named", "gateway"])
def test_each_process_exposes_the_families_it_did(
    process: str, before: dict[str, Any], now: dict[str, Any]
) -> None:
    was = {f["name"]: f for f in before[process]["families"]}
    is_ = {f["name"]: f for f in now[process]["families"]}
    assert sorted(is_) == sorted(was)
    for name, family in was.items():
        assert is_[name] == family, name


@pytest.mark.parametrize("process", ["worker", "api", "ops", "rebuild"])
def test_each_metric_keeps_its_attribute_name_type_help_labels_and_buckets(
    process: str, before: dict[str, Any], now: dict[str, Any]
) -> None:
    was, is_ = before[process]["attributes"], now[process]["attributes"]
    assert sorted(is_) == sorted(was)
    for attr, described in was.items():
        assert is_[attr] == described, attr
