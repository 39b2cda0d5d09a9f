"""The Cassandra mirror beside the projection: UserConversationState, group members and member
statistics written in spaced rounds, one at a time, by one background task, never on the flush
path. What is not acknowledged yet is owed in the changelog and restaged after a crash
(docs/decisions/0009-mirror-owed-writes.md). Past `backlog_rows` staged changes the intake waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from app.domain.processor import MemberChange, MemberStatsChange, MirrorChange, StateChange
from app.worker.ports import StateWriter

log = logging.getLogger("projector.worker")

# Cassandra's bigint (CQL has no unsigned type): a larger valid u64 cannot be mirrored.
CQL_BIGINT_MAX = 2**63 - 1
# A first appearance is written at timestamp 2^50 - seq: a larger seq is not sent as one.
FIRST_SEEN_LIMIT = 2**50
# Time between the starts of two rounds (s): writes to one key within it merge.
SPACING_S = 0.1
# Changes staged since the current round took its share before the intake waits for the mirror.
BACKLOG_ROWS = 200_000
# After a failed round: the next one after 0.5 s, doubling up to this (s).
RETRY_MAX_S = 30.0


class MirrorStats(Protocol):
    """What the pump counts (fields of the worker's stats)."""

    state_writes: int
    state_write_failures: int
    state_unmirrorable: int
    state_restaged_rows: int


class MirrorPump:
    def __init__(
        self,
        writer: StateWriter,
        stats: MirrorStats,
        *,
        spacing_s: float = SPACING_S,
        backlog_rows: int = BACKLOG_ROWS,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.writer = writer
        self.stats = stats
        self.spacing_s = spacing_s
        self.backlog_rows = backlog_rows
        self.retry_max_s = retry_max_s
        self._staged_since = 0  # changes staged since the current round took its share
        self._task: asyncio.Task[None] | None = None  # the rounds
        self._current: asyncio.Task[bool] | None = None  # the round being written: one at a time
        self._failing_since_round = 0  # failed rounds in the current streak
        # Loop time before which no round starts: the spacing after a write, else the backoff.
        self._not_before = 0.0
        self._started = 0.0  # loop time the current round started
        self._closed = False

    # -- staging ----------------------------------------------------------------------------------

    def stage(self, changes: Sequence[MirrorChange]) -> None:
        """A batch's mirror changes, staged for the next round."""
        writer = self.writer
        for change in changes:
            if isinstance(change, StateChange):
                fields = dict(change.fields)
                fields["updated_mailbox_seq"] = change.mailbox_seq
                if change.new_row and change.mailbox_seq < FIRST_SEEN_LIMIT and change.ts <= CQL_BIGINT_MAX:
                    fields["first_seen_mailbox_seq"] = change.mailbox_seq
                    fields["first_seen_ts"] = change.ts
                if all(not isinstance(v, int) or v <= CQL_BIGINT_MAX for v in fields.values()):
                    writer.stage(change.user_id, change.conversation_id, fields)
                else:
                    # Valid u64 values above Cassandra's bigint: not mirrored (the projection has them).
                    self.stats.state_unmirrorable += 1
            elif isinstance(change, MemberChange):
                writer.stage_member(
                    change.conversation_id,
                    change.user_id,
                    change.role,
                    change.membership,
                    change.joined_at,
                    change.left_at,
                )
            elif isinstance(change, MemberStatsChange):
                writer.stage_member_stats(
                    change.conversation_id,
                    change.user_id,
                    change.record_count,
                    change.mention_count,
                    change.mailbox_seq,
                )
        self._staged_since += len(changes)
        self.kick()

    def restage(self, key: tuple[int, str], owed: Any) -> None:
        """Owed writes read back from a row's changelog record after a restart."""
        try:
            self.writer.restage(key[0], key[1], owed)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a record it cannot read
            log.error("owed Cassandra writes of %s not restaged: %s", key, exc)
            return
        self.stats.state_restaged_rows += 1
        self._staged_since += 1

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        return self.writer.owed()

    def drop(self, keys: Iterable[tuple[int, str]]) -> None:
        self.writer.drop(keys)

    @property
    def caught_up(self) -> bool:
        """Every change staged so far is acknowledged by Cassandra."""
        current = self._current
        return not self._staged_since and (current is None or current.done())

    @property
    def behind(self) -> bool:
        """So much is staged that the intake should wait for the mirror."""
        return self._staged_since > self.backlog_rows

    # -- rounds -----------------------------------------------------------------------------------

    def kick(self) -> None:
        """Start the rounds unless they run (outside an event loop: the next drain writes)."""
        task = self._task
        if self._closed or (task is not None and not task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._rounds())

    async def _rounds(self) -> None:
        loop = asyncio.get_running_loop()
        while self._staged_since:
            pause = self._not_before - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
                continue  # a drain meanwhile may have written everything
            await self._round()

    async def _round(self) -> bool:
        """Write what is staged, after the round being written. False: it failed (still owed)."""
        await self.settle()
        if not self._staged_since:
            return True  # the round just written took everything (or nothing was staged)
        self._staged_since = 0  # this round takes it all (set before anyone else runs)
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        self._current = current = loop.create_task(self._write())
        current.add_done_callback(self._written)
        await asyncio.wait([current])  # not cancelled with its caller: the write completes
        return not current.cancelled() and current.result()

    def _written(self, write: asyncio.Task[bool]) -> None:
        loop = asyncio.get_running_loop()
        if not write.cancelled() and write.result():
            self._not_before = self._started + self.spacing_s
            return
        # A failed or cancelled round left its share staged: the next round takes it after the
        # backoff. A failure kicks the rounds' task here (a drain's round runs outside it).
        self._staged_since = max(self._staged_since, 1)
        failed = max(self._failing_since_round, 1)
        self._not_before = loop.time() + min(self.retry_max_s, 0.5 * 2 ** min(failed - 1, 10))
        if not write.cancelled():  # a cancel is a shutdown (or a kill): no new rounds for it
            self.kick()

    async def _write(self) -> bool:
        try:
            self.stats.state_writes += await self.writer.flush()
        except Exception as exc:  # a mirror: never stop the projection for it
            self.stats.state_write_failures += 1
            self._failing_since_round += 1
            if self._failing_since_round == 1:
                log.error("UserConversationState write failed (retrying, owed in the changelog): %s", exc)
            else:
                log.debug("UserConversationState write failed again (%d): %s", self._failing_since_round, exc)
            return False
        if self._failing_since_round:
            log.info(
                "UserConversationState writes succeed again (after %d failed rounds)",
                self._failing_since_round,
            )
            self._failing_since_round = 0
        return True

    async def settle(self) -> None:
        """Wait for the round being written, if any (not for the spacing before the next)."""
        while (current := self._current) is not None and not current.done():
            await asyncio.wait([current])

    async def drain(self) -> bool:
        """Write everything staged now (a clean stop, the backlog bound). False: the round failed."""
        return await self._round()

    async def close(self) -> None:
        """Stop the rounds and the write in progress (what is owed is in the changelog)."""
        self._closed = True  # a round cancelled here must not start the rounds again
        for task in (self._task, self._current):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._current = None
