"""In-memory projection store: the `ProjectionStore` port with exactly the Redis store's semantics.

Used by unit tests and by replay-vs-worker comparisons, so it must refuse, overwrite and count
exactly as `app.stores.redis_projection.RedisProjectionStore` does; one contract suite
(`tests/contract/test_projection_store_contract.py`) runs against both.

Rows are kept as orjson bytes (as Redis keeps them) and decoded on `load`, so a caller that
mutates a row after writing it cannot change what is stored, and values come back as a JSON
round trip gives them (tuples as lists, ...) from either store.

The batch validation and encoding below are shared with the Redis store: both reject the same
malformed batches, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from app.domain.projection_store import StoredProjection, StoredRows

if TYPE_CHECKING:
    from app.domain.badge import Badge
    from app.domain.flush import Correction, UserFlush

U64_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One user's batch, validated and serialized: what one atomic store write needs."""

    user_id: int
    version: int
    structure_version: int
    total_unread: int
    total_mention: int
    muted_unread: int
    rows: list[tuple[str, bytes]]  # (conversation_id, row JSON), in the batch's order


def _check_int(name: str, value: object, low: int, high: int = U64_LIMIT) -> int:
    # bool is an int subclass; True as a version would be a bug upstream, not a value.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ValueError(f"{name} must be an int in [{low}, {high}), got {value!r}")
    return value


def _encode_rows(where: str, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, bytes]]:
    """(conversation_id, row JSON) per row, in order; `where` names the user in the error."""
    encoded: list[tuple[str, bytes]] = []
    for row in rows:
        conversation_id = row.get("conversation_id")
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError(f"{where}: every row needs a conversation_id string, got {row!r}")
        encoded.append((conversation_id, orjson.dumps(row)))
    return encoded


def _check_badge(where: str, badge: Badge) -> tuple[int, int, int]:
    """(total_unread, total_mention, muted_unread), checked.

    Badge totals can in principle be any int; only the type is checked (the core owns their
    meaning). Redis stores them as decimal strings either way."""
    return (
        _check_int(f"{where}: total_unread", badge.total_unread, -U64_LIMIT),
        _check_int(f"{where}: total_mention", badge.total_mention, -U64_LIMIT),
        _check_int(f"{where}: muted_unread", badge.muted_unread, -U64_LIMIT),
    )


def encode_batches(batches: Sequence[UserFlush]) -> list[EncodedBatch]:
    """Validate and serialize every batch first, so a bad one fails the whole call before any
    user is written (a half-applied call would be safe — writes are idempotent — but confusing).

    Raises ValueError for a malformed batch, TypeError (from orjson) for an unserializable row.
    """
    encoded: list[EncodedBatch] = []
    for batch in batches:
        user_id = _check_int("user_id", batch.user_id, 0)
        where = f"user {user_id}"
        rows = _encode_rows(where, batch.rows)
        # The stored version starts at 0 ("nothing stored"), so a version must be >= 1 to be
        # writable at all; mailbox_seq is positive by contract (docs/contract.md §2).
        version = _check_int(f"{where}: projection_mailbox_seq", batch.projection_mailbox_seq, 1)
        structure_version = _check_int(f"{where}: structure_version", batch.structure_version, 0)
        total_unread, total_mention, muted_unread = _check_badge(where, batch.badge)
        encoded.append(
            EncodedBatch(
                user_id=user_id,
                version=version,
                structure_version=structure_version,
                total_unread=total_unread,
                total_mention=total_mention,
                muted_unread=muted_unread,
                rows=rows,
            )
        )
    return encoded


@dataclass(frozen=True, slots=True)
class EncodedCorrection:
    """One user's audit correction, validated and serialized (rows and badge; no version move)."""

    user_id: int
    version: int  # written only while the store holds exactly this version
    total_unread: int
    total_mention: int
    muted_unread: int
    rows: list[tuple[str, bytes]]


def encode_corrections(corrections: Sequence[Correction]) -> list[EncodedCorrection]:
    """As `encode_batches`: every correction checked and serialized before anything is written."""
    encoded: list[EncodedCorrection] = []
    for correction in corrections:
        user_id = _check_int("user_id", correction.user_id, 0)
        where = f"user {user_id}"
        rows = _encode_rows(where, correction.rows)
        version = _check_int(f"{where}: version", correction.version, 1)
        total_unread, total_mention, muted_unread = _check_badge(where, correction.badge)
        encoded.append(
            EncodedCorrection(
                user_id=user_id,
                version=version,
                total_unread=total_unread,
                total_mention=total_mention,
                muted_unread=muted_unread,
                rows=rows,
            )
        )
    return encoded


def decode_rows(raw: dict[str, bytes]) -> dict[str, dict[str, object]]:
    """conversation_id -> row, from stored JSON."""
    rows: dict[str, dict[str, object]] = {}
    for conversation_id, data in raw.items():
        row = orjson.loads(data)
        if not isinstance(row, dict):
            raise ValueError(f"stored row {conversation_id!r} is not a JSON object")
        rows[conversation_id] = row
    return rows


@dataclass(slots=True)
class _UserRecord:
    version: int = 0
    structure_version: int = 0
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    rows: dict[str, bytes] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)


class InMemoryProjectionStore:
    """The projection store in a dict: same refusal rule, same layout semantics, no I/O."""

    def __init__(self, count_writes: bool = False) -> None:
        self.count_writes = count_writes
        self._users: dict[int, _UserRecord] = {}

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        results: list[int | None] = []
        # In call order: a user appearing twice is written, then compared, in that order.
        for batch in encode_batches(batches):
            record = self._users.get(batch.user_id)
            previous = record.version if record is not None else 0
            if batch.version <= previous:
                results.append(None)  # stored version is not older: refused, nothing changes
                continue
            if record is None:
                # Created only when written (versions are >= 1, so a first write always is).
                record = self._users[batch.user_id] = _UserRecord()
            record.rows.update(batch.rows)
            if self.count_writes:
                for conversation_id, _ in batch.rows:
                    record.writes[conversation_id] = record.writes.get(conversation_id, 0) + 1
            record.version = batch.version
            record.structure_version = batch.structure_version
            record.total_unread = batch.total_unread
            record.total_mention = batch.total_mention
            record.muted_unread = batch.muted_unread
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
        )

    async def correct(self, corrections: Sequence[Correction]) -> list[bool]:
        results: list[bool] = []
        for correction in encode_corrections(corrections):
            record = self._users.get(correction.user_id)
            if record is None or record.version != correction.version:
                results.append(False)  # the store moved on (or never held it): nothing changes
                continue
            # Not counted in `writes`: that hook measures the flush path's compaction (J-1).
            record.rows.update(correction.rows)
            record.total_unread = correction.total_unread
            record.total_mention = correction.total_mention
            record.muted_unread = correction.muted_unread
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
