"""The member directory on real Cassandra behind the real HTTP API (a TCP server in this
process) and the real client library: keyset pages, convergence, limits, access codes,
statistics, read receipts."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

import app.api.app as api_app
from app.api import Deps, create_app
from app.api import members as member_routes
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.members.cache import CacheKey, SqliteMemberCache
from app.members.directory import MemberDirectory
from app.members.model import MemberPage, PresentationResult
from app.members.server import MemberService
from app.members.source import HttpMemberSource, HttpProfileSource, MemberAccessDenied
from app.settings import Settings
from app.stores.cassandra_members import CassandraMemberReader
from app.stores.cassandra_messages import CassandraMessageStore, NewMessage
from app.stores.cassandra_profiles import CassandraProfileStore
from app.stores.cassandra_remarks import CassandraRemarkStore
from app.stores.cassandra_state import UserConversationStateWriter
from app.stores.memory_projection import InMemoryProjectionStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "m" * 40
CALLER = 5
PAGE = "/api/v1/chats/members/page"
BY_IDS = "/api/v1/chats/members/by-user-ids"


@pytest.fixture(scope="module")
def schema(servers: Settings, cassandra_session: Any) -> Iterator[str]:
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"t_members_{uuid.uuid4().hex[:12]}"
    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    yield keyspace
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


@dataclass
class Live:
    base_url: str
    http: aiohttp.ClientSession
    writer: UserConversationStateWriter
    reader: CassandraMemberReader
    messages: CassandraMessageStore

    def token(self, user_id: int = CALLER) -> str:
        return TokenSigner(SECRET).mint(user_id, 4_000_000_000)

    async def post(self, path: str, body: Any, user_id: int = CALLER) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": "Bearer " + self.token(user_id)}
        async with self.http.post(self.base_url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async def send(self, method: str, path: str, body: Any = None, user_id: int = CALLER) -> tuple[int, Any]:
        headers = {"Authorization": "Bearer " + self.token(user_id)}
        async with self.http.request(method, self.base_url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str, user_id: int = CALLER) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": "Bearer " + self.token(user_id)}
        async with self.http.get(self.base_url + path, headers=headers) as resp:
            return resp.status, await resp.json()

    def source(self, user_id: int = CALLER) -> HttpMemberSource:
        return HttpMemberSource(self.base_url, self.token(user_id), self.http)

    async def members(self, group: str, ids: list[int], *, role: str = "member") -> None:
        for user_id in ids:
            self.writer.stage_member(group, user_id, role, "active", 1, None)
        await self.writer.flush()


@pytest.fixture
async def live(schema: str, cassandra_session: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    if (member_routes.routes, member_routes.SCHEMAS) not in api_app.RESOURCES:
        monkeypatch.setattr(
            api_app, "RESOURCES", (*api_app.RESOURCES, (member_routes.routes, member_routes.SCHEMAS))
        )
    settings = Settings.build(api_secret=SECRET, api_fill_from_state="never", cassandra_keyspace=schema)
    reader = CassandraMemberReader(cassandra_session, schema)
    deps = Deps(
        projections=MemoryProjectionReader(InMemoryProjectionStore()),
        # A long statistics budget: these tests check what the real reads return, and a busy CI
        # JVM may take longer than the product's 2 s (the budget itself: unit-tested).
        extra={
            "members": MemberService(
                reader,
                stats_budget_s=30.0,
                profiles=CassandraProfileStore(cassandra_session, schema),
                remarks=CassandraRemarkStore(cassandra_session, schema),
                remarks_budget_s=30.0,
            )
        },
    )
    server = TestServer(create_app(settings, deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            yield Live(
                str(server.make_url("")).rstrip("/"),
                http,
                UserConversationStateWriter(cassandra_session, schema),
                reader,
                CassandraMessageStore(cassandra_session, schema),
            )
    finally:
        await server.close()


def new_group() -> str:
    return str(uuid.uuid4())


async def walk(live: Live, group: str, **options: Any) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    after = None
    while True:
        body: dict[str, Any] = {"chat_session_uid": group, **options}
        if after is not None:
            body["page_ref"] = after
        status, page = await live.post(PAGE, body)
        assert status == 200, page
        pages.append(page)
        if not page["has_more"]:
            return pages
        after = page["next_page_ref"]


async def test_500_members_in_10_pages_no_duplicates_no_other_group(live: Live) -> None:
    group, other = new_group(), new_group()
    ids = [CALLER, *(1000 + 2 * i for i in range(499)), 2**64 - 1]  # 501 with the largest u64
    ids.remove(2**64 - 1)
    await live.members(group, ids)
    await live.members(other, [1001 + 2 * i for i in range(300)])  # interleaved ids elsewhere
    pages = await walk(live, group)
    got = [int(item["user_id"]) for page in pages for item in page["items"]]  # u64s as strings
    assert len(pages) == 10 and all(len(p["items"]) == 50 for p in pages)
    assert got == sorted(ids) and len(set(got)) == 500
    assert pages[-1]["next_page_ref"] is None and pages[-1]["has_more"] is False
    # The opaque reference is bound to the caller and the group.
    ref = pages[0]["next_page_ref"]
    status, body = await live.post(PAGE, {"chat_session_uid": group, "page_ref": ref}, user_id=1000)
    assert status == 400 and "another account" in body["error"]["message"]
    status, body = await live.post(PAGE, {"chat_session_uid": other, "page_ref": ref})
    assert status in (400, 403), body


async def test_u64_ids_page_in_numeric_order(live: Live) -> None:
    group = new_group()
    ids = [CALLER, 2**63 - 1, 2**63, 2**64 - 1, 17]
    await live.members(group, ids)
    got = [i["user_id"] for p in await walk(live, group, limit=2) for i in p["items"]]
    assert got == [str(u) for u in sorted(ids)]  # exact decimal strings, numeric order


async def test_limit_101_is_400_and_non_member_is_2001_and_disabled_is_2002(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, 10, 11])
    status, body = await live.post(PAGE, {"chat_session_uid": group, "limit": 101})
    assert status == 400, body
    status, body = await live.post(PAGE, {"chat_session_uid": group}, user_id=999)
    assert (status, body["error"]["code"]) == (403, "2001")
    live.writer.stage_member(group, 11, "member", "left", 1, 3)
    await live.writer.flush()
    status, body = await live.post(PAGE, {"chat_session_uid": group}, user_id=11)
    assert (status, body["error"]["code"]) == (403, "2001")
    await live.reader.set_disabled(group, 1, "test")
    status, body = await live.post(PAGE, {"chat_session_uid": group})
    assert (status, body["error"]["code"]) == (403, "2002")
    await live.reader.clear_disabled(group)
    status, body = await live.post(PAGE, {"chat_session_uid": group, "active_only": True})
    assert status == 200 and [i["user_id"] for i in body["items"]] == [str(CALLER), "10"]


async def test_active_only_reads_past_many_departed_members(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, *range(100, 400)])
    for user_id in range(100, 380):  # a long run of departed members inside one page window
        live.writer.stage_member(group, user_id, "member", "removed", 1, 2)
    await live.writer.flush()
    pages = await walk(live, group, active_only=True, limit=10)
    got = [int(i["user_id"]) for p in pages for i in p["items"]]
    assert got == [CALLER, *range(380, 400)]


class PagesAfter:
    """A member source whose pages wait for an event (orders the cache before the server)."""

    def __init__(self, source: HttpMemberSource, go: asyncio.Event) -> None:
        self.source = source
        self.go = go

    async def page(self, group: str, page_ref: str | None, limit: int, active_only: bool) -> MemberPage:
        await self.go.wait()
        return await self.source.page(group, page_ref, limit, active_only)

    async def by_user_ids(
        self, group: str, user_ids: Sequence[int], include_stats: bool
    ) -> PresentationResult:
        return await self.source.by_user_ids(group, user_ids, include_stats)


async def test_client_traversal_converges_after_a_leave_and_a_role_change(live: Live, tmp_path: Path) -> None:
    group = new_group()
    ids = [CALLER, *(2000 + i for i in range(499))]
    await live.members(group, ids)
    key = CacheKey("it", str(CALLER), group)
    cache = SqliteMemberCache(tmp_path / "m.sqlite", b"k" * 32, clock_ms=lambda: 1_800_000_000_000)
    first = MemberDirectory(key, live.source(), cache)
    first.subscribe()
    await asyncio.wait_for(first.until(lambda d: d.fresh), 60)
    await first.settled()
    assert len(first.members) == 500 and first.counters.pages == 10
    assert first.counters.cache_writes == 1
    await first.aclose()

    leaver, promoted = ids[100], ids[200]
    live.writer.stage_member(group, leaver, "member", "left", 1, 50)
    live.writer.stage_member(group, promoted, "admin", "active", 1, None)
    await live.writer.flush()
    # The cached roster must be on screen before the server answers (otherwise it is dropped as
    # late, by design): the first page waits for it, so the removal is confirmed every time.
    cache_shown = asyncio.Event()
    second = MemberDirectory(key, PagesAfter(live.source(), cache_shown), cache)
    second.subscribe()
    await asyncio.wait_for(second.until(lambda d: d.counters.cache_hits == 1), 30)
    assert len(second.members) == 500 and not second.fresh
    cache_shown.set()
    await asyncio.wait_for(second.until(lambda d: d.fresh), 60)
    await second.settled()
    assert len(second.members) == 499 and leaver not in second.members
    assert second.members[promoted].role == "admin"
    assert second.counters.removals_confirmed == 1
    roster = await cache.load(key)
    assert roster is not None and len(roster.members) == 499
    await second.aclose()
    await cache.close()

    stranger = MemberDirectory(CacheKey("it", "999", group), live.source(999))
    stranger.subscribe()
    await asyncio.wait_for(stranger.until(lambda d: d.error is not None), 30)
    assert isinstance(stranger.error, MemberAccessDenied) and stranger.error.code == 2001
    await stranger.aclose()


async def test_by_user_ids_statistics_are_aggregated_at_query_time(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, 10, 11])
    live.writer.stage_member(group, 11, "member", "removed", 1, 9)
    # Stale precomputed counts the answer must not use (seed 004: "不采用持久化 extra 中可能过期的计数").
    live.writer.stage_member_stats(group, 10, 70, 20, mailbox_seq=500)
    await live.writer.flush()
    act = "0" * 31
    live.messages.put_messages(
        [
            NewMessage(group, 1, "m1", act + "1", 10, 1, True, frozenset()),
            NewMessage(group, 2, "m2", act + "2", 10, 2, True, frozenset({CALLER})),
            NewMessage(group, 3, "m3", act + "3", 10, 3, True, frozenset({10, CALLER})),  # @all
            NewMessage(group, 4, "m4", act + "4", CALLER, 4, True, frozenset({10})),
            NewMessage(group, 5, "m5", act + "5", 10, 5, True, frozenset({CALLER})),  # recalled
        ]
    )
    live.messages.mark_recalled(group, 5)
    body = {"chat_session_uid": group, "user_ids": [10, 11, 12, CALLER], "include_stats": True}
    status, answer = await live.post(BY_IDS, body)
    assert status == 200, answer
    items = {int(i["user_id"]): i for i in answer["items"]}
    assert (items[10]["record_count"], items[10]["mention_count"]) == (3, 2)
    assert (items[CALLER]["record_count"], items[CALLER]["mention_count"]) == (1, 2)
    assert (items[11]["record_count"], items[11]["mention_count"]) == (0, 0)  # a real zero
    assert items[11]["active"] is False and items[11]["state"] == "removed"
    assert answer["missing_user_ids"] == ["12"] and answer["stats_included"] is True


async def test_capabilities_from_group_settings_in_cassandra(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, 10])
    live.writer.stage_member(group, 10, "admin", "active", 1, None)
    await live.writer.flush()
    status, page = await live.post(PAGE, {"chat_session_uid": group}, user_id=10)
    assert status == 200 and page["self_role"] == "admin" and page["capabilities"]["remove_members"]
    await live.reader.set_group_settings(group, {"remove_members": "owner", "invite": "admin"}, 1)
    status, page = await live.post(PAGE, {"chat_session_uid": group}, user_id=10)
    assert page["capabilities"]["remove_members"] is False and page["capabilities"]["invite"] is True
    status, page = await live.post(PAGE, {"chat_session_uid": group})  # CALLER: a plain member
    assert page["capabilities"]["invite"] is False
    assert page["join_events"] == [
        {"event_ref": "join:1", "joined_at_conversation_seq": 1, "invitee_refs": [str(CALLER), "10"]}
    ]


async def test_readers_of_an_unknown_message_are_404(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, 20])
    status, body = await live.get(f"/api/v1/chats/{group}/messages/8/readers?basic_only=true")
    assert (status, body["error"]["code"]) == (404, "unknown_message")


async def test_readers_from_persisted_read_state(live: Live) -> None:
    group = new_group()
    await live.members(group, [CALLER, 20, 21, 22])
    live.messages.put_messages([NewMessage(group, 8, "m8", "0" * 31 + "8", 20, 1, True, frozenset())])
    for user_id, read in ((CALLER, 9), (21, 8), (22, 7)):
        live.writer.stage(user_id, group, {"read_seq": read})
    await live.writer.flush()
    status, body = await live.get(f"/api/v1/chats/{group}/messages/8/readers?basic_only=true")
    assert status == 200, body
    assert body["sender_id"] == "20"
    assert body["read_user_ids"] == [str(CALLER), "21"] and body["unread_user_ids"] == ["22"]


def test_profiles_load_cli_checks_the_whole_file_then_writes(
    schema: str, servers: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from app.cli import profiles as cli

    settings = servers.replace(cassandra_keyspace=schema)
    good = tmp_path / "profiles.jsonl"
    good.write_text(
        '{"user_id": "18446744073709551615", "display_name": "Zoë", "avatar_url": "https://cdn.example/z.png"}\n'
        "\n"
        '{"user_id": 31, "display_name": null, "avatar_url": null}\n',
        encoding="utf-8",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user_id": "32", "display_name": "A"}\n{"user_id": "x"}\n', encoding="utf-8")
    assert cli.run(settings, argparse.Namespace(action="load", file=str(bad))) == 2
    assert "line 2" in capsys.readouterr().err
    assert cli.run(settings, argparse.Namespace(action="load", file=str(good))) == 0
    assert "2 profile(s) written" in capsys.readouterr().out
    assert cli.run(settings, argparse.Namespace(action="show", user_ids=["18446744073709551615", "32"])) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {"user_id": "18446744073709551615", "display_name": "Zoë", "avatar_url": "https://cdn.example/z.png"},
        {"user_id": "32", "missing": True},  # the bad file wrote nothing
    ]


async def test_profiles_reach_the_member_store_through_the_api(
    live: Live, cassandra_session: Any, schema: str
) -> None:
    from app.stores.cassandra_profiles import ProfileRow

    group = new_group()
    await live.members(group, [CALLER, 40, 41])
    store = CassandraProfileStore(cassandra_session, schema)
    await store.put([ProfileRow(40, "Ada", "https://cdn.example/40.png"), ProfileRow(CALLER, "Me", None)], 1)
    status, body = await live.post("/api/v1/users/profiles", {"user_ids": ["40", "41", str(CALLER)]})
    assert status == 200, body
    assert body["items"] == [
        {"user_id": "40", "display_name": "Ada", "avatar_url": "https://cdn.example/40.png"},
        {"user_id": str(CALLER), "display_name": "Me", "avatar_url": None},
    ]
    assert body["missing_user_ids"] == ["41"]
    status, body = await live.post("/api/v1/users/profiles", {"user_ids": [str(u) for u in range(51)]})
    assert status == 400
    directory = MemberDirectory(
        CacheKey("it", str(CALLER), group),
        live.source(),
        profiles=HttpProfileSource(live.base_url, live.token(), live.http),
    )
    directory.subscribe()
    await asyncio.wait_for(directory.until(lambda d: d.fresh), 30)
    await directory.settled()
    assert directory.members[40].display_name == "Ada"
    assert directory.members[40].avatar_url == "https://cdn.example/40.png"
    assert directory.members[41].profile_failed and directory.members[41].display_name is None
    await directory.aclose()


async def test_remarks_per_viewer_through_the_api_on_cassandra(live: Live) -> None:
    """PUT/DELETE /api/v1/users/{id}/remark write member_remarks; each caller's by-user-ids
    carries that caller's remarks only (null where it has none), ids past 2^53 exact."""
    group = new_group()
    big = 2**64 - 2
    other = 6
    await live.members(group, [CALLER, other, big])
    status, answer = await live.send("PUT", f"/api/v1/users/{big}/remark", {"remark": "Big one "})
    assert (status, answer) == (200, {"user_id": str(big), "remark": "Big one"})
    assert (await live.send("PUT", f"/api/v1/users/{big}/remark", {"remark": "theirs"}, other))[0] == 200
    status, refused = await live.send("PUT", f"/api/v1/users/{big}/remark", {"remark": "x" * 65})
    assert status == 400 and refused["error"]["code"] == "invalid_remark"

    body = {"chat_session_uid": group, "user_ids": [str(u) for u in (CALLER, other, big)]}
    for viewer, expected in ((CALLER, "Big one"), (other, "theirs")):
        status, presented = await live.post(BY_IDS, body, user_id=viewer)
        assert status == 200 and presented["remarks_included"] is True
        assert {i["user_id"]: i["remark"] for i in presented["items"]} == {
            str(CALLER): None,
            str(other): None,
            str(big): expected,
        }
    assert (await live.send("DELETE", f"/api/v1/users/{big}/remark"))[0] == 200
    status, presented = await live.post(BY_IDS, body)
    assert [i["remark"] for i in presented["items"]] == [None, None, None]
    status, presented = await live.post(BY_IDS, body, user_id=other)
    assert {i["user_id"]: i["remark"] for i in presented["items"]}[str(big)] == "theirs"
