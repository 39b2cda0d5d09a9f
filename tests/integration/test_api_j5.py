"""J-5 (seed 000 §9) on the real servers: the query API over TCP on a private Redis namespace, the
SDK walking it, SESSION_DELTA frames through a real Kafka topic, the Cassandra fill-in."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as redis
from aiohttp.test_utils import TestServer
from aiokafka import AIOKafkaProducer

from app.api import Deps, create_app
from app.api.sources import CassandraStateFiller, RedisProjectionReader
from app.api.tokens import TokenSigner
from app.domain.flush import UserFlush
from app.domain.listing import Folder
from app.domain.rebuild import Head, row_from_state
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.client import Page
from app.sdk.kafka import SessionDeltaFollower
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.support.api import SECRET
from tests.support.rows import cid, expected_order, flush, make_row, mixed_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ME = 4242
CONVERSATIONS = 5000
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    settings: Settings
    store: RedisProjectionStore
    base_url: str
    http: aiohttp.ClientSession

    def client(self, user_id: int = ME) -> SessionsClient:
        token = TokenSigner(SECRET).mint(user_id, int(time.time()) + 600)
        return SessionsClient(self.base_url, token, session=self.http)


@pytest.fixture
async def env(servers: Settings, unique_name: Callable[..., str]) -> AsyncIterator[Env]:
    settings = servers.replace(
        api_secret=SECRET,
        api_fill_from_state="never",
        projection_namespace=unique_name("api"),
        api_rate_limit_per_s=0,  # thousands of one-row pages at full speed: J-5, not the limit
    )
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, settings.redis.projection_namespace)
    app = create_app(settings, Deps(projections=RedisProjectionReader(store)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            yield Env(settings, store, str(server.make_url("")), http)
    finally:
        await server.close()
        await store.delete_all()
        await client.aclose()


async def write_in_batches(
    store: RedisProjectionStore, rows: list[dict[str, Any]], structure_version: int
) -> int:
    """5,000 rows as five flushes of 1,000 (versions 1..5), as a worker would have written them."""
    version = 0
    for start in range(0, len(rows), 1000):
        version += 1
        assert await store.write([flush(ME, rows[start : start + 1000], version, structure_version)]) == [
            version - 1
        ]
    return version


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["conversation_id"]) for r in rows]


# --------------------------------------------------------------------------------------------


async def test_j5_every_page_walk_of_5000_conversations_is_complete_and_ordered(env: Env) -> None:
    rows = mixed_rows(ME, CONVERSATIONS, seed=55)
    assert sum(r["pin_rank"] is not None for r in rows) > 50 and sum(r["archived"] for r in rows) > 200
    assert sum(not r["listed"] for r in rows) > 100 and sum(r["last_activity_id"] is None for r in rows) > 50
    await write_in_batches(env.store, rows, structure_version=7)
    async with env.client() as client:
        for limit in (1, 7, 50, 100):
            for folder in Folder:
                pages = [p async for p in client.pages(folder.value, limit, max_restarts=0)]
                got = [item for page in pages for item in page.items]
                assert ids(got) == expected_order(rows, folder), (limit, folder)
                assert len(set(ids(got))) == len(got)  # exactly once
                assert {p.snapshot_revision for p in pages} == {1}  # one revision for every walk
                assert all(len(p.items) == limit for p in pages[:-1])
                assert all(p.projection_complete and p.projection_mailbox_seq == 5 for p in pages)


class Hooked(SessionsClient):
    """Runs `hook` once, right after the n-th page request of a walk: a change mid-walk."""

    def __init__(self, base: SessionsClient, after: int, hook: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            base.base_url, base._headers["Authorization"].removeprefix("Bearer "), session=base._session
        )
        self.after = after
        self.hook: Callable[[], Awaitable[None]] | None = hook
        self.requests = 0
        self.seen: list[Page] = []

    async def page(self, folder: str = "main", limit: int = 50, cursor: str | None = None) -> Page:
        result = await super().page(folder, limit, cursor)
        self.seen.append(result)
        self.requests += 1
        if self.requests == self.after and self.hook is not None:
            hook, self.hook = self.hook, None
            await hook()
        return result


async def test_j5_pin_mid_walk_restarts_on_a_new_revision_and_ends_correct(env: Env) -> None:
    rows = mixed_rows(ME, CONVERSATIONS, seed=56)
    version = await write_in_batches(env.store, rows, structure_version=7)
    target = next(r for r in reversed(rows) if r["listed"] and not r["archived"] and r["pin_rank"] is None)
    pinned = {**target, "pin_rank": 0, "pinned": True, "projection_mailbox_seq": version + 1}

    async def pin() -> None:  # the worker's flush of a `pin` entry: structure_version moves
        assert await env.store.write([flush(ME, [pinned], version + 1, structure_version=8)]) == [version]

    hooked = Hooked(env.client(), after=3, hook=pin)
    walk = await hooked.walk("main", limit=50)
    after = [pinned if r["conversation_id"] == target["conversation_id"] else r for r in rows]
    assert ids(walk.rows) == expected_order(after, Folder.MAIN)
    assert walk.restarts == 1 and walk.snapshot_revision == 2 and walk.projection_mailbox_seq == version + 1
    restarted = hooked.seen[3]  # the request right after the pin
    assert restarted.projection_complete is False and restarted.snapshot_revision == 2
    assert ids(restarted.items) == expected_order(after, Folder.MAIN)[:50]  # the first page of the new order
    assert target["conversation_id"] in ids(restarted.items)
    assert [p.snapshot_revision for p in hooked.seen] == [1, 1, 1] + [2] * (len(hooked.seen) - 3)


async def test_j5_new_message_mid_walk_keeps_the_revision_and_the_delta_merge_matches_a_fresh_walk(
    env: Env, make_topic: Callable[..., Awaitable[str]]
) -> None:
    topic = await make_topic("session-delta", partitions=2)
    rows = mixed_rows(ME, CONVERSATIONS, seed=57)
    version = await write_in_batches(env.store, rows, structure_version=7)
    # A message in a conversation near the end of the list: it jumps to the top of its zone.
    target = next(r for r in reversed(rows) if r["listed"] and not r["archived"] and r["pin_rank"] is None)
    bumped = {
        **target,
        "last_activity_id": "f" * 32,
        "latest_conversation_seq": 11,
        "last_message_id": "m-new",
        "unread_count": 1,
        "projection_mailbox_seq": version + 1,
    }
    batch = UserFlush(
        user_id=ME,
        rows=[bumped],
        badge=flush(ME, [], 1, 0).badge,
        projection_mailbox_seq=version + 1,
        prev_projection_mailbox_seq=version,
        structure_version=7,  # a message is not structural
        driving_event_id="e-new",
        driving_mailbox_seq=version + 1,
    )
    producer = AIOKafkaProducer(bootstrap_servers=env.settings.kafka.kafka_bootstrap)
    await producer.start()
    try:

        async def new_message() -> None:  # the worker: store first, then the frame
            assert await env.store.write([batch]) == [version]
            # Garbage on the topic first: the follower drops it and goes on.
            await producer.send_and_wait(topic, b"not json", key=str(ME).encode())
            bad = {"type": "SESSION_DELTA", "user_id": ME, "projection_mailbox_seq": "x"}
            await producer.send_and_wait(topic, orjson.dumps(bad), key=str(ME).encode())
            await producer.send_and_wait(topic, orjson.dumps(batch.session_delta()), key=str(ME).encode())

        hooked = Hooked(env.client(), after=4, hook=new_message)
        live = LiveSessionList(hooked, ME, limit=50, max_restarts=0)  # max_restarts=0: no restart allowed
        async with SessionDeltaFollower(live, env.settings.kafka.kafka_bootstrap, [topic]) as follower:
            # start() pulled the list (the message landed mid-walk of the main folder); the frame
            # is on the topic. The main walk kept its revision and was never restarted; the
            # archived walk, a new walk after the change, got a new snapshot.
            end_of_main = next(i for i, p in enumerate(hooked.seen) if p.next_cursor is None)
            main_pages, archived_pages = hooked.seen[: end_of_main + 1], hooked.seen[end_of_main + 1 :]
            assert len(main_pages) > 4 and {p.snapshot_revision for p in main_pages} == {1}
            assert {p.snapshot_revision for p in archived_pages} == {2}
            assert all(p.projection_complete for p in hooked.seen)
            assert target["conversation_id"] in ids([i for p in main_pages[4:] for i in p.items])  # old place
            assert live.view.version == version  # the lower of the two walks' versions
            deadline = time.monotonic() + 30
            while follower.applied == 0:
                assert time.monotonic() < deadline, "the frame never arrived"
                await follower.poll(timeout_ms=200)
            assert live.view.version == version + 1 and live.syncs == 1
            assert follower.malformed == 2
    finally:
        await producer.stop()
    async with env.client() as fresh:
        main = await fresh.walk("main", 100)
        archived = await fresh.walk("archived", 100)
    assert main.snapshot_revision == 2
    assert [dict(r) for r in live.main()] == main.rows
    assert [dict(r) for r in live.archived()] == archived.rows
    assert (
        main.rows[0]["conversation_id"] == target["conversation_id"] or main.rows[0]["pin_rank"] is not None
    )


async def test_archived_only_in_its_folder_deleted_absent_until_revived(env: Env) -> None:
    rows = [make_row(ME, n, act=n) for n in range(1, 6)]
    rows[1] = make_row(ME, 2, act=2, archived=True)
    rows[2] = make_row(ME, 3, act=3, listed=False)  # deleted
    await env.store.write([flush(ME, rows, 1, 1)])
    async with env.client() as client:
        assert ids((await client.walk("main")).rows) == [cid(5), cid(4), cid(1)]
        assert ids((await client.walk("archived")).rows) == [cid(2)]
        revived = make_row(ME, 3, act=9, version=2)  # a newer message revives it (not structural)
        await env.store.write([flush(ME, [revived], 2, 1)])
        assert ids((await client.walk("main")).rows) == [cid(3), cid(5), cid(4), cid(1)]
        unarchived = make_row(ME, 2, act=2, version=3)
        await env.store.write([flush(ME, [unarchived], 3, 2)])
        assert ids((await client.walk("main")).rows) == [cid(3), cid(5), cid(4), cid(2), cid(1)]
        assert (await client.walk("archived")).rows == []


async def test_auth_and_bad_input_on_the_real_server(env: Env) -> None:
    await env.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 4)], 1, 1)])
    token = TokenSigner(SECRET).mint(ME, int(time.time()) + 60)
    expired = TokenSigner(SECRET).mint(ME, int(time.time()) - 1)
    cases: list[tuple[str, dict[str, str], int]] = [
        ("/v1/sessions", {}, 401),
        ("/v1/sessions", {"Authorization": f"Bearer {expired}"}, 401),
        ("/v1/sessions", {"Authorization": f"Bearer {token}x"}, 401),
        ("/v1/badge", {"Authorization": "Token abc"}, 401),
        ("/v1/sessions?limit=500", {"Authorization": f"Bearer {token}"}, 400),
        ("/v1/sessions?folder=spam", {"Authorization": f"Bearer {token}"}, 400),
        ("/v1/sessions?cursor=Zm9v", {"Authorization": f"Bearer {token}"}, 400),
        ("/v1/sessions?limit=2", {"Authorization": f"Bearer {token}"}, 200),
        ("/v1/badge", {"Authorization": f"Bearer {token}"}, 200),
    ]
    for path, headers, status in cases:
        async with env.http.get(env.base_url.rstrip("/") + path, headers=headers) as resp:
            body = await resp.json()
            assert resp.status == status, (path, headers, body)
            if status != 200:
                assert body["error"]["message"]
    # Another user's cursor.
    async with env.client(ME) as mine, env.client(ME + 1) as theirs:
        cursor = (await mine.page(limit=1)).next_cursor
        async with env.http.get(
            env.base_url.rstrip("/") + "/v1/sessions",
            params={"cursor": cursor or ""},
            headers={"Authorization": theirs._headers["Authorization"]},
        ) as resp:
            assert resp.status == 400 and "another user" in (await resp.json())["error"]["message"]


# -- fill from Cassandra -----------------------------------------------------------------------


@pytest.fixture
def schema(servers: Settings, cassandra_session: Any) -> Iterator[str]:
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"t_api_{uuid.uuid4().hex[:12]}"
    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    yield keyspace
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


async def test_rows_missing_from_the_projection_are_filled_from_state(
    servers: Settings, cassandra_session: Any, schema: str, unique_name: Callable[..., str]
) -> None:
    from app.stores.cassandra_messages import CassandraMessageStore, ConversationHead, NewMessage
    from app.stores.cassandra_state import UserConversationStateWriter

    messages = CassandraMessageStore(cassandra_session, schema)
    state = UserConversationStateWriter(cassandra_session, schema)
    conversations = [str(uuid.uuid4()) for _ in range(6)]
    for i, conversation in enumerate(conversations):
        seqs = range(1, 4 + i)
        messages.put_messages(
            NewMessage(conversation, s, f"m{i}-{s}", f"{i:02x}{s:030x}", sender_id=99, created_at=s)
            for s in seqs
        )
        messages.update_heads(
            [ConversationHead(conversation, seqs[-1], f"m{i}-{seqs[-1]}", f"{i:02x}{seqs[-1]:030x}")]
        )
        fields: dict[str, Any] = {"membership": "active", "read_seq": 1, "updated_mailbox_seq": 10 + i}
        if i == 1:
            fields["pin_rank"] = 2
        if i == 2:
            fields["archived"] = True
        if i == 3:
            fields["deleted_before"] = 3 + i  # deleted at its head: not listed
        state.stage(ME, conversation, fields)
    state.flush_sync()

    settings = servers.replace(
        api_secret=SECRET, api_fill_from_state="empty", projection_namespace=unique_name("api")
    )
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, settings.redis.projection_namespace)
    filler = CassandraStateFiller(state, messages, settings.processing.unread_precise_limit)
    app = create_app(settings, Deps(projections=RedisProjectionReader(store), state=filler))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        token = TokenSigner(SECRET).mint(ME, int(time.time()) + 60)
        async with SessionsClient(str(server.make_url("")), token) as api:
            first = await api.page("main", limit=100)
            archived = await api.page("archived", limit=100)
    finally:
        await server.close()
        await store.delete_all()
        await client.aclose()
    assert first.filled_from_state is True
    want = []
    for s in state.load_user(ME):
        head = messages.heads([s["conversation_id"]])[s["conversation_id"]]
        row = row_from_state(
            ME,
            s["conversation_id"],
            s,
            Head(head.latest_conversation_seq, head.last_message_id, head.last_activity_id),
            messages,
        ).as_row()
        want.append(row)
    assert first.items == expected_rows(want, Folder.MAIN)
    assert archived.items == expected_rows(want, Folder.ARCHIVED)
    assert len(first.items) == 4 and first.items[0]["conversation_id"] == conversations[1]  # pinned first
    assert first.items[1]["unread_count"] == 3 + 5 - 1  # unread by the core's rules (read_seq 1)


def expected_rows(rows: list[dict[str, Any]], folder: Folder) -> list[dict[str, Any]]:
    order = expected_order(rows, folder)
    by_id = {r["conversation_id"]: r for r in rows}
    return [by_id[c] for c in order]


# -- the commands --------------------------------------------------------------------------------


async def test_projector_api_and_token_commands(env: Env, schema: str) -> None:
    await env.store.write([flush(ME, [make_row(ME, 1, act=1)], 1, 1)])
    run_env = {
        **os.environ,
        **env.settings.as_env(),
        "PROJECTOR_CASSANDRA_KEYSPACE": schema,  # bootstrapped: the member directory needs its tables
        "PROJECTOR_API_FILL_FROM_STATE": "never",
        "PROJECTOR_LOG_LEVEL": "WARNING",
        # Pages and badge only: the live stream (its own tests) would need the frame topics.
        "PROJECTOR_GATEWAY_ENABLED": "false",
    }
    token = subprocess.run(
        [sys.executable, "-m", "app", "token", str(ME), "--ttl", "3600"],
        cwd=ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "api", "--port", "0"],
        cwd=ROOT,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=60)
        match = re.search(r"http://[0-9.]+:\d+", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        async with SessionsClient(match[0], token) as api:
            page = await api.page()
            assert ids(page.items) == [cid(1)]
            assert (await api.badge())["projection_mailbox_seq"] == 1
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    no_secret = {k: v for k, v in run_env.items() if k != "PROJECTOR_API_SECRET"}
    refused = subprocess.run(
        [sys.executable, "-m", "app", "api"],
        cwd=ROOT,
        env=no_secret,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "PROJECTOR_API_SECRET" in refused.stderr
