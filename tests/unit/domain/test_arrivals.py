"""Arrival reconciliation (docs/contract.md §9, app/domain/arrivals.py): the markers' counts
against what a partition received. One entry dropped on purpose is reported on its lane; nothing
is reported under duplicates, bad records, re-reads after a crash, or markers without counts."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.arrivals import ArrivalLedger
from app.domain.entries import DeadLetter, decode_record
from app.domain.processor import PartitionProcessor, Snapshot
from app.domain.projector import ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from tests.support.builders import StreamBuilder as Builder
from tests.support.clock import ManualClock as Clock
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import (
    RecordingOutbox as Outbox,
)
from tests.support.worker import (
    batches,
    make_core,
    message_store_for,
    records,
)


def counted_markers(stream: Stream, *, drop: int | None = None) -> list[bytes]:
    """The stream's lines with every marker carrying its count (distinct entries of its lane
    with mailbox_seq <= W: all of them were sent before it), entry `drop` (and its repeats) left
    out of the lines as a record lost on the way."""
    entries = stream.scenario.entries
    out: list[bytes] = []
    for item in stream.items:
        kind = item[0]
        if kind in ("entry", "dup"):
            if item[1] != drop:
                out.append(stream.scenario.rendered[item[1]] + b"\n")
        elif kind == "marker":
            lane, w = item[1], item[2]
            count = len(
                {
                    (e["user_id"], e["mailbox_seq"])
                    for e in entries
                    if e["lane"] == lane and e["mailbox_seq"] <= w
                }
            )
            out.append(
                orjson.dumps({"type": "watermark", "lane": lane, "watermark": w, "ts": 1, "count": count})
                + b"\n"
            )
        else:
            out.append(item[1] + b"\n")
    return out


def process(lines: list[bytes], lanes: int) -> PartitionProcessor:
    processor = PartitionProcessor(
        ProjectorConfig(), InMemoryMessageStore(), lanes=lanes, learn_messages=True
    )
    processor.on_records([line for line in lines if line.strip()], None)
    return processor


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(stream=streams(scenarios(min_steps=10, max_steps=80), full=True))
def test_counts_balance_under_duplicates_bad_records_and_disorder(stream: Stream) -> None:
    processor = process(counted_markers(stream), stream.lanes)
    ledger = processor.arrivals
    for lane in range(stream.lanes):
        assert ledger.balance(lane) in (0, None), (lane, ledger.dump())
        assert ledger.missing(lane) == 0


@SETTINGS
@given(stream=streams(scenarios(min_steps=10, max_steps=80), full=True), pick=st.integers(0, 10**6))
def test_one_entry_dropped_is_reported_on_its_lane(stream: Stream, pick: int) -> None:
    entries = stream.scenario.entries
    if not entries:
        return
    drop = pick % len(entries)
    lane = entries[drop]["lane"]
    processor = process(counted_markers(stream, drop=drop), stream.lanes)
    # full=True: every lane's last marker covers everything, with its count.
    assert processor.arrivals.missing_by_lane() == [1 if n == lane else 0 for n in range(stream.lanes)]


def test_a_late_entry_is_missing_until_it_arrives() -> None:
    s = Builder()
    s.message(7, 1)
    late = s.lines.pop()  # seq 1 arrives after the marker that counts it
    s.message(8, 1)
    s.lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": 2, "ts": 1, "count": 2}))
    processor = process(s.lines, 1)
    assert processor.arrivals.missing(0) == 1
    processor.on_records([late], None)
    assert processor.arrivals.missing(0) == 0
    assert processor.stats.applied == 2  # the report never held anything back


def test_entries_above_a_marker_count_for_the_next_one() -> None:
    """Entries past W may reach the partition before W's marker; they count for a later one."""
    s = Builder()
    s.message(7, 1)
    s.message(8, 1)
    s.message(9, 1)  # seq 3, sent after the marker for W=2 was requested
    s.lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": 2, "ts": 1, "count": 2}))
    processor = process(s.lines, 1)
    assert processor.arrivals.balance(0) == 0
    processor.on_records(
        [orjson.dumps({"type": "watermark", "lane": 0, "watermark": 3, "ts": 1, "count": 3})], None
    )
    assert processor.arrivals.balance(0) == 0


def test_a_marker_without_count_checks_nothing() -> None:
    s = Builder()
    s.message(7, 1)
    s.message(8, 1)
    s.lines.pop(0)
    s.lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": 2, "ts": 1, "count": 2}))
    processor = process(s.lines, 1)
    assert processor.arrivals.missing(0) == 1 and processor.arrivals.checked
    processor.on_records([orjson.dumps({"type": "watermark", "lane": 0, "watermark": 3, "ts": 1})], None)
    assert processor.arrivals.missing(0) == 0 and not processor.arrivals.checked


def test_bad_counts_are_dead_letters_with_a_reason() -> None:
    base = b'{"type":"watermark","lane":0,"watermark":5,"ts":1,"count":'
    for value, kind in (
        (b"-1", "schema"),
        (b"null", "schema"),  # absent is "no count"; null is a bad one
        (b"true", "schema"),
        (b"1.5", "schema"),
        (b'"3"', "schema"),
        (b"18446744073709551616", "int_out_of_range"),
    ):
        decoded = decode_record(base + value + b"}", 1)
        assert isinstance(decoded, DeadLetter) and decoded.kind == kind and "count" in decoded.reason
    processor = process([base + b"-1}"], 1)
    assert processor.stats.dead_letters == 1 and not processor.arrivals.checked


def test_a_producer_count_that_goes_down_sets_a_new_baseline() -> None:
    ledger = ArrivalLedger(1)
    for seq in (1, 2, 3):
        ledger.received(0, seq)
    ledger.marked(0, 3, 4)  # one missing
    assert ledger.missing(0) == 1
    ledger.received(0, 4)
    ledger.marked(0, 4, 1)  # the producer restarted its count: from here on, relative to it
    assert ledger.missing(0) == 0
    ledger.marked(0, 6, 3)  # two more sent, none arrived
    assert ledger.missing(0) == 2


def test_a_state_from_before_the_ledger_is_baselined_at_the_first_count() -> None:
    """Restored from a gate record written by a version without counts: what came before is
    unknown, so the first count-carrying marker of each lane is the baseline."""
    s = Builder(lanes=2)
    s.message(7, 1, lane=0)
    s.message(8, 1, lane=1)
    first = s.close()
    processor = process(first, 2)
    record = processor.gate_record()
    del record["arrivals"]
    snap = processor.snapshot()
    restored = PartitionProcessor.restore(
        ProjectorConfig(),
        InMemoryMessageStore(),
        Snapshot(snap.rows, snap.users, record, snap.pending),
        lanes=2,
    )
    ledger = restored.arrivals
    assert ledger.unbased == [True, True] and ledger.covered == [2, 2]
    s.lines = []
    s.message(9, 1, lane=0)  # seq 3
    s.message(9, 2, lane=0)  # seq 4: lost
    s.lines.pop()
    restored.on_records(
        [*s.lines, orjson.dumps({"type": "watermark", "lane": 0, "watermark": 4, "ts": 1, "count": 40})], None
    )
    assert ledger.missing(0) == 0  # the baseline: 40 sent "before our time" minus what we have
    restored.on_records(
        [orjson.dumps({"type": "watermark", "lane": 0, "watermark": 6, "ts": 1, "count": 42})], None
    )
    assert ledger.missing_by_lane() == [2, 0]


def test_the_ledger_survives_its_gate_record() -> None:
    s = Builder(lanes=2)
    s.message(7, 1, lane=0)
    s.message(8, 1, lane=1)  # pending: lane 1 has not reported
    s.lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": 2, "ts": 1, "count": 1}))
    s.message(9, 1, lane=1)  # seq 3, above lane 1's (absent) marker
    processor = process(s.lines, 2)
    snap = processor.snapshot()
    blob = msgspec.msgpack.encode(snap.gate)
    restored = PartitionProcessor.restore(
        ProjectorConfig(),
        InMemoryMessageStore(),
        Snapshot(snap.rows, snap.users, msgspec.msgpack.decode(blob), snap.pending),
        lanes=2,
    )
    assert restored.arrivals.dump() == processor.arrivals.dump()
    assert sorted(restored.arrivals.above[1]) == [2, 3]
    restored.on_records(
        [orjson.dumps({"type": "watermark", "lane": 1, "watermark": 3, "ts": 1, "count": 2})], None
    )
    assert restored.arrivals.balance(1) == 0 and restored.arrivals.balance(0) == 0


WORKER_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@WORKER_SETTINGS
@given(
    stream=streams(scenarios(min_steps=20, max_steps=80), full=True),
    seed=st.integers(0, 2**32 - 1),
    drop=st.booleans(),
)
def test_worker_counts_are_exact_across_a_kill_and_the_re_reads_after_it(
    stream: Stream, seed: int, drop: bool
) -> None:
    """SIGKILL mid-stream (the hot state gone), re-read from the durable offset or a few records
    before it: the restored counts plus the re-read records count every entry exactly once."""
    entries = stream.scenario.entries
    rnd = random.Random(seed)
    dropped = rnd.randrange(len(entries)) if drop and entries else None
    lines = [line for line in counted_markers(stream, drop=dropped) if line.strip()]
    lanes = stream.lanes
    store = message_store_for(lines, lanes)
    tables, projections, outbox, clock = MemoryTables(), InMemoryProjectionStore(), Outbox(), Clock()
    recs = records(lines)

    async def run() -> Any:
        core = make_core(lanes, tables, store, projections, outbox, clock, hot_rows=rnd.choice((3, 500_000)))
        parts = batches(recs, rnd)
        cut = rnd.randrange(len(parts) + 1)
        for batch in parts[:cut]:
            await core.on_records(batch)
            clock.now += rnd.choice((0, 60, 150))
            await core.flush_due(clock.now)
        crashed = core.partitions.get(0)
        durable = crashed.durable_offset if crashed is not None else None
        core = make_core(lanes, tables, store, projections, outbox, clock)
        for batch in batches(recs[max(0, (durable or 0) - rnd.randint(0, 5)) :], rnd):
            await core.on_records(batch)
        await core.flush_all()
        return core.partition(0).processor.arrivals

    ledger = asyncio.run(run())
    expected = [0] * lanes
    if dropped is not None:
        expected[entries[dropped]["lane"]] = 1
    assert [ledger.balance(lane) or 0 for lane in range(lanes)] == expected
