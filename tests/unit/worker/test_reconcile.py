"""Reconcile on request in the worker (app/worker/reconcile.py) over the real WorkerCore with the
in-memory tables and stores: rows drifted in the store and rows missing from it are corrected and
filled to the replay's result with ONE correction frame, nothing else is written; a clean user
costs nothing; the badge is recomputed in full; a user with a flush due gets it through the flush;
stale, foreign, unknown and malformed requests are dropped and counted."""

from __future__ import annotations

import asyncio
from typing import Any

from app.domain import seqs
from app.domain.badge import Badge
from app.domain.flush import Correction
from app.domain.reconcile import Outcome, ReconcileRequest, encode_request
from app.metrics import names, sample
from app.replay import ReplayOptions, run_replay
from app.worker.ports import RawRecord
from app.worker.reconcile import ReconcileConfig, ReconcileRunner
from tests.support.builders import StreamBuilder
from tests.support.worker import records
from tests.unit.worker.test_audit import World

HOUR = 3_600_000
CONVS = [f"0c0c0c0c-0000-4000-8000-{i:012x}" for i in range(1, 8)]
ME, PEER = 7, 8


def six_rows() -> list[bytes]:
    """User 7 in six conversations (unread, a mention, a read one, a muted one), user 8 in two."""
    s = StreamBuilder()
    for i, conv in enumerate(CONVS[:6]):
        for seq in range(1, 2 + i):
            s.message(ME, seq, conv=conv, mention=(i == 1 and seq == 1))
    s.read(ME, 3, conv=CONVS[3])
    s.entry("mute", ME, CONVS[4])
    s.entry("mark_unread", ME, CONVS[3])
    s.message(PEER, 1, conv=CONVS[0])
    s.message(PEER, 1, conv=CONVS[6])
    return s.close()


def runner(w: World, owned: bool = True, max_age_ms: int = HOUR) -> ReconcileRunner:
    return ReconcileRunner(
        w.core, ReconcileConfig(max_age_ms=max_age_ms, limit=200), lambda partition: owned, clock_ms=w.clock
    )


def request(user_id: int, w: World, age_ms: int = 0) -> ReconcileRequest:
    return ReconcileRequest(user_id, w.clock() - age_ms, "login")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_drifted_and_missing_rows_are_corrected_and_filled_in_one_correction_frame() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.project()
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        before = await w.projections.load(ME)
        await w.drift(ME, CONVS[0], unread_count=99)
        await w.drift(ME, CONVS[1], mention_count=0, mention_first_conversation_seq=None)
        await w.drift(ME, CONVS[2], pinned=True, pin_rank=3)
        w.projections.forget_rows(ME, [CONVS[3], CONVS[4]])
        corrections = w.projections.corrections(ME)
        sent = len(w.outbox.sent)

        result = await runner(w).handle(0, request(ME, w))

        assert result.outcome is Outcome.CORRECTED
        assert (result.rows, result.corrected, result.filled, result.badge_corrected) == (6, 3, 2, False)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        after = await w.projections.load(ME)
        assert after.projection_mailbox_seq == before.projection_mailbox_seq  # no version moved
        assert w.projections.corrections(ME) == corrections + 1  # one atomic correction
        frames = w.outbox.sent[sent:]
        assert len(frames) == 1
        (frame,) = frames
        assert frame["type"] == "SESSION_DELTA" and frame["correction"] is True
        assert (
            frame["projection_mailbox_seq"]
            == frame["prev_projection_mailbox_seq"]
            == after.projection_mailbox_seq
        )
        want = {r["conversation_id"]: r for r in w.expected.projections if r["user_id"] == ME}
        assert {r["conversation_id"] for r in frame["conversations"]} == set(CONVS[:5])
        for row in frame["conversations"]:
            assert row == want[row["conversation_id"]]
        stats = w.core.stats
        assert (stats.reconcile_rows_corrected, stats.reconcile_rows_filled) == (3, 2)
        assert stats.reconcile_outcomes == {"corrected": 1}
        text = w.scrape()
        assert {
            "projector_reconciles_total",
            "projector_reconcile_rows_corrected_total",
            "projector_reconcile_rows_filled_total",
            "projector_reconcile_rows_compared_total",
        } <= names(text)
        assert sample(text, "projector_reconciles_total", [("outcome", "corrected")]) == 1
        assert sample(text, "projector_reconcile_rows_corrected_total") == 3
        assert sample(text, "projector_reconcile_rows_filled_total") == 2
        assert sample(text, "projector_reconcile_rows_compared_total") == 6

        # Again: nothing differs any more, nothing written, no frame.
        result = await runner(w).handle(0, request(ME, w))
        assert result.outcome is Outcome.CLEAN and (result.corrected, result.filled) == (0, 0)
        assert len(w.outbox.sent) == sent + 1
        assert w.projections.corrections(ME) == corrections + 1

    run(scenario())


def test_a_drifted_badge_is_recomputed_in_full_and_corrected_with_its_frame() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.project()
        held = await w.projections.load(ME)
        await w.projections.correct([Correction(ME, held.projection_mailbox_seq, [], Badge(500, 9, 1))])
        sent = len(w.outbox.sent)
        result = await runner(w).handle(0, request(ME, w))
        assert result.outcome is Outcome.CORRECTED and result.badge_corrected
        assert (result.corrected, result.filled) == (0, 0)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges
        assert [(f["type"], f["correction"]) for f in w.outbox.sent[sent:]] == [("BADGE_UPDATE", True)]

    run(scenario())


def test_a_drifted_state_takes_the_message_store_recount() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.core.on_records(records(w.lines))
        processor = w.core.partitions[0].processor
        user = processor.users[ME]
        row = user.rows[CONVS[0]]
        row.unread_count += 5  # a bug in the deltas: the state and (after the flush) the store
        row.counting = seqs.add(row.counting, 40)
        user.badge = Badge(user.badge.total_unread + 5, *user.badge[1:])
        await w.core.flush_all()
        # The store as that flush would have written it: the fast lane flushed the user when its
        # mention was applied, before the state drifted, so the drift is put there by hand.
        held = await w.projections.load(ME)
        wrong = {**held.rows[CONVS[0]], "unread_count": row.unread_count}
        badge = Badge(held.total_unread + 5, held.total_mention, held.muted_unread)
        assert await w.projections.correct([Correction(ME, held.projection_mailbox_seq, [wrong], badge)]) == [
            True
        ]
        result = await runner(w).handle(0, request(ME, w))
        assert result.outcome is Outcome.CORRECTED
        assert (result.state_corrected, result.corrected, result.badge_corrected) == (1, 1, True)
        rows, badges = await w.stored()
        assert rows == w.expected.projections and badges == w.expected.badges

    run(scenario())


def test_a_user_with_a_flush_due_gets_the_repair_through_that_flush() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.project()
        await w.drift(ME, CONVS[0], unread_count=99)
        w.projections.forget_rows(ME, [CONVS[3]])
        # A new entry for the user, not flushed yet: its window is open.
        more = StreamBuilder()
        more.seq, more.ts = 10_000, 9_000_000
        more.message(ME, 9, conv=CONVS[5])
        extra = more.close()
        await w.core.on_records(records(extra, start=len(w.lines)))
        result = await runner(w).handle(0, request(ME, w))
        assert result.outcome is Outcome.REFLUSHED
        await w.core.flush_all()
        expected = run_replay(w.lines + extra, ReplayOptions(lanes=1))
        rows, badges = await w.stored()
        assert rows == expected.projections and badges == expected.badges

    run(scenario())


def test_stale_foreign_unknown_and_malformed_requests_are_dropped_and_counted() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.project()
        await w.drift(ME, CONVS[0], unread_count=99)
        sent = len(w.outbox.sent)
        assert (
            await runner(w, max_age_ms=HOUR).handle(0, request(ME, w, age_ms=HOUR + 1))
        ).outcome is Outcome.STALE
        assert (await runner(w, owned=False).handle(0, request(ME, w))).outcome is Outcome.NOT_OWNED
        assert (await runner(w).handle(5, request(ME, w))).outcome is Outcome.NOT_OWNED  # not held here
        assert (await runner(w).handle(0, request(12345, w))).outcome is Outcome.UNKNOWN_USER
        assert (await runner(w).handle_record(0, b'{"user_id": "7"}')).outcome is Outcome.MALFORMED
        assert (await runner(w).handle_record(0, None)).outcome is Outcome.MALFORMED
        assert len(w.outbox.sent) == sent
        assert (await w.projections.load(ME)).rows[CONVS[0]]["unread_count"] == 99  # untouched
        assert w.core.stats.reconcile_outcomes == {
            "stale": 1,
            "not_owned": 2,
            "unknown_user": 1,
            "malformed": 2,
        }

    run(scenario())


def test_the_task_handles_offered_records_in_order_and_reports_their_offsets() -> None:
    async def scenario() -> None:
        w = World(six_rows())
        await w.project()
        await w.drift(ME, CONVS[0], unread_count=99)
        r = runner(w)
        r.offer(
            [
                RawRecord("reconcile-request", 0, 40, b"7", encode_request(request(ME, w))),
                RawRecord("reconcile-request", 0, 41, b"8", b"not json"),
                RawRecord("reconcile-request", 0, 42, b"8", encode_request(request(PEER, w))),
            ]
        )
        task = asyncio.create_task(r.run())
        while r.handled.get(0) != 43:
            await asyncio.sleep(0)
        task.cancel()
        assert [x.outcome for x in r.results] == [Outcome.CORRECTED, Outcome.MALFORMED, Outcome.CLEAN]
        assert r.commit_due({}) == {0: 43}
        assert r.commit_due({0: 43}) == {}

    run(scenario())
