"""The query API over what the real worker wrote (simulate -> Kafka -> worker -> Redis/Cassandra),
against `projector replay` of the same stream: every user's pages and badge; the SDK's live list
fed by the worker's own SESSION_DELTA/BADGE_UPDATE frames; and, with the projection deleted, the
rows filled from the worker's UserConversationState mirror."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as redis
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import CassandraStateFiller, RedisProjectionReader
from app.domain.client import sort_rows
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.kafka import SessionDeltaFollower
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, read_jsonl
from tests.support.api import SECRET, token
from tests.support.rows import listed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


class Api:
    def __init__(self, settings: Settings, fill: str) -> None:
        self.settings = settings.replace(api_secret=SECRET, api_fill_from_state=fill)
        self.client = redis.Redis.from_url(self.settings.redis.redis_url)
        self.store = RedisProjectionStore(self.client, self.settings.redis.projection_namespace)
        self.cluster: Any = None
        self.server: TestServer | None = None

    async def start(self) -> str:
        state = None
        if self.settings.api.api_fill_from_state != "never":
            from app.stores.cassandra_messages import CassandraMessageStore
            from app.stores.cassandra_session import open_cluster
            from app.stores.cassandra_state import UserConversationStateWriter

            self.cluster, session = open_cluster(self.settings.cassandra)
            ks = self.settings.cassandra.cassandra_keyspace
            state = CassandraStateFiller(
                UserConversationStateWriter(session, ks), CassandraMessageStore(session, ks), 200
            )
        app = create_app(self.settings, Deps(projections=RedisProjectionReader(self.store), state=state))
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return str(self.server.make_url(""))

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
        await self.client.aclose()
        if self.cluster is not None:
            self.cluster.shutdown()


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    return make_stack("apiw")


async def test_pages_badges_live_frames_and_fill_from_state_equal_replay(
    stack: Stack, tmp_path: Path
) -> None:
    stream = tmp_path / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "30", "--conversations", "14", "--group-size", "20", "--messages", "500"),
        *("--rate", "0", "--lanes", "2", "--seed", "23", "--out", str(stream), "--progress", "never"),
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    rows = read_jsonl(out / "projections.jsonl")
    badges = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert rows and stats["dead_letters"] == 0 and stats["pending"] == 0
    # Structure happened: the list has pins, archives and deleted rows to get right.
    assert any(r["pin_rank"] is not None for r in rows) and any(r["archived"] for r in rows)
    busiest = max(badges, key=lambda u: sum(r["user_id"] == u for r in rows))

    api = Api(stack.settings, fill="never")
    base = await api.start()
    try:
        # The SDK follows the worker's frames from before the worker starts.
        sdk = SessionsClient(base, token(busiest))
        live = LiveSessionList(sdk, busiest, limit=7)
        topics = [stack.settings.topics.topic_session_delta, stack.settings.topics.topic_badge]
        async with sdk, SessionDeltaFollower(live, stack.settings.kafka.kafka_bootstrap, topics) as follower:
            assert live.view.version == 0 and live.main() == []
            stack.start_worker()
            versions = {u: b["projection_mailbox_seq"] for u, b in badges.items()}
            await stack.wait_for_versions(versions, timeout=300, alive=stack.alive())
            deadline = time.monotonic() + 60

            def behind() -> bool:  # deltas and badges come on two topics: wait for both
                held = live.view.badge
                return (
                    live.view.version < versions[busiest] or held is None or held.version < versions[busiest]
                )

            while behind():
                assert time.monotonic() < deadline, (
                    f"frames stopped at {live.view.version}, {live.view.badge}"
                )
                await follower.poll(timeout_ms=200)
            assert follower.applied > 0
            fresh_main = await sdk.walk("main", 7)
            fresh_archived = await sdk.walk("archived", 7)
            assert [dict(r) for r in live.main()] == fresh_main.rows
            assert [dict(r) for r in live.archived()] == fresh_archived.rows
            badge = live.view.badge
            assert badge is not None and badge.total_unread == badges[busiest]["total_unread"]
        stack.stop_workers()

        for user_id, expected_badge in badges.items():
            async with SessionsClient(base, token(user_id)) as client:
                for limit in (3, 50):
                    main = await client.walk("main", limit, max_restarts=0)
                    archived = await client.walk("archived", limit, max_restarts=0)
                    assert main.rows == listed(rows, user_id, archived=False), (user_id, limit)
                    assert archived.rows == listed(rows, user_id, archived=True), (user_id, limit)
                assert await client.badge() == {k: v for k, v in expected_badge.items() if k != "user_id"}
    finally:
        await api.close()

    # The projection is lost: the API rebuilds the rows from UserConversationState + MessageStore.
    lost = Api(stack.settings, fill="empty")
    assert await lost.store.delete_all() == len(badges)
    base = await lost.start()
    # State keeps the last *state* change, not the row's last entry: projection_mailbox_seq is
    # unknowable (app/domain/rebuild.py says so).
    unknowable = {"projection_mailbox_seq"}
    head = ("last_activity_id", "latest_conversation_seq", "last_message_id")
    joined_at_head = 0
    try:
        for user_id in badges:
            async with SessionsClient(base, token(user_id)) as client:
                main = await client.walk("main", 50, max_restarts=0)
                archived = await client.walk("archived", 50, max_restarts=0)
                first = await client.page("main", 1)
            assert first.filled_from_state is bool(main.rows or archived.rows)
            for got_rows, archived_flag in ((main.rows, False), (archived.rows, True)):
                assert got_rows == [dict(r) for r in sort_rows(got_rows)]  # served in list order
                got = {r["conversation_id"]: r for r in got_rows}
                want = {r["conversation_id"]: r for r in listed(rows, user_id, archived_flag)}
                assert got.keys() == want.keys(), user_id
                for cid, w in want.items():
                    g = {k: v for k, v in got[cid].items() if k not in unknowable}
                    w = {k: v for k, v in w.items() if k not in unknowable}
                    if w["latest_conversation_seq"] is None and g["latest_conversation_seq"] is not None:
                        # Known gap of row_from_state (reported): a member who joined at the
                        # conversation's head and received nothing since has no head in the
                        # projection, but state cannot tell "received nothing" from "received
                        # up to joined_at", so the rebuilt row takes the conversation head.
                        assert g["latest_conversation_seq"] <= w["joined_at_conversation_seq"], (g, w)
                        joined_at_head += 1
                        g = {k: v for k, v in g.items() if k not in head}
                        w = {k: v for k, v in w.items() if k not in head}
                    assert g == w, orjson.dumps(w).decode()
    finally:
        await lost.close()
    assert joined_at_head < len(rows) // 4  # the gap is the exception, not the rule
