"""Member notices in the worker (docs/contract.md §9, issue 16 part 2): the worker produces a
MEMBER_NOTICE frame per applied `message` entry of kind 24/27, keyed by the member, as the entry is
applied (before the batch's persist: at least once), after its own mirror writes staged so far
(the roster a client re-reads); a rebuild sends none; Kafka carries them on the session-delta
topic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from app.domain.projector import ProjectorConfig
from app.rebuild.by_replay import SilentOutbox
from app.runtime.outbox import KafkaOutbox
from app.settings import Settings
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from tests.support.builders import CONV_A, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.mirror_writer import MirrorCassandra, MirrorWriter
from tests.support.worker import RecordingOutbox, core_with_writer, records

ALICE, BOB, CAROL = 11982011376358104761, 17, 5000


class OrderedOutbox(RecordingOutbox):
    """Also what the worker produced in order, and at each notice the members the mirror had
    written to the roster (user, conversation)."""

    def __init__(self, cassandra: MirrorCassandra | None = None) -> None:
        super().__init__()
        self.cassandra = cassandra if cassandra is not None else MirrorCassandra()
        self.log: list[str] = []
        self.mirrored_at_notice: list[set[tuple[int, str]]] = []

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        await super().frames(session_deltas, badges)
        self.log += ["frame"] * (len(session_deltas) + len(badges))

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        self.mirrored_at_notice.append({(user, conv) for conv, user in self.cassandra.members})
        await super().notices(notices)
        self.log += ["notice"] * len(notices)


def worker(
    tables: MemoryTables, outbox: RecordingOutbox, clock: ManualClock, writer: MirrorWriter | None
) -> WorkerCore:
    config = WorkerConfig(lanes=1, projector=ProjectorConfig(window_ms=100))
    return core_with_writer(config, tables, writer, outbox=outbox, clock=clock)


def join_and_notices() -> tuple[list[bytes], dict[int, int]]:
    """Carol joins CONV_A; the group's members get the t=24 message (from Carol, not counted)."""
    s = StreamBuilder()
    s.entry("join", CAROL, CONV_A, joined_at_conversation_seq=9)
    seqs = {user: s.message(user, 10, sender=CAROL, counts=False, notification=24) for user in (ALICE, BOB)}
    s.marker(0)
    return s.lines, seqs


def test_the_worker_publishes_notices_when_applied_after_its_mirror_writes() -> None:
    async def run() -> None:
        cassandra = MirrorCassandra()
        tables, outbox, clock = MemoryTables(), OrderedOutbox(cassandra), ManualClock()
        core = worker(tables, outbox, clock, MirrorWriter(cassandra))
        lines, seqs = join_and_notices()
        await core.on_records(records(lines))
        # Sent as the entries were applied: before the window's flush (no frame yet).
        assert outbox.log == ["notice", "notice"]
        assert outbox.notices_out == [
            (
                str(user).encode(),
                {
                    "type": "MEMBER_NOTICE",
                    "user_id": user,
                    "conversation_id": CONV_A,
                    "kind": 24,
                    "conversation_seq": 10,
                    "projection_mailbox_seq": seqs[user],
                },
            )
            for user in (ALICE, BOB)
        ]
        # Carol's join, staged before the notices, was written to the roster before they left.
        assert outbox.mirrored_at_notice == [{(CAROL, CONV_A)}]
        assert core.stats.notices == 2

        # The flush's frames follow on the same key (the session-delta topic keeps them in order).
        clock.now += 1000
        await core.flush_due(clock.now)
        assert outbox.log[2:] == ["frame"] * 6  # 3 users x 2
        # The same entries read again (a producer's retry) are duplicates: nothing is sent.
        before = len(outbox.notices_out)
        offset = len(lines)
        await core.on_records(records(lines, offset))
        assert len(outbox.notices_out) == before and core.stats.duplicates == 3

    asyncio.run(run())


def test_a_failing_mirror_does_not_hold_notices_back_they_are_counted_and_the_roster_follows() -> None:
    async def run() -> None:
        cassandra = MirrorCassandra()
        tables, outbox, clock = MemoryTables(), OrderedOutbox(cassandra), ManualClock()
        writer = MirrorWriter(cassandra)
        writer.down = True
        core = worker(tables, outbox, clock, writer)
        lines, _ = join_and_notices()
        await core.on_records(records(lines))
        # Sent although Carol's join is not in the roster yet (a hint, never a fact): counted.
        assert len(outbox.notices_out) == 2 and outbox.mirrored_at_notice == [set()]
        assert core.stats.notices == 2 and core.stats.notices_ahead_of_roster == 2
        assert writer.failures >= 1
        # Cassandra back: the join is still owed and lands with the mirror's next write.
        writer.down = False
        await core.flush_all()
        assert cassandra.members[(CONV_A, CAROL)]["state"] == "active"
        assert core.stats.notices_ahead_of_roster == 2

    asyncio.run(run())


def test_a_crash_before_the_persist_sends_the_notice_again_after_it_nothing() -> None:
    async def run() -> None:
        tables, clock = MemoryTables(), ManualClock()
        lines, _ = join_and_notices()
        first = OrderedOutbox()
        await worker(tables, first, clock, None).on_records(records(lines))
        assert len(first.notices_out) == 2
        # The worker dies before persisting: the records are read again and re-applied.
        second = OrderedOutbox()
        core = worker(tables, second, clock, None)
        await core.on_records(records(lines))
        assert second.notices_out == first.notices_out  # at least once: the same notices
        await core.flush_all()  # persisted now
        # A restart after the persist skips what the changelog holds: no notice.
        third = OrderedOutbox()
        restarted = worker(tables, third, clock, None)
        await restarted.on_records(records(lines))
        assert third.notices_out == []

    asyncio.run(run())


def test_a_rebuild_sends_no_notice_and_kafka_routes_them_to_the_session_delta_topic() -> None:
    class Sender:
        def __init__(self) -> None:
            self.sent: list[tuple[str, list[tuple[bytes, bytes]]]] = []

        async def send_keyed(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> list[Any]:
            self.sent.append((topic, list(records)))
            return []

    async def run() -> None:
        silent = SilentOutbox()
        await silent.notices([(b"1", b"{}")])
        assert silent.notices_seen == 1
        sender = Sender()
        settings = Settings.from_env({"PROJECTOR_TOPIC_SESSION_DELTA": "sd"})
        await KafkaOutbox(sender, settings.topics).notices([(b"17", b"{}")])  # type: ignore[arg-type]
        assert sender.sent == [("sd", [(b"17", b"{}")])]

    asyncio.run(run())


class FailingOutbox(OrderedOutbox):
    """The producer gives up (broker away past its timeouts) while `down` is set: nothing of a
    failing send arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.refused = 0

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError("broker away")
        await super().dead_letters(letters)

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError("broker away")
        await super().notices(notices)


def test_notices_and_dead_letters_whose_send_failed_are_sent_before_the_offsets_go_durable() -> None:
    async def run() -> None:
        tables, outbox, clock = MemoryTables(), FailingOutbox(), ManualClock()
        core = worker(tables, outbox, clock, None)
        lines, _ = join_and_notices()
        lines = [b"{oops", *lines]
        await core.on_records(records(lines))  # applied; the sends raised and are kept
        assert outbox.refused == 1 and core.stats.outbound_send_failures == 1
        assert outbox.letters == [] and outbox.notices_out == [] and core.stats.applied == 3
        # No persist while they are owed: the offsets stay where a restart re-reads them.
        clock.now += 1000
        for _ in range(2):
            with contextlib.suppress(ConnectionError):
                await core.flush_due(clock.now)
        assert core.durable_offsets().get(0) in (None, 0)
        # A crash now re-reads the records and produces them again (the first core is gone).
        # Here the broker comes back instead: the next persist sends them, then goes durable.
        outbox.down = False
        await core.flush_due(clock.now)
        assert [letter["offset"] for letter in outbox.letters] == [0]
        assert [key for key, _ in outbox.notices_out] == [str(ALICE).encode(), str(BOB).encode()]
        assert outbox.log[:2] == ["notice", "notice"]  # before the flush's frames
        assert core.durable_offsets() == {0: len(lines)}
        assert core.stats.notices == 2

    asyncio.run(run())
