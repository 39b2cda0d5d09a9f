"""The unread audit in a real worker on Kafka, Redis and Cassandra (issue 7).

Simulated traffic whose event time lies 26 h in the past (so every row has had "no change for
24 h" without anyone waiting a day: the idle threshold stays at its 24 h default), the messages in
the Cassandra MessageStore, projected by one worker that audits every row every 5 s (rate 1.0).
Before any drift the rounds compare rows and find nothing (the recount agrees with the stream on
real traffic); then rows and a badge are corrupted in Redis, and the next round finds them,
corrects Redis to the replay's result, emits correction frames a client applies, and the drift
ratio scraped from the worker's /metrics endpoint moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis.asyncio as redis

from app.domain.client import ApplyStatus, SessionView
from app.metrics import sample
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HOUR = 3_600_000
LIMIT = 200


def auditable(row: dict[str, Any]) -> bool:
    """What the audit picks (app/domain/audit.eligible), from a stored row's own fields."""
    base = max(
        row["read_conversation_seq"],
        row["hidden_before_conversation_seq"],
        row["joined_at_conversation_seq"],
        row["deleted_before_conversation_seq"],
    )
    latest = row["latest_conversation_seq"] or 0
    return cast(bool, row["unread_count"] > 0 and row["unread_exact"] and latest - base <= LIMIT)


async def test_drift_injected_into_redis_is_found_corrected_and_reported(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    port = free_port()
    stack = make_stack(
        "audit",
        PROJECTOR_WORKER_METRICS_PORT=str(port),
        PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE="1",
        PROJECTOR_UNREAD_AUDIT_INTERVAL_MS="5000",
    )
    stream = tmp_path / "stream.jsonl"
    long_ago = int(time.time() * 1000) - 26 * HOUR
    stack.run(
        *("simulate", "--users", "40", "--conversations", "12", "--group-size", "25", "--messages", "400"),
        *("--rate", "0", "--lanes", "2", "--seed", "11", "--start-ms", str(long_ago)),
        *("--out", str(stream), "--progress", "never"),
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    expected_rows = read_jsonl(out / "projections.jsonl")
    expected_badges = read_jsonl(out / "badges.jsonl")
    eligible = [row for row in expected_rows if auditable(row)]
    assert len(eligible) >= 10

    stack.start_worker()
    alive = stack.alive()
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in expected_badges}
    await stack.wait_for_versions(versions, timeout=240, alive=alive)
    url = f"http://127.0.0.1:{port}/metrics"
    # A round after the projection is complete compared every eligible row and found no drift.
    text = await scrape_until(
        url, lambda t: sample(t, "projector_unread_audited_rows_total") >= 2 * len(eligible), 120, alive
    )
    assert sample(text, "projector_unread_drift_ratio") == 0
    assert sample(text, "projector_unread_drift_corrected_rows_total") == 0
    rows, badges = await stack.projection(sorted(versions))
    assert rows == expected_rows and badges == expected_badges

    # Drift, as Redis could have it: wrong unread, a lost mention, a lost row, a wrong badge.
    store = RedisProjectionStore.from_settings(
        stack.settings.redis, stack.settings.redis.projection_namespace
    )
    client: redis.Redis | redis.RedisCluster = store.client
    by_user: dict[int, list[dict[str, Any]]] = {}
    for row in eligible:
        by_user.setdefault(row["user_id"], []).append(row)
    victims = sorted(by_user, key=lambda u: (-len(by_user[u]), u))[:3]
    first, second, third = (by_user[u][0] for u in victims)
    drifted = {(r["user_id"], r["conversation_id"]) for r in (first, second, third)}
    badge_user = victims[0]
    try:
        pulled_before = await store.load(first["user_id"])
        wrong = {**first, "unread_count": first["unread_count"] + 7}
        lost_mention = {**second, "mention_count": second["mention_count"] + 1}
        # All of it in one round's reach: right after a round ended (rounds are 5 s apart), in
        # one MULTI, so no round sees part of it and corrects the rest a round later.
        audited = sample(text, "projector_unread_audited_rows_total")
        text = await scrape_until(
            url, lambda t: sample(t, "projector_unread_audited_rows_total") > audited, 60, alive
        )
        async with client.pipeline(transaction=True) as drift:
            drift.hset(store.rows_key(first["user_id"]), first["conversation_id"], orjson.dumps(wrong))
            drift.hset(
                store.rows_key(second["user_id"]), second["conversation_id"], orjson.dumps(lost_mention)
            )
            drift.hdel(store.rows_key(third["user_id"]), third["conversation_id"])
            drift.hset(store.meta_key(badge_user), "total_unread", 999)
            await drift.execute()
        # A client pulls user `first`'s drifted list at the stored version.
        pulled = await store.load(first["user_id"])
        assert pulled.projection_mailbox_seq == pulled_before.projection_mailbox_seq
        view = SessionView(first["user_id"])
        view.reset(pulled.rows.values(), pulled.projection_mailbox_seq)
        assert view.row(first["conversation_id"]) == wrong

        text = await scrape_until(
            url,
            lambda t: sample(t, "projector_unread_drift_corrected_rows_total") >= len(drifted),
            120,
            alive,
        )
        # The round that corrected them: 3 of the eligible rows drifted (rounds are 5 s apart,
        # so this scrape, within half a second of the counter moving, still shows that round).
        assert sample(text, "projector_unread_drift_corrected_rows_total") == len(drifted)
        assert sample(text, "projector_unread_drift_ratio") == pytest.approx(len(drifted) / len(eligible))
        rows, badges = await stack.projection(sorted(versions))
        assert rows == expected_rows and badges == expected_badges

        # Correction frames: the rows of each drifted user, the badge of the user whose badge was off.
        def corrections(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [f for f in frames if f.get("correction") is True]

        deltas = corrections(
            await stack.consume(
                stack.settings.topics.topic_session_delta, lambda fs: len(corrections(fs)) >= len(victims), 60
            )
        )
        assert sorted(
            (f["user_id"], r["conversation_id"]) for f in deltas for r in f["conversations"]
        ) == sorted(drifted)
        badge_frames = corrections(
            await stack.consume(stack.settings.topics.topic_badge, lambda fs: len(corrections(fs)) >= 1, 60)
        )
        want_badge = next(b for b in expected_badges if b["user_id"] == badge_user)
        assert [(f["user_id"], f["total_unread"]) for f in badge_frames] == [
            (badge_user, want_badge["total_unread"])
        ]
        for frame in deltas:
            if frame["user_id"] == first["user_id"]:
                assert view.apply(frame).status is ApplyStatus.CORRECTED
        want = {r["conversation_id"]: r for r in expected_rows if r["user_id"] == first["user_id"]}
        assert {cid: dict(r) for cid, r in view.known().items()} == want
    finally:
        await store.aclose()
    stack.stop_workers()
