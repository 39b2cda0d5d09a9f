"""Reconcile on request (docs/contract.md §10, "Reconcile on request"): the request record the API
sends to the worker that owns the user, and the pure rules around it.

The path (the API's `app/api/reconcile.py`, the worker's `app/worker/reconcile.py`):

  login (first page without cursor, the stream's hello) | POST /v1/reconcile
  → one atomic SET NX PX in the projection store under the user's hash tag: at most one per
    user per interval, fleet-wide (else 429 / nothing)
  → a `ReconcileRequest` on topic reconcile-request, keyed by the user (mailbox-tail's key and
    partition count: faust's assignor gives partition p of both topics to one worker)
  → the owner, between flushes: every row of the user from its state, the bounded ones recounted
    from the MessageStore, compared with the store (`app.domain.audit.audit_user`), differences
    corrected in place with correction frames, missing rows filled, the badge in full.

Pure: time comes in as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

import msgspec

from app.domain.conversation import ConversationState

Trigger = Literal["login", "stream", "request", "epoch", "retention"]
# What asked: a first page without cursor ("login"), the live stream's hello ("stream"),
# POST /v1/reconcile ("request"), a login whose slot of the previous projection epoch was still
# held ("epoch": the epoch moved since the user's last reconcile, app/domain/retention.py), the
# worker after a retention overrun of the user's partition ("retention").
TRIGGERS: Final[tuple[Trigger, ...]] = ("login", "stream", "request", "epoch", "retention")


class ReconcileRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One record of topic reconcile-request (JSON; key = the user id in decimal)."""

    user_id: int
    requested_at_ms: int
    trigger: Trigger


_DECODER: Final = msgspec.json.Decoder(ReconcileRequest)
_ENCODER: Final = msgspec.json.Encoder()


def request_key(user_id: int) -> bytes:
    """The record key: mailbox-tail's (the user id in decimal), so the default partitioner puts
    the request in the partition of the user's entries."""
    return str(user_id).encode()


def encode_request(request: ReconcileRequest) -> bytes:
    return _ENCODER.encode(request)


def decode_request(raw: bytes | None) -> ReconcileRequest | None:
    """The request, or None for a record that is not one (counted and skipped by the worker)."""
    if not raw:
        return None
    try:
        request = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if request.user_id < 0 or request.requested_at_ms < 0:
        return None
    return request


def recovers_lost_entries(trigger: Trigger) -> bool:
    """The reconcile the worker asks after a retention overrun recounts taking every stored message
    in a row's unread window as received (app.domain.audit.recount's `lost_entries`): the
    deleted entries may have been those messages."""
    return trigger == "retention"


def is_stale(request: ReconcileRequest, now_ms: int, max_age_ms: int) -> bool:
    """Older than the interval: a newer request may already have been accepted for the user, and
    a worker that was away (or a consumer group with no committed offset reading the topic from
    its start) must not work through a backlog of old logins."""
    return now_ms - request.requested_at_ms > max_age_ms


def retry_after_s(remaining_ms: int) -> int:
    """Whole seconds for a Retry-After header (at least 1)."""
    return max(1, math.ceil(remaining_ms / 1000))


def wants_recount(row: ConversationState, limit: int) -> bool:
    """Recounted from the MessageStore: a row with an unread window (base, latest] that one
    bounded read covers. A row with nothing above its base has nothing to count; a wider row is
    counted from its hand (one read cannot check it: the audit leaves it out for the same reason)
    and is still compared with the store as the state holds it."""
    return row.base < row.latest and row.latest - row.base <= limit


class Outcome(Enum):
    CLEAN = "clean"  # the store held every row and the badge as the state has them
    CORRECTED = "corrected"  # rows and/or the badge corrected in place, correction frames sent
    REFLUSHED = "reflushed"  # a flush of the user is due anyway (or the store lost a write): it carries them
    NOT_JUDGED = "not_judged"  # the store is ahead of this worker's state (another writer)
    REFUSED = "refused"  # the store moved on between the read and the correction
    UNKNOWN_USER = "unknown_user"  # the worker's state knows no row of the user
    FAILED = "failed"  # a read or write failed (Cassandra, Redis, the changelog)
    NOT_OWNED = "not_owned"  # the partition is not this worker's (any more)
    STALE = "stale"  # older than the interval
    MALFORMED = "malformed"  # not a reconcile request


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one request did."""

    user_id: int
    outcome: Outcome
    rows: int = 0  # rows of the user compared
    recounted: int = 0  # of them, recounted from the MessageStore
    corrected: int = 0  # rows the store held and that differed (rewritten)
    filled: int = 0  # rows the store lacked (written)
    state_corrected: int = 0  # rows whose state counts took the recount
    badge_corrected: bool = False  # the stored badge was off (a BADGE_UPDATE correction went out)


def split_rows(
    written: Iterable[Mapping[str, Any]], stored: Mapping[str, Mapping[str, object] | None]
) -> tuple[int, int]:
    """(corrected, filled): written rows the store held with other values / did not hold."""
    corrected = filled = 0
    for row in written:
        if stored.get(str(row["conversation_id"])) is None:
            filled += 1
        else:
            corrected += 1
    return corrected, filled
