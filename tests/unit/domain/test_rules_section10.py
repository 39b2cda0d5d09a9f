"""docs/contract.md §10 on hand-built streams, through `run_replay`: mark as unread, badge
preferences, folder totals; and their bad values dead-lettered with a reason."""

from __future__ import annotations

from typing import Any

import orjson

from app.domain.entries import DeadLetter, decode_record
from app.replay import ReplayOptions, run_replay
from tests.support.builders import CONV_A, CONV_B, StreamBuilder, rows_by_key

ME = 7


def final(stream: StreamBuilder, **options: Any) -> Any:
    return run_replay(stream.close(), ReplayOptions(lanes=stream.lanes, **options))


def badge(result: Any) -> dict[str, Any]:
    (line,) = [b for b in result.badges if b["user_id"] == ME]
    return dict(line)


def test_a_marked_row_counts_at_least_one_until_a_read_clears_it() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.read(ME, 1)
    s.entry("mark_unread", ME)
    result = final(s)
    assert rows_by_key(result.projections)[(ME, CONV_A)]["marked_unread"] is True
    assert badge(result)["total_unread"] == 1  # max(0, 1)
    s.message(ME, 2)  # unread 1: still max(1, 1)
    s.message(ME, 3)
    result = final(s)
    assert badge(result)["total_unread"] == 2
    s.read(ME, 0)  # any read clears it, whatever its value
    result = final(s)
    assert rows_by_key(result.projections)[(ME, CONV_A)]["marked_unread"] is False
    assert badge(result)["total_unread"] == 2


def test_delete_conversation_clears_the_mark() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.entry("mark_unread", ME)
    s.entry("delete_conversation", ME, deleted_before_conversation_seq=1)
    result = final(s)
    assert rows_by_key(result.projections)[(ME, CONV_A)]["marked_unread"] is False
    assert badge(result)["total_unread"] == 0


def test_conversations_mode_counts_rows_and_the_archived_folder_has_its_totals() -> None:
    s = StreamBuilder()
    for seq in (1, 2, 3):
        s.message(ME, seq, mention=seq == 2)
    s.message(ME, 1, conv=CONV_B)
    s.entry("archive", ME, conv=CONV_B)
    s.message(ME, 2, conv=CONV_B, mention=True)  # the archived folder's totals move
    result = final(s)
    b = badge(result)
    assert (b["total_unread"], b["total_mention"], b["archived_unread"], b["archived_mention"]) == (
        3,
        2,
        2,
        1,
    )
    assert (b["badge_mode"], b["include_muted"]) == ("messages", False)
    s.entry("badge_preferences", ME, badge_mode="conversations", include_muted=True)
    result = final(s)
    b = badge(result)
    assert (b["total_unread"], b["total_mention"], b["archived_unread"], b["archived_mention"]) == (
        1,
        2,
        1,
        1,
    )
    assert (b["badge_mode"], b["include_muted"]) == ("conversations", True)
    # A user-level entry: no new row, and the badge went out in a frame of its own version.
    assert len(result.projections) == 2
    last = [f for f in result.frames if f["type"] == "BADGE_UPDATE"][-1]
    assert last["badge_mode"] == "conversations" and last["total_unread"] == 1


def test_the_deployment_default_applies_until_the_users_own_choice() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.message(ME, 2)
    assert badge(final(s, badge_mode="conversations"))["total_unread"] == 1
    s.entry("badge_preferences", ME, badge_mode="messages", include_muted=False)
    assert badge(final(s, badge_mode="conversations"))["total_unread"] == 2


def test_bad_values_are_dead_lettered_with_a_reason() -> None:
    base = {
        "type": "badge_preferences",
        "mailbox_seq": 1,
        "lane": 0,
        "ts": 1,
        "event_id": "e",
        "user_id": ME,
        "conversation_id": "5eed0000-0000-0000-0000-000000000001",
        "badge_mode": "conversations",
        "include_muted": False,
    }
    assert not isinstance(decode_record(orjson.dumps(base), 1), DeadLetter)
    for bad in (
        {"badge_mode": "threads"},
        {"badge_mode": None},
        {"include_muted": "yes"},
        {"include_muted": 1},
    ):
        got = decode_record(orjson.dumps({**base, **bad}), 1)
        assert isinstance(got, DeadLetter) and got.kind == "schema", (bad, got)
        assert next(iter(bad)) in got.reason
    missing = {k: v for k, v in base.items() if k != "badge_mode"}
    got = decode_record(orjson.dumps(missing), 1)
    assert isinstance(got, DeadLetter) and "badge_mode" in got.reason
    mark = {
        **{k: v for k, v in base.items() if k not in ("badge_mode", "include_muted")},
        "type": "mark_unread",
    }
    assert not isinstance(decode_record(orjson.dumps(mark), 1), DeadLetter)
    got = decode_record(orjson.dumps({**mark, "type": "mark_unred"}), 1)
    assert isinstance(got, DeadLetter) and got.kind == "unknown_type"


def test_a_preferences_entry_alone_is_due_at_the_window_end_in_processing_time() -> None:
    """The worker's timer path (next_deadline / on_deadline): a user dirty with no row flushes."""
    from app.domain.processor import PartitionProcessor
    from app.domain.projector import ProjectorConfig
    from app.stores.memory_messages import InMemoryMessageStore

    processor = PartitionProcessor(ProjectorConfig(window_ms=100), InMemoryMessageStore())
    s = StreamBuilder()
    s.message(ME, 1)
    processor.on_records(s.close(), now=1000)
    assert processor.on_deadline(1100)
    line = orjson.dumps(
        {
            "type": "badge_preferences",
            "mailbox_seq": 10_000,
            "lane": 0,
            "ts": 5,
            "event_id": "p",
            "user_id": ME,
            "conversation_id": CONV_A,
            "badge_mode": "conversations",
            "include_muted": False,
        }
    )
    processor.on_records(
        [line, orjson.dumps({"type": "watermark", "lane": 0, "watermark": 10_000, "ts": 5})], now=2000
    )
    assert processor.next_deadline() == 2100
    (flush,) = processor.on_deadline(2100)
    assert flush.rows == [] and flush.badge.badge_mode == "conversations"
    assert processor.next_deadline() is None
