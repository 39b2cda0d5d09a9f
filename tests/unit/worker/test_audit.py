"""The unread audit in the worker (app/worker/audit.py) over the real WorkerCore, with the in-memory
tables and stores: drift injected into the projection store or into the state is
found, corrected to the replay's result, sent to clients as correction frames, and counted."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from typing import Any, cast

import msgspec
import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.domain import seqs
from app.domain.audit import AuditPolicy, eligible
from app.domain.badge import Badge
from app.domain.client import ApplyStatus, SessionView
from app.domain.conversation import ConversationState
from app.domain.flush import Correction
from app.metrics import WorkerMetrics, names, sample
from app.replay import ReplayOptions, ReplayResult, run_replay
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.audit import _READ_SLICE, AuditConfig, AuditReport, _sweeps, audit_tick
from app.worker.core import WorkerCore
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.metrics import metrics_text
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import make_core, message_store_for, records

DAY = 86_400_000
CONV_C = "0c0c0c0c-0000-4000-8000-00000000000c"
EVERY_ROW = AuditConfig(sample_rate=1.0, interval_ms=60_000, idle_ms=DAY, max_rows=100_000)


class FrameOutbox:
    """Frames as a client would receive them (in order), dead letters dropped."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        pass

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        self.sent.extend(orjson.loads(value) for _, value in [*session_deltas, *badges])


class World:
    """A worker core that has projected `lines` and flushed; the replay's result beside it."""

    def __init__(self, lines: list[bytes], lanes: int = 1) -> None:
        self.lines = lines
        self.expected: ReplayResult = run_replay(lines, ReplayOptions(lanes=lanes))
        self.store: InMemoryMessageStore = message_store_for(lines, lanes)
        self.tables = MemoryTables()
        self.projections = InMemoryProjectionStore()
        self.outbox = FrameOutbox()
        self.clock = ManualClock()
        self.core: WorkerCore = make_core(
            lanes,
            self.tables,
            self.store,
            self.projections,
            self.outbox,  # type: ignore[arg-type]
            self.clock,
        )
        self.core.metrics = WorkerMetrics()
        self.users = [b["user_id"] for b in self.expected.badges]
        self.last_ts = 0  # event time of the last change to any row, once projected

    async def project(self) -> None:
        await self.core.on_records(records(self.lines))
        await self.core.flush_all()
        self.settled()

    def settled(self) -> None:
        self.last_ts = max((row.changed_at for row in _rows(self.core)), default=0)

    async def stored(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await as_replay_files(self.projections, self.users)

    async def drift(self, user_id: int, conversation_id: str, **changes: Any) -> dict[str, Any]:
        """Overwrite one stored row (and keep the badge) at the stored version: Redis drifted."""
        held = await self.projections.load(user_id)
        wrong = {**held.rows[conversation_id], **changes}
        badge = Badge(held.total_unread, held.total_mention, held.muted_unread)
        fix = Correction(user_id, held.projection_mailbox_seq, [wrong], badge)
        assert await self.projections.correct([fix]) == [True]
        return wrong

    async def audit(self, after_idle: int = DAY, config: AuditConfig = EVERY_ROW) -> AuditReport:
        return await audit_tick(self.core, config, self.last_ts + after_idle, rng=random.Random(7))

    def scrape(self) -> str:
        metrics = cast("WorkerMetrics | None", self.core.metrics)  # World sets a WorkerMetrics
        assert metrics is not None
        metrics.sync(self.core)
        return metrics_text(metrics.registry)


def three_users() -> list[bytes]:
    s = StreamBuilder()
    for seq in (1, 2, 3):
        s.message(7, seq)  # user 7, A: 3 unread
        s.message(8, seq)  # user 8, A: 3 unread
    s.message(7, 1, conv=CONV_B, mention=True)
    s.message(7, 2, conv=CONV_B)  # user 7, B: 2 unread, 1 mention
    s.message(9, 1, sender=9)  # user 9: own message, nothing unread
    s.message(8, 1, conv=CONV_C)
    s.read(8, 1, conv=CONV_C)  # user 8, C: read, nothing unread
    return s.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_store_drift_is_found_corrected_to_the_replay_and_reported() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        text = w.scrape()
        assert {
            "projector_unread_audited_rows_total",
            "projector_unread_drift_corrected_rows_total",
        } <= names(text)
        assert sample(text, "projector_unread_drift_ratio") == 0

        # Redis drifted: a wrong unread for (7, A), a lost mention for (7, B), a lost row (8, A).
        wrong_a = await w.drift(7, CONV_A, unread_count=40)
        wrong_b = await w.drift(7, CONV_B, mention_count=0, mention_first_conversation_seq=None)
        w.projections._users[8].rows.pop(CONV_A)
        # A client pulled the drifted list of user 7 at the stored version.
        pulled = await w.projections.load(7)
        view = SessionView(7)
        view.reset(pulled.rows.values(), pulled.projection_mailbox_seq)
        assert view.row(CONV_A) == wrong_a and view.row(CONV_B) == wrong_b

        frames_before = len(w.outbox.sent)
        report = await w.audit()
        # Eligible: (7, A), (7, B), (8, A); (9, A) and (8, C) have nothing unread.
        assert (report.eligible, report.sampled, report.audited) == (3, 3, 3)
        assert (report.drifted, report.corrected, report.state_corrected) == (3, 3, 0)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges

        frames = w.outbox.sent[frames_before:]
        assert [(f["type"], f["user_id"], f["correction"]) for f in frames] == [
            ("SESSION_DELTA", 7, True),
            ("SESSION_DELTA", 8, True),
        ]
        for frame in frames:
            assert frame["projection_mailbox_seq"] == frame["prev_projection_mailbox_seq"]
        assert view.apply(frames[0]).status is ApplyStatus.CORRECTED
        want = {r["conversation_id"]: r for r in w.expected.projections if r["user_id"] == 7}
        assert {cid: dict(r) for cid, r in view.known().items()} == want

        text = w.scrape()
        assert sample(text, "projector_unread_drift_ratio") == 1.0
        assert sample(text, "projector_unread_audited_rows_total") == 3
        assert sample(text, "projector_unread_drift_corrected_rows_total") == 3
        assert w.core.stats.audit_rounds == 1

        # The next round finds nothing: the ratio goes back to 0, the counters stay.
        report = await w.audit()
        assert (report.audited, report.drifted) == (3, 0)
        text = w.scrape()
        assert sample(text, "projector_unread_drift_ratio") == 0
        assert sample(text, "projector_unread_audited_rows_total") == 6
        assert sample(text, "projector_unread_drift_corrected_rows_total") == 3

    run(scenario())


def test_rows_that_changed_within_the_idle_threshold_are_left_alone() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        await w.drift(7, CONV_A, unread_count=40)
        report = await w.audit(after_idle=DAY - 1000)  # the last entries are 23:59:59 old
        assert (report.eligible, report.audited) == (0, 0)
        assert (await w.projections.load(7)).rows[CONV_A]["unread_count"] == 40
        assert sample(w.scrape(), "projector_unread_drift_ratio") == 0  # no row compared: no news
        report = await w.audit(config=AuditConfig(0.0, 60_000, DAY, 100))  # rate 0: the audit is off
        assert report == AuditReport()

    run(scenario())


def test_a_drifted_state_is_corrected_persisted_and_written_with_its_badge() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.core.on_records(records(w.lines))
        # The state drifts before the flush (a bug in the deltas): the store gets it too.
        user = w.core.partitions[0].processor.users[7]
        row = user.rows[CONV_A]
        row.unread_count += 5
        row.counting = seqs.add(row.counting, 4)
        user.badge = Badge(user.badge.total_unread + 5, *user.badge[1:])
        await w.core.flush_all()
        w.settled()
        assert (await w.projections.load(7)).total_unread == 10
        report = await w.audit()
        assert (report.drifted, report.state_corrected, report.corrected) == (1, 1, 1)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        assert row.unread_count == 3 and user.badge == Badge(5, 1, 0)
        # Persisted: the changelog tables hold the corrected row and user.
        blob = w.tables.get_rows(0, [(7, CONV_A)])[(7, CONV_A)]
        persisted = ConversationState.load(msgspec.msgpack.decode(blob)["s"], 7, CONV_A)
        assert persisted.unread_count == 3
        assert msgspec.msgpack.decode(w.tables.get_users(0, [7])[7])["badge"] == [5, 1, 0, 0, 0]
        badge_frames = [f for f in w.outbox.sent if f["type"] == "BADGE_UPDATE" and f.get("correction")]
        assert [(f["user_id"], f["total_unread"]) for f in badge_frames] == [(7, 5)]

    run(scenario())


def test_a_state_that_drifted_alone_is_corrected_without_touching_the_store() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        row = w.core.partitions[0].processor.users[8].rows[CONV_A]
        row.unread_count, row.mention_count, row.mention_first = 1, 2, 1  # after the flush
        frames_before = len(w.outbox.sent)
        report = await w.audit()
        assert (report.drifted, report.state_corrected, report.corrected) == (1, 1, 1)
        # cast: mypy keeps row.mention_first narrowed to int from the assignment above (the audit
        # rewrites it behind mypy's back)
        assert (row.unread_count, row.mention_count, cast("int | None", row.mention_first)) == (3, 0, None)
        assert len(w.outbox.sent) == frames_before  # the store and the clients had it right
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges

    run(scenario())


class FailingMessages:
    """The MessageStore, failing every read of one conversation (Cassandra timing out)."""

    def __init__(self, store: InMemoryMessageStore, broken: str) -> None:
        self.store, self.broken = store, broken

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Any:
        if conversation_id == self.broken:
            raise TimeoutError("cassandra range read timed out")
        return self.store.range(conversation_id, after_seq, upto_seq)

    def get(self, conversation_id: str, conversation_seq: int) -> Any:
        return self.store.get(conversation_id, conversation_seq)


def test_failing_reads_cost_the_round_those_rows_never_the_worker() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        await w.drift(7, CONV_A, unread_count=40)
        await w.drift(7, CONV_B, unread_count=40)
        w.core.message_store = FailingMessages(w.store, CONV_B)
        report = await w.audit()
        assert (report.failed, report.audited, report.drifted) == (1, 2, 1)  # (7, B) not recounted
        stored = await w.projections.load(7)
        assert (stored.rows[CONV_A]["unread_count"], stored.rows[CONV_B]["unread_count"]) == (3, 40)

        async def down(user_id: int, conversation_ids: Sequence[str]) -> Any:
            raise ConnectionError("redis down")

        w.core.message_store = w.store
        w.projections.load_rows = down  # type: ignore[method-assign]
        report = await w.audit()
        assert (report.failed, report.audited) == (3, 0)
        assert w.core.stats.audit_rounds == 2

    run(scenario())


def test_rounds_of_one_core_never_overlap() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        first = asyncio.ensure_future(w.audit())
        await asyncio.sleep(0)  # the first round is under way (scanning, or in its worker thread)
        second = await w.audit()
        assert second.overlapped and second.audited == 0
        assert (await first).audited == 3

    run(scenario())


def test_a_pending_flush_carries_the_correction_at_a_newer_version() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        await w.drift(7, CONV_A, unread_count=40)
        later = StreamBuilder()
        later.seq, later.ts = 100, w.last_ts + 10
        later.message(7, 3, conv=CONV_B)  # user 7 changes elsewhere: a flush is pending
        await w.core.on_records(records(later.close(), len(w.lines)))
        report = await w.audit()
        assert (report.audited, report.drifted, report.corrected) == (2, 1, 1)  # (7, B) waits
        assert (await w.projections.load(7)).rows[CONV_A]["unread_count"] == 40  # not in place
        await w.core.flush_all()
        stored = await w.projections.load(7)
        assert stored.rows[CONV_A]["unread_count"] == 3 and stored.projection_mailbox_seq == 101
        delta = [f for f in w.outbox.sent if f["type"] == "SESSION_DELTA"][-1]
        assert "correction" not in delta and [r["conversation_id"] for r in delta["conversations"]] == [
            CONV_A,
            CONV_B,
        ]

    run(scenario())


def test_a_write_the_store_lost_is_restored_by_flushing_the_user_again() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        w.projections._users.pop(8)  # e.g. Redis restarted without its last writes
        report = await w.audit()
        assert report.drifted == 1  # the sampled row (8, A); (8, C) comes back with it
        await w.core.flush_all()
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges

    run(scenario())


def test_a_store_ahead_of_the_worker_is_not_judged() -> None:
    async def scenario() -> None:
        w = World(three_users())
        await w.project()
        w.projections._users[7].version += 1  # another writer got there first
        report = await w.audit()
        assert report.not_judged == 2 and report.audited == 1  # only user 8's row

    run(scenario())


def test_a_row_at_zero_unread_whose_recount_differs_is_found_and_corrected() -> None:
    """A row whose counts drifted to 0 (a message the incremental path lost) is where a missed
    message hides: the former sampler never drew a row at 0 unread; rows at 0 now have a rate of
    their own."""

    s = StreamBuilder()
    for seq in (1, 2, 3):
        s.message(7, seq)  # user 7, A: 3 unread
        s.message(8, seq)
    s.read(8, 3)  # user 8, A: all read
    s.message(9, 1, sender=9, conv=CONV_C)  # user 9, C: its own message

    async def scenario() -> None:
        w = World(s.close())
        await w.project()
        # (7, A) loses its 3 unread: in the state (persisted so) and in the store.
        state = w.core.partitions[0]
        user = state.processor.users[7]
        row = user.rows[CONV_A]
        assert row.unread_count == 3
        row.unread_count, row.counting = 0, None
        user.badge = Badge(user.badge.total_unread - 3, *user.badge[1:])
        state.processor.touch([(7, CONV_A)], [7], w.clock())
        await w.core.persist(state)
        await w.drift(7, CONV_A, unread_count=0)

        unread_only = await w.audit()  # rate 1 for rows with unread, 0 for rows at 0 (as before)
        assert (unread_only.read, unread_only.eligible, unread_only.audited) == (3, 0, 0)
        assert row.unread_count == 0  # every row is at 0 now: none is drawn

        frames_before = len(w.outbox.sent)
        zeros_too = AuditConfig(1.0, 60_000, DAY, 100_000, zero_sample_rate=1.0)
        report = await w.audit(config=zeros_too)
        assert (report.eligible, report.sampled, report.audited) == (3, 3, 3)
        assert (report.drifted, report.state_corrected, report.corrected) == (1, 1, 1)
        assert row.unread_count == 3 and user.badge == Badge(3, 0, 0)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        frames = w.outbox.sent[frames_before:]
        assert [(f["type"], f["user_id"], f["correction"]) for f in frames] == [("SESSION_DELTA", 7, True)]
        corrected = [(r["conversation_id"], r["unread_count"]) for r in frames[0]["conversations"]]
        assert corrected == [(CONV_A, 3)]

    run(scenario())


async def cold_world() -> World:
    """three_users() projected by a core whose hot set is one row, persisted after the flush:
    the rows are clean and left memory (their users' records stay)."""
    w = World(three_users())
    w.core = make_core(1, w.tables, w.store, w.projections, w.outbox, w.clock, hot_rows=1)  # type: ignore[arg-type]
    await w.project()
    await w.core.persist(w.core.partitions[0])
    residency = w.core.partitions[0].processor.residency
    assert residency is not None
    persisted = residency.rows_after(None, 99)
    w.last_ts = max(ConversationState.audit_facts(record).changed_at for _, record in persisted)
    return w


def test_rows_evicted_from_memory_are_audited_from_the_persisted_state() -> None:
    """A hot set of one row: after the flush every user's rows left memory. The sweep reads them
    from the tables, the users are read back (off the loop) for the verdict, and drift found in
    a cold row is corrected as in a warm one."""

    async def scenario() -> None:
        w = await cold_world()
        processor = w.core.partitions[0].processor
        assert processor.resident_rows <= 1 and not _rows(w.core)
        await w.drift(7, CONV_A, unread_count=40)
        report = await w.audit()
        assert (report.read, report.eligible, report.audited) == (5, 3, 3)
        assert (report.drifted, report.corrected) == (1, 1)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges

    run(scenario())


def test_a_user_read_off_the_loop_is_not_attached_if_rows_were_evicted_meanwhile() -> None:
    async def scenario() -> None:
        w = await cold_world()
        processor = w.core.partitions[0].processor
        residency = processor.residency
        assert residency is not None and not processor.users[7].rows
        before = residency.evictions
        read = residency.read_user(7)  # as the audit does in its worker thread
        assert read is not None and {row.conversation_id for row, _ in read.rows} == {CONV_A, CONV_B}
        # Meanwhile (A) and (B) get a message: loaded, changed, persisted and evicted again.
        later = StreamBuilder()
        later.seq, later.ts = 100, w.last_ts + 10
        later.message(7, 4)
        later.message(7, 3, conv=CONV_B)
        await w.core.on_records(records(later.close(), len(w.lines)))
        await w.core.flush_all()
        await w.core.persist(w.core.partitions[0])  # the flushed rows are clean: evicted
        assert residency.evictions != before and not processor.users[7].rows
        assert residency.attach(read, before) is None  # its (A) is older than the state's
        assert not processor.users[7].rows and not processor.users[7].complete
        fresh = residency.read_user(7)
        assert fresh is not None
        user = residency.attach(fresh, residency.evictions)
        assert user is not None and user.complete
        assert (user.rows[CONV_A].unread_count, user.rows[CONV_B].unread_count) == (4, 3)

    run(scenario())


class CountingTables(MemoryTables):
    """MemoryTables that count the rows each `rows_after` call returns, and in which thread."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []
        self.threads: set[str] = set()

    def rows_after(
        self, partition: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], bytes]]:
        got = super().rows_after(partition, after, limit)
        self.reads.append(len(got))
        self.threads.add(threading.current_thread().name)
        return got


def test_a_round_reads_its_share_of_the_rows_in_bounded_ticks_off_the_loop() -> None:
    """40,000 rows persisted, 20 rounds at rate 0.05: each round reads 2,000 rows (its share),
    at most `_READ_SLICE` rows per tick, in a worker thread; the rounds sweep on where the last
    one stopped, so after 20 rounds every row was read exactly once."""

    async def scenario() -> None:
        w = World(three_users())
        w.tables = tables = CountingTables()
        w.core = make_core(1, tables, w.store, w.projections, w.outbox, w.clock)  # type: ignore[arg-type]
        await w.project()
        idle = ConversationState(0, CONV_A)  # nothing unread: not eligible at rate 0 for zeros
        blob = msgspec.msgpack.encode({"s": idle.dump()})
        for n in range(40_000 - 5):
            tables.put_row(0, 1_000 + n % 9_000, f"{n:08x}-0000-4000-8000-{n:012x}", blob)
        await tables.commit()
        assert tables.estimated_rows(0) == 40_000
        config = AuditConfig(0.05, 60_000, DAY, 100_000)
        seen: list[int] = []
        for _ in range(20):
            tables.reads.clear()
            report = await w.audit(config=config)
            assert report.read == sum(tables.reads) == 2_000  # ceil(40,000 x 0.05)
            assert max(tables.reads) <= _READ_SLICE and len(tables.reads) >= 2_000 // _READ_SLICE
            seen.append(report.read)
        assert threading.main_thread().name not in tables.threads
        assert sum(seen) == 40_000
        sweep = _sweeps[w.core.partitions[0]]
        assert sweep.sweeps == 1  # once around: the key space's end passed once in 20 rounds

    run(scenario())


SLOW = settings(
    max_examples=150,
    deadline=None,  # whole streams through the worker core per example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SLOW
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_drift_injected_into_the_store_is_corrected_to_the_replay(stream: Stream, seed: int) -> None:
    """Named invariant `audit_restores_the_replay`: after any stream, drift injected into any
    auditable stored rows (wrong unread, mention, or a lost row) is found, exactly those rows are
    reported drifted, and the store equals the replay again."""
    lines = [line for line in stream.lines() if line.strip()]

    async def scenario() -> None:
        w = World(lines, lanes=stream.lanes)
        await w.project()
        state_rows = _rows(w.core)
        now = w.last_ts + DAY
        policy = AuditPolicy(EVERY_ROW.sample_rate, EVERY_ROW.idle_ms, EVERY_ROW.max_rows)
        policy_rows = [r for r in state_rows if eligible(r, now, policy)]
        rnd = random.Random(seed)
        hit = [r for r in policy_rows if rnd.random() < 0.5]
        for row in hit:
            how = rnd.randrange(3)
            if how == 0:
                await w.drift(
                    row.user_id, row.conversation_id, unread_count=row.unread_count + rnd.randint(1, 9)
                )
            elif how == 1:
                await w.drift(row.user_id, row.conversation_id, mention_count=row.mention_count + 1)
            else:
                w.projections._users[row.user_id].rows.pop(row.conversation_id)
        event(f"auditable rows: {min(len(policy_rows), 5)}{'+' if len(policy_rows) >= 5 else ''}")
        report = await w.audit()
        assert report.audited == len(policy_rows)
        assert report.drifted == len(hit) == report.corrected, "audit_restores_the_replay"
        rows, badges = await w.stored()
        assert rows == w.expected.projections, "audit_restores_the_replay"
        assert badges == w.expected.badges, "audit_restores_the_replay"
        if policy_rows:
            assert w.core.stats.audit_drift_ratio == len(hit) / len(policy_rows)

    run(scenario())


def _rows(core: WorkerCore) -> list[ConversationState]:
    users = [user for state in core.partitions.values() for user in state.processor.users.values()]
    return [row for user in users for row in user.rows.values()]
