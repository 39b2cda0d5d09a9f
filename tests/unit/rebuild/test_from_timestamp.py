"""`projector rebuild --by-replay --from-timestamp T` without servers: the semantics in the pure
core (rows rebuilt from state as the base, the log's tail applied on it through the projector)
and the command line's validation of T. The real-server acceptance is
tests/integration/test_rebuild_from_timestamp.py."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from app.cli import main
from app.cli.rebuild import _timestamp_ms
from app.domain.badge import Badge
from app.domain.entries import DeadLetter, WatermarkMarker, decode_record
from app.domain.projector import Projector, ProjectorConfig
from app.rebuild.from_state import StateBase
from app.replay import Replayer, ReplayOptions
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.rebuild import FakeHeads, state_of

ME = 7


class StateAsMirrored:
    """UserConversationState as the worker mirrors it: a row's state fields, and the mailbox_seq
    of its last state-changing entry (every non-message entry, and the entry creating the row)."""

    def __init__(self, lines: Iterable[bytes], projections: list[dict[str, Any]]) -> None:
        self.updated: dict[tuple[int, str], int] = {}
        for entry in map(orjson.loads, lines):
            if "mailbox_seq" not in entry:
                continue
            key = (entry["user_id"], entry["conversation_id"])
            if entry["type"] != "message" or key not in self.updated:
                self.updated[key] = entry["mailbox_seq"]
        self.rows = projections

    def load_user(self, user_id: int) -> list[dict[str, Any]]:
        return [
            {
                "conversation_id": r["conversation_id"],
                **state_of(r),
                "updated_mailbox_seq": self.updated[(user_id, r["conversation_id"])],
            }
            for r in self.rows
            if r["user_id"] == user_id
        ]


def replay(lines: list[bytes]) -> tuple[Replayer, Any]:
    replayer = Replayer(ReplayOptions(), lambda frame: None)
    replayer.feed_many(lines)
    return replayer, replayer.finish()


def history() -> StreamBuilder:
    s = StreamBuilder()
    for seq in range(1, 9):
        s.message(ME, seq, conv=CONV_A, mention=seq == 3)
        s.message(ME, seq, conv=CONV_B, sender=ME if seq == 2 else 99)
    s.read(ME, 2, conv=CONV_A)
    s.entry("pin", ME, CONV_B, pin_rank=4)
    s.recall(ME, 6, conv=CONV_A)
    return s


def test_the_tail_on_rows_rebuilt_from_state_equals_a_full_replay() -> None:
    s = history()
    before_t = s.seq  # T falls here: the log keeps only what follows
    s.message(ME, 9, conv=CONV_A, mention=True)
    s.message(ME, 7, conv=CONV_A)  # late fan-out of a message state already counts
    s.read(ME, 5, conv=CONV_A)  # another device, below the head: recomputed
    s.message(ME, 9, conv=CONV_B)
    lines = s.close()
    replayer, full = replay(lines)

    state = StateAsMirrored(lines, full.projections)
    base = StateBase(state, FakeHeads(replayer, {CONV_A: 9, CONV_B: 9}), replayer.store, 200)
    (rows, version) = base.load([ME])[ME]
    assert version == state.updated[(ME, CONV_A)]  # the read: the user's last state change
    projector = Projector(ProjectorConfig(), replayer.store)
    projector.adopt(ME, rows, version, "rebuild-base")
    applied = []
    for raw in lines:
        entry = decode_record(raw, 1)
        if isinstance(entry, DeadLetter | WatermarkMarker) or entry.mailbox_seq <= before_t:
            continue  # before T: not read
        applied.append(projector.apply(entry, entry.ts).value)
    # Entries at or below the state's version are in state already: duplicates.
    assert applied == ["duplicate", "duplicate", "duplicate", "applied"]
    (batch,) = projector.flush()
    assert batch.rows == full.projections  # every field, versions included, in this case
    assert batch.badge == Badge(
        *(full.badges[0][k] for k in ("total_unread", "total_mention", "muted_unread"))
    )
    assert batch.projection_mailbox_seq == full.badges[0]["projection_mailbox_seq"]


def test_a_row_whose_last_entry_is_before_t_keeps_the_state_version() -> None:
    s = history()
    s.message(ME, 9, conv=CONV_B)
    before_t = s.seq
    s.entry("mute", ME, CONV_A)
    lines = s.close()
    replayer, full = replay(lines)
    state = StateAsMirrored(lines, full.projections)
    base = StateBase(state, FakeHeads(replayer, {CONV_A: 8, CONV_B: 9}), replayer.store, 200)
    rows, version = base.load([ME])[ME]
    projector = Projector(ProjectorConfig(), replayer.store)
    projector.adopt(ME, rows, version, "rebuild-base")
    for raw in lines:
        entry = decode_record(raw, 1)
        if not isinstance(entry, DeadLetter | WatermarkMarker) and entry.mailbox_seq > before_t:
            projector.apply(entry, entry.ts)
    (batch,) = projector.flush()
    by_conv = {row["conversation_id"]: row for row in batch.rows}
    want = {row["conversation_id"]: row for row in full.projections}
    assert by_conv[CONV_A] == want[CONV_A]  # the mute is in the tail: exact
    # B's last entry (message 9) is before T and no state change: state's version (the pin).
    assert by_conv[CONV_B]["projection_mailbox_seq"] == state.updated[(ME, CONV_B)] < before_t
    assert {k: v for k, v in by_conv[CONV_B].items() if k != "projection_mailbox_seq"} == {
        k: v for k, v in want[CONV_B].items() if k != "projection_mailbox_seq"
    }


def test_adopt_writes_the_user_whole_with_a_full_badge() -> None:
    s = history()
    lines = s.close()
    replayer, full = replay(lines)
    state = StateAsMirrored(lines, full.projections)
    rows, version = StateBase(state, FakeHeads(replayer, {CONV_A: 8, CONV_B: 8}), replayer.store, 200).load(
        [ME, 12345]
    )[ME]
    projector = Projector(ProjectorConfig(), replayer.store)
    projector.adopt(ME, rows, version, "rebuild-base")
    with pytest.raises(ValueError, match="already"):
        projector.adopt(ME, rows, version, "rebuild-base")
    (batch,) = projector.flush()
    assert [r["conversation_id"] for r in batch.rows] == [CONV_A, CONV_B]
    assert batch.projection_mailbox_seq == version and batch.driving_event_id == "rebuild-base"
    assert batch.badge.total_unread == sum(r["unread_count"] for r in batch.rows)


# -- the command line ----------------------------------------------------------------------------


def test_timestamps_parse_as_ms_or_iso_8601_with_a_zone() -> None:
    assert _timestamp_ms("1767225600000") == 1_767_225_600_000
    assert _timestamp_ms("2026-01-01T00:00:00Z") == 1_767_225_600_000
    assert _timestamp_ms("2026-01-01T08:00:00+08:00") == 1_767_225_600_000
    assert _timestamp_ms(" 0 ") == 0


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("yesterday", "expected milliseconds since the epoch or an ISO 8601 time"),
        ("2026-01-01T00:00:00", "has no time zone"),
        ("1969-12-31T23:59:59Z", "before 1970"),
        ("1.5", "expected milliseconds"),
        ("", "expected milliseconds"),
    ],
)
def test_a_bad_timestamp_is_a_clear_usage_error(
    value: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["rebuild", "--by-replay", "--namespace", "fresh", f"--from-timestamp={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--from-timestamp" in err and reason in err


def test_a_timestamp_in_the_future_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    future = dt.datetime.fromtimestamp(time.time() + 3600, dt.UTC).isoformat()
    with pytest.raises(SystemExit) as exit_:
        main(["rebuild", "--by-replay", "--namespace", "fresh", "--from-timestamp", future])
    assert exit_.value.code == 2
    assert "in the future" in capsys.readouterr().err


def test_from_timestamp_goes_with_by_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("PROJECTOR_")]:
        monkeypatch.delenv(name)
    code = main(["rebuild", "--from-state", "--all-known", "--namespace", "fresh", "--from-timestamp", "0"])
    assert code == 2
    assert "--from-timestamp goes with --by-replay" in capsys.readouterr().err


def test_metrics_port_is_a_tcp_port(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["rebuild", "--by-replay", "--namespace", "fresh", "--metrics-port", "70000"])
    assert exit_.value.code == 2
    assert "not a TCP port" in capsys.readouterr().err
