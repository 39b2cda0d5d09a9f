"""Admission's verdicts on one fetch (app/worker/admission.py), alone: no core, no processor."""

from __future__ import annotations

from app.worker.admission import admit_fetch
from app.worker.offsets import Verdict


def test_a_fetch_continuing_the_state_is_applied_whole() -> None:
    verdict = admit_fetch(10, None, [10, 11, 12], 10, 13)
    assert verdict.verdict is Verdict.APPLY
    assert (verdict.admission.start, verdict.admission.next_offset) == (0, 13)
    assert verdict.hole_seen is None and verdict.hole_offsets == 0 and verdict.confirmed_hole is None


def test_a_fetch_overlapping_the_state_applies_only_its_new_records() -> None:
    verdict = admit_fetch(12, None, [10, 11, 12, 13], 10, 14)
    assert verdict.verdict is Verdict.APPLY
    assert (verdict.admission.start, verdict.admission.next_offset) == (2, 14)


def test_a_re_read_is_already_applied_and_keeps_a_hole_seen() -> None:
    seen = (20, 22)
    verdict = admit_fetch(20, seen, [15, 16], 15, 17)
    assert verdict.verdict is Verdict.ALREADY_APPLIED
    assert verdict.hole_seen == seen


def test_a_fetch_past_the_expected_offset_is_a_gap() -> None:
    verdict = admit_fetch(10, None, [15, 16], 15, 17)
    assert verdict.verdict is Verdict.GAP
    assert verdict.unconfirmed_hole is None and verdict.hole_seen is None


def test_a_hole_is_refused_the_first_time_and_remembered() -> None:
    # 11 holds no record for us (a transaction marker, say): the first read says so only once.
    verdict = admit_fetch(10, None, [10, 12], 10, 13)
    assert verdict.verdict is Verdict.GAP
    assert verdict.unconfirmed_hole == 11
    assert verdict.hole_seen == (10, 11)


def test_the_same_hole_read_again_from_the_expected_offset_is_applied_over() -> None:
    verdict = admit_fetch(10, (10, 11), [10, 12], 10, 13)
    assert verdict.verdict is Verdict.APPLY
    assert verdict.admission.next_offset == 13
    assert verdict.confirmed_hole == 11 and verdict.hole_offsets == 1
    assert verdict.hole_seen is None


def test_a_different_hole_is_not_confirmed_by_an_earlier_one() -> None:
    verdict = admit_fetch(10, (10, 11), [10, 11, 13], 10, 14)
    assert verdict.verdict is Verdict.GAP
    assert verdict.hole_seen == (10, 12)


def test_an_empty_fetch_moving_the_position_is_a_hole_to_confirm() -> None:
    first = admit_fetch(10, None, [], 10, 15)
    assert first.verdict is Verdict.GAP and first.hole_seen == (10, 10)
    second = admit_fetch(10, first.hole_seen, [], 10, 15)
    assert second.verdict is Verdict.APPLY
    assert second.admission.next_offset == 15 and second.hole_offsets == 5


def test_a_partition_not_placed_yet_applies_without_hole_rule() -> None:
    verdict = admit_fetch(None, None, [5, 7], None, 8)
    assert verdict.verdict is Verdict.APPLY
    assert verdict.hole_seen is None and verdict.hole_offsets == 0
