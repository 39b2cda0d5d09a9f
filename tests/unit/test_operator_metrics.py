"""Metrics added for the operator kit (issue 15): dead letters by a bounded reason, process and
build-info metrics on every process's registry."""

from __future__ import annotations

import asyncio
import platform

import orjson
import pytest

from app.build import build_info
from app.domain.entries import DEAD_LETTER_KINDS, DeadLetter, decode_record
from app.metrics import PROCESS_METRICS, RebuildMetrics, WorkerMetrics, names, sample
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from tests.support.builders import StreamBuilder
from tests.support.clock import ManualClock
from tests.support.metrics import metrics_text, scrape
from tests.support.worker import RecordingOutbox, make_core, records


def message(**changes: object) -> bytes:
    """A valid message entry (tests/support/builders.py) with some fields replaced."""
    s = StreamBuilder(lanes=1)
    s.message(7, 1)
    return orjson.dumps(orjson.loads(s.lines[0]) | changes)


# One record per kind, and the kind decode_record gives it.
EXAMPLES = {
    "empty": b"",
    "too_large": message(event_id="x" * 200, message_id="m") + b" " * (64 * 1024),
    "not_json": b"{oops",
    "unknown_type": b'{"type":"teleport"}',
    "schema": b"[]",
    "lane_out_of_range": message(lane=5),
    "int_out_of_range": b'{"type":"watermark","lane":0,"watermark":18446744073709551616,"ts":1}',
    "bad_conversation_id": message(conversation_id="not-a-uuid"),
    "bad_activity_id": message(activity_id="XYZ"),
}


@pytest.mark.parametrize("kind", DEAD_LETTER_KINDS)
def test_every_dead_letter_kind_is_reachable_and_named(kind: str) -> None:
    decoded = decode_record(EXAMPLES[kind], lanes=1)
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.kind == kind, decoded.reason


def test_dead_letters_are_counted_by_reason_with_a_closed_label_set() -> None:
    core = make_core(
        1, MemoryTables(), InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )
    metrics = WorkerMetrics()
    text = scrape(metrics, core)
    # Every reason is exported from the start, at 0 (rate() and alerts see a series at once).
    for kind in DEAD_LETTER_KINDS:
        assert f'projector_dead_letters_total{{reason="{kind}"}} 0.0' in text
    batch = [EXAMPLES["not_json"], EXAMPLES["not_json"], EXAMPLES["bad_activity_id"], EXAMPLES["empty"]]
    asyncio.run(core.on_records(records(batch)))
    text = scrape(metrics, core)
    assert sample(text, "projector_dead_letters_total", [("reason", "not_json")]) == 2
    assert sample(text, "projector_dead_letters_total", [("reason", "bad_activity_id")]) == 1
    assert sample(text, "projector_dead_letters_total", [("reason", "empty")]) == 1
    assert sample(text, "projector_entries_dead_lettered_total") == 4  # the total is still there
    # The record's content never becomes a label value.
    assert "oops" not in text
    reasons = {line.split('reason="')[1].split('"')[0] for line in text.splitlines() if "reason=" in line}
    assert reasons == set(DEAD_LETTER_KINDS)
    # Scraping again adds nothing.
    assert sample(scrape(metrics, core), "projector_dead_letters_total", [("reason", "not_json")]) == 2


def test_every_process_registry_has_process_and_build_info() -> None:
    info = build_info()
    for registry in (WorkerMetrics().registry, RebuildMetrics().registry):
        text = metrics_text(registry)
        assert set(PROCESS_METRICS) <= names(text)
        labels = [("version", info.version), ("python", platform.python_version()), ("compiled", "false")]
        assert sample(text, "projector_build_info", labels) == 1
        assert sample(text, "process_resident_memory_bytes") > 0
