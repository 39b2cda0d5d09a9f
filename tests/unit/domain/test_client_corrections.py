"""The client rule for audit corrections (issue 7, docs/contract.md §3.4 "Unread audit"): a
correction restates version V with the values V should have had; it overwrites the rows (and
badge) the client holds at a version <= V, keeps newer ones, and never moves the chain position."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.badge import Badge as Totals
from app.domain.client import ApplyStatus, Badge, DeltaMerger, FrameError, SessionView
from app.domain.flush import Correction
from tests.support.frames import C1, C2, C3, USER, badge, delta, row

ZERO = Totals()


def correction(version: int, rows: list[dict[str, object]], totals: Totals = ZERO) -> Correction:
    return Correction(USER, version, [dict(r) for r in rows], totals, driving_event_id="e")


def test_a_pull_of_drifted_rows_is_corrected_and_the_chain_goes_on() -> None:
    view = SessionView(USER)
    # The client pulled at version 10 while the store held a drifted C1 (unread 7, truly 2).
    view.reset([row(C1, 7), row(C2, 1)], 10, badge=Badge(8, 0, 0, 10))
    fix = correction(10, [row(C1, 2)], Totals(3, 0, 0))
    result = view.apply(fix.session_delta())
    assert result.status is ApplyStatus.CORRECTED and result.applied and not result.needs_repull
    assert result.conversations == (C1,)
    assert view.row(C1) == row(C1, 2) and view.row(C2) == row(C2, 1)
    assert view.version == 10  # no step in the chain
    assert view.apply(fix.badge_update()).status is ApplyStatus.CORRECTED
    assert view.badge == Badge(3, 0, 0, 10)
    # The next ordinary frame names 10 as its prev: applied, no gap.
    assert view.apply(delta(12, 10, [row(C2, 0)])).status is ApplyStatus.APPLIED
    assert view.apply(badge(12, 10, 2)).status is ApplyStatus.APPLIED
    # Corrections are idempotent (absolute): a redelivery changes nothing.
    assert view.apply(fix.session_delta()).status is ApplyStatus.CORRECTED
    assert view.row(C1) == row(C1, 2)


def test_rows_and_badges_held_at_a_newer_version_are_kept() -> None:
    view = SessionView(USER)
    view.reset([row(C1, 7), row(C2, 1)], 10)
    assert view.apply(delta(11, 10, [row(C1, 5)])).applied  # C1 moved on after the correction's V
    assert view.apply(badge(11, 10, 6)).applied
    stale = correction(10, [row(C1, 2), row(C2, 0)], Totals(2, 0, 0))
    result = view.apply(stale.session_delta())
    assert result.conversations == (C2,)  # C2 was still held at 10: corrected; C1 kept
    assert view.row(C1) == {**row(C1, 5), "projection_mailbox_seq": 11}
    assert view.row_version(C2) == 10 and view.version == 11
    assert view.apply(stale.badge_update()).status is ApplyStatus.STALE
    assert view.badge is not None and view.badge.total_unread == 6
    only_newer = correction(10, [row(C1, 0)])
    assert view.apply(only_newer.session_delta()).status is ApplyStatus.STALE


def test_a_correction_of_an_unknown_conversation_adds_its_row() -> None:
    view = SessionView(USER, version=4)
    assert view.apply(correction(4, [row(C3, 1)]).session_delta()).conversations == (C3,)
    assert view.row(C3) == row(C3, 1) and view.version == 4


def test_corrections_for_another_user_or_malformed_ones() -> None:
    view = SessionView(USER)
    other = {**correction(3, [row(C1, 1)]).session_delta(), "user_id": USER + 1}
    assert view.apply(other).status is ApplyStatus.FOREIGN
    stepping = {**correction(3, [row(C1, 1)]).session_delta(), "prev_projection_mailbox_seq": 2}
    with pytest.raises(FrameError, match="restates its version"):
        view.apply(stepping)
    with pytest.raises(FrameError, match="'correction' must be a boolean"):
        view.apply({**delta(3, 0, [row(C1, 1)]), "correction": "yes"})
    # An ordinary frame may say correction: false.
    assert view.apply({**delta(3, 0, [row(C1, 1)]), "correction": False}).applied


def test_the_merger_never_merges_a_correction_and_keeps_the_user_order() -> None:
    merger = DeltaMerger(150)
    assert merger.offer(delta(5, 0, [row(C1, 1)]), now_ms=0) == []
    fix = correction(5, [row(C1, 0)]).session_delta()
    out = merger.offer(fix, now_ms=10)
    assert [f["projection_mailbox_seq"] for f in out] == [5, 5]
    assert out[0].get("correction") is None and out[1]["correction"] is True
    assert len(merger) == 0
    view = SessionView(USER)
    assert [view.apply(f).status for f in out] == [ApplyStatus.APPLIED, ApplyStatus.CORRECTED]
    assert view.row(C1) == row(C1, 0)


@settings(max_examples=200, deadline=None)
@given(
    pulled_at=st.integers(1, 20),
    frames_after=st.lists(st.tuples(st.sampled_from((C1, C2)), st.integers(0, 9)), max_size=6),
    corrected_at=st.integers(1, 30),
)
def test_after_a_correction_every_row_is_the_newest_truth_the_client_was_sent(
    pulled_at: int, frames_after: list[tuple[str, int]], corrected_at: int
) -> None:
    """Named invariant `corrections_converge`: whatever the client pulled (drifted) and whatever
    ordinary frames followed, after the correction each row is the newest value the server sent
    for it: the correction's if nothing newer carried the row, else the newer frame's."""
    view = SessionView(USER)
    view.reset([row(C1, 99), row(C2, 99)], pulled_at)  # drifted: 99 everywhere
    truth: dict[str, tuple[int, dict[str, object]]] = {}
    version = pulled_at
    for conversation_id, unread in frames_after:
        version += 1
        frame = delta(version, version - 1, [row(conversation_id, unread)])
        assert view.apply(frame).applied
        truth[conversation_id] = (version, frame["conversations"][0])  # type: ignore[index]
    fixed = {C1: row(C1, 1), C2: row(C2, 2)}
    view.apply(correction(corrected_at, list(fixed.values())).session_delta())
    for conversation_id in (C1, C2):
        sent_at, sent = truth.get(conversation_id, (pulled_at, row(conversation_id, 99)))
        expected = fixed[conversation_id] if sent_at <= corrected_at else sent
        assert view.row(conversation_id) == expected
    assert view.version == version  # the chain position never moved
