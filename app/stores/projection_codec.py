"""The projection store's batch encoding, shared by every store (Redis, in memory): one validation of
a flush or a correction before anything is written, rows as orjson bytes, and their decoding.

Both stores reject the same malformed batches, before anything is written, and give back values
as a JSON round trip gives them (tuples as lists, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from app.domain.badge import Badge
    from app.domain.flush import Correction, UserFlush

U64_LIMIT = 1 << 64


@dataclass(slots=True)  # not frozen: see UserFlush (one per flushed user)
class EncodedBatch:
    """One user's batch, validated and serialized: what one atomic store write needs."""

    user_id: int
    version: int
    structure_version: int
    total_unread: int
    total_mention: int
    muted_unread: int
    rows: list[tuple[str, bytes]]  # (conversation_id, row JSON), in the batch's order
    # docs/contract.md §10: the folder totals and the preferences the badge is in (`extra`)
    extra: tuple[int, int, int, int] = (0, 0, 0, 0)


def _check_int(name: str, value: object, low: int, high: int = U64_LIMIT) -> int:
    # bool is an int subclass; True as a version would be a bug upstream, not a value.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ValueError(f"{name} must be an int in [{low}, {high}), got {value!r}")
    return value


def _encode_rows(user_id: int, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, bytes]]:
    """(conversation_id, row JSON) per row, in order; `user_id` names the user in the error."""
    encoded: list[tuple[str, bytes]] = []
    dumps = orjson.dumps
    for row in rows:
        conversation_id = row.get("conversation_id")
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError(f"user {user_id}: every row needs a conversation_id string, got {row!r}")
        encoded.append((conversation_id, dumps(row)))
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


def badge_extra(where: str, badge: Badge) -> tuple[int, int, int, int]:
    """(archived_unread, archived_mention, conversations_mode 0/1, include_muted 0/1), checked:
    what the store keeps of docs/contract.md §10's badge beside the three counts (all ints, so
    a meta hash stays a hash of decimal strings)."""
    if badge.badge_mode not in ("messages", "conversations"):
        raise ValueError(
            f"{where}: badge_mode must be 'messages' or 'conversations', got {badge.badge_mode!r}"
        )
    if type(badge.include_muted) is not bool:
        raise ValueError(f"{where}: include_muted must be a bool, got {badge.include_muted!r}")
    return (
        _check_int(f"{where}: archived_unread", badge.archived_unread, -U64_LIMIT),
        _check_int(f"{where}: archived_mention", badge.archived_mention, -U64_LIMIT),
        1 if badge.badge_mode == "conversations" else 0,
        1 if badge.include_muted else 0,
    )


def encode_batches(batches: Sequence[UserFlush]) -> list[EncodedBatch]:
    """Validate and serialize every batch first, so a bad one fails the whole call before any
    user is written (a half-applied call would be safe — writes are idempotent — but confusing).

    Raises ValueError for a malformed batch, TypeError (from orjson) for an unserializable row.
    """
    encoded: list[EncodedBatch] = []
    for batch in batches:
        user_id = batch.user_id
        version = batch.projection_mailbox_seq
        structure_version = batch.structure_version
        badge = batch.badge
        total_unread = badge.total_unread
        total_mention = badge.total_mention
        muted_unread = badge.muted_unread
        # One flush encodes a batch per user: plain ints in range pass in one test; anything
        # else takes the checks one by one, which name what is wrong (and accept an int
        # subclass other than bool, as they always did), in their old order: the user id, the
        # rows, then the numbers.
        plain = (
            type(user_id) is int
            and 0 <= user_id < U64_LIMIT
            and type(version) is int
            # The stored version starts at 0 ("nothing stored"), so a version must be >= 1 to
            # be writable at all; mailbox_seq is positive by contract (docs/contract.md §2).
            and 1 <= version < U64_LIMIT
            and type(structure_version) is int
            and 0 <= structure_version < U64_LIMIT
            and type(total_unread) is int
            and -U64_LIMIT <= total_unread < U64_LIMIT
            and type(total_mention) is int
            and -U64_LIMIT <= total_mention < U64_LIMIT
            and type(muted_unread) is int
            and -U64_LIMIT <= muted_unread < U64_LIMIT
        )
        if not plain:
            user_id = _check_int("user_id", user_id, 0)
        rows = _encode_rows(user_id, batch.rows)
        if not plain:
            where = f"user {user_id}"
            version = _check_int(f"{where}: projection_mailbox_seq", version, 1)
            structure_version = _check_int(f"{where}: structure_version", structure_version, 0)
            total_unread, total_mention, muted_unread = _check_badge(where, badge)
        encoded.append(
            EncodedBatch(
                user_id=user_id,
                version=version,
                structure_version=structure_version,
                total_unread=total_unread,
                total_mention=total_mention,
                muted_unread=muted_unread,
                rows=rows,
                extra=badge_extra(f"user {user_id}", badge),
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
    extra: tuple[int, int, int, int] = (0, 0, 0, 0)  # as EncodedBatch.extra


def encode_corrections(corrections: Sequence[Correction]) -> list[EncodedCorrection]:
    """As `encode_batches`: every correction checked and serialized before anything is written."""
    encoded: list[EncodedCorrection] = []
    for correction in corrections:
        user_id = _check_int("user_id", correction.user_id, 0)
        where = f"user {user_id}"
        rows = _encode_rows(user_id, correction.rows)
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
                extra=badge_extra(where, correction.badge),
            )
        )
    return encoded


def extra_fields(extra: Sequence[int]) -> dict[str, Any]:
    """The §10 badge fields of StoredProjection/StoredRows from the stored ints (badge_extra)."""
    archived_unread, archived_mention, conversations_mode, include_muted = extra
    return {
        "archived_unread": archived_unread,
        "archived_mention": archived_mention,
        "badge_mode": "conversations" if conversations_mode else "messages",
        "include_muted": bool(include_muted),
    }


def decode_rows(raw: dict[str, bytes]) -> dict[str, dict[str, object]]:
    """conversation_id -> row, from stored JSON."""
    rows: dict[str, dict[str, object]] = {}
    for conversation_id, data in raw.items():
        row = orjson.loads(data)
        if not isinstance(row, dict):
            raise ValueError(f"stored row {conversation_id!r} is not a JSON object")
        rows[conversation_id] = row
    return rows
