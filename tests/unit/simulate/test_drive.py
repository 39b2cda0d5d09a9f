"""The simulator's driver against fakes: the MessageStore is written before the entries that need
it, a lane's marker goes to every partition only after the broker acknowledged every entry of that
lane, --out is the produced stream, and a stop still sends the closing markers."""

from __future__ import annotations

import asyncio
import io
import random
from collections.abc import Awaitable, Sequence
from typing import Any

import orjson
import pytest

from app.replay import ReplayOptions, run_replay
from app.simulate import Mix, Report, SimParams, Workload, drive
from app.stores.cassandra_messages import ConversationHead, NewMessage

pytestmark = pytest.mark.timeout(60)


class Log:
    """One timeline shared by the fakes: what happened, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []


class FakeBroker:
    """Acknowledges each record after a random short delay (acks come back out of order)."""

    def __init__(self, log: Log, partitions: Sequence[int] = (0, 1, 2), seed: int = 0, fail_at: int = -1):
        self.log = log
        self.partitions: Sequence[int] = list(partitions)
        self.rng = random.Random(seed)
        self.sent: list[tuple[bytes, bytes | None, int | None]] = []
        self.unacked: dict[int, set[int]] = {}  # lane -> indexes into `sent` not acknowledged yet
        self.fail_at = fail_at

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        index = len(self.sent)
        self.sent.append((value, key, partition))
        record = orjson.loads(value)
        if record["type"] == "watermark":
            # At the moment a marker is sent, which entries of its lane are still unacknowledged?
            unacked = sorted(self.unacked.get(record["lane"], ()))
            self.log.events.append(("marker", (record, partition, unacked)))
        else:
            self.unacked.setdefault(record["lane"], set()).add(index)
            self.log.events.append(("entry", record))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane = record["lane"]

        def settle() -> None:
            if index == self.fail_at:
                ack.set_exception(ConnectionError("broker went away"))
            else:
                self.unacked.get(lane, set()).discard(index)
                ack.set_result(None)

        asyncio.get_running_loop().call_later(self.rng.random() * 0.003, settle)
        return ack


class FakeStore:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.messages: list[NewMessage] = []
        self.recalls: list[tuple[str, int, bool]] = []
        self.heads: list[ConversationHead] = []

    async def write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None:
        await asyncio.sleep(0.001)  # a round trip: entries must still wait for it
        self.messages.extend(messages)
        self.recalls.extend(recalls)
        self.heads.extend(heads)
        self.log.events.append(("stored", ({(m.conversation_id, m.conversation_seq) for m in messages},
                                           {(c, s) for c, s, _ in recalls})))  # fmt: skip


PARAMS = SimParams(
    users=30, conversations=8, group_size=20, messages=300, lanes=3, seed=4, mix=Mix(burst=0.2)
)


async def run_drive(**kwargs: Any) -> tuple[Log, FakeBroker, FakeStore, io.BytesIO, Report]:
    log = Log()
    broker = FakeBroker(log, **kwargs.pop("broker", {}))
    store = FakeStore(log)
    out = io.BytesIO()
    params = kwargs.pop("params", PARAMS)
    report = await drive(Workload(params), broker, store, out=out, **kwargs)
    return log, broker, store, out, report


async def test_store_first_then_entries() -> None:
    log, _, store, _, report = await run_drive()
    stored: set[tuple[str, int]] = set()
    recalled: set[tuple[str, int]] = set()
    for kind, payload in log.events:
        if kind == "stored":
            stored |= payload[0]
            recalled |= payload[1]
        elif kind == "entry" and payload["type"] == "message":
            assert (payload["conversation_id"], payload["conversation_seq"]) in stored
        elif kind == "entry" and payload["type"] in ("recall", "delete_message"):
            assert (payload["conversation_id"], payload["target_conversation_seq"]) in recalled
    assert report.messages == len(store.messages) == 300
    assert store.heads  # heads go with the messages


async def test_markers_wait_for_their_lane_and_reach_every_partition() -> None:
    log, broker, _, _, report = await run_drive()
    markers = [payload for kind, payload in log.events if kind == "marker"]
    assert markers
    for record, _, unacked in markers:
        assert unacked == [], f"marker {record} sent before entries {unacked[:10]}... were acknowledged"
    # Each lane report goes to every partition, explicitly, and nowhere else.
    by_report: dict[tuple[int, int], list[int | None]] = {}
    for record, partition, _ in markers:
        by_report.setdefault((record["lane"], record["watermark"]), []).append(partition)
    assert all(sorted(p) == [0, 1, 2] for p in by_report.values())  # type: ignore[type-var]
    assert report.markers == len(markers) == 3 * len(by_report)
    # Entries are keyed by user, on the partition Kafka's default partitioner picks for the key
    # (named explicitly: the markers' counts are per partition).
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    for value, key, partition in broker.sent:
        record = orjson.loads(value)
        if record["type"] != "watermark":
            assert key == str(record["user_id"]).encode()
            assert partition == partitioner(key, [0, 1, 2], [0, 1, 2])
    # Per lane the reports rise, and the last one covers the last seq.
    top = max(orjson.loads(v).get("mailbox_seq", 0) for v, _, _ in broker.sent)
    last = {lane: w for lane, w in by_report}
    assert last == dict.fromkeys(range(PARAMS.lanes), top)


async def test_out_file_is_the_produced_stream_and_replays_clean() -> None:
    _, broker, _, out, report = await run_drive()
    lines = out.getvalue().splitlines()
    assert lines == [value for value, _, _ in broker.sent]
    assert report.entries == sum(1 for line in lines if b'"watermark"' not in line)
    result = run_replay(lines, options=ReplayOptions(lanes=PARAMS.lanes))
    assert result.stats["dead_letters"] == 0
    assert result.stats["pending"] == 0
    assert result.stats["applied"] == report.entries


async def test_stop_still_sends_closing_markers() -> None:
    stop = asyncio.Event()
    params = SimParams(users=20, conversations=5, group_size=10, messages=None, lanes=2, seed=1)
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, stop.set)
    log, broker, _, out, report = await run_drive(params=params, stop=stop, rate=500.0)
    assert report.stopped_early and report.messages > 0
    top = max(orjson.loads(v).get("mailbox_seq", 0) for v, _, _ in broker.sent)
    final: dict[int, int] = {}
    for kind, payload in log.events:
        if kind == "marker":
            final[payload[0]["lane"]] = payload[0]["watermark"]
    assert final == {0: top, 1: top}
    result = run_replay(out.getvalue().splitlines(), options=ReplayOptions(lanes=2))
    assert result.stats["pending"] == 0 and result.stats["dead_letters"] == 0


async def test_duration_limit_and_pacing() -> None:
    params = SimParams(users=10, conversations=3, group_size=5, messages=None, seed=2)
    _, _, _, _, report = await run_drive(params=params, rate=200.0, duration_s=0.3)
    assert report.stopped_early and report.elapsed_s >= 0.3
    # Paced at 200 msg/s: never ahead of the rate over the time it really ran (a loaded machine
    # may run it longer or send fewer), never a flood (unpaced, 0.3 s is thousands).
    assert 1 <= report.messages <= 200 * report.elapsed_s + 10, report


async def test_a_failed_acknowledgement_fails_the_run() -> None:
    with pytest.raises(ConnectionError):
        await run_drive(broker={"fail_at": 50})


async def test_file_only_sink_writes_markers_once() -> None:
    from app.simulate import FileOnlySink

    out = io.BytesIO()
    report = await drive(Workload(PARAMS), FileOnlySink(), None, out=out)
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    markers = [line for line in lines if line["type"] == "watermark"]
    assert len(markers) == report.markers
    assert len({(m["lane"], m["watermark"]) for m in markers}) == len(markers)


def marker_counts_hold(sent: list[tuple[bytes, bytes | None, int | None]]) -> None:
    """Each marker's count is the number of entries of its lane sent to its partition before
    it that are <= its watermark (in the order the broker got them)."""
    seen: dict[tuple[int, int | None], list[int]] = {}
    for value, _, partition in sent:
        record = orjson.loads(value)
        if record["type"] == "watermark":
            below = [seq for seq in seen.get((record["lane"], partition), []) if seq <= record["watermark"]]
            assert record["count"] == len(below), record
        else:
            seen.setdefault((record["lane"], partition), []).append(record["mailbox_seq"])


async def test_markers_count_what_their_lane_sent_to_each_partition() -> None:
    _, broker, _, out, report = await run_drive()
    marker_counts_hold(broker.sent)
    # Nothing dropped: every count is exactly what reached the partition, and replay (one
    # partition: the counts of the others' markers are below what it received) misses nothing.
    lines = out.getvalue().splitlines()
    per: dict[tuple[int, int | None], int] = {}
    last: dict[tuple[int, int | None], int] = {}
    for value, _, partition in broker.sent:
        record = orjson.loads(value)
        if record["type"] == "watermark":
            last[(record["lane"], partition)] = record["count"]
        else:
            per[(record["lane"], partition)] = per.get((record["lane"], partition), 0) + 1
    assert last == per  # the closing markers cover everything
    result = run_replay(lines, options=ReplayOptions(lanes=PARAMS.lanes))
    assert result.stats["applied"] == report.entries


async def test_dropped_entries_are_counted_never_sent_and_reported_by_replay() -> None:
    from app.simulate import FileOnlySink
    from app.simulate.drive import DROP_SPACING

    out = io.BytesIO()
    report = await drive(Workload(PARAMS), FileOnlySink(), None, out=out, drop_entries=2)
    assert report.dropped == 2
    lines = out.getvalue().splitlines()
    records = [orjson.loads(line) for line in lines]
    entries = [r for r in records if r["type"] != "watermark"]
    assert len(entries) == report.entries
    # The workload's own numbering: the dropped ones are the DROP_SPACING-th and twice that.
    seqs = {r["mailbox_seq"] for r in entries}
    full = [e for b in Workload(PARAMS).batches() for e in b.entries]
    lost = [full[DROP_SPACING - 1], full[2 * DROP_SPACING - 1]]
    assert all(e["mailbox_seq"] not in seqs for e in lost)
    from app.replay import Replayer

    replayer = Replayer(ReplayOptions(lanes=PARAMS.lanes), lambda frame: None)
    replayer.feed_many(lines)
    replayer.finish()
    missing = replayer.processor.arrivals.missing_by_lane()
    expected = [0] * PARAMS.lanes
    for e in lost:
        expected[e["lane"]] += 1
    assert missing == expected


async def test_a_lagging_lane_holds_entries_above_the_watermark_and_still_closes() -> None:
    """--lane-lag-ms: lane 0's markers go out that much after its entries were acknowledged, so
    at every moment the other lanes' entries wait above the watermark; the closing markers still
    cover everything and the stream replays clean."""
    params = SimParams(users=30, conversations=8, group_size=20, messages=300, lanes=3, seed=4)
    log, _, _, out, report = await run_drive(params=params, rate=3000.0, lane_lag_s=0.03)
    waiting_peak = 0
    marks: dict[int, int] = {}
    top = 0
    for kind, payload in log.events:
        if kind == "entry":
            top = max(top, payload.get("mailbox_seq", 0))
        elif kind == "marker":
            marks[payload[0]["lane"]] = payload[0]["watermark"]
            if len(marks) == params.lanes:
                waiting_peak = max(waiting_peak, top - min(marks.values()))
    lagged = [p[0] for k, p in log.events if k == "marker" and p[0]["lane"] == 0]
    others = [p[0] for k, p in log.events if k == "marker" and p[0]["lane"] != 0]
    assert len(lagged) < len(others) / 2  # held back: superseded while they wait
    assert waiting_peak > 20  # entries above the min-over-lanes watermark at a marker's moment
    lines = out.getvalue().splitlines()
    result = run_replay(lines, options=ReplayOptions(lanes=params.lanes))
    assert result.stats["pending"] == 0 and result.stats["applied"] == report.entries
