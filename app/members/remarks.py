"""Remarks (备注): the private note or alias one member (the viewer) keeps about another user.

A remark belongs to the pair (viewer, target): the same target has a different remark, or none,
for each viewer, and nobody but the viewer ever sees it. It is not public profile data (names and
avatars are: app/stores/cassandra_profiles.py) and not group data: one remark per target, in
every group the viewer shares with them. The server hands the caller's remarks out with the
member presentation (``/members/by-user-ids``), so a client's cache is overwritten by the
server's answer (seed 004: the server's presentation wins over a late cache).

This module is the pure part: the rules a remark must satisfy (:func:`check_remark`), the storage
port (:class:`RemarkStore`) and its in-memory implementation. The Cassandra adapter is
app/stores/cassandra_remarks.py; both pass tests/contract/test_remark_store_contract.py.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from app.members.model import BY_IDS_MAX, U64_MAX

# Characters, not bytes: a remark is an alias shown in one row (chat apps allow 16 to 64).
REMARK_MAX_CHARS: Final = 64
# Categories never allowed inside a remark: control characters (Cc, e.g. newline, tab, NUL),
# line and paragraph separators (Zl, Zp) and lone surrogates (Cs: JSON can carry "\ud800", UTF-8
# cannot store it). Unassigned code points are allowed: a character newer than this server's
# Unicode tables (a new emoji) is still a character.
_FORBIDDEN_CATEGORIES: Final = frozenset({"Cc", "Zl", "Zp", "Cs"})
# The same rule as a JSON Schema pattern over the text as sent (the API description: a
# validator or a fuzzer accepts exactly what check_remark accepts, lone surrogates apart): any
# white space around, then 1 to REMARK_MAX_CHARS characters that start and end with a visible
# one and hold no control character (C0, DEL, C1) and no line or paragraph separator.
_EDGE = r"[^\s\x00-\x1f\x7f-\x9f]"
_INNER = r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]"
REMARK_PATTERN: Final = rf"^\s*{_EDGE}(?:{_INNER}{{0,{REMARK_MAX_CHARS - 2}}}{_EDGE})?\s*$"


class InvalidRemark(ValueError):
    """The text cannot be a remark; the message says why (it becomes a 400's message)."""


def check_remark(text: object) -> str:
    """The remark to store for ``text``: surrounding white space removed, then 1 to
    :data:`REMARK_MAX_CHARS` characters with no control character or line break in it.

    An empty (or all white space) remark is refused rather than stored: clearing is its own
    operation (``DELETE``), so a client never clears a remark by accident with a blank field."""
    if not isinstance(text, str):
        raise InvalidRemark("remark must be a string")
    remark = text.strip()
    if not remark:
        raise InvalidRemark("remark must not be empty or only white space (DELETE clears a remark)")
    if len(remark) > REMARK_MAX_CHARS:
        raise InvalidRemark(f"remark is {len(remark)} characters; at most {REMARK_MAX_CHARS}")
    for position, char in enumerate(remark):
        category = unicodedata.category(char)
        if category in _FORBIDDEN_CATEGORIES:
            raise InvalidRemark(
                f"remark has a forbidden character U+{ord(char):04X} ({category}) at position {position}"
            )
    return remark


def check_targets(viewer_id: int, target_ids: Sequence[int]) -> list[int]:
    """The distinct targets of a batch read, ascending; ValueError for a bad id or a batch over
    :data:`~app.members.model.BY_IDS_MAX` (the adapters' shared bound)."""
    _check_id(viewer_id)
    ids = sorted({_check_id(u) for u in target_ids})
    if len(ids) > BY_IDS_MAX:
        raise ValueError(f"at most {BY_IDS_MAX} remark targets a batch, got {len(ids)}")
    return ids


def _check_id(user_id: int) -> int:
    if isinstance(user_id, bool) or not isinstance(user_id, int) or not 0 <= user_id <= U64_MAX:
        raise ValueError(f"user id must be an int in [0, 2^64), got {user_id!r}")
    return user_id


class RemarkStore(Protocol):
    """Per-viewer remarks. Every method validates its ids (ValueError); the stored text has
    passed :func:`check_remark` (the adapters check again: a store never holds a bad remark)."""

    async def remarks(self, viewer_id: int, target_ids: Sequence[int]) -> dict[int, str]:
        """``{target: remark}`` for the targets (0 to 50 distinct ids) the viewer has a remark
        on; a target without one is absent. One viewer per call: no read ever mixes viewers."""
        ...

    async def set_remark(self, viewer_id: int, target_id: int, remark: str, updated_at_ms: int) -> None:
        """Store (or replace) the viewer's remark on the target."""
        ...

    async def clear_remark(self, viewer_id: int, target_id: int) -> None:
        """Remove the viewer's remark on the target; clearing an absent remark is not an error."""
        ...


@dataclass
class InMemoryRemarkStore:
    """:class:`RemarkStore` over a dict (unit tests, the replay tools; same contract as Cassandra)."""

    rows: dict[tuple[int, int], str] = field(default_factory=dict)
    reads: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (viewer, targets) per call

    async def remarks(self, viewer_id: int, target_ids: Sequence[int]) -> dict[int, str]:
        ids = check_targets(viewer_id, target_ids)
        self.reads.append((viewer_id, tuple(ids)))
        return {t: self.rows[(viewer_id, t)] for t in ids if (viewer_id, t) in self.rows}

    async def set_remark(self, viewer_id: int, target_id: int, remark: str, updated_at_ms: int) -> None:
        _check_id(viewer_id)
        _check_id(target_id)
        if check_remark(remark) != remark:
            raise InvalidRemark("remark must be stored as check_remark returns it")
        self.rows[(viewer_id, target_id)] = remark

    async def clear_remark(self, viewer_id: int, target_id: int) -> None:
        _check_id(viewer_id)
        _check_id(target_id)
        self.rows.pop((viewer_id, target_id), None)
