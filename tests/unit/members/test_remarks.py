"""The rules a remark (备注) must satisfy, whatever store keeps it (app/members/remarks.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.members.remarks import REMARK_MAX_CHARS, REMARK_PATTERN, InvalidRemark, check_remark, check_targets


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("Mum", "Mum"),
        ("  spaces around  ", "spaces around"),
        ("张三 (财务)", "张三 (财务)"),
        ("👩‍💻 dev", "👩‍💻 dev"),  # a ZWJ sequence is a format character (Cf), not a control
        ("x" * REMARK_MAX_CHARS, "x" * REMARK_MAX_CHARS),
        ("备" * REMARK_MAX_CHARS, "备" * REMARK_MAX_CHARS),  # characters, not UTF-8 bytes
    ],
)
def test_a_valid_remark_is_stored_trimmed(text: str, stored: str) -> None:
    assert check_remark(text) == stored


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (None, "must be a string"),
        (42, "must be a string"),
        ("", "must not be empty"),
        ("   \t ", "must not be empty"),
        ("x" * (REMARK_MAX_CHARS + 1), f"at most {REMARK_MAX_CHARS}"),
        ("two\nlines", "U+000A"),
        ("nul\x00", "U+0000"),
        ("tab\tinside", "U+0009"),
        ("line\u2028sep", "U+2028"),
        ("surrogate\ud800", "U+D800"),
        ("c1\x85control", "U+0085"),
    ],
)
def test_a_bad_remark_is_refused_with_its_reason(text: object, reason: str) -> None:
    with pytest.raises(InvalidRemark, match=reason.replace("+", r"\+")):
        check_remark(text)


def test_batch_targets_are_distinct_sorted_bounded_u64s() -> None:
    assert check_targets(1, [5, 3, 5]) == [3, 5]
    assert check_targets(1, []) == []
    assert check_targets(2**64 - 1, [2**64 - 1]) == [2**64 - 1]
    with pytest.raises(ValueError, match="at most 50"):
        check_targets(1, list(range(51)))
    for bad in (-1, 2**64, True):
        with pytest.raises(ValueError, match="user id"):
            check_targets(1, [bad])
        with pytest.raises(ValueError, match="user id"):
            check_targets(bad, [1])


@settings(max_examples=400)
@given(st.text(max_size=REMARK_MAX_CHARS + 8) | st.from_regex(REMARK_PATTERN))
@example("\t" + "x" * REMARK_MAX_CHARS + "\n")  # padded past 64: the padding does not count
@example("x" * (REMARK_MAX_CHARS + 1))
@example("\u2028x\x85")  # separators and NEL are white space at the edges...
@example("x\u2028y")  # ...and refused inside
@example("\x1fx")
@example("\ufeffx")  # a BOM is a format character, not white space: kept
@example("a b")
def test_the_api_descriptions_pattern_admits_exactly_what_check_remark_accepts(text: str) -> None:
    """The description's pattern (what a validator or the API fuzzer treats as valid) and the
    server's rule agree on every text (hypothesis never draws lone surrogates: JSON schema
    patterns cannot name them portably, and the server refuses them anyway)."""
    try:
        check_remark(text)
        accepted = True
    except InvalidRemark:
        accepted = False
    assert bool(re.fullmatch(REMARK_PATTERN, text)) == accepted, repr(text)
