"""The projection repair: a worker that finds the projection store lost data (markers gone or
left by a repair that died, the servers' run ids changed, a flush that found its user behind)
writes its partitions' projection again from its own state, chunk by chunk under the flush lock,
as correction frames that restate versions (docs/decisions/0013-projection-repair.md; the Redis
side is app/stores/redis_restore.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import orjson
from pyroaring import BitMap64

from app.domain.conversation import ConversationState
from app.domain.flush import Correction, UserFlush
from app.domain.projector import UserState
from app.domain.residency import ROW_STATE_KEY
from app.domain.restore import Need, need, restatement
from app.worker.state_source import TablesSource

if TYPE_CHECKING:
    from app.settings import WorkerSettings
    from app.worker.core import PartitionState, WorkerCore

log = logging.getLogger("projector.repair")

DONE = "done:"
RESTORING = "restoring:"
# Keys read from the tables between two yields to the event loop.
_KEY_SLICE = 20_000
# How long a chunk waits for the partition's queued flushes to be published before trying again.
_HELD_WAIT_S = 0.05


class RepairTarget(Protocol):
    """What the repair needs from the projection store (app/stores/redis_restore.py)."""

    async def identity(self) -> frozenset[str]:
        """The store servers' run ids (changes at a restart or a failover)."""
        ...

    async def read_markers(self, partitions: Sequence[int]) -> dict[int, list[str | None]]: ...

    async def set_markers(self, partition: int, value: str) -> None: ...

    async def confirm_markers(self, partition: int, expected: str, value: str) -> bool: ...

    async def inventory(self, user_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Per user, the stored version (0: none) and the number of stored rows."""
        ...

    async def restore(self, batches: Sequence[UserFlush]) -> list[int | None]:
        """Write each batch whole unless the store holds a NEWER version (then None)."""
        ...


@dataclass(frozen=True, slots=True)
class RepairConfig:
    interval_ms: int = 2_000
    chunk_users: int = 256

    @classmethod
    def from_settings(cls, worker: WorkerSettings) -> RepairConfig:
        return cls(interval_ms=worker.store_check_interval_ms, chunk_users=worker.restore_chunk_users)


@dataclass(slots=True)
class _Job:
    partition: int
    reason: str
    users: set[int] | None  # None: every user of the partition


@dataclass(slots=True)
class RepairReport:
    """One repair (also logged)."""

    checked: int = 0  # users compared with the store
    restated: int = 0  # users written whole at their version
    rows: int = 0  # rows those writes carried
    reflushed: int = 0  # users handed whole to their next flush
    ahead: int = 0  # users the store holds at a newer version than this state
    chunks: int = 0
    waits: int = 0  # chunks that waited for the partition's queued flushes
    started: float = field(default_factory=time.monotonic)


class ProjectionRepairer:
    def __init__(self, core: WorkerCore, target: RepairTarget, config: RepairConfig) -> None:
        self.core = core
        core.track_store_behind = True  # `check` drains what the flushes find
        self.target = target
        self.config = config
        # Our markers' tokens: this process, then a count (a dead process's never looks like ours).
        self._tokens = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count(1))
        self.identity: frozenset[str] | None = None
        self.jobs: dict[int, _Job] = {}
        # Partition -> the "restoring:<token>" marker of the repair of ours that runs now.
        self.marking: dict[int, str] = {}
        self.last_report: RepairReport | None = None
        self._checked_at = float("-inf")

    # -- the loop (the worker's task) ------------------------------------------------------------

    async def run(self) -> None:
        """Check, repair, wait `interval_ms`; forever. A failing store costs a round, never the worker."""
        failing = False
        while True:
            try:
                await self.check()
                await self.work()
                if failing:
                    log.info("projection store checks work again")
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("projection store check or repair failed (tried again): %s", exc)
                failing = True
            await asyncio.sleep(self.config.interval_ms / 1000)

    # -- detection ------------------------------------------------------------------------------

    async def check(self) -> None:
        """One detection round over the partitions this worker owns now."""
        self._checked_at = time.monotonic()
        core = self.core
        owned = sorted(core.partitions)
        for partition in list(self.jobs):
            if partition not in core.partitions:
                del self.jobs[partition]  # revoked: its new owner checks it
        identity = await self.target.identity()
        if self.identity is not None and identity != self.identity:
            for partition in owned:
                self.want(partition, "the store's servers changed (a restart or a failover)", None)
        self.identity = identity
        markers = await self.target.read_markers(owned)
        for partition in owned:
            values = markers.get(partition, [None])
            mine = self.marking.get(partition)
            if any(value is None for value in values):
                self.want(partition, "its markers in the store are gone", None)
            elif any(not (value.startswith(DONE) or value == mine) for value in values if value is not None):
                self.want(partition, "a repair of it did not finish", None)
        behind, core.store_behind = core.store_behind, set()
        for user_id in behind:
            holder = core.holder(user_id)
            if holder is not None:
                self.want(holder.partition, "a flush found the store behind", {user_id})

    def want(self, partition: int, reason: str, users: set[int] | None) -> None:
        job = self.jobs.get(partition)
        if job is None:
            self.jobs[partition] = _Job(partition, reason, users)
        elif users is None:
            job.users, job.reason = None, reason
        elif job.users is not None:
            job.users |= users

    # -- repairing ------------------------------------------------------------------------------

    async def work(self) -> None:
        """Run the repairs found, one partition at a time (lowest first)."""
        while self.jobs:
            partition = min(self.jobs)
            job = self.jobs.pop(partition)
            try:
                await self._repair(job)
            except BaseException:
                self.want(partition, job.reason, job.users)  # not done: the next round again
                raise

    async def _repair(self, job: _Job) -> None:
        core = self.core
        partition = job.partition
        state = core.partitions.get(partition)
        if state is None:
            return
        whole = job.users is None
        report = RepairReport()
        marker = ""
        if whole:
            token = next(self._tokens)
            marker = RESTORING + token
            await self.target.set_markers(partition, marker)
            self.marking[partition] = marker
            # INFO: markers are also absent the first time a store is seen; a loss shows at the end.
            log.info("checking partition %d against the projection store: %s", partition, job.reason)
        try:
            users = await self._users_of(state) if job.users is None else sorted(job.users)
            if users is None:
                return  # the partition went to another worker meanwhile
            at = 0
            while at < len(users):
                if core.partitions.get(partition) is not state:
                    log.info("repair of partition %d stopped: it went to another worker", partition)
                    return
                chunk = users[at : at + self.config.chunk_users]
                if not await self._chunk(state, chunk, report):
                    report.waits += 1
                    await asyncio.sleep(_HELD_WAIT_S)  # its queued flushes go out first
                    continue
                at += len(chunk)
                report.chunks += 1
                if time.monotonic() - self._checked_at >= self.config.interval_ms / 1000:
                    await self.check()  # a long repair still notices other partitions' losses
                else:
                    await asyncio.sleep(0)  # batches and flushes go on between chunks
            done = DONE + marker[len(RESTORING) :]
            if whole and not await self.target.confirm_markers(partition, marker, done):
                self.want(partition, "the store lost data again during its repair", None)
                log.warning("partition %d: the store lost data again during its repair", partition)
                return
        finally:
            if whole:
                self.marking.pop(partition, None)
        self.last_report = report
        written = report.restated + report.reflushed
        if written:
            core.stats.projection_restores += 1
        log.log(
            logging.WARNING if written else logging.INFO if whole else logging.DEBUG,
            "%s partition %d%s: %d users checked, %d written again (%d rows), %d handed whole "
            "to their next flush, %d newer in the store, in %.1f s",
            f"projection store lost data ({job.reason}): repaired" if written else "nothing lost in",
            partition,
            "" if whole else f" ({len(users)} users a flush found missing)",
            report.checked,
            report.restated,
            report.rows,
            report.reflushed,
            report.ahead,
            time.monotonic() - report.started,
        )

    async def _users_of(self, state: PartitionState) -> list[int] | None:
        """Every user of the partition's changelog tables, ascending (keys only, in slices)."""
        core = self.core
        users = BitMap64()
        for count, (user_id, _) in enumerate(core.tables.row_keys(state.partition), 1):
            users.add(user_id)
            if count % _KEY_SLICE == 0:
                await asyncio.sleep(0)
                if core.partitions.get(state.partition) is not state:
                    return None
        return list(users)

    async def _chunk(self, state: PartitionState, chunk: list[int], report: RepairReport) -> bool:
        """Repair these users (docs/decisions/0013-projection-repair.md); False while the partition has
        unpublished flushes."""
        core = self.core
        async with core.flush_lock:
            if state.unpublished:
                return False
            checked, reflushed = report.checked, report.reflushed
            try:
                return await self._chunk_locked(state, chunk, report)
            finally:
                stats = core.stats
                stats.restore_checked_users += report.checked - checked
                stats.restore_reflushed_users += report.reflushed - reflushed

    async def _chunk_locked(self, state: PartitionState, chunk: list[int], report: RepairReport) -> bool:
        """`_chunk` under the flush lock."""
        core = self.core
        stored = await self.target.inventory(chunk)
        # From here to the write nothing awaits: the state read is one instant's.
        batches: list[UserFlush] = []
        corrections: list[Correction] = []
        processor = state.processor
        projector = processor.projector
        source = TablesSource(core.tables, state.partition)
        cold = source.get_users([u for u in chunk if u not in projector.users])
        now = core.clock()
        include_muted = core.config.include_muted
        for user_id, (stored_version, stored_rows) in zip(chunk, stored, strict=True):
            # Memory first (newer than the tables); the rest is read, not kept (the hot set's bound).
            user = projector.users.get(user_id)
            held: dict[str, ConversationState] = {}
            if user is None:
                if user_id not in cold:
                    continue  # no user record (nothing of it was ever flushed)
                user = UserState.load(cold[user_id], [])
            else:
                held = user.rows
            rows = list(held.values())
            if user_id in cold or not user.complete:
                rows += [
                    ConversationState.load(record[ROW_STATE_KEY], user_id, conversation_id)
                    for conversation_id, record in source.user_rows(user_id)
                    if conversation_id not in held
                ]
            report.checked += 1
            verdict = need(user, rows, stored_version, stored_rows)
            if verdict is Need.INTACT:
                continue
            if verdict is Need.AHEAD:
                report.ahead += 1
            elif verdict is Need.REFLUSH:
                live = projector.user(user_id)  # read into memory if it was not
                if live is not None:
                    projector.complete(live)
                    processor.mark_dirty(user_id, list(live.rows), now)
                    report.reflushed += 1
            else:
                if stored_version == user.flushed_seq:
                    # Part of the user was flushed at this version after the loss (app/domain/restore).
                    live = projector.user(user_id)
                    if live is not None:
                        live.structure_version += 1
                        processor.touch((), [user_id], now)
                        user = live
                batch, correction = restatement(user, rows, include_muted=include_muted)
                batches.append(batch)
                corrections.append(correction)
        if not batches:
            return True
        previous = await self.target.restore(batches)
        deltas: list[tuple[bytes, bytes]] = []
        badges: list[tuple[bytes, bytes]] = []
        restated = rows_written = 0
        for batch, correction, before in zip(batches, corrections, previous, strict=True):
            if before is None:
                report.ahead += 1  # written meanwhile at a newer version: left as it is
                continue
            restated += 1
            rows_written += len(batch.rows)
            key = str(batch.user_id).encode()
            deltas.append((key, orjson.dumps(correction.session_delta())))
            badges.append((key, orjson.dumps(correction.badge_update())))
        if deltas:
            await core.outbox.frames(deltas, badges)
            core.stats.frames += len(deltas) + len(badges)
        report.restated += restated
        report.rows += rows_written
        core.stats.restored_users += restated
        core.stats.restored_rows += rows_written
        return True
