"""The query API over HTTP (aiohttp's TestServer/TestClient) on the in-memory projection store:
pages, snapshots and revisions, auth, bad input (never a 500), the OpenAPI description."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import ApiConfigError, Deps, create_app
from app.api.cursor import Cursor, CursorCodec
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner, b64url_encode
from app.domain.badge import Badge
from app.domain.listing import Folder, Position, Zone
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import ME, SECRET, SETTINGS, T0, Api
from tests.support.clock import ManualClock
from tests.support.rows import cid, expected_order, flush, make_row, mixed_rows


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    store = InMemoryProjectionStore()
    clock = ManualClock(T0)
    app = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=clock))
    async with TestClient(TestServer(app)) as client:
        yield Api(client, store, clock, "")


def ids(pages: list[dict[str, Any]]) -> list[str]:
    return [item["conversation_id"] for page in pages for item in page["items"]]


# -- pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 7, 50, 100])
async def test_walks_give_every_listed_row_once_in_order(api: Api, limit: int) -> None:
    rows = mixed_rows(ME, 400)
    await api.store.write([flush(ME, rows, version=10, structure_version=3)])
    for folder in Folder:
        pages = await api.walk(limit, folder.value)
        assert ids(pages) == expected_order(rows, folder)
        assert {p["snapshot_revision"] for p in pages} == {1}
        assert all(p["projection_complete"] and p["projection_mailbox_seq"] == 10 for p in pages)
        assert all(len(p["items"]) == limit for p in pages[:-1])


async def test_default_limit_is_50_and_rows_are_the_stored_rows(api: Api) -> None:
    rows = [make_row(ME, n, act=n) for n in range(1, 61)]
    await api.store.write([flush(ME, rows, version=5, structure_version=0)])
    status, body = await api.get("/v1/sessions")
    assert status == 200 and len(body["items"]) == 50 and body["next_cursor"]
    assert body["items"][0] == {**rows[-1], "user_id": str(ME)}  # the u64 id as a string
    assert body["folder"] == "main" and body["filled_from_state"] is False and body["truncated"] is False


# 2^64 - 6,464,732,697,350,446,855: far above 2^53; a JavaScript number would read it back as
# 11982011376358105000.
JS_UNSAFE = 11982011376358104761


async def test_a_js_unsafe_user_id_goes_out_as_its_exact_decimal_string(api: Api) -> None:
    rows = [make_row(JS_UNSAFE, n, act=n) for n in range(1, 4)]
    await api.store.write([flush(JS_UNSAFE, rows, version=5, structure_version=0)])
    async with api.client.get("/v1/sessions", headers=api.auth(JS_UNSAFE)) as resp:
        raw = await resp.read()
    assert resp.status == 200
    assert raw.count(b'"user_id":"11982011376358104761"') == 3 and b'"user_id":1' not in raw
    # What a client that reads numbers as doubles would have seen, had it been a number:
    assert float(JS_UNSAFE) != JS_UNSAFE and int(float(JS_UNSAFE)) == 11982011376358105088


async def test_a_user_without_projection_gets_an_empty_list(api: Api) -> None:
    status, body = await api.get("/v1/sessions")
    assert status == 200 and body["items"] == [] and body["next_cursor"] is None
    assert body["snapshot_revision"] == 1


async def test_badge_comes_from_the_store_meta(api: Api) -> None:
    await api.store.write([flush(ME, [make_row(ME, 1, act=1)], 9, 0, Badge(5, 2, 1))])
    status, body = await api.get("/v1/badge")
    assert status == 200
    assert body == {
        "total_unread": 5,
        "total_mention": 2,
        "muted_unread": 1,
        "archived_unread": 0,
        "archived_mention": 0,
        "badge_mode": "messages",
        "include_muted": False,
        "projection_mailbox_seq": 9,
    }


async def test_the_badge_carries_folder_totals_and_preferences(api: Api) -> None:
    """docs/contract.md §10: archived_unread/archived_mention and the preferences the badge is in."""
    await api.store.write(
        [flush(ME, [make_row(ME, 1, act=1)], 9, 0, Badge(2, 1, 0, 4, 3, "conversations", True))]
    )
    status, body = await api.get("/v1/badge")
    assert status == 200
    assert body["archived_unread"] == 4 and body["archived_mention"] == 3
    assert body["badge_mode"] == "conversations" and body["include_muted"] is True


async def test_a_user_reads_only_their_own_list(api: Api) -> None:
    await api.store.write(
        [flush(ME, [make_row(ME, 1, act=1)], 3, 0), flush(7, [make_row(7, 2, act=1)], 3, 0)]
    )
    _, mine = await api.get("/v1/sessions")
    _, theirs = await api.get("/v1/sessions", user_id=7)
    assert ids([mine]) == [cid(1)] and ids([theirs]) == [cid(2)]


# -- revisions ------------------------------------------------------------------------------


async def test_structure_change_mid_walk_restarts_with_a_new_revision(api: Api) -> None:
    rows = [make_row(ME, n, act=n) for n in range(1, 31)]
    await api.store.write([flush(ME, rows, version=10, structure_version=1)])
    _, first = await api.get("/v1/sessions", limit=10)
    pinned = make_row(ME, 3, act=3, pin_rank=0, version=11)
    await api.store.write([flush(ME, [pinned], version=11, structure_version=2)])
    _, again = await api.get("/v1/sessions", limit=10, cursor=first["next_cursor"])
    assert again["projection_complete"] is False
    assert again["snapshot_revision"] == 2 and again["projection_mailbox_seq"] == 11
    assert again["items"][0]["conversation_id"] == cid(3)  # the first page of the new order
    rest = await api.walk(10)
    assert ids(rest) == expected_order(
        [*[r for r in rows if r["conversation_id"] != cid(3)], pinned], Folder.MAIN
    )


async def test_new_messages_keep_the_revision_but_a_new_walk_sees_them(api: Api) -> None:
    rows = [make_row(ME, n, act=n) for n in range(1, 31)]
    await api.store.write([flush(ME, rows, version=10, structure_version=1)])
    _, first = await api.get("/v1/sessions", limit=10)
    bumped = make_row(ME, 1, act=99, unread=1, version=11)
    await api.store.write([flush(ME, [bumped], version=11, structure_version=1)])
    _, second = await api.get("/v1/sessions", limit=10, cursor=first["next_cursor"])
    assert second["snapshot_revision"] == 1 and second["projection_complete"] is True
    assert second["items"][0]["conversation_id"] == cid(20)  # the walk goes on over the snapshot
    # A walk already under way keeps its revision even after a new walk loaded a newer one.
    _, fresh = await api.get("/v1/sessions", limit=10)
    assert fresh["snapshot_revision"] == 2 and fresh["items"][0] == {**bumped, "user_id": str(ME)}
    _, third = await api.get("/v1/sessions", limit=10, cursor=second["next_cursor"])
    assert third["snapshot_revision"] == 1 and third["projection_complete"] is True
    assert ids([first, second, third]) == [cid(n) for n in range(30, 0, -1)]


async def test_snapshots_expire_after_the_ttl(api: Api) -> None:
    await api.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 5)], 10, 1)])
    _, first = await api.get("/v1/sessions", limit=2)
    api.clock.now += SETTINGS.api.api_snapshot_ttl_ms - 1
    _, same = await api.get("/v1/sessions", limit=2, cursor=first["next_cursor"])
    assert same["snapshot_revision"] == 1 and same["projection_complete"]
    api.clock.now += 1
    _, expired = await api.get("/v1/sessions", limit=2, cursor=first["next_cursor"])
    assert expired["snapshot_revision"] == 2 and expired["projection_complete"] is False


async def test_lru_bound_evicts_other_users_and_an_evicted_walk_goes_on_from_the_fleet_record(
    api: Api,
) -> None:
    # Cache bound 5,000 rows: two users of 3,000 rows cannot both be held.
    for user in (1, 2):
        await api.store.write([flush(user, [make_row(user, n, act=n) for n in range(1, 3001)], 5, 0)])
    _, a1 = await api.get("/v1/sessions", user_id=1)
    _, b1 = await api.get("/v1/sessions", user_id=2)  # evicts user 1
    _, a2 = await api.get("/v1/sessions", user_id=1, cursor=a1["next_cursor"])
    # Issue 32: the snapshot's frozen order is kept in the store; the evicted walk is adopted
    # back (the same revision, the next rows), where it used to restart.
    assert a2["projection_complete"] is True and a2["snapshot_revision"] == 1
    assert [r["conversation_id"] for r in a1["items"] + a2["items"]] == [
        cid(n) for n in range(3000, 2900, -1)
    ]
    assert b1["snapshot_revision"] == 1


async def test_a_cursor_of_a_snapshot_the_fleet_does_not_know_is_stale_not_confused(api: Api) -> None:
    await api.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 5)], 10, 1)])
    await api.get("/v1/sessions", limit=2)
    foreign = Cursor(1, ME, Folder.MAIN, Position(Zone.NORMAL, 0, bytes(16), bytes(16)), snapshot_id=12345)
    _, body = await api.get("/v1/sessions", limit=2, cursor=CursorCodec(SECRET).encode(foreign))
    assert body["projection_complete"] is False and body["items"][0]["conversation_id"] == cid(4)


# -- auth -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/badge"])
@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        (None, "missing Authorization"),
        ("", "missing Authorization"),
        ("Bearer", "Bearer <token>"),
        ("Bearer    ", "Bearer <token>"),
        ("Basic dXNlcjpwYXNz", "Bearer <token>"),
        ("Bearer abc", "malformed"),
        ("Bearer v1.x.y", "signature"),
        ("Bearer " + TokenSigner("not-the-server-secret-at-all-000").mint(ME, 2**40), "signature is invalid"),
        ("Bearer " + TokenSigner(SECRET).mint(ME, T0 // 1000), "expired"),
        ("Bearer " + "A" * 5000, "too long"),
        ("Bearer v1.\u00e9t\u00e9.AAAA", "malformed"),
        ("bearer v1.x", "malformed"),
    ],
)
async def test_bad_credentials_are_401(api: Api, path: str, header: str | None, fragment: str) -> None:
    headers = {} if header is None else {"Authorization": header}
    async with api.client.get(path, headers=headers) as resp:
        body = await resp.json()
        assert resp.status == 401, body
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert body["error"]["code"] == "unauthorized" and fragment in body["error"]["message"]


async def test_the_description_is_public(api: Api) -> None:
    async with api.client.get("/openapi.json") as resp:
        assert resp.status == 200


# -- bad input ------------------------------------------------------------------------------


def _other_users_cursor() -> str:
    return CursorCodec(SECRET).encode(Cursor(1, 7, Folder.MAIN, Position(Zone.NORMAL, 0, None, bytes(16)), 1))


def _archived_cursor() -> str:
    return CursorCodec(SECRET).encode(
        Cursor(1, ME, Folder.ARCHIVED, Position(Zone.NORMAL, 0, None, bytes(16)), 1)
    )


BAD_QUERIES: list[tuple[str, str, str]] = [
    ("limit=0", "bad_request", "limit must be an integer from 1 to 100, got '0'"),
    ("limit=101", "bad_request", "from 1 to 100"),
    ("limit=-1", "bad_request", "from 1 to 100"),
    ("limit=abc", "bad_request", "from 1 to 100"),
    ("limit=1.5", "bad_request", "from 1 to 100"),
    ("limit=1e2", "bad_request", "from 1 to 100"),
    ("limit=%20%205", "bad_request", "from 1 to 100"),
    ("limit=%D9%A3", "bad_request", "from 1 to 100"),  # Arabic-Indic 3: int() would take it
    ("limit=1_0", "bad_request", "from 1 to 100"),
    ("limit=" + "9" * 5000, "bad_request", "from 1 to 100"),
    ("limit=1&limit=2", "bad_request", "more than once"),
    ("folder=Main", "bad_request", "folder must be 'main' or 'archived'"),
    ("folder=trash", "bad_request", "folder must be"),
    ("folder=%00", "bad_request", "folder must be"),
    ("limt=5", "bad_request", "unknown query parameter 'limt'"),
    ("cursor=!!!", "bad_cursor", "malformed"),
    ("cursor=a", "bad_cursor", "malformed"),
    ("cursor=" + "A" * 1000, "bad_cursor", "too long"),
    ("cursor=" + b64url_encode(b"\x0a\x02hi\x12\x10" + bytes(16)), "bad_cursor", "signature is invalid"),
    ("cursor=" + b64url_encode(b"\xff" * 40), "bad_cursor", "malformed"),
    ("cursor=%F0%9F%98%80", "bad_cursor", "malformed"),
    ("cursor=" + _other_users_cursor(), "bad_cursor", "issued to another user"),
    ("cursor=" + _archived_cursor(), "bad_cursor", "issued for folder 'archived', not 'main'"),
    ("cursor=x&cursor=y", "bad_request", "more than once"),
    ("limit=%ZZ", "bad_request", "from 1 to 100"),
    ("folder=%C3%28", "bad_request", "folder must be"),
    ("cursor=%C3%28", "bad_cursor", "malformed"),
    ("cursor=%00%00", "bad_cursor", "malformed"),
    ("%FF=1", "bad_request", "unknown query parameter"),
]


@pytest.mark.parametrize(("qs", "code", "fragment"), BAD_QUERIES)
async def test_bad_input_is_400_with_a_clear_message(api: Api, qs: str, code: str, fragment: str) -> None:
    await api.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 5)], 10, 1)])
    async with api.client.get("/v1/sessions?" + qs, headers=api.auth()) as resp:
        body = await resp.json()
        assert resp.status == 400, body
    assert body["error"]["code"] == code and fragment in body["error"]["message"], body


async def test_a_tampered_real_cursor_is_400(api: Api) -> None:
    await api.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 5)], 10, 1)])
    _, first = await api.get("/v1/sessions", limit=1)
    cursor = first["next_cursor"]
    for i in range(len(cursor)):
        flipped = cursor[:i] + ("A" if cursor[i] != "A" else "B") + cursor[i + 1 :]
        status, body = await api.get("/v1/sessions", limit=1, cursor=flipped)
        assert status == 400 and body["error"]["code"] == "bad_cursor", (i, body)


async def test_empty_parameters_count_as_absent(api: Api) -> None:
    await api.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 5)], 10, 1)])
    async with api.client.get("/v1/sessions?cursor=&limit=&folder=", headers=api.auth()) as resp:
        body = await resp.json()
    assert resp.status == 200 and len(body["items"]) == 4


async def test_badge_takes_no_parameters_and_unknown_routes_are_json_404(api: Api) -> None:
    async with api.client.get("/v1/badge?x=1", headers=api.auth()) as resp:
        assert resp.status == 400
    async with api.client.get("/v1/nothing", headers=api.auth()) as resp:
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
    async with api.client.post("/v1/sessions", headers=api.auth()) as resp:
        assert resp.status == 405 and (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_a_broken_store_is_503_not_500() -> None:
    from app.api.fleet import MemoryFleetState
    from app.stores.redis_projection import ProjectionStoreError

    class Down:
        fleet = MemoryFleetState()

        async def load_rows(self, user_id: int) -> Any:
            raise ProjectionStoreError("down")

        async def meta(self, user_id: int) -> Any:
            raise ProjectionStoreError("down")

        async def some_rows(self, user_id: int, conversation_ids: list[str]) -> Any:
            raise ProjectionStoreError("down")

    app = create_app(SETTINGS, Deps(projections=Down(), clock_ms=ManualClock(T0)))
    async with TestClient(TestServer(app)) as client:
        headers = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(ME, T0 // 1000 + 60)}
        for path in ("/v1/sessions", "/v1/badge"):
            async with client.get(path, headers=headers) as resp:
                assert resp.status == 503 and (await resp.json())["error"]["code"] == "unavailable"


async def test_malformed_stored_rows_are_left_out(api: Api) -> None:
    rows = [make_row(ME, 1, act=1), {**make_row(ME, 2, act=2), "last_activity_id": "not-hex"}]
    await api.store.write([flush(ME, rows, 10, 1)])
    status, body = await api.get("/v1/sessions")
    assert status == 200 and ids([body]) == [cid(1)]


def test_the_api_refuses_to_start_without_a_secret() -> None:
    with pytest.raises(ApiConfigError, match="PROJECTOR_API_SECRET"):
        create_app(
            SETTINGS.replace(api_secret=""),
            Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())),
        )


# -- description ----------------------------------------------------------------------------


async def test_every_route_is_described(api: Api) -> None:
    async with api.client.get("/openapi.json") as resp:
        doc = await resp.json()
    served = {
        (route.resource.canonical, route.method.lower())
        for route in cast(TestServer, api.client.server).app.router.routes()
        if route.resource is not None
    }
    described = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert served == described
    assert doc["openapi"].startswith("3.")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            # A success answer (200; 202 for POST /v1/reconcile, handed to the worker).
            assert op["responses"].get("200") or op["responses"].get("202"), (path, method)
            # The only public routes: the description, metrics, health and the browser client's
            # files (the page asks for a token itself).
            public = ("/openapi.json", "/metrics", "/livez", "/readyz")
            if path not in public and not path.startswith("/app/"):
                assert "401" in op["responses"]
            else:
                assert op["security"] == []
    # Every $ref resolves.
    refs: list[str] = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(doc)
    for ref in refs:
        section, name = ref.removeprefix("#/components/").split("/")
        assert name in doc["components"][section], ref


async def test_responses_carry_server_timing(api: Api) -> None:
    async with api.client.get("/v1/badge", headers=api.auth()) as resp:
        assert resp.headers["Server-Timing"].startswith("app;dur=")


async def test_a_list_beyond_the_snapshot_bound_is_cut_and_says_so() -> None:
    settings = SETTINGS.replace(api_snapshot_max_rows=10)
    store = InMemoryProjectionStore()
    await store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 16)], 1, 1)])
    app = create_app(settings, Deps(projections=MemoryProjectionReader(store), clock_ms=ManualClock(T0)))
    async with TestClient(TestServer(app)) as client:
        headers = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(ME, T0 // 1000 + 60)}
        async with client.get("/v1/sessions?limit=100", headers=headers) as resp:
            body = await resp.json()
    assert body["truncated"] is True
    assert [r["conversation_id"] for r in body["items"]] == [
        cid(n) for n in range(15, 5, -1)
    ]  # the head of the order


async def test_fuzzed_requests_are_never_a_500(api: Api) -> None:
    """Seeded random mutations of real cursors, tokens and parameters: 200/400/401 only."""
    import random
    from urllib.parse import quote

    rnd = random.Random(2026)
    await api.store.write(
        [flush(ME, [make_row(ME, n, act=n, pin_rank=n % 3 or None) for n in range(1, 40)], 5, 1)]
    )
    _, first = await api.get("/v1/sessions", limit=3)
    cursor = first["next_cursor"]
    token = api.auth()["Authorization"].removeprefix("Bearer ")
    alphabet = "AZaz09-_=+/.%&?#é\x00 \t☃" + "".join(chr(rnd.randrange(32, 0x2FFF)) for _ in range(40))

    def mutate(text: str) -> str:
        choice = rnd.randrange(6)
        if choice == 0 and text:  # flip one character
            i = rnd.randrange(len(text))
            return text[:i] + rnd.choice(alphabet) + text[i + 1 :]
        if choice == 1:  # truncate
            return text[: rnd.randrange(len(text) + 1)]
        if choice == 2:  # extend
            return text + "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 20)))
        if choice == 3:  # splice two
            return text[: len(text) // 2] + text[::-1][: len(text) // 2]
        if choice == 4:
            return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 300)))
        return text

    statuses: dict[int, int] = {}
    for _ in range(600):
        params = []
        for name in rnd.sample(["cursor", "limit", "folder", "x"], rnd.randrange(0, 4)):
            base = {"cursor": cursor, "limit": str(rnd.randrange(-5, 120)), "folder": "main", "x": "1"}[name]
            params.append(f"{quote(name)}={quote(mutate(base), safe='')}")
        header = "Bearer " + (mutate(token) if rnd.random() < 0.3 else token)
        header = "".join(c for c in header if c >= " ")  # a client cannot send control characters
        try:
            header.encode("latin-1")
        except UnicodeEncodeError:
            header = header.encode("utf-8").decode("latin-1")  # what a raw client would put on the wire
        path = rnd.choice(["/v1/sessions", "/v1/badge"])
        async with api.client.get(path + "?" + "&".join(params), headers={"Authorization": header}) as resp:
            assert resp.status in (200, 400, 401), (path, params, header, await resp.text())
            body = await resp.json()
            assert ("error" in body) is (resp.status != 200)
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
    assert set(statuses) == {200, 400, 401}, statuses
