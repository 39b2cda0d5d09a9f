"""The pure and the compiled build give byte-identical outputs (issue 30): projections, badges,
frames, dead letters with their reasons and stats from replay (in memory and with RocksDB
state), and every step, persist, snapshot and restore of the worker's processing object, on the
property suites' streams (valid, disordered, duplicated, garbled) and a 100,000-record garbage
corpus.

`make test` runs it at CI size; `make test-differential` at full size (DIFF_SCALE, >= 1,000,000
lines; the count is in .local/differential/last.json). Marked `compiled`: it builds the mypyc
wheel first when it is missing or stale, so the no-server suite (`make test-fast`) leaves it out.
"""

from __future__ import annotations

import os
import random
from typing import Any

import orjson
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from app.domain.conversation import ConversationState
from app.domain.projector import UserState
from tests.property.test_core_vs_model import options
from tests.property.test_garbage import edge_streams, garbled_streams
from tests.support.build_diff import Differential
from tests.support.garbage import Garbage, GarbageMaker
from tests.support.strategies import Stream, scenarios, streams

pytestmark = pytest.mark.compiled

SCALE = float(os.environ.get("DIFF_SCALE", "1"))
MODES = st.sampled_from(("replay", "replay", "processor", "replay-rocks"))


def n(examples: int) -> int:
    return max(1, int(examples * SCALE))


def request(mode: str, lines: list[bytes], lanes: int, opts: dict[str, Any], seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": "processor" if mode == "processor" else "replay",
        "lines": lines,
        "options": {"lanes": lanes, **opts},
        "seed": seed,
    }
    if mode == "replay-rocks":
        out["state_dir"] = "new"  # each build gets a new folder of its own
    return out


def assert_same(differential: Differential, req: dict[str, Any]) -> None:
    verdict = differential.check(req)
    assert verdict.same, f"the builds differ ({req['mode']}, {len(req['lines'])} lines): {verdict.explain()}"


@settings(max_examples=n(150))
@given(stream=streams(), opts=options, mode=MODES, seed=st.integers(0, 2**32 - 1))
def test_delivered_streams(
    differential: Differential, stream: Stream, opts: dict[str, Any], mode: str, seed: int
) -> None:
    """Disordered, duplicated, with bad and blank lines, markers early and late."""
    assert_same(differential, request(mode, stream.lines(), stream.lanes, opts, seed))


@settings(max_examples=n(40))
@given(
    stream=streams(scenarios(big=True, max_steps=20)),
    opts=options,
    mode=MODES,
    seed=st.integers(0, 2**32 - 1),
)
def test_big_rows(
    differential: Differential, stream: Stream, opts: dict[str, Any], mode: str, seed: int
) -> None:
    """Bursts of > 200 messages: bounded recomputes, seq ranges, bitmaps."""
    assert_same(differential, request(mode, stream.lines(), stream.lanes, opts, seed))


@settings(max_examples=n(150))
@given(case=garbled_streams(), opts=options, mode=MODES, seed=st.integers(0, 2**32 - 1))
def test_garbled_streams(
    differential: Differential,
    case: tuple[Stream, list[bytes], list[Garbage]],
    opts: dict[str, Any],
    mode: str,
    seed: int,
) -> None:
    """Garbage made from the stream's own entries, inserted anywhere."""
    stream, mixed, _ = case
    assert_same(differential, request(mode, mixed, stream.lanes, opts, seed))


@settings(max_examples=n(100))
@given(lines=edge_streams(), opts=options, mode=MODES, seed=st.integers(0, 2**32 - 1))
def test_values_at_the_edges(
    differential: Differential, lines: list[bytes], opts: dict[str, Any], mode: str, seed: int
) -> None:
    """u64 bounds, upper-case ids, unicode at its bound, unknown fields."""
    assert_same(differential, request(mode, lines, 3, opts, seed))


@pytest.mark.parametrize("mode", ["replay", "processor"])
def test_the_garbage_corpus(differential: Differential, mode: str) -> None:
    """100,000 garbage records from every family (DIFF_SCALE / 10 corpora of them at full
    size), made from a valid stream's own entries (same users, same mailbox_seqs) and
    interleaved with it."""
    corpora = max(1, round(SCALE / 10))
    for corpus in range(corpora):
        rnd = random.Random(30_000 + corpus)
        stream = valid_stream(rnd.randrange(2**32))
        lines = stream.lines()
        maker = GarbageMaker(seed=30_000 + corpus, lanes=stream.lanes, huge_share=0.0002)
        bad = [g.raw for g in maker.many(100_000, [dict(e) for e in stream.scenario.entries])]
        mixed = bad + lines
        rnd.shuffle(mixed)  # the valid lines keep their order among themselves below
        it = iter(lines)
        valid = set(lines)
        mixed = [next(it) if raw in valid else raw for raw in mixed]
        opts = {"window_ms": rnd.choice((20, 5000)), "max_dirty_rows": 100_000, "include_muted": False}
        assert_same(differential, request(mode, mixed, stream.lanes, opts, corpus))


def valid_stream(seed: int) -> Stream:
    """A valid delivered stream of the property strategies (3 lanes, >= 60 entries), drawn
    outside @given from a seed."""
    return find(
        streams(scenarios(lanes=3, min_steps=30, max_steps=40), full=True, bad=False, blanks=False),
        lambda stream: len(stream.scenario.entries) >= 60,
        settings=settings(database=None, max_examples=1000),
        random=random.Random(seed),
    )


WRONG_VALUES: list[Any] = [True, False, 1, 0, 1.0, -1, 2**64, "1", None, b"x", [1], {"a": 1}]


def state_records() -> list[tuple[str, Any]]:
    """A valid record of each loader, then each field of each replaced by every wrong value."""
    row = ConversationState(7, "00000000-0000-0000-0000-000000000001")
    row.head_seq, row.pin_rank, row.mention_first = 5, 3, 4
    user = UserState(7)
    user.total_unread, user.projection_mailbox_seq = 4, 9
    valid: list[tuple[str, Any]] = [
        ("row", row.dump()),
        ("user", user.dump()),
        ("gate", {"marks": [3, None, 5], "hi": 5}),
        (
            "arrivals",
            {
                "counted": [1, 2, 3],
                "covered": [1, -1, 2],
                "expected": [None, 4, 2],
                "base": [0, 0, 0],
                "unbased": [False, True, False],
            },
        ),
    ]
    out = list(valid)
    for what, record in valid:
        if isinstance(record, list):
            for index in range(1, len(record)):
                for value in WRONG_VALUES:
                    out.append((what, [*record[:index], value, *record[index + 1 :]]))
        else:
            for key in record:
                for value in WRONG_VALUES:
                    out.append((what, {**record, key: value}))
                    if isinstance(record[key], list):
                        out.append((what, {**record, key: [value, *record[key][1:]]}))
    return out


def test_state_records_of_the_wrong_types(differential: Differential) -> None:
    """Changelog records with a bool for an int, an int for a bool, a float, a string, null...:
    both builds refuse (or, where the value is of an allowed type, take) exactly the same ones
    with the same error. A compiled class would keep True as 1 where the pure one kept True."""
    records = state_records()
    verdict = differential.check({"mode": "load", "lines": [], "loads": records})
    assert verdict.same, f"the builds differ: {verdict.explain()}"
    # Not vacuous: one outcome per record, the valid ones loaded, most of the others refused.
    outcomes = orjson.loads(verdict.pure)["ok"]
    assert len(outcomes) == len(records)
    refused = [isinstance(o, str) and o.startswith("ValueError") for o in outcomes]
    assert not any(refused[:4]) and sum(refused) > len(records) // 2
