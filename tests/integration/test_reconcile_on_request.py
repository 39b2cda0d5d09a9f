"""Reconcile on login and POST /v1/reconcile (docs/contract.md §10) on the real servers.

A real worker projects simulated traffic (Kafka → worker → Redis/Cassandra) until the store equals
`projector replay`'s; then, as a bug or a lost write would leave it, 3 of one user's stored rows
drift and 2 are deleted from the store (the badge left as it was). The real `projector api`
(subprocess, its own Kafka producer) serves that user's first page without cursor: a login. The
worker that owns the user reconciles it: afterwards every user's rows and badge equal replay's
again, exactly 5 rows went out in correction frames (one SESSION_DELTA, correction=true, at the
stored version), no badge frame, no other frame, no version moved; the same API instance, which
served (and holds) the drifted rows, serves the corrected ones on the next walk. A flood of
logins of that user within the interval asks nothing more; POST /v1/reconcile for another user is
202, then 429 with Retry-After; bad requests are clear 4xx.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as redis
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.api.tokens import TokenSigner
from app.domain.wire_ids import row_from_client
from app.metrics import sample
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until, start_api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

API_SECRET = "integration-api-secret-reconcile-0123456789"
INTERVAL_S = 3600


def simulate(stack: Stack, tmp: Path) -> dict[str, Any]:
    """Simulated traffic into the stack (Kafka and the MessageStore), and replay's result of it:
    20 users in 12 conversations of 15 members, so each user has several rows."""
    stream = tmp / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "20", "--conversations", "12", "--group-size", "15", "--messages", "500"),
        *("--rate", "0", "--lanes", str(stack.settings.processing.lanes), "--seed", "7"),
        *("--out", str(stream), "--progress", "never"),
    )
    out = tmp / "replay"
    stack.run(
        "replay", "--input", str(stream), "--out", str(out), "--lanes", str(stack.settings.processing.lanes)
    )
    badges = read_jsonl(out / "badges.jsonl")
    return {
        "rows": read_jsonl(out / "projections.jsonl"),
        "badges": badges,
        "versions": {b["user_id"]: b["projection_mailbox_seq"] for b in badges},
    }


def auth(user_id: int) -> dict[str, str]:
    return {"Authorization": "Bearer " + TokenSigner(API_SECRET).mint(user_id, int(time.time()) + 3600)}


async def end_offsets(stack: Stack, topics: list[str]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.settings.kafka.kafka_bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(stack.settings.topics.topic_partitions)]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def records_between(
    stack: Stack, start: dict[TopicPartition, int], end: dict[TopicPartition, int]
) -> list[dict[str, Any]]:
    """Every frame produced on these partitions between the two offset maps."""
    wanted = {tp: (start[tp], end[tp]) for tp in start if end[tp] > start[tp]}
    if not wanted:
        return []
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.settings.kafka.kafka_bootstrap, group_id=None)
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        consumer.assign(list(wanted))
        for tp, (first, _) in wanted.items():
            consumer.seek(tp, first)
        deadline = time.monotonic() + 60
        done: set[TopicPartition] = set()
        while len(done) < len(wanted):
            assert time.monotonic() < deadline, "frames not read back in 60 s"
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for r in records:
                    if r.offset < wanted[tp][1]:
                        out.append({"topic": tp.topic, **orjson.loads(r.value)})
                if await consumer.position(tp) >= wanted[tp][1]:
                    done.add(tp)
    finally:
        await consumer.stop()
    return out


async def test_login_reconciles_drift_and_post_is_bounded(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    metrics_port, api_port = free_port(), free_port()
    stack = make_stack(
        "rcq",
        PROJECTOR_WORKER_METRICS_PORT=str(metrics_port),
        PROJECTOR_RECONCILE_MIN_INTERVAL_S=str(INTERVAL_S),
        # Nothing but the reconcile may repair the drift planted below.
        PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE="0",
    )
    expected = simulate(stack, tmp_path)
    stack.start_worker()
    alive = stack.alive()
    users = sorted(expected["versions"])
    await stack.wait_for_versions(expected["versions"], timeout=240, alive=alive)
    rows, badges = await stack.projection(users)
    assert rows == expected["rows"] and badges == expected["badges"]

    by_user: dict[int, list[dict[str, Any]]] = {}
    for row in expected["rows"]:
        by_user.setdefault(row["user_id"], []).append(row)
    victim = max(users, key=lambda u: (len(by_user.get(u, [])), -u))
    other = next(u for u in users if u != victim and by_user.get(u))
    mine = by_user[victim]
    assert len(mine) >= 6
    drifted, deleted = mine[:3], mine[3:5]
    planted = {r["conversation_id"] for r in drifted + deleted}

    store = RedisProjectionStore.from_settings(
        stack.settings.redis, stack.settings.redis.projection_namespace
    )
    client: redis.Redis | redis.RedisCluster = store.client
    api: subprocess.Popen[bytes] | None = None
    try:
        before = await store.load(victim)
        corrections_before = int(await client.hget(store.meta_key(victim), "corrections") or 0)
        async with client.pipeline(transaction=True) as drift:
            wrong = [
                {**drifted[0], "unread_count": drifted[0]["unread_count"] + 7},
                {**drifted[1], "mention_count": drifted[1]["mention_count"] + 2},
                {**drifted[2], "muted": not drifted[2]["muted"]},
            ]
            for row in wrong:
                drift.hset(store.rows_key(victim), row["conversation_id"], orjson.dumps(row))
            drift.hdel(store.rows_key(victim), *(r["conversation_id"] for r in deleted))
            await drift.execute()
        frame_topics = [stack.settings.topics.topic_session_delta, stack.settings.topics.topic_badge]
        start = await end_offsets(stack, frame_topics)

        api = await start_api(stack, api_port, tmp_path / "api.log", {"PROJECTOR_API_SECRET": API_SECRET})
        base = f"http://127.0.0.1:{api_port}"
        worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        async with aiohttp.ClientSession() as http:
            # The login: a first page without cursor. It is served as the store holds it.
            async with http.get(f"{base}/v1/sessions", params={"limit": "100"}, headers=auth(victim)) as resp:
                assert resp.status == 200, await resp.text()
                first = {r["conversation_id"]: row_from_client(r) for r in (await resp.json())["items"]}
            for row in wrong:  # the drift, as this instance served (and holds) it
                if row["conversation_id"] in first:
                    assert first[row["conversation_id"]] == row
            text = await scrape_until(
                worker_metrics,
                lambda t: sample(t, "projector_reconciles_total", [("outcome", "corrected")]) >= 1,
                120,
                alive,
            )
            assert sample(text, "projector_reconcile_rows_corrected_total") == 3
            assert sample(text, "projector_reconcile_rows_filled_total") == 2
            assert sample(text, "projector_reconcile_rows_compared_total") == len(mine)

            # The store equals replay again, every user; the victim's version did not move.
            rows, badges = await stack.projection(users)
            assert rows == expected["rows"] and badges == expected["badges"]
            after = await store.load(victim)
            assert after.projection_mailbox_seq == before.projection_mailbox_seq
            assert (
                int(await client.hget(store.meta_key(victim), "corrections") or 0) == corrections_before + 1
            )

            # Exactly the 5 rows, in one correction frame; no badge frame, no other frame.
            end = await end_offsets(stack, frame_topics)
            frames = await records_between(stack, start, end)
            assert len(frames) == 1, frames
            (frame,) = frames
            assert frame["topic"] == stack.settings.topics.topic_session_delta
            assert frame["correction"] is True and frame["user_id"] == victim
            assert (
                frame["projection_mailbox_seq"]
                == frame["prev_projection_mailbox_seq"]
                == after.projection_mailbox_seq
            )
            assert {r["conversation_id"] for r in frame["conversations"]} == planted
            want = {r["conversation_id"]: r for r in mine}
            for row in frame["conversations"]:
                assert row == want[row["conversation_id"]]

            # The instance that served the drift serves the corrected rows on the next walk (a
            # correction invalidates held snapshots), the filled ones included.
            async with http.get(f"{base}/v1/sessions", params={"limit": "100"}, headers=auth(victim)) as resp:
                again = {r["conversation_id"]: row_from_client(r) for r in (await resp.json())["items"]}
            assert {cid: want[cid] for cid in again} == again
            shown = {cid for cid in planted if want[cid]["listed"] and not want[cid]["archived"]}
            assert shown and shown <= again.keys()
            assert all(first.get(cid) != want[cid] for cid in shown)  # the first walk served the drift

            # A flood of logins within the interval asks nothing more.
            for _ in range(20):
                async with http.get(f"{base}/v1/sessions", headers=auth(victim)) as resp:
                    assert resp.status == 200
            api_text = await scrape_until(
                f"{base}/metrics",
                lambda t: (
                    sample(
                        t,
                        "projector_api_reconcile_requests_total",
                        [("trigger", "login"), ("outcome", "limited")],
                    )
                    >= 20
                ),
                60,
                alive,
            )
            assert (
                sample(
                    api_text,
                    "projector_api_reconcile_requests_total",
                    [("trigger", "login"), ("outcome", "accepted")],
                )
                == 1
            )

            # POST /v1/reconcile: 202, then 429 with Retry-After within the interval.
            async with http.post(f"{base}/v1/reconcile", headers=auth(other)) as resp:
                assert resp.status == 202, await resp.text()
                body = await resp.json()
                assert body == {"accepted": True, "user_id": str(other), "min_interval_s": INTERVAL_S}
            async with http.post(f"{base}/v1/reconcile", headers=auth(other), json={}) as resp:
                assert resp.status == 429, await resp.text()
                retry_after = int(resp.headers["Retry-After"])
                assert 1 <= retry_after <= INTERVAL_S
                assert (await resp.json())["error"]["code"] == "reconcile_too_soon"
            # The accepted one is reconciled by the worker: nothing drifted, nothing written.
            text = await scrape_until(
                worker_metrics,
                lambda t: sample(t, "projector_reconciles_total", [("outcome", "clean")]) >= 1,
                120,
                alive,
            )
            assert sample(text, "projector_reconciles_total", [("outcome", "corrected")]) == 1
            api_text = await scrape_until(
                f"{base}/metrics",
                lambda t: (
                    sample(
                        t,
                        "projector_api_reconcile_requests_total",
                        [("trigger", "request"), ("outcome", "limited")],
                    )
                    >= 1
                ),
                30,
                alive,
            )
            assert (
                sample(
                    api_text,
                    "projector_api_reconcile_requests_total",
                    [("trigger", "request"), ("outcome", "accepted")],
                )
                == 1
            )

            # Bad requests: clear 4xx, never 5xx, nothing asked.
            third = next(u for u in users if u not in (victim, other))
            async with http.post(f"{base}/v1/reconcile", headers=auth(third), data=b"not json") as resp:
                assert resp.status == 400
                assert "body must be empty" in (await resp.json())["error"]["message"]
            async with http.post(f"{base}/v1/reconcile", headers=auth(third), json={"user_id": 1}) as resp:
                assert resp.status == 400
                assert "no parameters" in (await resp.json())["error"]["message"]
            async with http.post(f"{base}/v1/reconcile?user_id=1", headers=auth(third)) as resp:
                assert resp.status == 400
                assert "unknown query parameter" in (await resp.json())["error"]["message"]
            async with http.post(f"{base}/v1/reconcile") as resp:
                assert resp.status == 401
            async with http.get(f"{base}/v1/reconcile", headers=auth(third)) as resp:
                assert resp.status == 405
            # None of them took the third user's slot.
            async with http.post(f"{base}/v1/reconcile", headers=auth(third)) as resp:
                assert resp.status == 202

        # Still exactly replay's, every user.
        rows, badges = await stack.projection(users)
        assert rows == expected["rows"] and badges == expected["badges"]
    finally:
        if api is not None:
            api.terminate()
            api.wait(timeout=30)
        await store.aclose()
    stack.stop_workers()
