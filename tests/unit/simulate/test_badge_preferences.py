"""`projector simulate`'s shares of docs/contract.md §10: users who mark conversations unread and
users who choose each badge mode; the default traffic of a seed does not change."""

from __future__ import annotations

import dataclasses
from collections import Counter

import orjson
import pytest

from app.domain.entries import DeadLetter, decode_record
from app.replay import ReplayOptions, run_replay
from app.simulate import Mix, SimParams, Workload
from tests.property.invariants import check_all
from tests.property.model import run_model

BASE = SimParams(users=40, conversations=12, group_size=30, messages=400, lanes=2, seed=9)
SHARES = dataclasses.replace(BASE, mix=Mix(markers=0.5, badge_conversations=0.3, badge_messages=0.2))


def lines(params: SimParams) -> list[bytes]:
    out: list[bytes] = []
    for batch in Workload(params).batches():
        out += [orjson.dumps(e) for e in batch.entries]
        out += [orjson.dumps(m) for m in batch.markers]
    return out


def test_without_shares_the_traffic_is_what_it_was() -> None:
    """Only entries of the old types, and the same as with the shares minus the §10 entries."""
    kinds = Counter(orjson.loads(line)["type"] for line in lines(BASE))
    assert "mark_unread" not in kinds and "badge_preferences" not in kinds


def test_the_shares_make_marks_and_preferences_the_core_applies_as_the_model_does() -> None:
    got = lines(SHARES)
    kinds = Counter(orjson.loads(line)["type"] for line in got)
    assert kinds["mark_unread"] > 10
    prefs = [orjson.loads(line) for line in got if orjson.loads(line)["type"] == "badge_preferences"]
    modes = Counter(p["badge_mode"] for p in prefs)
    assert modes["conversations"] > 0 and modes["messages"] > 0
    for line in got:
        assert not isinstance(decode_record(line, SHARES.lanes), DeadLetter)
    res = run_replay(got, ReplayOptions(lanes=SHARES.lanes, window_ms=5000))
    check_all(res, run_model(got, lanes=SHARES.lanes), False, 5000, 100_000)
    assert any(row["marked_unread"] for row in res.projections)
    assert {b["badge_mode"] for b in res.badges} == {"messages", "conversations"}


def test_shares_of_modes_above_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        dataclasses.replace(BASE, mix=Mix(badge_conversations=0.6, badge_messages=0.5))
