"""The pure pieces of reconcile on request (app/domain/reconcile.py): the request record, its
age rule, Retry-After rounding, which rows a reconcile recounts, corrected vs filled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain import seqs
from app.domain.conversation import ConversationState
from app.domain.reconcile import (
    ReconcileRequest,
    decode_request,
    encode_request,
    is_stale,
    request_key,
    retry_after_s,
    split_rows,
    wants_recount,
)
from app.settings import ProcessingSettings, ReconcileSettings
from app.worker.reconcile import MIN_MAX_AGE_S, ReconcileConfig

U64 = 2**64 - 1


@given(
    st.integers(0, U64),
    st.integers(0, 2**53),
    st.sampled_from(["login", "stream", "request"]),
)
def test_a_request_round_trips_and_is_keyed_like_mailbox_tail(user: int, at: int, trigger: str) -> None:
    request = ReconcileRequest(user, at, trigger)  # type: ignore[arg-type]  # drawn from the Literal
    assert decode_request(encode_request(request)) == request
    assert request_key(user) == str(user).encode()  # mailbox-tail's key: the same partition


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"not json",
        b"[]",
        b'{"user_id": "7", "requested_at_ms": 1, "trigger": "login"}',
        b'{"user_id": 7, "requested_at_ms": 1, "trigger": "logout"}',
        b'{"user_id": 7, "trigger": "login"}',
        b'{"user_id": -7, "requested_at_ms": 1, "trigger": "login"}',
        b'{"user_id": 7, "requested_at_ms": -1, "trigger": "login"}',
    ],
)
def test_anything_else_is_not_a_request(raw: bytes | None) -> None:
    assert decode_request(raw) is None


def test_unknown_fields_are_ignored_for_a_newer_api() -> None:
    raw = b'{"user_id": 7, "requested_at_ms": 5, "trigger": "request", "device": "x"}'
    assert decode_request(raw) == ReconcileRequest(7, 5, "request")


def test_a_request_older_than_the_bound_is_stale() -> None:
    request = ReconcileRequest(7, 1_000, "login")
    assert not is_stale(request, 1_000 + 60_000, 60_000)
    assert is_stale(request, 1_000 + 60_001, 60_000)
    assert not is_stale(request, 0, 60_000)  # a clock behind the API's: not stale


def test_the_worker_keeps_requests_at_least_a_minute() -> None:
    assert (
        ReconcileConfig.from_settings(
            ReconcileSettings(reconcile_min_interval_s=1), ProcessingSettings()
        ).max_age_ms
        == MIN_MAX_AGE_S * 1000
    )
    assert (
        ReconcileConfig.from_settings(
            ReconcileSettings(reconcile_min_interval_s=300), ProcessingSettings()
        ).max_age_ms
        == 300_000
    )


@pytest.mark.parametrize(("ms", "s"), [(1, 1), (999, 1), (1000, 1), (1001, 2), (299_001, 300)])
def test_retry_after_is_whole_seconds_rounded_up(ms: int, s: int) -> None:
    assert retry_after_s(ms) == s


def _row(read: int, latest: int) -> ConversationState:
    row = ConversationState(7, "0c0c0c0c-0000-4000-8000-000000000001")
    for seq in range(1, latest + 1):
        row.counting = seqs.add(row.counting, seq)
    row.head_seq = latest or None
    row.read_seq = read
    row.base = read  # what _rebase keeps: max(read, hidden, joined, deleted)
    return row


def test_only_rows_with_a_window_one_read_covers_are_recounted() -> None:
    limit = 200
    assert wants_recount(_row(read=2, latest=5), limit)
    assert not wants_recount(_row(read=5, latest=5), limit)  # nothing above the base
    assert wants_recount(_row(read=0, latest=200), limit)
    assert not wants_recount(_row(read=0, latest=201), limit)  # counted from the hand


def test_written_rows_split_into_corrected_and_filled() -> None:
    written = [{"conversation_id": c} for c in ("a", "b", "c")]
    assert split_rows(written, {"a": {"x": 1}, "b": None}) == (1, 2)
