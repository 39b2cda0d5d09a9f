"""Garbage for mailbox-tail: records a producer must never send, and valid ones at the edges.

Every bad record is bad *by construction* (the family that made it says why), and the reference
model (tests/property/model.py `parse_line`, written from docs/contract.md §2) must agree; the
tests check both. Records are built as lists of (key, raw JSON value) pairs, so a value can be
anything bytes can be (NaN, 1e400, a 5,000-digit integer, invalid UTF-8) and a key can repeat.

Two ways in, one implementation: the families are functions of a seeded `random.Random` and a
valid template, so hypothesis strategies (`garbage()`, `valid_records()`: the template and the
family shrink) and the scale runs (`GarbageMaker`: 100,000 records in seconds) make the same
records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from app.domain.entries import ENTRY_TYPES, MAX_NESTING, MAX_RECORD_BYTES

U64_MAX = 2**64 - 1
Pairs = list[tuple[str, bytes]]  # a record: (key, raw JSON value), in order

# The schema, by the kind of value each field takes (docs/contract.md §2, the project's bounds).
COMMON_FIELDS = {
    "mailbox_seq": "seq1",
    "lane": "lane",
    "ts": "u64",
    "event_id": "text",
    "user_id": "u64",
    "conversation_id": "uuid",
}
_TARGET = {
    "target_conversation_seq": "cseq1",
    "target_sender_id": "u64",
    "target_counts_unread": "bool",
    "target_mention": "bool",
}
TYPE_FIELDS: dict[str, dict[str, str]] = {
    "message": {
        "conversation_seq": "cseq1",
        "message_id": "text",
        "activity_id": "activity",
        "sender_id": "u64",
        "created_at": "u64",
        "counts_unread": "bool",
        "mention": "bool",
    },
    "read": {"read_conversation_seq": "cseq0"},
    "recall": _TARGET,
    "delete_message": _TARGET,
    "join": {"joined_at_conversation_seq": "cseq0"},
    "leave": {"left_at_conversation_seq": "cseq0", "reason": "reason"},
    "pin": {"pin_rank": "u32"},
    "unpin": {},
    "archive": {},
    "unarchive": {},
    "mute": {},
    "unmute": {},
    "clear_history": {"hidden_before_conversation_seq": "cseq0"},
    "delete_conversation": {"deleted_before_conversation_seq": "cseq0"},
    "mailbox_dirty": {},
    # docs/contract.md §10
    "mark_unread": {},
    "badge_preferences": {"badge_mode": "badge_mode", "include_muted": "bool"},
}
# `notification` (docs/contract.md §9): an integer kind, u32; any kind is valid (24 and 27 notify).
# `urgent` (bool) and `member_count` (u32): the fast lane's (§10).
OPTIONAL_FIELDS = {
    "join": {"role": "role"},
    "watermark": {"count": "u64"},
    "message": {"notification": "u32", "urgent": "bool", "member_count": "u32"},
}
MARKER_FIELDS = {"lane": "lane", "watermark": "u64", "ts": "u64"}
assert set(TYPE_FIELDS) == set(ENTRY_TYPES)


def fields_of(type_: str) -> dict[str, str]:
    """Required fields of a record type (`watermark` included) and their value kinds."""
    if type_ == "watermark":
        return dict(MARKER_FIELDS)
    return {**COMMON_FIELDS, **TYPE_FIELDS[type_]}


# --------------------------------------------------------------------------- rendering


def enc(value: Any, *, ascii_only: bool = False) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8", "surrogatepass")


def render(pairs: Pairs) -> bytes:
    return b"{" + b",".join(enc(k) + b":" + v for k, v in pairs) + b"}"


def pairs_of(record: dict[str, Any]) -> Pairs:
    return [(k, enc(v)) for k, v in record.items()]


# --------------------------------------------------------------------------- valid values

_EDGE_INTS = (0, 1, 2, 255, 2**31 - 1, 2**32 - 1, 2**32, 2**53 - 1, 2**53 + 1, 2**63 - 1, 2**63)
_TEXTS = ("", "e", "ev-1", 'a"quote', "back\\slash", "nul\x00", "tab\t", "é😀", "\u2028", "\U0010ffff")


def _uuid(rnd: random.Random) -> str:
    h = f"{rnd.getrandbits(128):032x}"
    text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return text.upper() if rnd.random() < 0.2 else text


def valid_value(kind: str, rnd: random.Random, lanes: int) -> Any:
    """A value the schema accepts, often at an edge."""
    if kind in ("seq1", "u64", "cseq1", "cseq0"):
        low = 1 if kind in ("seq1", "cseq1") else 0
        high = U64_MAX - 1 if kind.startswith("cseq") else U64_MAX
        return rnd.choice((low, high, rnd.randint(low, high), rnd.randint(low, 10_000), *_EDGE_INTS[low:]))
    if kind == "lane":
        return rnd.randrange(lanes)
    if kind == "u32":
        return rnd.choice((0, 2**32 - 1, rnd.randrange(2**32)))
    if kind == "bool":
        return rnd.random() < 0.5
    if kind == "text":
        choice = rnd.random()
        if choice < 0.5:
            return rnd.choice(_TEXTS)
        if choice < 0.8:
            return "".join(
                chr(rnd.choice((rnd.randint(32, 126), rnd.randint(0xA0, 0xD7FF)))) for _ in range(20)
            )
        return rnd.choice(("x", "é", "😀")) * 300  # long ids are valid (the record's bound only)
    if kind == "uuid":
        return _uuid(rnd)
    if kind == "activity":
        return f"{rnd.getrandbits(128):032x}"
    if kind == "reason":
        return rnd.choice(("left", "removed"))
    if kind == "role":
        return rnd.choice(("owner", "admin", "member"))
    if kind == "badge_mode":
        return rnd.choice(("messages", "conversations"))
    raise AssertionError(kind)


def _extra_value(rnd: random.Random, depth: int = 0) -> Any:
    """An unknown field's value: any JSON, shallow (unknown fields are ignored)."""
    pick = rnd.randrange(8 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rnd.random() < 0.5
    if pick == 2:
        return rnd.choice((-1, 0, 2**64, -(2**70), 10**30))
    if pick == 3:
        return rnd.choice((0.5, -0.0, 1e300))
    if pick in (4, 5):
        return rnd.choice(_TEXTS)
    if pick == 6:
        return [_extra_value(rnd, depth + 1) for _ in range(rnd.randrange(3))]
    return {f"k{i}": _extra_value(rnd, depth + 1) for i in range(rnd.randrange(3))}


def valid_pairs(rnd: random.Random, lanes: int, type_: str | None = None) -> Pairs:
    """A valid record (entry or marker) with values at the edges, unknown fields now and then,
    keys in any order, strings escaped either way."""
    type_ = type_ or rnd.choice((*ENTRY_TYPES, "watermark"))
    ascii_only = rnd.random() < 0.3
    values: dict[str, Any] = {name: valid_value(kind, rnd, lanes) for name, kind in fields_of(type_).items()}
    for name, kind in OPTIONAL_FIELDS.get(type_, {}).items():
        if rnd.random() < 0.5:
            values[name] = valid_value(kind, rnd, lanes)
    if rnd.random() < 0.15:
        # `count` is a field of markers, `notification`, `urgent` and `member_count` of messages:
        # elsewhere unknown, so ignored.
        extra = rnd.choice(("count", "notification", "urgent", "member_count", "x-trace", "meta"))
        if extra not in OPTIONAL_FIELDS.get(type_, {}):  # a field of this type is no extra
            values[extra] = _extra_value(rnd)
    pairs = [(name, enc(value, ascii_only=ascii_only)) for name, value in values.items()]
    rnd.shuffle(pairs)
    pairs.insert(rnd.randrange(len(pairs) + 1), ("type", enc(type_)))
    return pairs


# --------------------------------------------------------------------------- bad values

_NOT_INT = (b'"5"', b"5.0", b"1e2", b"-0.0", b"0.5", b"true", b"false", b"null", b"[]", b"{}", b"[5]", b'"1"')
_NOT_JSON_NUMBERS = (b"NaN", b"Infinity", b"-Infinity", b"+1", b"01", b"0x10", b".5", b"5.", b"1_000", b"--1")
_OVERFLOW = (2**64, 2**64 + 1, 2**65, 10**30, -1, -(2**63), -(2**63) - 1, -(2**64), -(10**30))


def bad_value(kind: str, rnd: random.Random, lanes: int) -> bytes:
    """A raw JSON value (or a token that is no JSON at all) the schema refuses for `kind`."""
    if kind in ("seq1", "u64", "cseq1", "cseq0", "u32", "lane"):
        pick = rnd.randrange(6)
        if pick == 0:
            return rnd.choice(_NOT_INT)
        if pick == 1:
            return rnd.choice(_NOT_JSON_NUMBERS)
        if pick == 2:  # JSON can carry them; no decoder can hold them as a u64
            return rnd.choice((b"1E400", b"-1e400", b"18446744073709551616.0", b"1e19"))
        if pick == 3:  # digits far past u64 (CPython's int parser stops at 4,300)
            return b"9" * rnd.choice((21, 40, 400, 4_301, 20_000))
        own: list[int] = list(_OVERFLOW)
        if kind in ("seq1", "cseq1"):
            own.append(0)
        if kind.startswith("cseq"):
            own.append(U64_MAX)  # seq + 1 must fit in u64
        if kind == "u32":
            own += [2**32, 2**32 + rnd.randrange(1, 2**32)]
        if kind == "lane":
            own += [lanes, lanes + rnd.randrange(1, 1000), U64_MAX]
        return enc(rnd.choice(own))
    if kind == "text":
        pick = rnd.randrange(3)
        if pick == 0:
            return rnd.choice((b"5", b"null", b"true", b"[]", b"{}", b'["x"]', b"1.5"))
        return rnd.choice((b"5", b"null", b"true", b"[]", b"{}", b'["x"]', b"1.5"))
    if kind == "uuid":
        good = _uuid(rnd).lower()
        hexes = good.replace("-", "")
        return (
            enc(
                rnd.choice(
                    (
                        hexes,
                        "{" + good + "}",
                        "urn:uuid:" + good,
                        good[:-1],
                        good + "0",
                        good[:-1] + "g",
                        hexes[:8] + "-" + hexes[8:],
                        good + "\n",
                        " " + good,
                        good.replace("-", "_"),
                        good[:-1] + "\u0661",  # an Arabic-Indic digit: str.isdigit, not hex
                        good.replace("a", "\uff41").replace("0", "\uff10")
                        if "a" in good or "0" in good
                        else "",
                        "",
                        "x" * 36,
                    )
                )
            )
            if rnd.random() < 0.85
            else rnd.choice((b"5", b"null", b"[]", b"{}", b"true"))
        )
    if kind == "activity":
        good = f"{rnd.getrandbits(128):032x}"
        return (
            enc(
                rnd.choice(
                    (
                        good.upper() if good.upper() != good else "A" + good[1:],
                        good[:-1],
                        good + "0",
                        "g" + good[1:],
                        "0x" + good[2:],
                        good[:-1] + "\uff10",
                        "",
                    )
                )
            )
            if rnd.random() < 0.85
            else rnd.choice((b"5", b"null", b"[]", b"true"))
        )
    if kind == "bool":
        return rnd.choice((b"0", b"1", b'"true"', b"null", b"[]", b'"false"', b"1.0", b"{}"))
    if kind == "reason":
        return rnd.choice((b'"Left"', b'""', b'"kicked"', b"5", b"null", b'"left "', b"true"))
    if kind == "role":
        return rnd.choice((b'"root"', b'""', b'"Owner"', b"1", b"true", b"null", b'["admin"]'))
    if kind == "badge_mode":
        return rnd.choice((b'"Messages"', b'""', b'"threads"', b"0", b"true", b"null", b'["messages"]'))
    raise AssertionError(kind)


# --------------------------------------------------------------------------- families

Family = Callable[[random.Random, Pairs, int], bytes]


def _type_of(pairs: Pairs) -> str:
    for key, value in pairs:
        if key == "type":
            loaded: str = json.loads(value)
            return loaded
    raise AssertionError("a template has a type")


def field_broken(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """One required or optional field of the template's type: a bad value, or missing."""
    type_ = _type_of(pairs)
    kinds = {**fields_of(type_), **OPTIONAL_FIELDS.get(type_, {})}
    name = rnd.choice(sorted(kinds))
    return break_field(pairs, name, kinds[name], rnd, lanes, missing=rnd.random() < 0.15)


def break_field(
    pairs: Pairs, name: str, kind: str, rnd: random.Random, lanes: int, *, missing: bool
) -> bytes:
    optional = ("role", "count", "notification", "urgent", "member_count")
    if missing and name not in optional:  # an optional field may be missing
        return render([(k, v) for k, v in pairs if k != name])
    value = bad_value(kind, rnd, lanes)
    out = [(k, v) for k, v in pairs if k != name]
    out.insert(rnd.randrange(len(out) + 1), (name, value))
    return render(out)


_INVALID_UTF8 = (
    b"\xff",
    b"\xfe",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xe2\x82",
    b"\xf5\x80\x80\x80",
    b"\x80",
    b"\xf0\x9f\x98",
)


def invalid_utf8(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """A byte sequence that is no UTF-8, inside a string (a value or a key) or between tokens."""
    bad = rnd.choice(_INVALID_UTF8)
    raw = render(pairs)
    quotes = [i for i, byte in enumerate(raw) if byte == ord('"')]
    at = rnd.choice(quotes) + 1 if rnd.random() < 0.8 else rnd.randrange(len(raw) + 1)
    return raw[:at] + bad + raw[at:]


def lone_surrogate(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """A UTF-16 surrogate escape with no partner: JSON text, not Unicode text."""
    escape = rnd.choice((b"\\ud800", b"\\udc00", b"\\udbff\\u0041", b"\\ude00\\ud83d", b"\\uD800"))
    raw = render(pairs)
    quotes = [i for i, byte in enumerate(raw) if byte == ord('"')]
    at = rnd.choice(quotes) + 1
    return raw[:at] + escape + raw[at:]


def not_json(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    raw = render(pairs)
    pick = rnd.randrange(10)
    if pick == 0:
        return raw[: rnd.randrange(1, len(raw) - 1)]  # truncated: never closed
    if pick == 1:
        return raw + rnd.choice((b"x", b"}", b",", b"]", raw, b"\x00"))
    if pick == 2:
        return b"\xef\xbb\xbf" + raw  # a byte-order mark
    if pick == 3:  # a raw control character inside a string
        at = raw.index(b'":"') + 3 if b'":"' in raw else 2
        return raw[:at] + bytes([rnd.randrange(0, 32)]) + raw[at:]
    if pick == 4:
        return raw.replace(b'"', b"'")
    if pick == 5:
        return raw[:-1] + b",}"  # trailing comma
    if pick == 6:
        return b"/* c */" + raw
    if pick == 7:  # an unquoted key
        key = rnd.choice(pairs)[0]
        return raw.replace(enc(key) + b":", key.encode() + b":", 1)
    if pick == 8:
        return rnd.choice(
            (b"{", b"}", b"{,}", b"{:}", b'{"type"}', b'{"a":1,,"b":2}', b"\x00", b" ", b"\n\t ")
        )
    return raw.replace(b":", b"=", 1)


def wrong_shape(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """Valid JSON that is no record: not an object, or an object with no usable type."""
    raw = render(pairs)
    pick = rnd.randrange(9)
    if pick == 0:
        return b"[" + raw + b"]"
    if pick == 1:
        return rnd.choice((b"5", b"-1", b"1.5", b'"x"', b"null", b"true", b"false", b"[]", b'""', b"1e400"))
    if pick == 2:
        return b"{}"
    if pick == 3:
        return render([(k, v) for k, v in pairs if k != "type"])
    if pick == 4:
        return render([("type", next(v for k, v in pairs if k == "type"))])
    if pick == 5:
        return render([("entry", raw)])
    if pick == 6:
        return enc(raw.decode("utf-8", "surrogatepass"))  # the record as a JSON string
    if pick == 7:
        return b"[" + b",".join(enc(k) for k, _ in pairs) + b"]"
    return render([(k, v if k != "type" else b"[" + v + b"]") for k, v in pairs])


def unknown_type(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    type_ = _type_of(pairs)
    new = rnd.choice(
        (
            "reaction",
            type_.upper(),
            type_ + " ",
            " " + type_,
            type_.replace("_", "-") if "_" in type_ else type_ + "s",
            "",
            "Watermark",
            "message\x00",
            "x" * 300,
        )
    )
    raw_type = enc(new) if rnd.random() < 0.85 else rnd.choice((b"5", b"null", b"true", b"[]", b"{}"))
    return render([(k, v if k != "type" else raw_type) for k, v in pairs])


def duplicate_key(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """A key twice (the same value, another valid value, or a bad one): ambiguous, refused."""
    type_ = _type_of(pairs)
    kinds = {**fields_of(type_), "type": "type"}
    name, value = rnd.choice(pairs)
    pick = rnd.randrange(3)
    if pick == 0 or name not in kinds or kinds[name] == "type":
        again = value
    elif pick == 1:
        again = enc(valid_value(kinds[name], rnd, lanes))
    else:
        again = bad_value(kinds[name], rnd, lanes)
    out = list(pairs)
    out.insert(rnd.randrange(len(out) + 1), (name, again))
    return render(out)


def deep_nesting(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """Nesting past MAX_NESTING: in an unknown field (the record is otherwise valid), in a known
    one, or around the record; up to 10,000 levels within the size bound."""
    depth = rnd.choice((MAX_NESTING, MAX_NESTING + 1, 100, 999, 1_000, 5_000, 10_000))
    style = rnd.randrange(3)
    if style == 0:
        nested = b"[" * depth + b"]" * depth
    elif style == 1:
        nested = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        half = depth // 2
        nested = b'[{"a":' * half + b"0" + b"}]" * half
    where = rnd.randrange(3)
    if where == 0:
        out = list(pairs)
        out.insert(rnd.randrange(len(out) + 1), ("deep", nested))
        return render(out)
    if where == 1:
        name = rnd.choice([k for k, _ in pairs])
        return render([(k, v if k != name else nested) for k, v in pairs])
    return b"[" * depth + render(pairs) + b"]" * depth


def huge(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    """Past MAX_RECORD_BYTES: a 1 MiB string in some field (a known one or not), or a valid
    record padded with whitespace to one byte over the bound."""
    pick = rnd.randrange(3)
    if pick == 2:
        raw = render(pairs)
        return raw + b" " * (MAX_RECORD_BYTES + 1 - len(raw))
    big = enc(rnd.choice(("x", "é", "\x01")) * (1 << 20 if rnd.random() < 0.7 else MAX_RECORD_BYTES))
    if pick == 0:
        name = rnd.choice([k for k, _ in pairs])
        return render([(k, v if k != name else big) for k, v in pairs])
    return render([*pairs, ("blob", big)])


def lane_out_of_range(rnd: random.Random, pairs: Pairs, lanes: int) -> bytes:
    value = enc(rnd.choice((lanes, lanes + 1, lanes + 1000, 2**63, U64_MAX)))
    return render([(k, v if k != "lane" else value) for k, v in pairs])


FAMILIES: dict[str, Family] = {
    "field_broken": field_broken,
    "invalid_utf8": invalid_utf8,
    "lone_surrogate": lone_surrogate,
    "not_json": not_json,
    "wrong_shape": wrong_shape,
    "unknown_type": unknown_type,
    "duplicate_key": duplicate_key,
    "deep_nesting": deep_nesting,
    "huge": huge,
    "lane_out_of_range": lane_out_of_range,
}
# How often each family comes up in a scale run (the cheap ones more: 1 MiB records are slow to
# send and the broker's default bound is 1 MB; the size bound is shown by fewer of them).
WEIGHTS = {
    "field_broken": 40,
    "invalid_utf8": 8,
    "lone_surrogate": 5,
    "not_json": 10,
    "wrong_shape": 8,
    "unknown_type": 6,
    "duplicate_key": 10,
    "deep_nesting": 4,
    "huge": 1,
    "lane_out_of_range": 5,
}


# --------------------------------------------------------------------------- hypothesis


@dataclass(frozen=True)
class Garbage:
    family: str
    raw: bytes

    def __repr__(self) -> str:  # shrunk examples stay readable
        shown = self.raw if len(self.raw) < 300 else self.raw[:200] + b"...(%d bytes)" % len(self.raw)
        return f"Garbage({self.family}, {shown!r})"


def valid_records(lanes: int = 2, types: tuple[str, ...] | None = None) -> st.SearchStrategy[bytes]:
    """A valid entry or marker (edge values, unknown fields, escapes) as its raw bytes."""
    choices = types or (*ENTRY_TYPES, "watermark")
    return st.builds(
        lambda type_, seed: render(valid_pairs(random.Random(seed), lanes, type_)),
        st.sampled_from(choices),
        st.integers(0, 2**32 - 1),
    )


def garbage(
    lanes: int = 2, template: st.SearchStrategy[Pairs] | None = None, families: tuple[str, ...] | None = None
) -> st.SearchStrategy[Garbage]:
    """A bad record: a family applied to a valid template (a generated one unless given)."""
    templates = (
        template
        if template is not None
        else st.builds(
            lambda type_, seed: valid_pairs(random.Random(seed), lanes, type_),
            st.sampled_from((*ENTRY_TYPES, "watermark")),
            st.integers(0, 2**32 - 1),
        )
    )
    names = families or tuple(FAMILIES)
    return st.builds(
        lambda name, seed, pairs: Garbage(name, FAMILIES[name](random.Random(seed), pairs, lanes)),
        st.sampled_from(names),
        st.integers(0, 2**32 - 1),
        templates,
    )


# --------------------------------------------------------------------------- at scale


class GarbageMaker:
    """Bad records at scale, from a seed: each a family applied to a template (a valid record of
    the stream, when given, so the garbage names real users and mailbox_seqs)."""

    def __init__(self, seed: int, lanes: int, *, huge_share: float | None = None) -> None:
        self.rnd = random.Random(seed)
        self.lanes = lanes
        self.names = list(WEIGHTS)
        self.weights: list[float] = [WEIGHTS[name] for name in self.names]
        if huge_share is not None:
            total = sum(w for n, w in WEIGHTS.items() if n != "huge")
            self.weights[self.names.index("huge")] = max(0.0, huge_share * total / (1 - huge_share))

    def one(self, template: dict[str, Any] | None = None) -> Garbage:
        rnd = self.rnd
        pairs = pairs_of(template) if template is not None else valid_pairs(rnd, self.lanes)
        name = rnd.choices(self.names, self.weights)[0]
        return Garbage(name, FAMILIES[name](rnd, pairs, self.lanes))

    def many(self, count: int, templates: list[dict[str, Any]] | None = None) -> Iterator[Garbage]:
        for _ in range(count):
            template = self.rnd.choice(templates) if templates else None
            yield self.one(template)
