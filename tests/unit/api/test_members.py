"""Member routes over HTTP on the in-memory reader: keyset pages, access codes, presentation with
the statistics budget, read receipts; and the client's HTTP source against the same server."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

import app.api.app as api_app
from app.api import Deps, create_app
from app.api import members as member_routes
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.members.cache import CacheKey
from app.members.directory import MemberDirectory
from app.members.model import BaseMember, MemberPage
from app.members.remarks import REMARK_MAX_CHARS, InMemoryRemarkStore
from app.members.server import InMemoryMemberReader, MemberService
from app.members.source import HttpMemberSource, MemberAccessDenied, MemberRequestError
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore

SECRET = "k" * 40
SETTINGS = Settings.build(api_secret=SECRET, api_fill_from_state="never")
T0 = 1_800_000_000_000
G1 = str(uuid.UUID(int=1))
G2 = str(uuid.UUID(int=2))
ME = 7
PAGE = "/api/v1/chats/members/page"
BY_IDS = "/api/v1/chats/members/by-user-ids"


@dataclass
class Api:
    client: TestClient[Any, Any]
    reader: InMemoryMemberReader
    service: MemberService
    remarks: InMemoryRemarkStore

    def auth(self, user_id: int = ME) -> dict[str, str]:
        return {"Authorization": "Bearer " + TokenSigner(SECRET).mint(user_id, T0 // 1000 + 3600)}

    async def post(self, path: str, body: Any, user_id: int = ME) -> tuple[int, dict[str, Any]]:
        async with self.client.post(path, json=body, headers=self.auth(user_id)) as resp:
            return resp.status, await resp.json()

    async def send(
        self, method: str, path: str, body: Any = None, user_id: int = ME, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        async with self.client.request(method, path, json=body, headers=self.auth(user_id), **kwargs) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str, user_id: int = ME) -> tuple[int, dict[str, Any]]:
        async with self.client.get(path, headers=self.auth(user_id)) as resp:
            return resp.status, await resp.json()


def roster(reader: InMemoryMemberReader, group: str, n: int, first: int = 1000) -> list[int]:
    ids = [first + 3 * i for i in range(n)]
    for user_id in ids:
        reader.put(group, BaseMember(user_id, "member", "active", 1, None))
    return ids


@pytest.fixture
async def api(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    if (member_routes.routes, member_routes.SCHEMAS) not in api_app.RESOURCES:
        # Until app.py lists the member resource itself (see the report), register it here.
        monkeypatch.setattr(
            api_app, "RESOURCES", (*api_app.RESOURCES, (member_routes.routes, member_routes.SCHEMAS))
        )
    reader = InMemoryMemberReader()
    reader.put(G1, BaseMember(ME, "admin", "active", 1, None))
    remarks = InMemoryRemarkStore()
    service = MemberService(reader, stats_budget_s=0.2, remarks=remarks, remarks_budget_s=0.2)
    deps = Deps(
        projections=MemoryProjectionReader(InMemoryProjectionStore()),
        clock_ms=lambda: T0,
        extra={"members": service},
    )
    async with TestClient(TestServer(create_app(SETTINGS, deps))) as client:
        yield Api(client, reader, service, remarks)


async def walk(api: Api, group: str, **options: Any) -> list[dict[str, Any]]:
    pages = []
    after = None
    while True:
        body = {"chat_session_uid": group, **options}
        if after is not None:
            body["page_ref"] = after
        status, page = await api.post(PAGE, body)
        assert status == 200, page
        pages.append(page)
        if not page["has_more"]:
            return pages
        after = page["next_page_ref"]


async def test_500_members_page_in_10_pages_without_duplicates_or_other_groups(api: Api) -> None:
    ids = roster(api.reader, G1, 499)
    roster(api.reader, G2, 300, first=1001)  # interleaved ids in another group
    pages = await walk(api, G1)
    assert len(pages) == 10
    got = [int(item["user_id"]) for page in pages for item in page["items"]]
    assert got == sorted([*ids, ME]) and len(set(got)) == 500
    # u64 ids go out as decimal strings (docs/contract.md §9); the page reference is opaque: it
    # names no user id a client could read or edit.
    assert all(isinstance(item["user_id"], str) for page in pages for item in page["items"])
    assert all(isinstance(page["next_page_ref"], str) for page in pages[:-1])
    for page in pages[:-1]:
        assert page["items"][-1]["user_id"] not in page["next_page_ref"]
    assert all(page["self_role"] == "admin" for page in pages)
    assert pages[-1]["next_page_ref"] is None and "next_user_id" not in pages[-1]


async def test_active_only_skips_departed_members(api: Api) -> None:
    ids = roster(api.reader, G1, 120)
    for user_id in ids[::2]:
        api.reader.put(G1, BaseMember(user_id, "member", "left", 1, 5))
    everyone = [i["user_id"] for p in await walk(api, G1, limit=7) for i in p["items"]]
    active = [i["user_id"] for p in await walk(api, G1, limit=7, active_only=True) for i in p["items"]]
    assert len(everyone) == 121 and active == [str(u) for u in sorted([ME, *ids[1::2]])]


@pytest.mark.parametrize(
    "body",
    [
        {"chat_session_uid": G1, "limit": 101},
        {"chat_session_uid": G1, "limit": 0},
        {"chat_session_uid": G1, "limit": True},
        {"chat_session_uid": G1, "limit": "50"},
        {"chat_session_uid": "not-a-uuid"},
        {"chat_session_uid": G1, "after_user_id": 5},  # replaced by the opaque page_ref
        {"chat_session_uid": G1, "page_ref": 5},
        {"chat_session_uid": G1, "page_ref": ""},
        {"chat_session_uid": G1, "page_ref": "not-a-reference"},
        {"chat_session_uid": G1, "active_only": "yes"},
        {"chat_session_uid": G1, "cursor": "x"},
        {},
        [],
    ],
)
async def test_bad_page_requests_are_400(api: Api, body: Any) -> None:
    status, answer = await api.post(PAGE, body)
    assert status == 400, answer


async def test_access_is_checked_on_every_page(api: Api) -> None:
    roster(api.reader, G1, 120)
    status, first = await api.post(PAGE, {"chat_session_uid": G1})
    assert status == 200
    status, body = await api.post(PAGE, {"chat_session_uid": G1}, user_id=99_999)  # never a member
    assert (status, body["error"]["code"]) == (403, "2001")
    api.reader.put(G1, BaseMember(ME, "admin", "removed", 1, 9))  # removed between two pages
    status, body = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": first["next_page_ref"]})
    assert (status, body["error"]["code"]) == (403, "2001")
    api.reader.put(G1, BaseMember(ME, "admin", "active", 1, None))
    api.reader.disabled_ids.add(G1)
    status, body = await api.post(PAGE, {"chat_session_uid": G1})
    assert (status, body["error"]["code"]) == (403, "2002")


async def test_by_user_ids_marks_inactive_and_missing_and_adds_stats(api: Api) -> None:
    ids = roster(api.reader, G1, 3)
    api.reader.put(G1, BaseMember(ids[2], "member", "left", 1, 9))
    api.reader.stats_by_member[(G1, ids[0])] = (12, 3)
    body = {"chat_session_uid": G1, "user_ids": [ids[0], ids[2], 424242], "include_stats": True}
    status, answer = await api.post(BY_IDS, body)
    assert status == 200, answer
    items = {int(item["user_id"]): item for item in answer["items"]}
    assert answer["missing_user_ids"] == ["424242"] and answer["stats_included"] is True
    assert (items[ids[0]]["record_count"], items[ids[0]]["mention_count"]) == (12, 3)
    assert items[ids[2]]["active"] is False and items[ids[2]]["state"] == "left"
    assert (items[ids[2]]["record_count"], items[ids[2]]["mention_count"]) == (0, 0)  # known zero
    status, plain = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": [ids[0]]})
    assert status == 200 and "record_count" not in plain["items"][0] and plain["stats_included"] is False


@pytest.mark.parametrize("failure", ["late", "error"])
async def test_late_or_failed_stats_drop_both_fields_but_keep_identities(api: Api, failure: str) -> None:
    ids = roster(api.reader, G1, 2)
    api.reader.stats_by_member[(G1, ids[0])] = (12, 3)
    if failure == "late":
        api.reader.stats_delay_s = 600.0  # budget is 0.2 s in this fixture: never a race
    else:
        api.reader.stats_error = RuntimeError("cassandra timed out")
    status, answer = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": ids, "include_stats": True})
    assert status == 200 and answer["stats_included"] is False
    assert [item["user_id"] for item in answer["items"]] == [str(u) for u in ids]
    assert all("record_count" not in i and "mention_count" not in i for i in answer["items"])


async def test_a_cancelled_presentation_is_cancelled_not_a_success() -> None:
    reader = InMemoryMemberReader(stats_delay_s=3600.0)
    reader.put(G1, BaseMember(ME, "member", "active", 1, None))
    service = MemberService(reader, stats_budget_s=600.0)  # cancelled long before either
    task = asyncio.ensure_future(service.present(G1, ME, [ME], True))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("ids", [[], list(range(51)), "1,2", [True], [-5]])
async def test_by_user_ids_bounds(api: Api, ids: Any) -> None:
    status, _ = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": ids})
    assert status == 400


async def test_by_user_ids_needs_access(api: Api) -> None:
    status, body = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": [ME]}, user_id=5)
    assert (status, body["error"]["code"]) == (403, "2001")


async def test_readers_split_active_members_by_read_state(api: Api) -> None:
    a, b, c, late, left = roster(api.reader, G1, 5)
    api.reader.put(G1, BaseMember(late, "member", "active", 20, None))  # joined after seq 10
    api.reader.put(G1, BaseMember(left, "member", "left", 1, 9))
    api.reader.senders[(G1, 10)] = a
    api.reader.read_by_member.update({(G1, b): 10, (G1, c): 9, (G1, ME): 12})
    status, basic = await api.get(f"/api/v1/chats/{G1}/messages/10/readers?basic_only=true")
    assert status == 200, basic
    assert basic["read_user_ids"] == [str(ME), str(b)] and basic["unread_user_ids"] == [str(c)]
    assert basic["sender_id"] == str(a) and basic["basic_only"] is True and "read" not in basic
    status, full = await api.get(f"/api/v1/chats/{G1}/messages/10/readers")
    assert status == 200
    assert full["unread"] == [{"user_id": str(c), "role": "member", "read_conversation_seq": 9}]
    status, _ = await api.get(f"/api/v1/chats/{G1}/messages/0/readers")
    assert status == 400
    status, _ = await api.get(f"/api/v1/chats/{G1}/messages/10/readers?basic_only=maybe")
    assert status == 400
    status, denied = await api.get(f"/api/v1/chats/{G1}/messages/10/readers", user_id=left)
    assert (status, denied["error"]["code"]) == (403, "2001")


JS_UNSAFE = 11982011376358104761  # > 2^53: a JavaScript number reads 11982011376358105000


async def test_js_unsafe_member_ids_round_trip_exactly_as_strings(api: Api) -> None:
    api.reader.put(G1, BaseMember(JS_UNSAFE, "member", "active", 1, None))
    api.reader.senders[(G1, 10)] = JS_UNSAFE
    api.reader.senders[(G1, 11)] = ME
    api.reader.read_by_member[(G1, JS_UNSAFE)] = 11
    async with api.client.post(PAGE, json={"chat_session_uid": G1, "limit": 1}, headers=api.auth()) as resp:
        first = await resp.read()
    ref = json.loads(first)["next_page_ref"]
    status, page = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": ref})
    assert status == 200 and page["items"][0]["user_id"] == "11982011376358104761"
    # A request may name the member by the string it got (or, older clients, a number).
    for named in ("11982011376358104761", JS_UNSAFE):
        status, shown = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": [named]})
        assert status == 200 and [i["user_id"] for i in shown["items"]] == ["11982011376358104761"]
    status, readers = await api.get(f"/api/v1/chats/{G1}/messages/10/readers")
    assert status == 200 and readers["sender_id"] == "11982011376358104761"
    status, readers = await api.get(f"/api/v1/chats/{G1}/messages/11/readers")
    assert status == 200 and readers["read_user_ids"] == ["11982011376358104761"]
    assert readers["read"][0]["user_id"] == "11982011376358104761"
    # The client store parses them back into the exact int.
    assert MemberPage.from_wire(page).items[0].user_id == JS_UNSAFE
    for bad in ("0x10", "٣", " 7", "007", "18446744073709551616"):
        status, _ = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": [bad]})
        assert status == 400, bad


async def test_the_openapi_description_names_the_member_routes(api: Api) -> None:
    async with api.client.get("/openapi.json") as resp:
        description = await resp.json()
    assert {PAGE, BY_IDS} <= set(description["paths"])
    schemas = description["components"]["schemas"]
    assert "MembersPage" in schemas
    # Ids are described as strings with the u64 note, wherever a response carries one.
    assert schemas["Member"]["properties"]["user_id"]["type"] == "string"
    assert schemas["Member"]["properties"]["user_id"]["format"] == "uint64"
    assert schemas["MembersPage"]["properties"]["next_page_ref"]["type"] == ["string", "null"]
    assert "after_user_id" not in schemas["MembersPageRequest"]["properties"]
    assert schemas["MessageReaders"]["properties"]["read_user_ids"]["items"]["format"] == "uint64"
    pattern = re.compile(schemas["SessionRow"]["properties"]["user_id"]["pattern"])
    # Exactly the canonical decimals of a u64: a fuzzer sends whatever the pattern admits.
    assert pattern.fullmatch("0") and pattern.fullmatch(str(2**64 - 1)) and pattern.fullmatch(str(2**63))
    assert not pattern.fullmatch(str(2**64)) and not pattern.fullmatch("01") and not pattern.fullmatch("-1")
    assert not pattern.fullmatch("9" * 20)


async def test_client_http_source_and_directory_against_the_routes(api: Api) -> None:
    ids = roster(api.reader, G1, 130)
    api.reader.stats_by_member[(G1, ids[0])] = (4, 1)
    base = str(api.client.make_url("")).rstrip("/")
    token = api.auth()["Authorization"].removeprefix("Bearer ")
    async with aiohttp.ClientSession() as session:
        source = HttpMemberSource(base, token, session)
        page = await source.page(G1, None, 50, True)
        assert len(page.items) == 50 and page.has_more and page.self_role == "admin"
        with pytest.raises(MemberRequestError):
            await source.page(G1, None, 101, True)
        directory = MemberDirectory(CacheKey("env", str(ME), G1), source)
        directory.subscribe()
        await asyncio.wait_for(directory.until(lambda d: d.fresh), 10)
        assert len(directory.members) == 131
        assert directory.members[ids[0]].record_count == 4 and directory.members[ids[0]].stats_known
        stranger = HttpMemberSource(base, TokenSigner(SECRET).mint(5, T0 // 1000 + 3600), session)
        with pytest.raises(MemberAccessDenied) as denied:
            await stranger.page(G1, None, 50, True)
        assert denied.value.code == 2001
        await directory.aclose()


async def test_the_default_budget_is_2_seconds_and_identities_come_anyway() -> None:
    reader = InMemoryMemberReader(stats_delay_s=3600.0)  # returning at all = the budget gave up
    ids = roster(reader, G1, 3)
    reader.put(G1, BaseMember(ME, "member", "active", 1, None))
    service = MemberService(reader)  # the seed's 2 s
    loop = asyncio.get_running_loop()
    started = loop.time()
    shown = await service.present(G1, ME, ids, True)
    elapsed = loop.time() - started
    assert shown.stats is None and [m.user_id for m in shown.items] == ids
    # Timers never fire early; the upper bound leaves room for a loaded machine's slow loop.
    assert 1.9 <= elapsed < 60


async def test_chunked_bodies_are_read_whole_and_oversized_ones_refused(api: Api) -> None:
    roster(api.reader, G1, 3)

    async def chunks(data: bytes) -> Any:
        for start in range(0, len(data), 7):  # many small chunks
            yield data[start : start + 7]

    import orjson

    body = orjson.dumps({"chat_session_uid": G1, "limit": 2})
    async with api.client.post(PAGE, data=chunks(body), headers=api.auth()) as resp:
        assert resp.status == 200 and len((await resp.json())["items"]) == 2
    huge = orjson.dumps({"chat_session_uid": G1, "padding": "x" * 70_000})
    async with api.client.post(PAGE, data=chunks(huge), headers=api.auth()) as resp:
        assert resp.status == 413


# -- issue 34: opaque references, capabilities, join events, stats, read receipts ---------------


async def test_page_refs_are_bound_to_account_group_and_walk(api: Api) -> None:
    roster(api.reader, G1, 120)
    roster(api.reader, G2, 120)
    other = 1000  # a member of both groups
    api.reader.put(G2, BaseMember(ME, "member", "active", 1, None))
    status, first = await api.post(PAGE, {"chat_session_uid": G1})
    ref = first["next_page_ref"]
    # Honoured as issued: the page after the first one.
    status, second = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": ref})
    assert status == 200 and second["items"][0]["user_id"] > first["items"][-1]["user_id"]
    cases = [
        ({"chat_session_uid": G1, "page_ref": ref}, other, "another account"),
        ({"chat_session_uid": G2, "page_ref": ref}, ME, "another group"),
        ({"chat_session_uid": G1, "page_ref": ref, "active_only": True}, ME, "active_only"),
        ({"chat_session_uid": G1, "page_ref": ref[:-2] + ("AA" if ref[-2:] != "AA" else "BA")}, ME, ""),
    ]
    for body, user, reason in cases:
        status, answer = await api.post(PAGE, body, user_id=user)
        assert status == 400, (body, answer)
        assert reason in answer["error"]["message"]
    # A session-list cursor (same envelope, another key) is not a member page reference.
    from app.api.cursor import SignedEnvelope

    forged = SignedEnvelope(SECRET, "cursor").seal(b"\x01" + b"\x00" * 33)
    status, answer = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": forged})
    assert status == 400 and "signature" in answer["error"]["message"]
    # Signed with the right purpose but another server's secret: refused too.
    alien = SignedEnvelope("z" * 40, "member-page").seal(b"\x01" + b"\x00" * 33)
    status, answer = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": alien})
    assert status == 400 and "signature" in answer["error"]["message"]


async def test_capabilities_come_from_the_group_settings_and_the_role_of_this_page(api: Api) -> None:
    roster(api.reader, G1, 3)
    status, page = await api.post(PAGE, {"chat_session_uid": G1})
    assert status == 200
    # Defaults for an admin: invite (member+), remove (admin+), edit (admin+), not manage admins.
    assert page["capabilities"] == {
        "invite": True,
        "remove_members": True,
        "edit_info": True,
        "manage_admins": False,
    }
    api.reader.settings_by_group[G1] = {"remove_members": "owner", "invite": "nobody", "edit_info": "?"}
    status, page = await api.post(PAGE, {"chat_session_uid": G1})
    assert status == 200 and page["capabilities"] == {
        "invite": False,
        "remove_members": False,
        "edit_info": True,  # an unknown value falls back to the default, never grants more
        "manage_admins": False,
    }
    # The role is the one this page's access check read: demoted now, no admin entry now.
    api.reader.put(G1, BaseMember(ME, "member", "active", 1, None))
    status, page = await api.post(PAGE, {"chat_session_uid": G1})
    assert (
        status == 200
        and page["self_role"] == "member"
        and not any(page["capabilities"][k] for k in ("remove_members", "edit_info", "manage_admins"))
    )


async def test_join_events_come_with_pages_and_merge_across_pages_by_member_ref(api: Api) -> None:
    from app.members.model import MemberPage, merge_join_events

    # One join event at seq 40 invited 5 members whose ids straddle two pages of 3.
    invited = [2000, 2001, 2002, 2003, 2004]
    for user_id in invited:
        api.reader.put(G1, BaseMember(user_id, "member", "active", 40, None))
    api.reader.put(G1, BaseMember(1500, "member", "active", 12, None))
    pages = await walk(api, G1, limit=3)
    assert [e["event_ref"] for e in pages[0]["join_events"]] == ["join:1", "join:12", "join:40"]
    merged: dict[str, Any] = {}
    for page in pages:
        merged = merge_join_events(merged, MemberPage.from_wire(page).join_events)
    assert merged["join:40"].invitees == tuple(invited)
    assert merged["join:12"].invitees == (1500,) and merged["join:1"].invitees == (ME,)
    # Merging the same page again changes nothing (by memberRef, not appended twice).
    again = merge_join_events(merged, MemberPage.from_wire(pages[1]).join_events)
    assert again["join:40"] is merged["join:40"]


async def test_statistics_are_known_only_as_two_safe_integers_and_unknown_is_never_zero() -> None:
    class Partial(InMemoryMemberReader):
        async def stats(self, conversation_id: str, user_ids: Any) -> dict[int, tuple[int, int]]:
            # One member's count is missing, one is negative, one is past 2^53.
            return {1: (3, 0), 3: (-1, 2), 4: (2**53, 0)}

    reader = Partial()
    for user_id in (ME, 1, 2, 3, 4):
        reader.put(G1, BaseMember(user_id, "member", "active", 1, None))
    shown = await MemberService(reader).present(G1, ME, [1, 2, 3, 4], True)
    assert shown.stats == {1: (3, 0)}  # 2, 3, 4: unknown, left out (the API omits both fields)


async def test_readers_page_with_a_limit_and_a_bound_reference(api: Api) -> None:
    ids = roster(api.reader, G1, 25)
    api.reader.senders[(G1, 10)] = ids[0]
    api.reader.read_by_member.update({(G1, u): 10 for u in ids[1::2]})
    read: list[str] = []
    unread: list[str] = []
    ref = None
    pages = 0
    while True:
        path = f"/api/v1/chats/{G1}/messages/10/readers?basic_only=true&limit=7"
        status, body = await api.get(path + ("" if ref is None else f"&page_ref={ref}"))
        assert status == 200, body
        pages += 1
        read += body["read_user_ids"]
        unread += body["unread_user_ids"]
        if not body["has_more"]:
            assert body["next_page_ref"] is None
            break
        ref = body["next_page_ref"]
    assert pages == 4  # 26 active members, 7 a page
    assert sorted(map(int, read)) == sorted(ids[1::2]) and len(set(read)) == len(read)
    assert sorted(map(int, unread)) == sorted([ME, *ids[2::2]])
    # The reference is bound: not usable by another member, nor as a member page reference.
    status, _ = await api.get(f"/api/v1/chats/{G1}/messages/10/readers?page_ref={ref}", user_id=ids[1])
    assert status == 400
    status, _ = await api.post(PAGE, {"chat_session_uid": G1, "page_ref": ref, "active_only": True})
    assert status == 400
    for bad in ("limit=0", "limit=501", "limit=x"):
        status, _ = await api.get(f"/api/v1/chats/{G1}/messages/10/readers?{bad}")
        assert status == 400, bad


async def test_readers_of_an_unknown_message_are_404_not_everyone_unread(api: Api) -> None:
    roster(api.reader, G1, 5)
    status, body = await api.get(f"/api/v1/chats/{G1}/messages/77/readers?basic_only=true")
    assert (status, body["error"]["code"]) == (404, "unknown_message")
    # Access still comes first: a stranger learns nothing about which messages exist.
    status, body = await api.get(f"/api/v1/chats/{G1}/messages/77/readers", user_id=99_999)
    assert (status, body["error"]["code"]) == (403, "2001")


async def test_readers_over_the_budget_are_503_not_a_guess(api: Api) -> None:
    roster(api.reader, G1, 5)
    api.reader.senders[(G1, 10)] = ME
    api.reader.read_delay_s = 1.0
    api.service.readers_budget_s = 0.05
    status, body = await api.get(f"/api/v1/chats/{G1}/messages/10/readers")
    assert (status, body["error"]["code"]) == (503, "timeout")


async def test_the_python_client_pages_read_receipts_and_gets_404_as_a_request_error(api: Api) -> None:
    ids = roster(api.reader, G1, 30)
    api.reader.senders[(G1, 10)] = ids[0]
    api.reader.read_by_member.update({(G1, u): 11 for u in ids[::3]})
    base = str(api.client.make_url("")).rstrip("/")
    token = api.auth()["Authorization"].removeprefix("Bearer ")
    async with aiohttp.ClientSession() as session:
        source = HttpMemberSource(base, token, session)
        read: list[int] = []
        unread: list[int] = []
        ref = None
        pages = 0
        while True:
            page = await source.read_receipts(G1, 10, basic_only=False, limit=8, page_ref=ref)
            pages += 1
            read += page.read_user_ids
            unread += page.unread_user_ids
            assert all(page.read_seqs[u] == 11 for u in page.read_user_ids)
            if not page.has_more:
                break
            ref = page.next_ref
        assert pages == 4 and page.sender_id == ids[0]
        assert sorted(read) == sorted(ids[3::3]) and sorted(unread) == sorted(
            [ME, *(u for u in ids[1:] if u not in ids[::3])]
        )
        with pytest.raises(MemberRequestError) as missing:
            await source.read_receipts(G1, 99)
        assert missing.value.status == 404


def remark_path(user_id: object) -> str:
    return f"/api/v1/users/{user_id}/remark"


async def test_remarks_are_per_viewer_and_come_with_the_callers_presentation(api: Api) -> None:
    ids = roster(api.reader, G1, 3)
    other = ids[0]  # another member of the group, who is also a viewer
    status, answer = await api.send("PUT", remark_path(ids[1]), {"remark": "  Finance Zhang  "})
    assert (status, answer) == (200, {"user_id": str(ids[1]), "remark": "Finance Zhang"})  # trimmed
    assert (await api.send("PUT", remark_path(ids[2]), {"remark": "备注"}))[0] == 200
    assert (await api.send("PUT", remark_path(ids[1]), {"remark": "other's view"}, user_id=other))[0] == 200

    body = {"chat_session_uid": G1, "user_ids": [ME, *ids]}
    status, mine = await api.post(BY_IDS, body)
    assert status == 200 and mine["remarks_included"] is True
    assert {i["user_id"]: i["remark"] for i in mine["items"]} == {
        str(ME): None,
        str(ids[0]): None,
        str(ids[1]): "Finance Zhang",
        str(ids[2]): "备注",
    }
    status, theirs = await api.post(BY_IDS, body, user_id=other)
    assert status == 200
    assert {i["user_id"]: i["remark"] for i in theirs["items"]} == {
        str(ME): None,
        str(ids[0]): None,
        str(ids[1]): "other's view",
        str(ids[2]): None,
    }
    # One read per presentation, keyed by the caller only.
    assert {viewer for viewer, _ in api.remarks.reads} == {ME, other}

    # Replace, then clear: the next presentation says so (null), clearing twice is fine.
    assert (await api.send("PUT", remark_path(ids[1]), {"remark": "Zhang"}))[1]["remark"] == "Zhang"
    assert (await api.post(BY_IDS, body))[1]["items"][2]["remark"] == "Zhang"
    for _ in range(2):
        status, answer = await api.send("DELETE", remark_path(ids[1]))
        assert (status, answer) == (200, {"user_id": str(ids[1]), "remark": None})
    items = {i["user_id"]: i for i in (await api.post(BY_IDS, body))[1]["items"]}
    assert items[str(ids[1])]["remark"] is None and items[str(ids[2])]["remark"] == "备注"


@pytest.mark.parametrize(
    ("path_id", "body", "reason"),
    [
        ("12", {}, "remark .* is required"),
        ("12", {"remark": None}, "must be a string"),
        ("12", {"remark": 5}, "must be a string"),
        ("12", {"remark": ""}, "must not be empty"),
        ("12", {"remark": "   "}, "must not be empty"),
        ("12", {"remark": "x" * (REMARK_MAX_CHARS + 1)}, f"at most {REMARK_MAX_CHARS}"),
        ("12", {"remark": "two\nlines"}, "U\\+000A"),
        ("12", {"remark": "ok", "color": "red"}, "unknown field"),
        ("12", ["remark"], "JSON object"),
        ("abc", {"remark": "ok"}, "user_id must be a user id"),
        ("-1", {"remark": "ok"}, "user_id must be a user id"),
        ("012", {"remark": "ok"}, "user_id must be a user id"),
        (str(2**64), {"remark": "ok"}, "user_id must be a user id"),
        (str(ME), {"remark": "ok"}, "cannot set one on itself"),
    ],
)
async def test_bad_remark_requests_are_400_with_the_reason(
    api: Api, path_id: str, body: Any, reason: str
) -> None:
    status, answer = await api.send("PUT", remark_path(path_id), body)
    assert status == 400, answer
    assert re.search(reason, answer["error"]["message"]), answer
    assert api.remarks.rows == {}  # nothing stored


async def test_bad_remark_deletes_are_400_and_an_unconfigured_server_is_503(api: Api) -> None:
    for path_id, reason in (("x", "user_id must be a user id"), (str(ME), "on itself")):
        status, answer = await api.send("DELETE", remark_path(path_id))
        assert status == 400 and reason in answer["error"]["message"], answer
    status, answer = await api.send("DELETE", remark_path(12), data=b'{"remark": "x"}')
    assert status == 400 and "no body" in answer["error"]["message"]
    api.service.remark_store = None
    status, answer = await api.send("PUT", remark_path(12), {"remark": "ok"})
    assert (status, answer["error"]["code"]) == (503, "unavailable")
    status, plain = await api.post(BY_IDS, {"chat_session_uid": G1, "user_ids": [ME]})
    assert status == 200 and plain["remarks_included"] is False and "remark" not in plain["items"][0]


async def test_late_or_failed_remarks_are_not_included_but_identities_and_stats_come() -> None:
    class SlowRemarks(InMemoryRemarkStore):
        async def remarks(self, viewer_id: int, target_ids: Any) -> dict[int, str]:
            await asyncio.sleep(600)
            return {}

    class BrokenRemarks(InMemoryRemarkStore):
        async def remarks(self, viewer_id: int, target_ids: Any) -> dict[int, str]:
            raise RuntimeError("cassandra timed out")

    reader = InMemoryMemberReader()
    reader.put(G1, BaseMember(ME, "member", "active", 1, None))
    reader.stats_by_member[(G1, ME)] = (4, 1)
    for store in (SlowRemarks(), BrokenRemarks()):
        service = MemberService(reader, stats_budget_s=5.0, remarks=store, remarks_budget_s=0.1)
        result = await service.present(G1, ME, [ME], True)
        assert result.remarks is None  # not included: clients keep theirs, never cleared by this
        assert [m.user_id for m in result.items] == [ME] and result.stats == {ME: (4, 1)}


async def test_the_python_client_sets_and_clears_remarks_and_reads_them_back(api: Api) -> None:
    ids = roster(api.reader, G1, 2)
    async with aiohttp.ClientSession() as http:
        source = HttpMemberSource(str(api.client.make_url("")), api.auth()["Authorization"][7:], http)
        assert await source.set_remark(ids[0], " Zhang ") == "Zhang"
        result = await source.by_user_ids(G1, ids, False)
        assert result.remarks_included
        assert {i.base.user_id: i.remark for i in result.items} == {ids[0]: "Zhang", ids[1]: None}
        with pytest.raises(MemberRequestError) as refused:
            await source.set_remark(ids[0], "\x00")
        assert refused.value.status == 400 and refused.value.code is None
        await source.clear_remark(ids[0])
        result = await source.by_user_ids(G1, ids, False)
        assert [i.remark for i in result.items] == [None, None]
