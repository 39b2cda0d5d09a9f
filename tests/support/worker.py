"""The worker core's wiring in unit tests: in-memory ports around the real `WorkerCore`.

State lives in `app.stores.memory_tables.MemoryTables` (the `StateTables` port in dicts; the
contract suite tests/contract/test_state_tables_contract.py holds it to the faust tables'
behaviour), projections in the in-memory projection store, the MessageStore in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, settings

from app.domain.entries import DeleteMessageEntry, MessageEntry, RecallEntry, decode_record
from app.domain.projector import ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from app.worker.ports import RawRecord, StateWriter
from tests.support.builders import CONV_A
from tests.support.clock import ManualClock


class RecordingOutbox:
    """The worker's `Outbox` port: keeps the dead letters, frames and member notices it is given,
    decoded (notices with their keys)."""

    def __init__(self) -> None:
        self.letters: list[dict[str, Any]] = []
        self.frames_out: list[dict[str, Any]] = []
        self.notices_out: list[tuple[bytes, dict[str, Any]]] = []

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        self.letters.extend(orjson.loads(value) for _, value in letters)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        for (_, delta), (_, badge) in zip(session_deltas, badges, strict=True):
            self.frames_out += [orjson.loads(delta), orjson.loads(badge)]

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        self.notices_out += [(key, orjson.loads(value)) for key, value in notices]


def message_store_for(lines: Sequence[bytes], lanes: int) -> InMemoryMessageStore:
    """The MessageStore as the writers left it before the mailbox entries were produced."""
    store = InMemoryMessageStore()
    for raw in lines:
        entry = decode_record(raw, lanes)
        if isinstance(entry, MessageEntry):
            store.record_message(
                entry.conversation_id,
                entry.conversation_seq,
                message_id=entry.message_id,
                activity_id=entry.activity_id,
                sender_id=entry.sender_id,
                counts_unread=entry.counts_unread,
                mentioned_user=entry.user_id if entry.mention else None,
            )
        elif isinstance(entry, RecallEntry | DeleteMessageEntry):
            store.record_recall(entry.conversation_id, entry.target_conversation_seq)
    return store


def make_core(
    lanes: int,
    tables: MemoryTables,
    store: InMemoryMessageStore,
    projections: InMemoryProjectionStore,
    outbox: RecordingOutbox,
    clock: ManualClock,
    window_ms: int = 100,
    max_dirty_rows: int = 100_000,
    hot_rows: int = 500_000,
    hot_bytes: int | None = None,
) -> WorkerCore:
    config = WorkerConfig(
        lanes=lanes,
        projector=ProjectorConfig(
            window_ms=window_ms, max_dirty_rows=max_dirty_rows, include_muted=False, unread_precise_limit=200
        ),
        hot_rows=hot_rows,
        hot_bytes=hot_bytes,
    )
    return WorkerCore(
        config, message_store=store, projection_store=projections, tables=tables, outbox=outbox, clock=clock
    )


def core_with_writer(
    config: WorkerConfig,
    tables: MemoryTables,
    writer: StateWriter | None,
    *,
    outbox: RecordingOutbox | None = None,
    projections: InMemoryProjectionStore | None = None,
    clock: ManualClock | None = None,
) -> WorkerCore:
    """A core over in-memory stores with a Cassandra `StateWriter` (its mirror), as a worker
    (re)started on `tables`."""
    return WorkerCore(
        config,
        message_store=InMemoryMessageStore(),
        projection_store=projections if projections is not None else InMemoryProjectionStore(),
        tables=tables,
        outbox=outbox if outbox is not None else RecordingOutbox(),
        state_writer=writer,
        clock=clock if clock is not None else ManualClock(),
    )


def records(lines: Sequence[bytes], start: int = 0) -> list[RawRecord]:
    """Lines as the records of partition 0 from offset `start` on (a later batch continues the
    log: a batch at offsets the core already applied is skipped as a re-read)."""
    return [
        RawRecord("mailbox-tail", 0, offset, b"k", raw.rstrip(b"\n"))
        for offset, raw in enumerate(lines, start)
    ]


def batches(recs: list[RawRecord], rnd: random.Random) -> list[list[RawRecord]]:
    """The records cut into consecutive batches of 1 to 12, as fetches would deliver them."""
    out, i = [], 0
    while i < len(recs):
        size = rnd.randint(1, 12)
        out.append(recs[i : i + size])
        i += size
    return out


# Hypothesis settings for tests that run whole generated streams through a core per example.
WHOLE_STREAMS = settings(
    max_examples=80,
    deadline=None,  # whole streams per example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class StreamRig:
    """One stream's worker run against its replay: the expected outputs, the ports that survive
    a crash (tables, stores, outbox, clock) and a fresh core over them (a restart)."""

    def __init__(self, stream: Any, seed: int, hot_rows: int = 500_000, hot_bytes: int | None = None) -> None:
        from app.replay import ReplayOptions, run_replay

        self.lanes: int = stream.lanes
        self.lines = [line for line in stream.lines() if line.strip()]
        self.expected = run_replay(self.lines, ReplayOptions(lanes=self.lanes))
        self.rnd = random.Random(seed)
        self.store = message_store_for(self.lines, self.lanes)
        self.tables = MemoryTables()
        self.projections = InMemoryProjectionStore()
        self.outbox = RecordingOutbox()
        self.clock = ManualClock()
        self.records = records(self.lines)
        self.hot_rows = hot_rows
        self.hot_bytes = hot_bytes

    def new_core(self) -> WorkerCore:
        return make_core(
            self.lanes,
            self.tables,
            self.store,
            self.projections,
            self.outbox,
            self.clock,
            hot_rows=self.hot_rows,
            hot_bytes=self.hot_bytes,
        )

    def reread_from(self, durable: int | None) -> list[RawRecord]:
        """What a restarted worker reads: from the durable offset (the last persist), or from a
        few records earlier (an older commit)."""
        return self.records[max(0, (durable or 0) - self.rnd.randint(0, 5)) :]


def pin_batch(offset: int) -> list[RawRecord]:
    """One pin (staged for the mirror) and the watermark that releases it."""
    seq = offset + 1
    pin = {
        "type": "pin",
        "mailbox_seq": seq,
        "lane": 0,
        "ts": seq,
        "event_id": f"e{seq}",
        "user_id": 7,
        "conversation_id": CONV_A,
        "pin_rank": seq,
    }
    mark = {"type": "watermark", "lane": 0, "watermark": seq, "ts": seq}
    return [
        RawRecord("mailbox-tail", 0, 2 * offset, b"k", orjson.dumps(pin)),
        RawRecord("mailbox-tail", 0, 2 * offset + 1, b"k", orjson.dumps(mark)),
    ]


async def flush_scheduler(
    core: WorkerCore,
    clock: ManualClock,
    rnd: random.Random,
    stop: asyncio.Event,
    on_tick: Callable[[], None] | None = None,
) -> None:
    """The worker's flush scheduler in tests: woken by a batch's flushes or at once, flushes what
    is due, then `on_tick` (an offset commit, say), then yields a few event-loop turns."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(core.publish_wanted.wait(), 0)
        core.publish_wanted.clear()
        await core.flush_due(clock.now)
        if on_tick is not None:
            on_tick()
        for _ in range(rnd.randint(1, 3)):
            await asyncio.sleep(0)
