"""After a retention overrun (app/worker/retention.py): the projection epoch bumped once per
overrun, a reconcile asked of every user of the partition in bounded chunks, and the reconcile
then corrects what the deleted entries left wrong where the state can tell (a conversation with a
message after the gap is recounted from the MessageStore); the known gap (a conversation that
first appeared in the deleted entries, nothing after) stays missing."""

from __future__ import annotations

import asyncio
from typing import Any

from app.domain.reconcile import ReconcileRequest
from app.domain.retention import is_new_overrun
from app.metrics import sample
from app.worker.reconcile import ReconcileConfig, ReconcileRunner
from app.worker.retention import RetentionReconciles
from tests.support.builders import StreamBuilder
from tests.support.worker import records
from tests.unit.worker.test_audit import World

HOUR = 3_600_000
A, B, C = (f"0c0c0c0c-0000-4000-8000-{i:012x}" for i in range(1, 4))
ME, PEER, OTHER = 7, 8, 9


def three_parts() -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Kept, deleted unread, after: ME in A (messages in all three), B (read in the deleted part),
    C (first and only message in the deleted part); PEER in A; OTHER only after the gap."""
    s = StreamBuilder()
    s.message(ME, 1, conv=A)
    s.message(ME, 2, conv=A)
    s.message(ME, 1, conv=B)
    s.message(PEER, 1, conv=A)
    kept = s.close_part()
    s.message(ME, 3, conv=A)
    s.message(ME, 4, conv=A)
    s.read(ME, 1, conv=B)
    s.message(ME, 1, conv=C)
    deleted = s.close_part()
    s.message(ME, 5, conv=A)
    s.message(ME, 2, conv=B)
    s.message(OTHER, 1, conv=A)
    return kept, deleted, s.close()


class MemoryEpoch:
    """The store's bump (app/stores/redis_epoch.py) over a dict, with the same rule."""

    def __init__(self) -> None:
        self.epoch = 0
        self.seen: dict[str, int] = {}

    async def bump(self, mark: str, checkpoint_next: int) -> tuple[bool, int]:
        if not is_new_overrun(self.seen.get(mark), checkpoint_next):
            return False, self.epoch
        self.seen[mark] = checkpoint_next
        self.epoch += 1
        return True, self.epoch


class RunnerSender:
    """The topic and its intake in one: each request handed to the runner at once."""

    def __init__(self, runner: ReconcileRunner) -> None:
        self.runner = runner
        self.sent: list[ReconcileRequest] = []
        self.fail_users: set[int] = set()

    async def send(self, request: ReconcileRequest) -> None:
        if request.user_id in self.fail_users:
            raise ConnectionError("kafka (test) refused")
        self.sent.append(request)
        await self.runner.handle(0, request)


async def overrun_world() -> tuple[World, int, int]:
    kept, deleted, after = three_parts()
    w = World([*kept, *deleted, *after])  # the replay and the MessageStore hold every entry
    await w.core.on_records(records(kept))
    await w.core.flush_all()
    checkpoint_next, log_start = len(kept), len(kept) + len(deleted)
    w.core.retention_overrun(0, log_start)
    await w.core.on_records(records(after, start=log_start))
    await w.core.flush_all()
    return w, checkpoint_next, log_start


def reconciles(
    w: World, sender: Any, epoch: MemoryEpoch, owned: Any = None, chunk: int = 200
) -> RetentionReconciles:
    return RetentionReconciles(
        w.core,
        epoch.bump,
        sender,
        "mailbox-tail",
        owned or (lambda partition: True),
        lambda: 0,
        chunk=chunk,
        clock_ms=w.clock,
    )


def stored_row(rows: list[dict[str, Any]], user_id: int, conv: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["user_id"] == user_id and r["conversation_id"] == conv), None)


def test_an_overrun_bumps_the_epoch_once_and_reconciles_every_user_of_the_partition() -> None:
    async def scenario() -> None:
        w, checkpoint_next, _ = await overrun_world()
        want = {(r["user_id"], r["conversation_id"]): r for r in w.expected.projections}
        rows, _ = await w.stored()
        assert stored_row(rows, ME, A) != want[(ME, A)]  # the deleted messages are not counted
        runner = ReconcileRunner(
            w.core, ReconcileConfig(max_age_ms=HOUR, limit=200), lambda p: True, clock_ms=w.clock
        )
        sender, epoch = RunnerSender(runner), MemoryEpoch()
        retention = reconciles(w, sender, epoch, chunk=2)
        w.core.metrics.watch_retention(retention.counts)  # type: ignore[union-attr]  # World sets it

        await retention.overrun(0, checkpoint_next)
        await retention.drain()

        assert epoch.epoch == 1 and retention.epoch == 1
        assert [r.user_id for r in sender.sent] == [ME, PEER, OTHER]
        assert {r.trigger for r in sender.sent} == {"retention"}
        rows, _ = await w.stored()
        # A: messages after the gap: recounted over (read, latest] from the MessageStore, which
        # holds the deleted ones: as the replay of the whole stream says.
        assert stored_row(rows, ME, A) == want[(ME, A)]
        assert stored_row(rows, ME, A)["unread_count"] == 5  # type: ignore[index]
        # C: first seen in the deleted entries, nothing after: the known gap, still missing.
        assert (ME, C) in want and stored_row(rows, ME, C) is None
        # PEER's rows were right all along.
        assert stored_row(rows, PEER, A) == want[(PEER, A)]
        text = w.scrape()
        assert sample(text, "projector_projection_epoch_bumps_total") == 1
        assert sample(text, "projector_retention_reconciles_total", [("outcome", "sent")]) == 3

        # The same overrun found again (a restart before the checkpoint moved): no second bump;
        # the users are asked again (a reconcile is idempotent).
        await retention.overrun(0, checkpoint_next)
        await retention.drain()
        assert epoch.epoch == 1 and retention.counts.epoch_bumps == 1
        assert len(sender.sent) == 6
        assert stored_row((await w.stored())[0], ME, A) == want[(ME, A)]

    asyncio.run(scenario())


def test_requests_stop_when_the_partition_moves_and_failures_are_counted() -> None:
    async def scenario() -> None:
        w, checkpoint_next, _ = await overrun_world()
        runner = ReconcileRunner(
            w.core, ReconcileConfig(max_age_ms=HOUR, limit=200), lambda p: True, clock_ms=w.clock
        )
        sender, epoch = RunnerSender(runner), MemoryEpoch()
        sender.fail_users.add(ME)
        owned_checks: list[bool] = []

        def owned(partition: int) -> bool:
            owned_checks.append(True)
            return len(owned_checks) <= 1  # the partition moves after the first chunk

        retention = reconciles(w, sender, epoch, owned, chunk=2)
        await retention.overrun(0, checkpoint_next)
        await retention.drain()
        assert [r.user_id for r in sender.sent] == [PEER]  # ME's send failed, OTHER's never went
        assert (retention.counts.reconciles_asked, retention.counts.reconciles_unsent) == (1, 2)

    asyncio.run(scenario())


def test_a_failed_bump_is_counted_and_the_users_are_asked_anyway() -> None:
    async def scenario() -> None:
        w, checkpoint_next, _ = await overrun_world()
        runner = ReconcileRunner(
            w.core, ReconcileConfig(max_age_ms=HOUR, limit=200), lambda p: True, clock_ms=w.clock
        )
        sender = RunnerSender(runner)

        async def failing(mark: str, checkpoint_next: int) -> tuple[bool, int]:
            raise ConnectionError("redis (test) unreachable")

        retention = RetentionReconciles(
            w.core, failing, sender, "mailbox-tail", lambda p: True, lambda: 0, clock_ms=w.clock
        )
        await retention.overrun(0, checkpoint_next)
        await retention.drain()
        assert retention.counts.epoch_bump_failures == 1 and retention.counts.epoch_bumps == 0
        assert [r.user_id for r in sender.sent] == [ME, PEER, OTHER]

    asyncio.run(scenario())


def test_the_reconciles_wait_until_the_partition_read_on_to_the_end_it_had_at_the_overrun() -> None:
    async def scenario() -> None:
        kept, deleted, after = three_parts()
        w = World([*kept, *deleted, *after])
        await w.core.on_records(records(kept))
        await w.core.flush_all()
        checkpoint_next, log_start = len(kept), len(kept) + len(deleted)
        w.core.retention_overrun(0, log_start)
        runner = ReconcileRunner(
            w.core, ReconcileConfig(max_age_ms=HOUR, limit=200), lambda p: True, clock_ms=w.clock
        )
        sender = RunnerSender(runner)

        async def input_end(partition: int) -> int:
            return log_start + len(after)  # the entries after the deleted ones, not applied yet

        retention = RetentionReconciles(
            w.core,
            MemoryEpoch().bump,
            sender,
            "mailbox-tail",
            lambda p: True,
            lambda: 0,
            input_end=input_end,
            clock_ms=w.clock,
        )
        await retention.overrun(0, checkpoint_next)
        for _ in range(5):
            await asyncio.sleep(0)
        assert sender.sent == []  # waiting for the partition to read on
        await w.core.on_records(records(after, start=log_start))
        await w.core.flush_all()
        await retention.drain()
        assert [r.user_id for r in sender.sent] == [ME, PEER, OTHER]
        want = {(r["user_id"], r["conversation_id"]): r for r in w.expected.projections}
        assert stored_row((await w.stored())[0], ME, A) == want[(ME, A)]

    asyncio.run(scenario())
