"""The worker fleet on real Kafka, Redis and Cassandra against `projector replay` (issue 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from app.domain.client import SessionView
from tests.integration.stack import Stack, read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


async def test_worker_projection_and_frames_equal_replay(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("e2e")
    stream = tmp_path / "stream.jsonl"
    stack.run(
        "simulate",
        "--users",
        "40",
        "--conversations",
        "12",
        "--group-size",
        "25",
        "--messages",
        "400",
        "--rate",
        "0",
        "--lanes",
        "2",
        "--seed",
        "11",
        "--out",
        str(stream),
        "--progress",
        "never",
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    expected_rows = read_jsonl(out / "projections.jsonl")
    expected_badges = read_jsonl(out / "badges.jsonl")
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert expected_rows and stats["dead_letters"] == 0 and stats["pending"] == 0

    stack.start_worker()
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in expected_badges}
    await stack.wait_for_versions(versions, timeout=240, alive=stack.alive())
    rows, badges = await stack.projection(sorted(versions))
    assert badges == expected_badges
    assert rows == expected_rows

    # The frames on the topic, applied with the client rule, give the same rows.
    def complete(frames: list[dict[str, object]]) -> bool:
        seen = {f["user_id"]: f["projection_mailbox_seq"] for f in frames}
        return all(seen.get(u) == v for u, v in versions.items())

    frames = await stack.consume(stack.settings.topics.topic_session_delta, complete, timeout=60)
    views: dict[int, SessionView] = {}
    for frame in frames:
        view = views.setdefault(int(frame["user_id"]), SessionView(int(frame["user_id"])))
        assert not view.apply(frame).needs_repull
    client_rows = [
        dict(row) for user_id in sorted(views) for _, row in sorted(views[user_id].known().items())
    ]
    assert client_rows == expected_rows
    # A clean stop persists the hot state and commits every offset read: a restart reads
    # nothing again (the window is 5 s: without the stop hook the last commits lag behind).
    ends = await stack.end_offsets()
    stack.stop_workers()
    assert stack.workers[0].returncode == 0, stack.log_tail()
    assert await stack.group_offsets() == ends
