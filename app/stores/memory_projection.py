"""In-memory projection store: the `ProjectionStore` port with exactly the Redis store's semantics.

Used by unit tests and by replay-vs-worker comparisons, so it must refuse, overwrite and count
exactly as `app.stores.redis_projection.RedisProjectionStore` does; one contract suite
(`tests/contract/test_projection_store_contract.py`) runs against both.

Rows are kept as orjson bytes (as Redis keeps them) and decoded on `load`, so a caller that
mutates a row after writing it cannot change what is stored, and values come back as a JSON
round trip gives them (tuples as lists, ...) from either store.

The batch validation and encoding are the Redis store's too (app/stores/projection_codec.py):
both reject the same malformed batches, before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.domain.projection_store import StoredProjection, StoredRows
from app.stores.projection_codec import (
    EncodedBatch,
    EncodedCorrection,
    decode_rows,
    encode_batches,
    encode_corrections,
    extra_fields,
)

if TYPE_CHECKING:
    from app.domain.flush import Correction, UserFlush


@dataclass(slots=True)
class _UserRecord:
    version: int = 0
    structure_version: int = 0
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    corrections: int = 0  # rewrites without a new version (redis_projection.SERVED_FIELDS)
    extra: tuple[int, int, int, int] = (0, 0, 0, 0)  # projection_codec.badge_extra
    rows: dict[str, bytes] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)

    def take(self, written: EncodedBatch | EncodedCorrection) -> None:
        """A write's rows and badge (its version is the caller's to move: a correction keeps it)."""
        self.rows.update(written.rows)
        self.total_unread = written.total_unread
        self.total_mention = written.total_mention
        self.muted_unread = written.muted_unread
        self.extra = written.extra


class InMemoryProjectionStore:
    """The projection store in a dict: same refusal rule, same layout semantics, no I/O."""

    def __init__(self, count_writes: bool = False) -> None:
        self.count_writes = count_writes
        self._users: dict[int, _UserRecord] = {}
        # The projection repair's markers and the "server run id" (app/stores/redis_restore.py).
        self._markers: dict[int, str] = {}
        self._run_id = 1

    async def restore(self, batches: Sequence[UserFlush]) -> list[int | None]:
        """`write`, as the projection repair writes (RESTORE_SCRIPT): a batch at the stored
        version is written too, only an older one refused; writes are not counted."""
        return self._write(batches, restoring=True)

    def corrections(self, user_id: int) -> int:
        """How many times the user's rows were rewritten without a new version (correct, restore)."""
        record = self._users.get(user_id)
        return record.corrections if record is not None else 0

    async def inventory(self, user_ids: Sequence[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for user_id in user_ids:
            record = self._users.get(user_id)
            out.append((record.version, len(record.rows)) if record is not None else (0, 0))
        return out

    # -- the projection repair's markers (app/worker/repair.RepairTarget) --------------------

    async def identity(self) -> frozenset[str]:
        return frozenset({f"run-{self._run_id}"})

    async def read_markers(self, partitions: Sequence[int]) -> dict[int, list[str | None]]:
        return {partition: [self._markers.get(partition)] for partition in partitions}

    async def set_markers(self, partition: int, value: str) -> None:
        self._markers[partition] = value

    async def confirm_markers(self, partition: int, expected: str, value: str) -> bool:
        if self._markers.get(partition) != expected:
            return False
        self._markers[partition] = value
        return True

    # -- data loss (tests) ----------------------------------------------------------------------

    def flushall(self, *, restart: bool = False) -> None:
        """Everything gone, as a FLUSHALL (`restart`: as a restart without persistence, which
        also changes the server's run id)."""
        self._users.clear()
        self._markers.clear()
        if restart:
            self._run_id += 1

    def forget(self, user_ids: Sequence[int]) -> None:
        """These users' keys gone (an eviction, a DEL), nothing else."""
        for user_id in user_ids:
            self._users.pop(user_id, None)

    def forget_rows(self, user_id: int, conversation_ids: Sequence[str]) -> None:
        """These rows of the user gone (an HDEL), its meta and other rows kept."""
        user = self._users.get(user_id)
        if user is not None:
            for conversation_id in conversation_ids:
                user.rows.pop(conversation_id, None)

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        return self._write(batches, restoring=False)

    def _write(self, batches: Sequence[UserFlush], *, restoring: bool) -> list[int | None]:
        """WRITE_SCRIPT, or with `restoring` RESTORE_SCRIPT: per batch the version stored before
        it, or None when refused (nothing changes)."""
        results: list[int | None] = []
        # In call order: a user appearing twice is written, then compared, in that order.
        for batch in encode_batches(batches):
            record = self._users.get(batch.user_id)
            previous = record.version if record is not None else 0
            if batch.version < previous or (batch.version == previous and not restoring):
                results.append(None)  # the stored version is newer (or as new): refused
                continue
            if record is None:
                # Created only when written (versions are >= 1, so a first write always is).
                record = self._users[batch.user_id] = _UserRecord()
            record.take(batch)
            record.version = batch.version
            record.structure_version = batch.structure_version
            if restoring:
                record.corrections += 1
            elif self.count_writes:
                for conversation_id, _ in batch.rows:
                    record.writes[conversation_id] = record.writes.get(conversation_id, 0) + 1
            results.append(previous)
        return results

    async def versions(self, user_ids: Sequence[int]) -> list[int]:
        out: list[int] = []
        for user_id in user_ids:
            record = self._users.get(user_id)
            out.append(record.version if record else 0)
        return out

    async def load(self, user_id: int) -> StoredProjection:
        record = self._users.get(user_id)
        if record is None:
            return StoredProjection(user_id, {}, 0, 0, 0, 0, 0)
        return StoredProjection(
            user_id=user_id,
            rows=decode_rows(record.rows),
            total_unread=record.total_unread,
            total_mention=record.total_mention,
            muted_unread=record.muted_unread,
            projection_mailbox_seq=record.version,
            structure_version=record.structure_version,
            **extra_fields(record.extra),
        )

    async def load_rows(self, user_id: int, conversation_ids: Sequence[str]) -> StoredRows:
        record = self._users.get(user_id)
        if record is None:
            return StoredRows(user_id, dict.fromkeys(conversation_ids), 0, 0, 0, 0)
        present = {cid: record.rows[cid] for cid in conversation_ids if cid in record.rows}
        decoded = decode_rows(present)
        return StoredRows(
            user_id=user_id,
            rows={cid: decoded.get(cid) for cid in conversation_ids},
            total_unread=record.total_unread,
            total_mention=record.total_mention,
            muted_unread=record.muted_unread,
            projection_mailbox_seq=record.version,
            **extra_fields(record.extra),
        )

    async def correct(self, corrections: Sequence[Correction]) -> list[bool]:
        results: list[bool] = []
        for correction in encode_corrections(corrections):
            record = self._users.get(correction.user_id)
            if record is None or record.version != correction.version:
                results.append(False)  # the store moved on (or never held it): nothing changes
                continue
            # Not counted in `writes`: that hook measures the flush path's compaction (J-1).
            record.take(correction)
            record.corrections += 1
            results.append(True)
        return results

    async def write_counts(self, user_id: int) -> dict[str, int]:
        """Persistent writes per conversation of this user (empty unless `count_writes`)."""
        record = self._users.get(user_id)
        return dict(record.writes) if record is not None else {}

    async def user_ids(self) -> list[int]:
        """Every user with a stored projection, ascending."""
        return sorted(self._users)

    async def delete_all(self) -> int:
        """Forget everything; returns how many users were stored."""
        count = len(self._users)
        self._users.clear()
        return count
