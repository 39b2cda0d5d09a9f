"""The J-1 bench stream is what J-1 says, and its in-band watermark markers are correct."""

from __future__ import annotations

import io
import math
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import ceiling, naive_projector
from bench.gen_j1 import CONVERSATION_ID, Params, generate, write

SMALL = Params(members=20, messages=30, lanes=4)


def records(params: Params) -> list[dict[str, Any]]:
    return list(generate(params))


@pytest.mark.parametrize(
    "params",
    [
        SMALL,
        Params(members=20, messages=30, lanes=1),
        Params(members=7, messages=5, lanes=3, markers_per_batch=3),
    ],
)
def test_every_marker_follows_all_entries_of_its_lane_at_or_below_it(params: Params) -> None:
    stream = records(params)
    entries = [r for r in stream if r["type"] != "watermark"]
    markers = [(i, r) for i, r in enumerate(stream) if r["type"] == "watermark"]
    assert markers
    for position, marker in markers:
        lane, w = marker["lane"], marker["watermark"]
        later = stream[position + 1 :]
        assert not any(
            r["type"] != "watermark" and r["lane"] == lane and r["mailbox_seq"] <= w for r in later
        ), f"marker {marker} precedes an entry of its lane at or below it"
    # Every lane reports at least once per message batch.
    per_lane = Counter(r["lane"] for _, r in markers)
    assert set(per_lane) == set(range(params.lanes))
    assert min(per_lane.values()) >= params.messages
    # At the end every lane has covered the whole stream: nothing is left above the watermark.
    last_seq = entries[-1]["mailbox_seq"]
    final = {r["lane"]: r["watermark"] for _, r in markers}
    assert min(final.values()) == last_seq
    assert all(r["type"] == "watermark" for r in stream[-params.lanes :])


def test_markers_never_go_backwards_per_lane() -> None:
    last: dict[object, int] = {}
    for r in records(SMALL):
        if r["type"] == "watermark":
            w = r["watermark"]
            assert isinstance(w, int)
            assert w >= last.get(r["lane"], 0)
            last[r["lane"]] = w


def test_counts_and_fields() -> None:
    params = SMALL
    entries = [r for r in records(params) if r["type"] != "watermark"]
    assert len(entries) == params.members * params.messages
    seqs = [r["mailbox_seq"] for r in entries]
    assert seqs == list(range(1, len(entries) + 1))  # globally increasing
    assert {r["conversation_id"] for r in entries} == {CONVERSATION_ID}
    per_message = Counter(r["conversation_seq"] for r in entries)
    assert per_message == dict.fromkeys(range(1, params.messages + 1), params.members)
    for message in range(1, params.messages + 1):
        fan_out = [r for r in entries if r["conversation_seq"] == message]
        assert sorted(r["user_id"] for r in fan_out) == list(range(1, params.members + 1))
        shared = {(r["ts"], r["sender_id"], r["message_id"], r["activity_id"]) for r in fan_out}
        assert len(shared) == 1
        sender = fan_out[0]["sender_id"]
        assert isinstance(sender, int) and 1 <= sender <= params.members
        assert not any(r["mention"] for r in fan_out if r["user_id"] == sender)
    for r in entries:
        assert r["type"] == "message"
        assert r["counts_unread"] is True
        assert r["lane"] == r["user_id"] % params.lanes
        activity = r["activity_id"]
        assert isinstance(activity, str) and len(activity) == 32
        assert activity == activity.lower() and int(activity, 16) >= 0
    # Time-sortable activity ids follow the messages; ts steps by 1000 / rate ms.
    heads = sorted({(r["conversation_seq"], r["ts"], r["activity_id"]) for r in entries})
    assert [h[2] for h in heads] == sorted(h[2] for h in heads)
    assert [h[1] for h in heads] == [params.t0_ms + 50 * i for i in range(params.messages)]
    # @all every 100th message, one member mentioned every 10th.
    mentions = Counter(r["conversation_seq"] for r in entries if r["mention"])
    assert mentions == {10: 1, 20: 1, 30: 1}


def test_j1_defaults_make_the_acceptance_stream() -> None:
    params = Params()
    assert (params.members, params.messages, params.rate, params.step_ms) == (1000, 1000, 20, 50)
    span_ms = (params.messages - 1) * params.step_ms
    assert math.ceil(span_ms / 5000) + 1 == 11


def test_write_emits_json_lines_matching_generate() -> None:
    buffer = io.BytesIO()
    written = write(SMALL, buffer)
    lines = buffer.getvalue().splitlines()
    assert [orjson.loads(line) for line in lines] == records(SMALL)
    assert written.entries == SMALL.members * SMALL.messages
    assert written.entries + written.markers == len(lines)
    assert written.bytes == len(buffer.getvalue())


def test_baselines_count_what_they_read(tmp_path: Path) -> None:
    path = tmp_path / "j1.jsonl"
    with path.open("wb") as fp:
        written = write(SMALL, fp)
    naive = naive_projector.run(path)
    assert naive["entries"] == naive["applied"] == written.entries
    assert naive["markers"] == written.markers
    # The baseline writes the row on every entry: one write per entry, `messages` per row.
    assert naive["projection_writes"] == written.entries
    assert naive["max_writes_per_user_conversation"] == SMALL.messages
    assert naive["rows"] == SMALL.members
    ceiling_counts = ceiling.run(path)
    assert ceiling_counts["lines"] == written.entries + written.markers
    assert ceiling_counts["keys"] == SMALL.members + 1  # the markers' (None, None) key
