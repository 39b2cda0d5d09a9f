"""The hot set of `projector replay --state-dir` is bounded in bytes, not only in rows (issue 33,
item 4): rows grow as they hold messages, so a bound in rows alone let the hot set's memory grow
with the log. The footprint counted per row must follow the rows exactly, stay under the byte
bound after every persist, and change nothing in the outputs."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.domain.conversation import ROW_BYTES
from app.domain.residency import FOOTPRINT_UNIT, Residency
from app.replay import Replayer, ReplayOptions

T0_MS = 1767225600000
USERS = 120
CONVERSATIONS = 5  # per user
GROUP = 4  # members per conversation
MESSAGES = 3  # per conversation, fanned out to its members
HOT_ROWS = 400  # of 600 rows: the row bound evicts already while the joins come in
CHUNK = 40  # lines per feed: a persist and an eviction round after each


def _line(kind: str, seq: int, user: int, conversation: str, **fields: Any) -> bytes:
    doc = {"type": kind, "mailbox_seq": seq, "lane": 0, "ts": T0_MS + seq, "event_id": f"e{seq}"}
    return orjson.dumps({**doc, "user_id": user, "conversation_id": conversation, **fields})


def _conversation(index: int) -> str:
    return str(uuid.UUID(int=(0x5EED << 112) | index))


def joins_then_messages() -> list[bytes]:
    """Every membership's join (rows without messages), then MESSAGES messages per conversation
    to each member (the same rows, now holding seqs and head ids), a marker after each fan-out."""
    groups_per_slot = USERS // GROUP
    lines: list[bytes] = []
    seq = 0
    for slot in range(CONVERSATIONS):
        for user in range(USERS):
            seq += 1
            conversation = _conversation(slot * groups_per_slot + user // GROUP)
            lines.append(_line("join", seq, 1000 + user, conversation, joined_at_conversation_seq=0))
    lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
    for number in range(1, MESSAGES + 1):
        for index in range(CONVERSATIONS * groups_per_slot):
            first = (index % groups_per_slot) * GROUP
            for user in range(first, first + GROUP):
                seq += 1
                lines.append(
                    _line(
                        "message", seq, 1000 + user, _conversation(index), conversation_seq=number,
                        message_id=f"m-{index}-{number}", activity_id=f"{T0_MS + seq:012x}{number:020x}",
                        sender_id=1000 + first + number % GROUP, created_at=T0_MS + seq,
                        counts_unread=True, mention=number == 2,
                    )
                )  # fmt: skip
            lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
    return lines


def footprints(residency: Residency) -> int:
    """The resident rows' footprints counted from scratch, each rounded up to whole units (what
    the running count must equal)."""
    total = 0
    for user in residency.projector.users.values():
        for row in user.rows.values():
            size = row.footprint()
            stats = residency.member_stats.get((user.user_id, row.conversation_id))
            size += stats.footprint() if stats is not None else 0
            total += math.ceil(size / FOOTPRINT_UNIT) * FOOTPRINT_UNIT
    return total


def replay(lines: list[bytes], state: Path | None, **hot: Any) -> tuple[Replayer, list[Any]]:
    frames: list[Any] = []
    replayer = Replayer(ReplayOptions(window_ms=30), frames.append, state_dir=state, **hot)
    return replayer, frames


def test_the_hot_set_stays_under_its_byte_bound_while_its_rows_grow_messages(tmp_path: Path) -> None:
    lines = joins_then_messages()
    replayer, frames = replay(lines, tmp_path / "state", hot_rows=HOT_ROWS)
    residency = replayer.processor.residency
    assert residency is not None
    bound = HOT_ROWS * ROW_BYTES  # the default: what HOT_ROWS rows without messages take
    peak_bytes = 0
    fewest_rows = HOT_ROWS
    for start in range(0, len(lines), CHUNK):
        replayer.feed_many(lines[start : start + CHUNK])
        held = footprints(residency)
        assert held <= bound, f"{held} bytes in memory after line {start + CHUNK}, bound {bound}"
        assert residency.resident_rows <= HOT_ROWS
        peak_bytes = max(peak_bytes, held)
        if start > len(lines) // 2:  # the rows hold messages by now
            fewest_rows = min(fewest_rows, residency.resident_rows)
    # The bound did the work: rows holding messages are bigger, so fewer of them stayed than the
    # row bound allows (without the byte bound the same rows would hold more than `bound`).
    assert fewest_rows < int(HOT_ROWS * 0.8)
    assert peak_bytes > bound * 0.8

    want, want_frames = replay(lines, None)
    want.feed_many(lines)
    expected = want.finish()
    got = replayer.finish()
    assert list(got.projections) == list(expected.projections)
    assert list(got.badges) == list(expected.badges)
    assert got.stats == expected.stats
    assert frames == want_frames


@pytest.mark.parametrize("hot_bytes", [1, 60_000])
def test_an_explicit_byte_bound_holds_and_replays_exactly_as_in_memory(
    tmp_path: Path, hot_bytes: int
) -> None:
    """The running count equals the rows' footprints after every persist. 1 byte: every clean
    row leaves after every persist; 60,000: the byte bound binds long before the row bound."""
    lines = joins_then_messages()
    replayer, frames = replay(lines, tmp_path / "state", hot_rows=HOT_ROWS, hot_bytes=hot_bytes)
    residency = replayer.processor.residency
    assert residency is not None
    for start in range(0, len(lines), CHUNK):
        replayer.feed_many(lines[start : start + CHUNK])
        assert residency.resident_bytes == footprints(residency), "the running count follows the rows"
        if residency.resident_bytes > hot_bytes:  # only rows waiting for a flush may not leave
            dirty = residency.projector.dirty.rows
            users = residency.projector.users.items()
            assert all(key in dirty.get(user_id, ()) for user_id, user in users for key in user.rows)
    want, want_frames = replay(lines, None)
    want.feed_many(lines)
    expected = want.finish()
    got = replayer.finish()
    assert list(got.projections) == list(expected.projections)
    assert list(got.badges) == list(expected.badges)
    assert got.stats == expected.stats
    assert frames == want_frames
