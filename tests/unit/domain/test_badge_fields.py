"""The badge's one spelling (app.domain.badge.badge_fields / badge_of), shared by GET /v1/badge,
the stream's hello, BADGE_UPDATE frames and replay's badges.jsonl."""

from __future__ import annotations

from app.domain.badge import Badge, badge_fields, badge_of
from app.domain.flush import badge_update_frame
from app.domain.projection_store import StoredRows

BADGE = Badge(7, 2, 3, 4, 1, "conversations", True)


def test_badge_fields_spell_every_field_in_the_contracts_order() -> None:
    assert list(badge_fields(BADGE, 42).items()) == [
        ("total_unread", 7),
        ("total_mention", 2),
        ("muted_unread", 3),
        ("archived_unread", 4),
        ("archived_mention", 1),
        ("badge_mode", "conversations"),
        ("include_muted", True),
        ("projection_mailbox_seq", 42),
    ]


def test_a_badge_update_frame_is_the_badge_fields_between_its_header_and_prev_version() -> None:
    frame = badge_update_frame(9, BADGE, version=42, prev_version=40)
    keys = list(frame)
    assert keys[:2] == ["type", "user_id"] and keys[-1] == "prev_projection_mailbox_seq"
    assert {k: frame[k] for k in keys[2:-1]} == badge_fields(BADGE, 42)
    assert list(frame)[2:-1] == list(badge_fields(BADGE, 42))


def test_badge_of_reads_the_seven_fields_a_stored_record_holds() -> None:
    stored = StoredRows(
        user_id=9,
        rows={},
        total_unread=7,
        total_mention=2,
        muted_unread=3,
        projection_mailbox_seq=42,
        archived_unread=4,
        archived_mention=1,
        badge_mode="conversations",
        include_muted=True,
    )
    assert badge_of(stored) == BADGE
