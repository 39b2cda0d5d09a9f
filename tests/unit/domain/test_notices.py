"""Member notifications in the pure core (docs/contract.md §9, issue 16 part 2): a `message`
entry's optional `notification` kind, decoded and validated once; kinds 24 and 27 make a
MemberNotice that the processor reports (Step.notices) when the entry is applied; the message
itself is processed as if it had no kind, and replay's outputs do not change."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.entries import DEAD_LETTER_KINDS, DeadLetter, MessageEntry, decode_record
from app.domain.notices import MEMBER_JOINED, MEMBER_LEFT_HISTORY, MemberNotice, notice_of
from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions, run_replay
from app.stores.memory_messages import InMemoryMessageStore
from tests.property.model import run_model
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.strategies import Stream, scenarios, streams

ALICE, BOB, CAROL = 11982011376358104761, 17, 5000


def message_line(notification: bytes | None, **over: Any) -> bytes:
    """A valid message entry, with `"notification": <raw JSON value>` when given."""
    entry = {
        "type": "message",
        "mailbox_seq": 7,
        "lane": 0,
        "ts": 1000,
        "event_id": "ev",
        "user_id": ALICE,
        "conversation_id": CONV_A,
        "conversation_seq": 3,
        "message_id": "m3",
        "activity_id": f"{3:032x}",
        "sender_id": CAROL,
        "created_at": 1000,
        "counts_unread": False,
        "mention": False,
        **over,
    }
    raw = orjson.dumps(entry)
    return raw if notification is None else raw[:-1] + b',"notification":' + notification + b"}"


# --------------------------------------------------------------------------- decoding


def test_absent_means_no_notification_and_kinds_decode_as_ints() -> None:
    plain = decode_record(message_line(None), 1)
    assert isinstance(plain, MessageEntry) and plain.notification is msgspec.UNSET
    assert notice_of(plain) is None
    for kind in (0, 1, MEMBER_JOINED, 25, MEMBER_LEFT_HISTORY, 2**32 - 1):
        entry = decode_record(message_line(str(kind).encode()), 1)
        assert isinstance(entry, MessageEntry) and entry.notification == kind
        notice = notice_of(entry)
        # Unknown kinds are plain messages: no notice.
        assert (notice is not None) == (kind in (24, 27))
    # A re-encoded entry (the pending buffer) keeps the kind, and leaves "none" out.
    for raw in (message_line(b"27"), message_line(None)):
        entry = decode_record(raw, 1)
        assert decode_record(msgspec.json.encode(entry), 1) == entry
    assert b"notification" not in msgspec.json.encode(plain)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b'"24"', "got `str`"),
        (b"24.0", "got `float`"),
        (b"2.4e1", "got `float`"),
        (b"true", "got `bool`"),
        (b"false", "got `bool`"),
        (b"null", "got `null`"),
        (b"[24]", "got `array`"),
        (b'{"t":24}', "got `object`"),
        (b"-1", ">= 0"),
        (b"-24", ">= 0"),
        (b"4294967296", "<= 4294967295"),
        (b"18446744073709551616", "<= 4294967295"),
        (b"9" * 400, ""),
    ],
)
def test_an_ill_typed_or_out_of_range_kind_is_a_dead_letter_naming_the_field(value: bytes, why: str) -> None:
    raw = message_line(value)
    out = decode_record(raw, 1)
    assert isinstance(out, DeadLetter), out
    assert out.kind == "schema" and out.raw == raw
    assert "$.notification" in out.reason and why in out.reason, out.reason


def test_other_types_ignore_a_notification_field_as_unknown() -> None:
    raw = orjson.dumps(
        {
            "type": "read",
            "mailbox_seq": 1,
            "lane": 0,
            "ts": 1,
            "event_id": "e",
            "user_id": 1,
            "conversation_id": CONV_A,
            "read_conversation_seq": 1,
            "notification": "anything",
        }
    )
    assert not isinstance(decode_record(raw, 1), DeadLetter)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([24, 27, 0, 2**32 - 1, 2**32, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
raw_tokens = st.sampled_from(
    [b"NaN", b"Infinity", b"-Infinity", b"1E400", b"-0", b"0x18", b"024", b"+24", b"24 ", b"", b"2_4"]
)


@settings(max_examples=300, deadline=None)
@given(value=json_values | raw_tokens.map(lambda raw: ("raw", raw)))
def test_garbage_kinds_never_crash_they_pass_or_dead_letter(value: Any) -> None:
    """Whatever sits in `notification`, decoding and processing never raise: an int in [0, 2^32)
    passes (24/27 make a notice), anything else is a dead letter with a reason."""
    raw = message_line(value[1] if isinstance(value, tuple) else json.dumps(value).encode())
    out = decode_record(raw, 1)
    valid = type(value) is int and 0 <= value < 2**32
    if valid:
        assert isinstance(out, MessageEntry) and out.notification == value
    elif isinstance(value, tuple) and value[1] in (b"-0", b"24 "):
        # Valid JSON integers after all ("-0" is 0; whitespace is JSON's).
        assert isinstance(out, MessageEntry)
    else:
        assert isinstance(out, DeadLetter) and out.reason and out.kind in DEAD_LETTER_KINDS, out
    processor = PartitionProcessor(ProjectorConfig(), InMemoryMessageStore(), lanes=1)
    marker = orjson.dumps({"type": "watermark", "lane": 0, "watermark": 7, "ts": 1000})
    step = processor.on_records([raw, marker], 1000)
    if isinstance(out, DeadLetter):
        assert [index for index, _ in step.dead_letters] == [0] and not step.notices
        assert processor.stats.applied == 0
    else:
        assert processor.stats.applied == 1
        kinds = [n.kind for n in step.notices]
        assert kinds == ([out.notification] if out.notification in (24, 27) else [])


# --------------------------------------------------------------------------- the processor


def notify(
    stream: StreamBuilder,
    user: int,
    seq: int,
    kind: int | None,
    conv: str = CONV_A,
    *,
    lane: int = 0,
    sender: int = CAROL,
    counts: bool = False,
) -> int:
    """A group message from Carol carrying `kind` (None: no kind)."""
    return stream.message(user, seq, sender=sender, conv=conv, counts=counts, lane=lane, notification=kind)


def test_the_processor_reports_notices_of_applied_entries_once_in_order() -> None:
    s = StreamBuilder(lanes=2)
    s.entry("join", CAROL, CONV_A, joined_at_conversation_seq=4)
    joined = notify(s, ALICE, 5, 24)
    plain = notify(s, ALICE, 6, 99)  # an unknown kind: a plain message
    waits = notify(s, BOB, 6, 27, lane=1, counts=True)  # lane 1 has not reported yet
    s.marker(0, waits)
    s.marker(1, waits - 1)
    processor = PartitionProcessor(ProjectorConfig(window_ms=1000), InMemoryMessageStore(), lanes=2)
    step = processor.on_records(s.lines, None)
    assert step.notices == [MemberNotice(ALICE, CONV_A, 24, 5, joined)]
    assert processor.pending_count == 1
    # A duplicate of an applied entry is dropped: no second notice.
    again = processor.on_records([s.lines[1], s.lines[2]], None)
    assert again.notices == [] and processor.stats.duplicates == 2
    # The waiting one makes its notice when the marker releases it, not before.
    s.lines = []
    s.marker(1, waits)
    released = processor.on_records(s.lines, None)
    assert released.notices == [MemberNotice(BOB, CONV_A, 27, 6, waits)]
    assert plain < waits


def test_a_notified_message_is_processed_like_a_plain_one() -> None:
    """counts_unread decides whether it counts; the row's head moves as for any message."""
    lines = {}
    for kind in (None, 24):
        s = StreamBuilder()
        s.message(ALICE, 1, sender=CAROL)
        notify(s, ALICE, 2, kind, counts=True)
        notify(s, ALICE, 3, kind, counts=False)
        notify(s, BOB, 3, kind, conv=CONV_B)
        lines[kind] = s.close()
    with_kind, without = (run_replay(lines[k], ReplayOptions(window_ms=1)) for k in (24, None))
    assert list(with_kind.projections) == list(without.projections)
    assert list(with_kind.badges) == list(without.badges)
    assert with_kind.frames == without.frames and with_kind.stats == without.stats
    [row] = [r for r in with_kind.projections if r["user_id"] == ALICE]
    assert (row["unread_count"], row["latest_conversation_seq"]) == (2, 3)


def with_kinds(lines: list[bytes], lanes: int, rnd: random.Random) -> list[bytes]:
    """The same lines with a `notification` kind added to some valid message entries."""
    out = []
    for line in lines:
        decoded = decode_record(line.strip(), lanes) if line.strip() else None
        if isinstance(decoded, MessageEntry) and rnd.random() < 0.6:
            body = line.rstrip()
            kind = rnd.choice((24, 27, 24, 27, 0, 5, 2**32 - 1))
            line = body[:-1] + b',"notification":%d}' % kind + line[len(body) :]
        out.append(line)
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=20, max_steps=80))), seed=st.integers(0, 2**32)
)
def test_kinds_change_no_replay_output_and_notices_follow_the_applied_entries(
    stream: Stream, seed: int
) -> None:
    """Any stream (disorder, duplicates, bad lines, pending entries): with kinds added to its
    messages, replay's outputs are the same, byte for byte, and the processor's notices are
    exactly one per applied message of kind 24/27, each user's in mailbox_seq order (the
    reference model says which entries are applied)."""
    lines = stream.lines()
    kinded = with_kinds(lines, stream.lanes, random.Random(seed))
    plain, notified = (run_replay(ls, ReplayOptions(lanes=stream.lanes)) for ls in (lines, kinded))
    assert orjson.dumps(list(notified.projections)) == orjson.dumps(list(plain.projections))
    assert orjson.dumps(list(notified.badges)) == orjson.dumps(list(plain.badges))
    assert orjson.dumps(notified.frames) == orjson.dumps(plain.frames)
    assert notified.stats == plain.stats

    processor = PartitionProcessor(ProjectorConfig(), InMemoryMessageStore(), lanes=stream.lanes)
    got: list[MemberNotice] = []
    rnd = random.Random(seed)
    todo = [line.strip() for line in kinded if line.strip()]
    while todo:  # any batching
        size = rnd.randint(1, 20)
        got += processor.on_records(todo[:size], None).notices
        todo = todo[size:]
    model = run_model(kinded, stream.lanes)
    expected = [
        MemberNotice(
            e["user_id"], e["conversation_id"], e["notification"], e["conversation_seq"], e["mailbox_seq"]
        )
        for e in model.applied
        if e["type"] == "message" and e.get("notification") in (24, 27)
    ]
    key = lambda n: (n.user_id, n.mailbox_seq)  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)
    for user in {n.user_id for n in got}:
        seqs = [n.mailbox_seq for n in got if n.user_id == user]
        assert seqs == sorted(seqs)
