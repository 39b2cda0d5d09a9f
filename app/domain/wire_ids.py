"""64-bit ids towards clients: decimal strings (docs/contract.md §9 "Ids towards clients").

A u64 user id does not survive JavaScript's doubles (``11982011376358104761`` reads back as
``11982011376358105000``), so every JSON the system sends to a client carries user ids as
decimal strings. Inside the system (mailbox input, Kafka frames between the worker and the
gateway, the projection store) they stay JSON numbers: only the edges convert, in one place,
here: the query API (rows, member directory), the live stream gateway (frames) and the push
topic; the Python SDK converts back with :func:`frame_from_client` / :func:`row_from_client`.

Which fields are ids: ``user_id`` (frame, row, member, notice, push record), ``sender_id``,
``next_user_id`` and the id lists of the member routes. Sequence numbers and counts stay
numbers (a ``projection_mailbox_seq`` is a version, not an identity; the browser client checks
that every number it compares is a safe integer).

Stdlib only (the domain core stays pure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

U64_MAX: Final = (1 << 64) - 1


def _decimal_at_most(limit: int) -> str:
    """A regex of the canonical decimals from 0 to `limit` (a description's pattern must not
    admit a 20-digit string above 2^64-1: a fuzzer sends it as valid)."""
    top = str(limit)
    shorter = f"[1-9][0-9]{{0,{len(top) - 2}}}"
    same_length = []
    for i, digit in enumerate(top):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(top) - i - 1
            same_length.append(f"{top[:i]}[{low}-{int(digit) - 1}][0-9]{{{rest}}}")
    return "^(0|" + "|".join([shorter, *same_length, top]) + ")$"


# The canonical decimal form: no sign, no leading zero, at most 2^64-1.
U64_PATTERN: Final = _decimal_at_most(U64_MAX)
_U64_TEXT: Final = re.compile(r"0|[1-9][0-9]{0,19}")

# The OpenAPI schema of an id as sent to clients.
ID_SCHEMA: Final[dict[str, Any]] = {
    "type": "string",
    "pattern": U64_PATTERN,
    "format": "uint64",
    "description": (
        "An unsigned 64-bit id as a decimal string (a JSON number would lose precision in JavaScript)"
    ),
}

# A row's ``"user_id": <digits>`` member in JSON as the store holds it. Rows are flat objects, so
# the only place a quote-user_id-quote-colon sequence can appear unescaped is that key (inside a
# string value every quote is escaped).
_ROW_USER_ID: Final = re.compile(rb'"user_id"\s*:\s*(-?[0-9]+)')
_AFTER_VALUE: Final = frozenset(b",}")  # what ends a number in compact JSON


def id_text(value: int) -> str:
    """``value`` (a u64) as the decimal string clients get."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise ValueError(f"not a u64 id: {value!r}")
    return str(value)


def parse_id(value: object) -> int:
    """A u64 id from a client's JSON: the canonical decimal string, or (older clients, Python
    callers) a JSON integer. ValueError otherwise."""
    if isinstance(value, str):
        if not _U64_TEXT.fullmatch(value) or int(value) > U64_MAX:
            raise ValueError(f"not a u64 id: {value[:40]!r}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise ValueError(f"not a u64 id: {value!r}")
    return value


def row_json_to_client(data: bytes, user_id: int | None = None) -> bytes:
    """A stored row's JSON with its ``user_id`` as a string (byte level: the API holds rows as the
    JSON the store returned and never decodes them whole). A row already converted, or without
    the field, comes back unchanged. With the ``user_id`` the row is expected to carry, the
    compact form the store writes is found by a plain search (a cold load converts thousands of
    rows: ~30x cheaper than the pattern); anything else takes the pattern."""
    if user_id is not None:
        needle = b'"user_id":%d' % user_id
        at = data.find(needle)
        end = at + len(needle)
        if at >= 0 and end < len(data) and data[end] in _AFTER_VALUE and data.find(b'"user_id"') == at:
            return b"".join((data[:at], b'"user_id":"%d"' % user_id, data[end:]))
    return _ROW_USER_ID.sub(rb'"user_id":"\1"', data, count=1)


def row_to_client(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if isinstance(out.get("user_id"), int):
        out["user_id"] = id_text(out["user_id"])
    return out


def row_from_client(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "user_id" in out:
        out["user_id"] = parse_id(out["user_id"])
    return out


def frame_to_client(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A frame (SESSION_DELTA, BADGE_UPDATE, MEMBER_NOTICE) as the live stream sends it."""
    out = dict(frame)
    if isinstance(out.get("user_id"), int):
        out["user_id"] = id_text(out["user_id"])
    rows = out.get("conversations")
    if isinstance(rows, list):
        out["conversations"] = [row_to_client(r) if isinstance(r, Mapping) else r for r in rows]
    return out


def frame_from_client(frame: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`frame_to_client` (the Python SDK): ids back to ints. ValueError for
    an id that is not a u64."""
    out = dict(frame)
    if "user_id" in out:
        out["user_id"] = parse_id(out["user_id"])
    rows = out.get("conversations")
    if isinstance(rows, list):
        out["conversations"] = [row_from_client(r) if isinstance(r, Mapping) else r for r in rows]
    return out
