"""The operator console (issue 17) over HTTP on in-memory stores: who may open it (every route and
action: no token 401, a user token 403), the CSRF defence of its POSTs, the inspector's diff and
its reconcile/rebuild actions, the fleet summary over the workers' real metric names, the vendored
chart library's integrity, and that app/api stays free of aiokafka."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.ops import OPS_KEY, OpsDeps
from app.api.ops.auth import OperatorSigner
from app.api.ops.fleet import parse, summarize
from app.api.ops.ports import PartitionOffsets, TopicRecord
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.domain.flush import Correction
from app.members.model import BaseMember
from app.metrics import WorkerMetrics, exposition
from app.settings import Settings, SettingsError
from app.stores.cassandra_messages import ConversationHead
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.paths import ROOT

API_SECRET = "unit-test-secret-0123456789-abcdefghij"
OPS_SECRET = "ops-unit-test-secret-0123456789-abcdef"
SETTINGS = Settings.build(
    api_secret=API_SECRET,
    ops_secret=OPS_SECRET,
    api_fill_from_state="never",
    api_snapshot_cache_rows=5000,
    ops_metrics_urls=("http://127.0.0.1:1/metrics",),
    topic_partitions=2,
)
USER = 42
CONV_A = "00000000-0000-4000-8000-00000000000a"
CONV_B = "00000000-0000-4000-8000-00000000000b"
ORIGIN = "http://127.0.0.1"


class Messages(InMemoryMessageStore):
    def heads(self, conversation_ids: Iterable[str]) -> dict[str, ConversationHead]:
        out = {}
        for cid in conversation_ids:
            top = self.range(cid, 0, 10_000)
            if top:
                m = top[-1]
                out[cid] = ConversationHead(cid, m.conversation_seq, m.message_id, m.activity_id)
        return out


@dataclass
class State:
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def load_user(self, user_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows.get(user_id, [])]


@dataclass
class Members:
    roster: dict[str, list[BaseMember]] = field(default_factory=dict)
    reads: dict[tuple[str, int], int] = field(default_factory=dict)

    async def page(
        self, conversation_id: str, after_user_id: int | None, count: int, active_only: bool
    ) -> list[BaseMember]:
        members = [
            m
            for m in self.roster.get(conversation_id, [])
            if after_user_id is None or m.user_id > after_user_id
        ]
        return members[:count]

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]:
        return {u: self.reads[(conversation_id, u)] for u in user_ids if (conversation_id, u) in self.reads}


@dataclass
class Bus:
    published: list[tuple[int, list[bytes], list[bytes]]] = field(default_factory=list)
    dead: list[TopicRecord] = field(default_factory=list)
    down: bool = False

    def partition_of(self, user_id: int) -> int:
        return user_id % 2

    async def last_records(self, topic: str, key: str, limit: int) -> list[TopicRecord]:
        frames = []
        for _, deltas, badges in self.published:
            for i, value in enumerate(deltas if "delta" in topic else badges):
                frames.append(TopicRecord(topic, 0, i, 0, key, value))
        return frames[-limit:]

    async def tail(self, topic: str, limit: int, partition: int | None = None) -> list[TopicRecord]:
        if self.down:
            raise ConnectionError("kafka is away")
        return [r for r in self.dead if partition is None or r.partition == partition][:limit]

    async def group_offsets(self) -> list[PartitionOffsets]:
        return [PartitionOffsets(0, 90, 100), PartitionOffsets(1, None, 7)]

    async def publish_frames(self, user_id: int, deltas: Sequence[bytes], badges: Sequence[bytes]) -> None:
        self.published.append((user_id, list(deltas), list(badges)))

    async def aclose(self) -> None:
        pass


def worker_metrics_text() -> str:
    """A worker's exposition with the real metric names (app/metrics/worker.py), owning partition 0."""
    m = WorkerMetrics()
    m.watermark_hi.labels("0").set(120)
    m.watermark_lane.labels("0", "0").set(120)
    m.watermark_lane.labels("0", "1").set(130)
    m.partition_pending.labels("0").set(3)
    m.watermark_lag.labels("0").set(10)
    m.partition_owed_rows.labels("0").set(2)
    m.entries_applied.inc(500)
    m.entries_dead_lettered.inc(4)
    m.unread_drift_ratio.set(0.25)
    m.last_flush.set(1_700_000_000)
    return exposition(m.registry).decode()


@dataclass
class Console:
    client: TestClient[Any, Any]
    store: InMemoryProjectionStore
    state: State
    messages: Messages
    bus: Bus
    members: Members

    def operator(self, ttl_s: int = 3600, name: str = "alice") -> str:
        import time

        return OperatorSigner(OPS_SECRET).mint(name, int(time.time()) + ttl_s)

    def user_token(self) -> str:
        import time

        return TokenSigner(API_SECRET).mint(USER, int(time.time()) + 3600)

    def bearer(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": "Bearer " + (token or self.operator())}


def state_row(cid: str, **fields: Any) -> dict[str, Any]:
    row = {
        "conversation_id": cid,
        "membership": "active",
        "role": "member",
        "joined_at_conversation_seq": 0,
        "left_at_conversation_seq": None,
        "read_conversation_seq": 0,
        "hidden_before_conversation_seq": 0,
        "deleted_before_conversation_seq": 0,
        "pin_rank": None,
        "archived": False,
        "muted": False,
        "updated_mailbox_seq": 5,
    }
    row.update(fields)
    return row


@pytest.fixture
async def console() -> AsyncIterator[Console]:
    store = InMemoryProjectionStore()
    messages = Messages()
    for seq in range(1, 6):
        messages.record_message(
            CONV_A,
            seq,
            message_id=f"m{seq}",
            activity_id=f"{seq:032x}",
            sender_id=7,
            counts_unread=True,
            mentioned_user=USER if seq == 4 else None,
        )
    for seq in range(1, 3):
        messages.record_message(
            CONV_B,
            seq,
            message_id=f"b{seq}",
            activity_id=f"{seq + 100:032x}",
            sender_id=USER,
            counts_unread=True,
            mentioned_user=None,
        )
    state = State(
        {USER: [state_row(CONV_A, read_conversation_seq=2), state_row(CONV_B, updated_mailbox_seq=3)]}
    )
    bus = Bus()
    members = Members(
        roster={
            CONV_A: [BaseMember(USER, "member", "active", 0, None), BaseMember(7, "owner", "active", 0, None)]
        },
        reads={(CONV_A, USER): 2, (CONV_A, 7): 5},
    )

    async def serving() -> str:
        return "proj"

    async def fetch(url: str) -> str:
        return worker_metrics_text()

    ops = OpsDeps(
        store=store,
        state=state,
        messages=messages,
        members=members,
        serving=serving,
        bus=bus,
        metrics_fetch=fetch,
    )

    deps = Deps(projections=MemoryProjectionReader(store), extra={OPS_KEY: ops})
    app = create_app(SETTINGS, deps)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield Console(client, store, state, messages, bus, members)
    finally:
        await client.close()


async def project_user(c: Console) -> None:
    """The worker's projection of USER as the recompute gives it (a correct store)."""
    from app.api.ops.inspector import recompute

    fresh = recompute(OpsDeps(c.store, c.state, c.messages, c.members, _serving), SETTINGS.processing, USER)
    assert fresh is not None
    await c.store.write([fresh])


async def _serving() -> str:
    return "proj"


async def drift(c: Console, cid: str, **changes: Any) -> None:
    """Corrupt one stored row in place (same version), as a lost or wrong write would."""
    stored = await c.store.load(USER)
    row = {**stored.rows[cid], **changes}
    badge = Badge(stored.total_unread, stored.total_mention, stored.muted_unread)
    assert (await c.store.correct([Correction(USER, stored.projection_mailbox_seq, [row], badge)])) == [True]


GETS = [
    "/ops/",
    "/ops/static/console.js",
    "/ops/static/vendor/uPlot.iife.min.js",
    "/ops/api/whoami",
    f"/ops/api/user/{USER}",
    f"/ops/api/conversation/{CONV_A}",
    "/ops/api/fleet",
    "/ops/api/series",
    "/ops/api/dead-letters",
    "/ops/api/no-such-route",
]
POSTS = [f"/ops/api/user/{USER}/reconcile", f"/ops/api/user/{USER}/rebuild", "/ops/logout"]


# -- who may open it ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", p) for p in GETS] + [("POST", p) for p in POSTS])
async def test_no_token_401_and_a_user_token_403_on_every_route(
    console: Console, method: str, path: str
) -> None:
    c = console.client
    async with c.request(method, path) as resp:
        assert resp.status == 401, path
    async with c.request(method, path, headers={"Authorization": "Bearer garbage"}) as resp:
        assert resp.status == 401
    user = console.user_token()
    async with c.request(method, path, headers=console.bearer(user)) as resp:
        assert resp.status == 403, path
    async with c.request(method, path, cookies={"ops_session": user}) as resp:
        assert resp.status == 403
    expired = console.operator(ttl_s=-10)
    async with c.request(method, path, headers=console.bearer(expired)) as resp:
        assert resp.status == 401
    # An operator token signed with the API secret (the wrong key) is no credential either.
    import time

    forged = OperatorSigner(API_SECRET).mint("mallory", int(time.time()) + 60)
    async with c.request(method, path, headers=console.bearer(forged)) as resp:
        assert resp.status == 401


async def test_an_operator_token_opens_the_console_but_not_the_users_api(console: Console) -> None:
    c = console.client
    for path in GETS[:-1]:
        async with c.get(path, headers=console.bearer()) as resp:
            assert resp.status == 200, (path, await resp.text())
            assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
    async with c.get("/ops/api/no-such-route", headers=console.bearer()) as resp:
        assert resp.status == 404
    async with c.get("/v1/badge", headers=console.bearer()) as resp:
        assert resp.status == 401  # the query API does not take an operator token


async def test_the_page_without_a_token_is_a_401_sign_in_form(console: Console) -> None:
    async with console.client.get("/ops/") as resp:
        assert resp.status == 401
        text = await resp.text()
    assert '<form method="post" action="/ops/login">' in text


async def test_sign_in_sets_strict_httponly_cookies_and_refuses_user_tokens(console: Console) -> None:
    c = console.client
    async with c.post("/ops/login", data={"token": console.user_token()}, allow_redirects=False) as resp:
        assert resp.status == 403
        assert "ops_session" not in resp.cookies
    async with c.post("/ops/login", data={"token": ""}, allow_redirects=False) as resp:
        assert resp.status == 401
    token = console.operator()
    async with c.post(
        "/ops/login", data={"token": token}, headers={"Origin": "http://evil.example"}, allow_redirects=False
    ) as resp:
        assert resp.status == 403  # login CSRF: a cross-origin form cannot sign anyone in
    async with c.post("/ops/login", data={"token": token}, allow_redirects=False) as resp:
        assert resp.status == 303
        session, csrf = resp.cookies["ops_session"], resp.cookies["ops_csrf"]
    assert session.value == token
    assert session["httponly"] and session["samesite"] == "Strict" and session["path"] == "/ops/"
    assert not csrf["httponly"] and csrf["samesite"] == "Strict"
    assert csrf.value == OperatorSigner(OPS_SECRET).csrf_token(token)


# -- CSRF ----------------------------------------------------------------------------------------------


async def test_cookie_authenticated_posts_need_the_signed_double_submit_token(console: Console) -> None:
    await project_user(console)
    c = console.client
    token = console.operator()
    good = OperatorSigner(OPS_SECRET).csrf_token(token)
    path = f"/ops/api/user/{USER}/reconcile"
    cases = [
        ({"ops_session": token, "ops_csrf": good}, {}),  # no header
        # header != cookie (the first character changed, whatever it was)
        (
            {"ops_session": token, "ops_csrf": good},
            {"X-CSRF-Token": ("y" if good[0] == "x" else "x") + good[1:]},
        ),
        ({"ops_session": token, "ops_csrf": "planted"}, {"X-CSRF-Token": "planted"}),  # equal, not signed
        ({"ops_session": token}, {"X-CSRF-Token": good}),  # no cookie
        # Right token, but posted from another origin.
        ({"ops_session": token, "ops_csrf": good}, {"X-CSRF-Token": good, "Origin": "http://evil.example"}),
        (
            {"ops_session": token, "ops_csrf": good},
            {"X-CSRF-Token": good, "Referer": "http://evil.example/x"},
        ),
    ]
    for cookies, headers in cases:
        async with c.post(path, cookies=cookies, headers=headers) as resp:
            assert resp.status == 403, (cookies, headers)
            assert (
                "CSRF" in (await resp.json())["error"]["message"]
                or "cross-origin" in (await resp.json())["error"]["message"]
            )
    # A CSRF token of another session does not pass for this one.
    other = OperatorSigner(OPS_SECRET).csrf_token(console.operator(name="bob"))
    async with c.post(
        path, cookies={"ops_session": token, "ops_csrf": other}, headers={"X-CSRF-Token": other}
    ) as resp:
        assert resp.status == 403
    same_origin = f"http://{c.host}:{c.port}"
    async with c.post(
        path,
        cookies={"ops_session": token, "ops_csrf": good},
        headers={"X-CSRF-Token": good, "Origin": same_origin},
    ) as resp:
        assert resp.status == 200, await resp.text()
    # Bearer (never sent by a browser on its own): no CSRF token, but still no foreign Origin.
    async with c.post(path, headers={**console.bearer(), "Origin": "http://evil.example"}) as resp:
        assert resp.status == 403
    async with c.post(path, headers=console.bearer()) as resp:
        assert resp.status == 200
    # GET never acts: the actions are POST only.
    async with c.get(path, headers=console.bearer()) as resp:
        assert resp.status == 405


# -- inspector and actions ----------------------------------------------------------------------------


async def test_inspector_highlights_drift_and_reconcile_corrects_it_with_correction_frames(
    console: Console,
) -> None:
    await project_user(console)
    c = console.client
    async with c.get(f"/ops/api/user/{USER}", headers=console.bearer()) as resp:
        clean = await resp.json()
    assert clean["counts"] == {"same": 2, "drifted": 0, "missing_in_store": 0, "unknown_to_state": 0}
    assert clean["user_id"] == str(USER) and clean["gate"]["partition"] == 0 and clean["gate"]["hi"] == 120
    before = await console.store.load(USER)
    right = before.rows[CONV_A]
    assert right["unread_count"] == 3 and right["mention_count"] == 1  # seqs 3..5 unread, 4 mentions

    await drift(console, CONV_A, unread_count=9)
    async with c.get(f"/ops/api/user/{USER}", headers=console.bearer()) as resp:
        body = await resp.json()
    row = next(r for r in body["rows"] if r["conversation_id"] == CONV_A)
    assert row["status"] == "drifted"
    assert [f["name"] for f in row["fields"] if f["differs"]] == ["unread_count"]
    unread = next(f for f in row["fields"] if f["name"] == "unread_count")
    assert (unread["stored"], unread["recomputed"]) == (9, 3)
    seq = next(f for f in row["fields"] if f["name"] == "projection_mailbox_seq")
    assert not seq["knowable"] and not seq["differs"]

    async with c.post(f"/ops/api/user/{USER}/reconcile", headers=console.bearer()) as resp:
        result = await resp.json()
        assert resp.status == 200, result
    assert result["written"] and result["rows"] == 1 and result["conversations"] == [CONV_A]
    assert result["version"] == before.projection_mailbox_seq
    after = await console.store.load(USER)
    assert after.rows == before.rows and after.projection_mailbox_seq == before.projection_mailbox_seq
    ((user, deltas, badges),) = console.bus.published
    frame = orjson.loads(deltas[0])
    assert user == USER and frame["correction"] is True and badges == []  # the badge was right
    assert (
        frame["projection_mailbox_seq"]
        == frame["prev_projection_mailbox_seq"]
        == before.projection_mailbox_seq
    )
    assert [r["conversation_id"] for r in frame["conversations"]] == [CONV_A]
    # Nothing left to correct: a second reconcile writes nothing.
    async with c.post(f"/ops/api/user/{USER}/reconcile", headers=console.bearer()) as resp:
        again = await resp.json()
    assert again["written"] is False and len(console.bus.published) == 1
    # The actions are counted on the API's /metrics.
    async with c.get("/metrics") as resp:
        text = await resp.text()
    assert 'projector_ops_actions_total{action="reconcile",outcome="written"} 1.0' in text
    assert 'projector_ops_actions_total{action="reconcile",outcome="clean"} 1.0' in text
    assert 'projector_ops_corrected_rows_total{action="reconcile"} 1.0' in text


async def test_rebuild_rewrites_every_row_and_a_lost_user_is_written_from_state(console: Console) -> None:
    c = console.client
    async with c.post(f"/ops/api/user/{USER}/reconcile", headers=console.bearer()) as resp:
        assert resp.status == 409  # nothing stored: reconcile has nothing to compare with
    async with c.post(f"/ops/api/user/{USER}/rebuild", headers=console.bearer()) as resp:
        lost = await resp.json()
        assert resp.status == 200, lost
    assert lost["mode"] == "write" and lost["rows"] == 2 and lost["version"] == 5
    stored = await console.store.load(USER)
    assert stored.total_unread == 3 and stored.projection_mailbox_seq == 5
    await drift(console, CONV_B, muted=True)
    async with c.post(f"/ops/api/user/{USER}/rebuild", headers=console.bearer()) as resp:
        result = await resp.json()
    assert (
        result["mode"] == "correct"
        and result["rows"] == 2
        and result["frames"] == {"session_delta": 1, "badge": 1}
    )
    assert (await console.store.load(USER)).rows[CONV_B]["muted"] is False
    # State ahead of the store (a change not flushed yet): refused, nothing written.
    console.state.rows[USER][0]["updated_mailbox_seq"] = 99
    async with c.post(f"/ops/api/user/{USER}/rebuild", headers=console.bearer()) as resp:
        assert resp.status == 409 and (await resp.json())["error"]["code"] == "flush_pending"
    async with c.get("/ops/api/user/18446744073709551616", headers=console.bearer()) as resp:
        assert resp.status == 400


async def test_conversation_view_dead_letters_and_fleet(console: Console) -> None:
    await project_user(console)
    c = console.client
    async with c.get(f"/ops/api/conversation/{CONV_A}", headers=console.bearer()) as resp:
        conv = await resp.json()
    assert conv["head"]["latest_conversation_seq"] == 5
    me = next(m for m in conv["members"] if m["user_id"] == str(USER))
    assert me["read_seq_state"] == 2 and me["stored"]["unread_count"] == 3
    assert next(m for m in conv["members"] if m["user_id"] == "7")["stored"] is None
    async with c.get("/ops/api/conversation/not-a-uuid", headers=console.bearer()) as resp:
        assert resp.status == 400

    envelope = {"reason": "unknown type 'x'", "topic": "t", "partition": 1, "offset": 17, "value": "<b>x</b>"}
    console.bus.dead.append(TopicRecord("dl", 0, 3, 1000, "42", orjson.dumps(envelope)))
    console.bus.dead.append(TopicRecord("dl", 1, 0, 999, None, b"\xffnot json"))
    async with c.get("/ops/api/dead-letters", headers=console.bearer()) as resp:
        items = (await resp.json())["items"]
    assert items[0]["reason"] == "unknown type 'x'" and items[0]["source_offset"] == 17
    assert items[0]["record"] == "<b>x</b>"
    assert items[1]["reason"] == "(not a dead-letter envelope)"
    for bad in ("limit=0", "limit=999", "partition=-1", "limit=x"):
        async with c.get(f"/ops/api/dead-letters?{bad}", headers=console.bearer()) as resp:
            assert resp.status == 400, bad

    console.bus.down = True
    async with c.get("/ops/api/dead-letters", headers=console.bearer()) as resp:
        assert resp.status == 503
    console.bus.down = False

    async with c.get("/ops/api/fleet", headers=console.bearer()) as resp:
        fleet = await resp.json()
    p0, p1 = fleet["partitions"]
    assert p0["owners"] == ["http://127.0.0.1:1/metrics"] and p0["hi"] == 120
    assert p0["lanes"] == {"0": 120, "1": 130} and p0["pending"] == 3 and p0["owed_rows"] == 2
    assert p0["lag"] == 10 and p0["dead_letters"] == 4 and p0["drift_ratio"] == 0.25
    assert p1["owners"] == [] and p1["lag"] == 7 and p1["committed"] is None
    assert fleet["serving_namespace"] == "proj" and fleet["totals"]["lag"] == 17
    async with c.get("/ops/api/series", headers=console.bearer()) as resp:
        series = await resp.json()
    assert len(series["t"]) >= 1 and series["lag"][-1] == 17


def test_fleet_summary_reads_rebuilds_and_shows_a_partition_claimed_twice() -> None:
    from app.metrics import RebuildMetrics

    rebuild = RebuildMetrics(namespace="proj-next")
    rebuild.update(3, 4)
    a = parse("http://a/metrics", worker_metrics_text())
    b = parse("http://b/metrics", worker_metrics_text())
    r = parse("http://r/metrics", exposition(rebuild.registry).decode())
    view = summarize([a, b, r], [PartitionOffsets(0, 5, 5)], partitions=1)
    assert view["partitions"][0]["owners"] == ["http://a/metrics", "http://b/metrics"]
    assert view["rebuilds"] == [
        {
            "url": "http://r/metrics",
            "namespace": "proj-next",
            "items": 4,
            "done": 3,
            "ratio": 0.75,
            "diff": None,
        }
    ]
    # Once the rebuild has compared with the serving namespace: its diff counts (an identical
    # rebuild shows zeros, not "not compared yet").
    for counts in (
        {"rows_added": 2, "rows_removed": 1, "rows_changed": 5, "badges_differing": 3},
        {"rows_added": 0, "rows_removed": 0, "rows_changed": 0, "badges_differing": 0},
    ):
        rebuild.update(4, 4)
        rebuild.diffed({**counts, "rows_live": 9, "fields_changed": {"unread_count": 5}})
        r = parse("http://r/metrics", exposition(rebuild.registry).decode())
        (shown,) = summarize([r], [PartitionOffsets(0, 5, 5)], partitions=1)["rebuilds"]
        assert shown["ratio"] == 1.0 and shown["diff"] == counts


# -- configuration, CLI, packaging --------------------------------------------------------------------


def test_settings_keep_the_operator_secret_apart() -> None:
    with pytest.raises(SettingsError, match="must differ from PROJECTOR_API_SECRET"):
        Settings.build(api_secret=API_SECRET, ops_secret=API_SECRET)
    with pytest.raises(SettingsError, match="PROJECTOR_OPS_SECRET: 5 characters"):
        Settings.build(ops_secret="short")
    with pytest.raises(SettingsError, match="not an http"):
        Settings.from_env({"PROJECTOR_OPS_METRICS_URLS": "http://a:1/metrics,ftp://b"})
    s = Settings.from_env({"PROJECTOR_OPS_METRICS_URLS": "http://a:1/metrics, http://b:2/metrics"})
    assert s.ops.ops_metrics_urls == ("http://a:1/metrics", "http://b:2/metrics")
    assert "ops-unit" not in repr(SETTINGS)  # never in logs
    # Without an operator secret the console is not served at all.
    app = create_app(
        SETTINGS.replace(ops_secret=""),
        Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())),
    )
    assert not any(r.canonical.startswith("/ops") for r in app.router.resources())
    with_console = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())))
    assert not any(
        r.canonical.startswith("/ops") for r in with_console.router.resources()
    )  # no deps, no console


def test_projector_token_operator(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PROJECTOR_API_SECRET": API_SECRET, "PROJECTOR_OPS_SECRET": OPS_SECRET}
    done = subprocess.run(
        [sys.executable, "-m", "app", "token", "--operator", "alice", "--ttl", "60"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    import time

    assert OperatorSigner(OPS_SECRET).verify(done.stdout.decode().strip(), time.time()) == "alice"
    bad = subprocess.run(
        [sys.executable, "-m", "app", "token", "--operator", "a b"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
    )
    assert bad.returncode == 2 and b"operator name" in bad.stderr


def test_the_vendored_chart_library_is_the_recorded_release() -> None:
    vendor = ROOT / "app" / "api" / "ops" / "static" / "vendor"
    table = (vendor / "README.md").read_text()
    rows = re.findall(r"\| (\S+) \| uplot \(npm\) \| (\S+) \| MIT[^|]*\| ([0-9a-f]{64}) \|", table)
    assert {name for name, _, _ in rows} == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, version, digest in rows:
        assert version == "1.6.32"
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest
    assert "MIT License" in (vendor / "uPlot.LICENSE").read_text()


def test_the_api_package_imports_no_kafka_client() -> None:
    code = (
        "import sys, app.api, app.api.ops, app.api.ops.views, app.api.ops.inspector;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'faust', 'mode'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_partition_of_matches_the_producers_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from app.kafka.ops import partition_for

    for user in (0, 1, 42, 10**6, 2**64 - 1):
        key = str(user).encode()
        assert partition_for(key, 4) == DefaultPartitioner()(key, [0, 1, 2, 3], [0, 1, 2, 3])
