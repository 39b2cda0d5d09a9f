"""The client library's side of docs/contract.md §10: the badge's folder totals and preferences,
"99+" above 99 (seed 000 §3.3), a row marked unread shown as unread."""

from __future__ import annotations

import pytest

from app.domain.client import (
    ApplyStatus,
    Badge,
    FrameError,
    SessionView,
    badge_of,
    display_count,
    shows_unread,
)

ME = 7


def frame(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "type": "BADGE_UPDATE",
        "user_id": ME,
        "total_unread": 2,
        "total_mention": 1,
        "muted_unread": 0,
        "projection_mailbox_seq": 5,
        "prev_projection_mailbox_seq": 4,
    }
    base.update(fields)
    return base


def test_an_older_servers_badge_takes_the_defaults() -> None:
    assert badge_of(frame()) == Badge(2, 1, 0, 5, 0, 0, "messages", False)


def test_the_folder_totals_and_preferences_are_kept() -> None:
    view = SessionView(ME)
    got = frame(archived_unread=3, archived_mention=2, badge_mode="conversations", include_muted=True)
    assert view.apply(got).status is ApplyStatus.APPLIED
    assert view.badge == Badge(2, 1, 0, 5, 3, 2, "conversations", True)


@pytest.mark.parametrize(
    "bad",
    [
        {"badge_mode": "threads"},
        {"badge_mode": None},
        {"include_muted": 1},
        {"include_muted": "true"},
        {"archived_unread": -1},
        {"archived_mention": "3"},
    ],
)
def test_a_bad_field_is_a_frame_error(bad: dict[str, object]) -> None:
    with pytest.raises(FrameError):
        badge_of(frame(**bad))


def test_counts_above_99_show_99_plus() -> None:
    assert [display_count(n) for n in (0, 1, 99, 100, 150, 200)] == ["0", "1", "99", "99+", "99+", "99+"]
    assert display_count(3, exact=False) == "99+"


def test_a_marked_row_shows_unread() -> None:
    assert not shows_unread({"unread_count": 0, "marked_unread": False})
    assert not shows_unread({"unread_count": 0})  # a row from before §10
    assert shows_unread({"unread_count": 0, "marked_unread": True})
    assert shows_unread({"unread_count": 4, "marked_unread": False})
