"""Garbage on mailbox-tail (issue 18): the decoder and the processing object never raise, every
bad record is a dead letter with a reason and a kind from the closed set, and the valid records
around the garbage project exactly as they do alone.

The garbage comes from tests/support/garbage.py (wrong types, u64 overflows, NaN and 1e400, invalid
UTF-8, lone surrogates, 1 MiB strings, 10,000 levels of nesting, valid JSON of the wrong shape,
repeated keys, each field of each type broken in turn); the reference model
(tests/property/model.py) must call each of them bad as well.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.decoding import decode_chunk
from app.domain.entries import DEAD_LETTER_KINDS, ENTRY_TYPES, DeadLetter, WatermarkMarker, decode_record
from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions, run_replay
from app.stores.memory_messages import InMemoryMessageStore
from tests.property import invariants as inv
from tests.property.model import parse_line, run_model
from tests.property.test_core_vs_model import fast, n, options
from tests.support.garbage import (
    OPTIONAL_FIELDS,
    Garbage,
    GarbageMaker,
    break_field,
    fields_of,
    garbage,
    pairs_of,
    valid_pairs,
    valid_records,
)
from tests.support.strategies import Stream, streams

LANES = 3
SETTINGS = settings(max_examples=n(400), deadline=None)


def assert_dead_letter(raw: bytes, lanes: int = LANES) -> DeadLetter:
    out = decode_record(raw, lanes)
    assert isinstance(out, DeadLetter), f"accepted: {raw[:300]!r} -> {out}"
    assert out.reason.strip(), raw[:300]
    assert out.kind in DEAD_LETTER_KINDS, out.kind
    assert out.raw == raw
    return out


# --------------------------------------------------------------------------- the decoder


@SETTINGS
@given(garbage(LANES))
def test_every_garbage_record_is_a_dead_letter_with_a_reason(bad: Garbage) -> None:
    assert_dead_letter(bad.raw)
    # The reference model (written from the contract) calls it bad too: the verdict is the
    # contract's, not an accident of the decoder. (A whitespace-only record is a blank line to a
    # replay file and a dead letter on Kafka.)
    assert parse_line(bad.raw, LANES)[0] in ("bad", "blank"), bad


@SETTINGS
@given(valid_records(LANES))
def test_valid_records_at_the_edges_decode_as_the_model_reads_them(raw: bytes) -> None:
    verdict, value = parse_line(raw, LANES)
    out = decode_record(raw, LANES)
    assert not isinstance(out, DeadLetter), f"refused: {raw[:300]!r}: {out.reason}"
    if verdict == "marker":
        assert isinstance(out, WatermarkMarker)
        assert (out.lane, out.watermark) == value
        return
    assert verdict == "entry", (verdict, value)
    decoded = msgspec.structs.asdict(out)
    expected = {name: value[name] for name in fields_of(value["type"])}
    expected["conversation_id"] = value["conversation_id"].lower()
    if value["type"] == "join":
        expected["role"] = value.get("role", "member")
    if value["type"] == "message":
        for optional in ("notification", "urgent", "member_count"):
            expected[optional] = value.get(optional, msgspec.UNSET)
    assert decoded == expected


@pytest.mark.parametrize("type_", [*ENTRY_TYPES, "watermark"])
def test_each_field_of_each_type_broken_in_turn(type_: str) -> None:
    """Every field of the type (the optional ones too): missing, then 30 bad values of its kind."""
    kinds = {**fields_of(type_), **OPTIONAL_FIELDS.get(type_, {})}
    checked = 0
    for seed in range(30):
        rnd = random.Random(seed)
        template = valid_pairs(rnd, LANES, type_)
        for name, kind in kinds.items():
            for missing in (True, False) if seed == 0 else (False,):
                if missing and name in OPTIONAL_FIELDS.get(type_, {}):
                    continue
                raw = break_field(template, name, kind, rnd, LANES, missing=missing)
                assert_dead_letter(raw)
                assert parse_line(raw, LANES)[0] == "bad", raw[:300]
                checked += 1
    assert checked >= 30 * len(kinds)


@pytest.mark.parametrize(
    "value",
    [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1E400",
        b"-1e400",
        b"1.0",
        b"-0.0",
        b"1e2",
        b"18446744073709551616.0",
    ],
)
def test_numbers_json_cannot_or_can_carry_are_refused_in_int_fields(value: bytes) -> None:
    template = valid_pairs(random.Random(1), LANES, "read")
    for name in ("mailbox_seq", "ts", "user_id", "read_conversation_seq"):
        raw = (
            b"{"
            + b",".join((b'"%s":%s' % (k.encode(), value if k == name else v)) for k, v in template)
            + b"}"
        )
        assert_dead_letter(raw)


def test_the_bounds_are_exact() -> None:
    """64 KiB are allowed, one byte more is not; 32 levels are, 33 are not; a long id is fine."""
    from app.domain.entries import MAX_NESTING, MAX_RECORD_BYTES

    rnd = random.Random(3)
    pairs = valid_pairs(rnd, LANES, "mute")
    pairs = [(k, v) for k, v in pairs if k in fields_of("mute") or k == "type"]
    raw = b"{" + b",".join(b'"%s":%s' % (k.encode(), v) for k, v in pairs) + b"}"
    assert not isinstance(decode_record(raw + b" " * (MAX_RECORD_BYTES - len(raw)), LANES), DeadLetter)
    assert assert_dead_letter(raw + b" " * (MAX_RECORD_BYTES + 1 - len(raw))).kind == "too_large"

    def with_event_id(text: str) -> bytes:
        return raw.replace(
            b'"event_id":', b'"event_id":' + msgspec.json.encode(text) + b',"old_event_id":', 1
        )

    assert not isinstance(decode_record(with_event_id("😀" * 5000), LANES), DeadLetter)

    def nested(levels: int) -> bytes:  # the record itself is level 1
        inner = b"[" * (levels - 1) + b"]" * (levels - 1)
        return raw[:-1] + b',"x":' + inner + b"}"

    assert not isinstance(decode_record(nested(MAX_NESTING), LANES), DeadLetter)
    assert assert_dead_letter(nested(MAX_NESTING + 1)).kind == "schema"
    assert assert_dead_letter(nested(10_000)).kind == "schema"


def test_a_repeated_key_is_refused_even_with_the_same_value() -> None:
    template = valid_pairs(random.Random(4), LANES, "message")
    for name, value in template:
        raw = b"{" + b",".join(b'"%s":%s' % (k.encode(), v) for k, v in [*template, (name, value)]) + b"}"
        assert "duplicate key" in assert_dead_letter(raw).reason or name == "type"


def test_an_upper_case_conversation_id_does_not_skip_the_activity_id_check() -> None:
    """Found by the garbage: an upper-case conversation_id returned early, before the
    activity_id check, so a message with a bad activity_id was applied."""
    entry = dict(msgspec.json.decode(decode_bytes := _message_bytes()))
    entry["conversation_id"] = entry["conversation_id"].upper()
    entry["activity_id"] = "Z" * 32
    assert assert_dead_letter(msgspec.json.encode(entry)).kind == "bad_activity_id"
    assert decode_bytes


def test_text_no_decoder_reads_is_still_checked() -> None:
    """msgspec skips an unknown field unread: invalid UTF-8 or a lone surrogate there must not
    make the record valid."""
    record = dict(msgspec.json.decode(_message_bytes()))
    good = msgspec.json.encode(record)
    for junk in (b'"\xed\xa0\x80"', b'"\xff"', b'"\\udc00"', b'["\\ud800"]', b'{"\\ud800":1}'):
        assert assert_dead_letter(good[:-1] + b',"x":' + junk + b"}").kind == "not_json"
    assert assert_dead_letter(good[:-1] + b',"\xc3":1}').kind == "not_json"  # in a key
    # A surrogate *pair* is Unicode: fine anywhere.
    assert not isinstance(decode_record(good[:-1] + b',"x":"\\ud83d\\ude00"}', LANES), DeadLetter)


def _message_bytes() -> bytes:
    return msgspec.json.encode(
        {
            "type": "message",
            "mailbox_seq": 1,
            "lane": 0,
            "ts": 1,
            "event_id": "e",
            "user_id": 7,
            "conversation_id": "0000000a-0000-0000-0000-000000000001",
            "conversation_seq": 1,
            "message_id": "m",
            "activity_id": "0" * 32,
            "sender_id": 8,
            "created_at": 1,
            "counts_unread": True,
            "mention": False,
        }
    )


# --------------------------------------------------------------------------- the processing object


@st.composite
def garbled_streams(draw: st.DrawFn) -> tuple[Stream, list[bytes], list[Garbage]]:
    """A valid delivered stream, and the same with garbage inserted (much of it made from the
    stream's own entries: same users, same mailbox_seqs)."""
    stream = draw(streams(full=True, bad=False, blanks=False))
    templates = (
        st.sampled_from([pairs_of(e) for e in stream.scenario.entries]) if stream.scenario.entries else None
    )
    bad = draw(st.lists(garbage(stream.lanes, template=templates), min_size=1, max_size=25))
    lines = stream.lines()
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    mixed = list(lines)
    for item in bad:
        mixed.insert(rnd.randrange(len(mixed) + 1), item.raw)
    return stream, mixed, bad


@settings(SETTINGS, max_examples=n(150))
@given(case=garbled_streams(), opts=options)
def test_garbage_never_changes_what_the_valid_records_project(
    case: tuple[Stream, list[bytes], list[Garbage]], opts: dict[str, Any]
) -> None:
    stream, mixed, bad = case
    clean = run_replay(stream.lines(), ReplayOptions(lanes=stream.lanes, **opts))
    # Replay skips blank lines (a file's); the worker dead-letters them: both below.
    dirty = run_replay(mixed, ReplayOptions(lanes=stream.lanes, **opts))
    assert dirty.projections == clean.projections
    assert dirty.badges == clean.badges
    assert dirty.frames == clean.frames
    counted = sum(1 for g in bad if g.raw.strip())
    assert dirty.stats["dead_letters"] == clean.stats["dead_letters"] + counted
    for name in ("applied", "duplicates", "pending", "flushes", "projection_writes"):
        assert dirty.stats[name] == clean.stats[name], name


@settings(SETTINGS, max_examples=n(150))
@given(case=garbled_streams())
def test_the_processing_object_dead_letters_exactly_the_garbage(
    case: tuple[Stream, list[bytes], list[Garbage]],
) -> None:
    """PartitionProcessor.on_records, as the worker calls it (processing time, whitespace records
    included): it never raises, and its dead letters are the garbage's positions, each with a
    reason and a kind of the closed set."""
    stream, mixed, bad = case
    bad_raw = {g.raw for g in bad}
    processor = PartitionProcessor(
        ProjectorConfig(window_ms=20, max_dirty_rows=3),
        InMemoryMessageStore(),
        lanes=stream.lanes,
        mirror=True,
        member_stats=True,
        track_changes=True,
    )
    now = 1_000
    letters: list[tuple[int, DeadLetter]] = []
    offset = 0
    rnd = random.Random(len(mixed))
    while offset < len(mixed):  # in batches of any size, as fetches come
        size = rnd.randint(1, 40)
        step = processor.on_records(mixed[offset : offset + size], now)
        letters += [(offset + index, letter) for index, letter in step.dead_letters]
        processor.changes_since_persist()
        now += rnd.choice((0, 5, 50))
        processor.on_deadline(now)
        offset += size
    processor.on_end()
    assert sorted(index for index, _ in letters) == [i for i, raw in enumerate(mixed) if raw in bad_raw]
    for _, letter in letters:
        assert letter.reason.strip() and letter.kind in DEAD_LETTER_KINDS


@st.composite
def edge_streams(draw: st.DrawFn) -> list[bytes]:
    """Valid records with values at the edges (u64 ids and seqs at 2^64-1, ts at 2^64-1, pin
    ranks at 2^32-1, upper-case ids, unicode text at its bound, unknown fields), in random
    order, closed by markers at 2^64-1 for every lane: everything applies."""
    records = draw(st.lists(valid_records(LANES, types=ENTRY_TYPES), min_size=1, max_size=40))
    seed = draw(st.integers(0, 2**32 - 1))
    maker_rnd = random.Random(seed)
    markers = [
        msgspec.json.encode({"type": "watermark", "lane": lane, "watermark": 2**64 - 1, "ts": 2**64 - 1})
        for lane in range(LANES)
    ]
    mixed = list(records)
    for _ in range(maker_rnd.randrange(4)):  # early markers too: some entries wait, some apply
        mixed.insert(
            maker_rnd.randrange(len(mixed) + 1),
            msgspec.json.encode(
                {"type": "watermark", "lane": maker_rnd.randrange(LANES), "watermark": 2**63, "ts": 0}
            ),
        )
    return mixed + markers


@settings(SETTINGS, max_examples=n(200))
@given(lines=edge_streams(), opts=options)
def test_valid_records_at_the_edges_never_crash_and_match_the_model(
    lines: list[bytes], opts: dict[str, Any]
) -> None:
    res = run_replay(lines, ReplayOptions(lanes=LANES, **opts))
    model = run_model(lines, LANES, opts["include_muted"], opts.get("badge_mode", "messages"))
    assert res.stats["dead_letters"] == 0
    inv.check_all(res, model, opts["include_muted"], opts["window_ms"], opts["max_dirty_rows"], **fast(opts))


def test_ten_thousand_garbage_records_in_one_batch() -> None:
    """Every family at once, through one call: none raises, every one is a dead letter, nothing
    reaches the state."""
    maker = GarbageMaker(seed=18, lanes=LANES, huge_share=0.002)
    records = [g.raw for g in maker.many(10_000)]
    processor = PartitionProcessor(ProjectorConfig(), InMemoryMessageStore(), lanes=LANES)
    step = processor.on_records(records, 1)
    assert len(step.dead_letters) == len(records)
    assert processor.stats.applied == 0 and not processor.users


# --------------------------------------------------------------------------- regressions


def _message_with(**fields: Any) -> bytes:
    record = dict(msgspec.json.decode(_message_bytes()))
    record.update(fields)
    return msgspec.json.encode(record)


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"conversation_id": "", "activity_id": ""}, "bad_conversation_id"),
        ({"activity_id": ""}, "bad_activity_id"),
        ({"conversation_id": ""}, "bad_conversation_id"),
    ],
)
def test_empty_ids_are_refused_first_in_a_chunk_and_after_a_valid_message(
    fields: dict[str, Any], kind: str
) -> None:
    """Was (issue 30, hypothesis seed 322565824778361833737782352520352977366): decode_chunk's fast
    path remembered the last accepted ids in variables that started as "", so a message with an
    empty conversation_id / activity_id matched them and was applied unchecked, in both builds
    (the compiled suite's seed found it first): first in a chunk with both ids empty, and after
    a valid message of the same conversation with the activity id empty."""
    bad = _message_with(**fields)
    good = _message_bytes()
    for chunk in ([bad], [good, bad], [good, good, bad, good]):
        decoded = decode_chunk(chunk, LANES)[0]
        pairs = list(zip(chunk, decoded, strict=True))
        letters = [out for raw, out in pairs if raw is bad]
        assert letters and all(isinstance(out, DeadLetter) and out.kind == kind for out in letters)
        assert all(not isinstance(out, DeadLetter) for raw, out in pairs if raw is good)
    stream = [good, bad, b'{"type":"watermark","lane":0,"watermark":1,"ts":2}']
    res = run_replay(stream, ReplayOptions(lanes=1))
    assert res.stats["dead_letters"] == 1 and res.stats["applied"] == 1
