"""The browser page's member drawer (issue 34, items 3 and 4; seed 004) in a REAL browser:
Debian's headless Chromium driven by Playwright, against `projector api` serving the page and the
TypeScript SDK's browser build from the packed tgz (`npm pack`, PROJECTOR_API_WEB_SDK), with a
500-member group in Cassandra (public profiles with avatars included). The page has no client
rules of its own: the member store, its Web Storage cache, the profiles and the avatar loader are
the SDK's.

* 500 members: the first 50 are shown after ONE round trip (the second page is held back by the
  test until they are); the whole roster, names and statistics follow.
* Avatars are requested only for rows that were visible (IntersectionObserver): never 500 at
  once; scrolling to the end asks for the rows scrolled to, never for the ones skipped over.
* Restart (a new page, the browser's storage kept): the cached 500 are shown before the server
  answers (every member request held); meanwhile one member leaves and one member's name changes
  on the server; once the server answers, page and storage converge to 499 with the new name.
* Remarks (备注, the viewer's own): set on the server through the API, shown in the page and
  kept in its storage; changed and cleared on the server, a restart shows the cached remarks
  first and converges, page and storage, on the server's presentation; a cache read that answers
  only after the server's presentation (the test holds the page's Web Crypto signing until then)
  is dropped, never bringing an old remark back. Another viewer's remark never shows.
* Seed 004's timing scenario: every member/profile request answered 2 s late (the test delays
  them in the browser's network layer); the milestones the page records (cache answer, 500
  cached visible, first 50, full roster) are printed next to the seed's and written to
  `seed004-browser-timings.json` in the test's folder. Only order is asserted, never time.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.stores.cassandra_messages import CassandraMessageStore, NewMessage
from app.stores.cassandra_profiles import CassandraProfileStore, ProfileRow
from app.stores.cassandra_session import open_cluster
from app.stores.cassandra_state import UserConversationStateWriter
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import ROOT, Stack
from tests.integration.test_browser_client import Api
from tests.integration.test_sdk_consumer import _need_node, pack
from tests.support.api import SECRET
from tests.support.chromium import launched_chromium
from tests.support.rows import cid, flush, make_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

USER = 11982011376358104761  # JavaScript would read 11982011376358105000
MEMBERS = 500
WAIT_S = 90.0  # generous: a loaded 2-core machine; the page reacts in well under a second
UPSTREAM_DELAY_S = 2.0  # the seed's fake upstream
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)
MEMBER_API = ("/api/v1/chats/members/", "/api/v1/users/profiles")
SEED = {"cache_answer_ms": 44, "cached_visible_ms": 89, "first50_ms": 2000, "complete_ms": 32000}


class Group:
    """USER's group of 500 in the stack's Cassandra, with a profile (name, avatar) for each."""

    def __init__(self, stack: Stack, api_url: str, size: int = MEMBERS) -> None:
        self.stack = stack
        self.id = cid(1)
        self.api_url = api_url
        self.ids = sorted([USER, *range(10_001, 10_001 + size - 1)])

    def name(self, user_id: int) -> str:
        """The public display name seeded for `user_id`."""
        return f"Member {user_id}"

    def avatar(self, user_id: int, version: int = 1) -> str:
        return f"{self.api_url}/avatars/{user_id}-{version}.png"

    async def _session(self) -> tuple[Any, Any]:
        return await asyncio.to_thread(open_cluster, self.stack.settings.cassandra)

    async def seed(self) -> None:
        cluster, session = await self._session()
        try:
            keyspace = self.stack.settings.cassandra.cassandra_keyspace
            writer = UserConversationStateWriter(session, keyspace)
            for user_id in self.ids:
                writer.stage_member(
                    self.id, user_id, "owner" if user_id == USER else "member", "active", 1, None
                )
            await writer.flush()
            rows = [ProfileRow(u, self.name(u), self.avatar(u)) for u in self.ids]
            await CassandraProfileStore(session, keyspace).put(rows, 1)
        finally:
            cluster.shutdown()

    async def leave_and_rename(self, gone: int, renamed: int, name: str) -> None:
        """On the server: `gone` leaves the group; `renamed` gets a new public name."""
        cluster, session = await self._session()
        try:
            keyspace = self.stack.settings.cassandra.cassandra_keyspace
            writer = UserConversationStateWriter(session, keyspace)
            writer.stage_member(self.id, gone, "member", "left", 1, 2)
            await writer.flush()
            await CassandraProfileStore(session, keyspace).put(
                [ProfileRow(renamed, name, self.avatar(renamed))], int(time.time() * 1000)
            )
        finally:
            cluster.shutdown()


async def seed_list(stack: Stack) -> None:
    """USER's conversation list: the group and a few others (the page's rows to click)."""
    store = RedisProjectionStore.from_settings(stack.settings.redis)
    try:
        rows = [{**make_row(USER, n, act=n * 10), "projection_mailbox_seq": 5} for n in range(1, 6)]
        [written] = await store.write([flush(USER, rows, 5, 1, Badge())])
        assert written is not None
    finally:
        await store.aclose()


class Network:
    """The browser's member requests as the test sees them: which went out, in what order; some
    held until released, or all answered UPSTREAM_DELAY_S late; avatars answered from here."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (kind, detail) in the order they happened
        self.avatars: list[str] = []
        self.hold_pages_after = -1  # page requests beyond this many are held (-1: none)
        self.pages_seen = 0
        self.released = asyncio.Event()
        self.delay_s = 0.0

    async def install(self, page: Any) -> None:
        await page.route("**/avatars/**", self._avatar)
        await page.route("**/api/v1/chats/members/**", self._member)
        await page.route("**/api/v1/users/profiles", self._member)

    def answered(self, kind: str) -> int:
        return sum(1 for k, _ in self.log if k == f"{kind} answered")

    async def _avatar(self, route: Any) -> None:
        self.avatars.append(route.request.url)
        await route.fulfill(status=200, content_type="image/png", body=PNG)

    async def _member(self, route: Any) -> None:
        url = route.request.url
        kind = "page" if url.endswith("/members/page") else "presentation"
        kind = "profiles" if "profiles" in url else kind
        self.log.append((f"{kind} sent", url))
        if kind == "page":
            self.pages_seen += 1
            if self.hold_pages_after >= 0 and self.pages_seen > self.hold_pages_after:
                await self.released.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        response = await route.fetch()
        self.log.append((f"{kind} answered", url))
        await route.fulfill(response=response)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with launched_chromium() as chromium:
        yield chromium


async def until(page: Any, expression: str, what: str = "") -> None:
    deadline = time.monotonic() + WAIT_S
    while not await page.evaluate(expression):
        if time.monotonic() > deadline:
            counters = await page.evaluate(
                "JSON.stringify({c: window.__sp.store && window.__sp.store.counters, t: window.__sp.timings})"
            )
            raise AssertionError(f"not met after {WAIT_S} s: {what or expression}; {counters}")
        await asyncio.sleep(0.05)


ROWS = "document.querySelectorAll('#member-list li.member').length"
COMPLETE = "window.__sp.timings && window.__sp.timings.complete !== undefined"
STORED = """(async () => {
  const r = await window.__sp.cache.load(window.__sp.store.key);
  return r && r.members.map((m) => [m.userId, m.displayName]);
})()"""
VISIBLE_AVATARS = """(() => {
  const list = document.getElementById('member-list').getBoundingClientRect();
  return [...document.querySelectorAll('#member-list li.member')].filter((li) => {
    const r = li.getBoundingClientRect();
    // In the list's box and in the viewport (with the loader's 100px margin: a superset of what
    // the IntersectionObserver reports as visible).
    const inList = r.bottom > list.top - 100 && r.top < list.bottom + 100;
    return inList && r.bottom > -100 && r.top < innerHeight + 100;
  }).map((li) => li.querySelector('img').dataset.url);
})()"""


async def sign_in_and_open(page: Any, api: Api, token: str, group: str, query: str = "") -> None:
    await page.goto(f"{api.url}/app/{query}")
    await page.fill("#token", token)
    await page.click("#connect")
    row = page.locator(f'#list li.row[data-conversation-id="{group}"]')
    await row.wait_for(timeout=WAIT_S * 1000)
    await row.click()


async def start(
    make_stack: Callable[..., Stack],
    tmp_path: Path,
    prefix: str,
    size: int = MEMBERS,
    group_type: type[Group] = Group,
) -> tuple[Stack, Api, Group, str]:
    _need_node()
    stack = make_stack(prefix, partitions=1, lanes=1)
    tgz = pack(tmp_path, tmp_path / "npm.log")  # the page's SDK: the packed tgz, as shipped
    api = Api(stack, tmp_path)
    api.env["PROJECTOR_API_WEB_SDK"] = str(tgz)
    api.env["PROJECTOR_API_RATE_LIMIT_PER_S"] = "0"
    group = group_type(stack, api.url, size)
    await group.seed()
    await seed_list(stack)
    await api.start()
    token = TokenSigner(SECRET).mint(USER, int(time.time()) + 3600)
    return stack, api, group, token


async def test_the_page_member_store_pages_caches_converges_and_loads_visible_avatars(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    _, api, group, token = await start(make_stack, tmp_path, "bmem")
    context = await browser.new_context()
    try:
        # -- first visit: one round trip shows the first 50 ------------------------------------
        page = await context.new_page()
        net = Network()
        net.hold_pages_after = 1  # the second page waits until the test has seen the first 50
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, f"{ROWS} === 50", "the first page's 50 rows")
        assert net.answered("page") == 1 and net.pages_seen == 2, net.log
        names = await page.locator("#member-list li.member .name").all_text_contents()
        assert names[0] in (str(group.ids[0]), f"Member {group.ids[0]}")
        net.released.set()
        await until(page, COMPLETE, "the whole roster with names")
        assert await page.evaluate(ROWS) == MEMBERS
        assert net.answered("page") == MEMBERS // 50
        shown = await page.locator("#member-list li.member .name").all_text_contents()
        assert shown == [f"Member {u}" for u in group.ids]  # user id order, names from profiles
        counters = await page.evaluate("window.__sp.store.counters")
        assert counters["maxPresentationInFlight"] <= 2 and counters["cacheHits"] == 0
        assert await page.locator("#members").get_attribute("data-self-role") == "owner"
        assert await page.locator("#members").get_attribute("data-can-remove") == "true"

        # Avatars: only the rows that were visible, never the whole roster.
        await asyncio.sleep(0.5)  # let the observer report what is on screen
        visible = set(await page.evaluate(VISIBLE_AVATARS))
        asked = set(net.avatars)
        assert asked and asked <= visible, (sorted(asked - visible)[:5], len(asked), len(visible))
        assert len(asked) < 50, len(asked)
        # The last row scrolled into view (the list and the page), straight past the middle.
        await page.evaluate("document.querySelector('#member-list li.member:last-child').scrollIntoView()")
        last = group.avatar(group.ids[-1])
        deadline = time.monotonic() + WAIT_S
        while last not in net.avatars:
            assert time.monotonic() < deadline, "the last row's avatar was not asked for"
            await asyncio.sleep(0.05)
        middle = group.avatar(group.ids[MEMBERS // 2])
        assert middle not in net.avatars, "a row scrolled past (never visible) had its avatar loaded"
        assert len(set(net.avatars)) < 100

        # The roster went to this browser's storage (written from the server's answers only).
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        stored = await page.evaluate(STORED)
        assert [int(u) for u, _ in stored] == group.ids
        await page.close()

        # -- on the server: one member leaves, one is renamed --------------------------------------
        gone, renamed = group.ids[7], group.ids[123]
        await group.leave_and_rename(gone, renamed, "Renamed 123")

        # -- restart: the cached 500 before the server answers, then convergence --------------------
        page = await context.new_page()
        net = Network()
        net.hold_pages_after = 0  # no member page is answered until the test says so
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, f"{ROWS} === {MEMBERS}", "the cached roster")
        assert net.answered("page") == 0 and net.pages_seen >= 1, net.log  # asked, not answered
        assert await page.evaluate("window.__sp.store.counters.cacheHits") == 1
        assert await page.locator("#members").get_attribute("data-fresh") == "false"
        assert await page.locator("#member-status").text_content() == ""  # a silent refresh
        assert await page.locator(f'#member-list li[data-member-ref="{gone}"]').count() == 1
        net.released.set()
        await until(page, COMPLETE, "the refreshed roster")
        await until(page, f"{ROWS} === {MEMBERS - 1}", "the removal in the page")
        assert await page.locator(f'#member-list li[data-member-ref="{gone}"]').count() == 0
        renamed_row = page.locator(f'#member-list li[data-member-ref="{renamed}"] .name')
        name_js = f"document.querySelector('#member-list li[data-member-ref=\"{renamed}\"] .name')"
        await until(page, f"{name_js}.textContent === 'Renamed 123'", "the new name in the page")
        assert await renamed_row.text_content() == "Renamed 123"
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        stored = dict(await page.evaluate(STORED))
        assert len(stored) == MEMBERS - 1 and str(gone) not in stored
        assert stored[str(renamed)] == "Renamed 123"
        assert await page.evaluate("window.__sp.store.counters.removalsConfirmed") == 1
        await page.screenshot(path=str(tmp_path / "browser-members.png"), full_page=True)
        if os.environ.get("SP_DOCS_SCREENSHOT"):
            await page.screenshot(path=str(ROOT / "docs" / "browser-members.png"), full_page=True)
    finally:
        await context.close()
        api.stop()


async def test_seed_004_timing_scenario_with_a_2s_upstream(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    _, api, group, token = await start(make_stack, tmp_path, "btim")
    context = await browser.new_context()
    try:
        page = await context.new_page()
        net = Network()
        net.delay_s = UPSTREAM_DELAY_S
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, COMPLETE, "the whole roster behind a 2 s upstream")
        cold = await page.evaluate("window.__sp.timings")
        # Order, not time: the first 50 were shown before the second page was answered.
        assert cold["first50"] < cold["fresh"] <= cold["complete"]
        counters = await page.evaluate("window.__sp.store.counters")
        assert counters["pages"] == MEMBERS // 50 and counters["maxPresentationInFlight"] <= 2
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        await page.close()

        page = await context.new_page()
        net = Network()
        net.delay_s = UPSTREAM_DELAY_S
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        cached = "window.__sp.timings && window.__sp.timings.cachedVisible !== undefined"
        await until(page, cached, "the cached roster")
        assert net.answered("page") == 0  # shown before the server answered
        await until(page, COMPLETE, "the refresh behind the 2 s upstream")
        warm = await page.evaluate("window.__sp.timings")
        assert warm["cacheHit"] is True and warm["cachedVisibleCount"] == MEMBERS
        assert warm["cachedVisible"] < warm["first50"]
        ours = {
            "cache_answer_ms": round(warm["cacheAnswer"], 1),
            "cached_visible_ms": round(warm["cachedVisible"], 1),
            "first50_ms": round(cold["first50"]),
            "complete_ms": round(cold["complete"]),
            "fresh_ms": round(cold["fresh"]),
        }
        report = {"upstream_delay_s": UPSTREAM_DELAY_S, "members": MEMBERS, "seed": SEED, "ours": ours}
        (tmp_path / "seed004-browser-timings.json").write_text(json.dumps(report, indent=2))
        print("\nseed 004 timings (browser, 2 s upstream):")
        for name, seed in SEED.items():
            print(f"  {name:18} seed ~{seed} ms   ours {ours[name]} ms")
    finally:
        await context.close()
        api.stop()


REMARK_SIZE = 60  # two pages: enough for a roster, quick to seed and walk
# Holds every Web Crypto signature the page asks for while its member store is not fresh: the
# cache's read (which verifies a signature) then answers only after the server's answer, when
# the test calls window.__releaseCache(). The store's own write (after "fresh") is not held.
HOLD_CACHE_READ = """(() => {
  const sign = SubtleCrypto.prototype.sign;
  let release;
  const released = new Promise((resolve) => (release = resolve));
  window.__releaseCache = () => release();
  window.__heldSigns = 0;
  SubtleCrypto.prototype.sign = async function (...args) {
    const store = window.__sp && window.__sp.store;
    if (!(store && store.fresh)) {
      window.__heldSigns += 1;
      await released;
    }
    return sign.apply(this, args);
  };
})();"""
STORED_REMARKS = """(async () => {
  const r = await window.__sp.cache.load(window.__sp.store.key);
  return r && Object.fromEntries(r.members.filter((m) => m.remark !== null).map((m) => [m.userId, m.remark]));
})()"""


def row_name(user_id: int) -> str:
    return f"document.querySelector('#member-list li[data-member-ref=\"{user_id}\"] .name').textContent"


async def remark(api: Api, method: str, viewer: int, target: int, text: str | None = None) -> None:
    """PUT or DELETE `viewer`'s remark on `target` through the API (another device of the viewer)."""
    import aiohttp

    token = TokenSigner(SECRET).mint(viewer, int(time.time()) + 3600)
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method,
            f"{api.url}/api/v1/users/{target}/remark",
            json=None if text is None else {"remark": text},
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        answer = await response.json()
        assert response.status == 200, answer
        assert answer["remark"] == (None if text is None else text.strip())


async def test_a_remark_changed_on_the_server_converges_in_the_page_and_its_storage(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    _, api, group, token = await start(make_stack, tmp_path, "brem", size=REMARK_SIZE)
    changed, cleared, others = group.ids[3], group.ids[17], group.ids[40]
    other_viewer = group.ids[5]
    await remark(api, "PUT", USER, changed, "Old note")
    await remark(api, "PUT", USER, cleared, "  To be cleared ")
    await remark(api, "PUT", other_viewer, others, "Not USER's note")  # per viewer: never shown to USER
    context = await browser.new_context()
    try:
        # -- first visit: the remarks come with the presentation and go to storage ------------------
        page = await context.new_page()
        await sign_in_and_open(page, api, token, group.id)
        await until(page, COMPLETE, "the roster with remarks")
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        assert await page.evaluate(row_name(changed)) == "Old note"
        assert await page.evaluate(row_name(cleared)) == "To be cleared"
        assert await page.evaluate(row_name(others)) == f"Member {others}"
        assert await page.evaluate(STORED_REMARKS) == {
            str(changed): "Old note",
            str(cleared): "To be cleared",
        }
        await page.close()

        # -- on the server: one remark changed, one cleared ---------------------------------------
        await remark(api, "PUT", USER, changed, "New note")
        await remark(api, "DELETE", USER, cleared)

        # -- restart: the cached remarks first, then the server's presentation wins ---------------
        page = await context.new_page()
        net = Network()
        net.hold_pages_after = 0  # nothing answered until the cached roster is on screen
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, f"{ROWS} === {REMARK_SIZE}", "the cached roster")
        assert net.answered("page") == 0 and net.answered("presentation") == 0, net.log
        assert await page.evaluate("window.__sp.store.counters.cacheHits") == 1
        assert await page.evaluate(row_name(changed)) == "Old note"  # the cache's, for now
        assert await page.evaluate(row_name(cleared)) == "To be cleared"
        net.released.set()
        await until(page, COMPLETE, "the refreshed roster")
        await until(page, f"{row_name(changed)} === 'New note'", "the changed remark in the page")
        await until(page, f"{row_name(cleared)} === 'Member {cleared}'", "the cleared remark in the page")
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        assert await page.evaluate(STORED_REMARKS) == {str(changed): "New note"}
        await page.close()

        # -- a late cache: it answers only after the server's presentation, and is dropped --------
        await remark(api, "PUT", USER, changed, "Newest note")
        page = await context.new_page()
        await page.add_init_script(HOLD_CACHE_READ)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, COMPLETE, "the server's roster while the cache read is held")
        assert await page.evaluate("window.__heldSigns") >= 1  # the cache read was really held
        assert await page.evaluate("window.__sp.store.counters.cacheHits") == 0
        assert await page.evaluate(row_name(changed)) == "Newest note"
        await until(page, "window.__sp.store.counters.cacheWrites >= 1", "the cache write")
        await page.evaluate("window.__releaseCache()")
        await until(page, "window.__sp.store.counters.lateCacheDropped === 1", "the late cache dropped")
        assert await page.evaluate("window.__sp.store.counters.cacheHits") == 0
        assert await page.evaluate(row_name(changed)) == "Newest note"
        assert await page.evaluate(row_name(cleared)) == f"Member {cleared}"
        assert await page.evaluate(STORED_REMARKS) == {str(changed): "Newest note"}
    finally:
        await context.close()
        api.stop()


# -- the @-candidates and the read-receipt details (the drawer's store, seed 004) ------------------

FIRST_NAMES = ("Ada", "Adam", "Bea", "Ben", "Cy", "Dora")  # "ada" matches Ada and Adam
VIEW_SIZE = 120  # three member pages of 50, three read-receipt pages of 50
READ_SEQ = 8
MENTION_ROWS = 10  # app.js: candidates rendered at first and per scroll to the end


class NamedGroup(Group):
    """USER's group with first names sharing prefixes, and one message (READ_SEQ) sent by the
    first member, read by every third other member: the server's truth for the views."""

    def __init__(self, stack: Stack, api_url: str, size: int = VIEW_SIZE) -> None:
        super().__init__(stack, api_url, size)
        self.first_names = {u: FIRST_NAMES[i % len(FIRST_NAMES)] for i, u in enumerate(self.ids)}
        self.sender = self.ids[0]
        self.readers = {u for i, u in enumerate(self.ids) if i % 3 == 1}

    def name(self, user_id: int) -> str:
        return f"{self.first_names[user_id]} {user_id}"

    def read_truth(self, members: list[int]) -> tuple[list[str], list[str]]:
        """(read, not read) of READ_SEQ among `members`, as the API orders them."""
        others = [u for u in members if u != self.sender]
        return [str(u) for u in others if u in self.readers], [
            str(u) for u in others if u not in self.readers
        ]

    async def seed(self) -> None:
        await super().seed()
        cluster, session = await self._session()
        try:
            keyspace = self.stack.settings.cassandra.cassandra_keyspace
            writer = UserConversationStateWriter(session, keyspace)
            for user_id in self.readers:
                writer.stage(user_id, self.id, {"read_seq": READ_SEQ})
            await writer.flush()
            message = NewMessage(
                self.id, READ_SEQ, "m-read", "0" * 31 + "8", self.sender, 1, True, frozenset()
            )
            await asyncio.to_thread(CassandraMessageStore(session, keyspace).put_messages, [message])
        finally:
            cluster.shutdown()


CANDIDATES = "[...document.querySelectorAll('#mention-list li.candidate')].map((li) => li.dataset.memberRef)"
CANDIDATE_NAMES = (
    "[...document.querySelectorAll('#mention-list li.candidate .name')].map((e) => e.textContent)"
)
PAGE_MEMBER_REQUESTS = "window.__sp.store.counters"
SCROLL_CANDIDATES_TO_END = (
    "(() => { const ul = document.getElementById('mention-list'); ul.scrollTop = 1e9; })()"
)


def visible_avatars(rows: str, box: str) -> str:
    """The avatar URLs of `rows` inside `box` and the viewport (with the loader's 100px margin:
    a superset of what the IntersectionObserver reports as visible)."""
    return f"""(() => {{
  const box = document.querySelector('{box}').getBoundingClientRect();
  return [...document.querySelectorAll('{rows}')].filter((li) => {{
    const r = li.getBoundingClientRect();
    const inBox = r.bottom > box.top && r.top < box.bottom;
    return inBox && r.bottom > -100 && r.top < innerHeight + 100;
  }}).map((li) => li.querySelector('img').dataset.url);
}})()"""


async def type_mention(page: Any, text: str) -> None:
    """Replace the compose box's text with `text` (one input event, the caret at its end)."""
    await page.fill("#compose-text", text)


async def all_candidates(page: Any, expected_matches: int) -> list[str]:
    """The candidate rows once the list was scrolled to its end until every match is rendered
    (and left scrolled to its end)."""
    await until(page, f"document.getElementById('mention-list').dataset.matches === '{expected_matches}'")
    for _ in range(expected_matches // MENTION_ROWS + 2):
        await page.evaluate(SCROLL_CANDIDATES_TO_END)  # the page renders more rows at the end
        await asyncio.sleep(0.2)
        if len(await page.evaluate(CANDIDATES)) >= expected_matches:
            break
    await page.evaluate(SCROLL_CANDIDATES_TO_END)
    shown: list[str] = await page.evaluate(CANDIDATES)
    return shown


async def test_the_at_picker_filters_the_drawers_store_and_follows_a_removal_and_a_remark(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    _, api, group, token = await start(make_stack, tmp_path, "bment", VIEW_SIZE, NamedGroup)
    assert isinstance(group, NamedGroup)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        net = Network()
        await net.install(page)
        await sign_in_and_open(page, api, token, group.id)
        await until(page, COMPLETE, "the drawer's roster with names")
        requests_before = len(net.log)
        counters_before = await page.evaluate(PAGE_MEMBER_REQUESTS)

        def matching(prefix: str) -> list[str]:
            return [str(u) for u in group.ids if u != USER and group.name(u).lower().startswith(prefix)]

        # "@adam": exactly the Adams, a screenful first, the rest as the list scrolls.
        adams = matching("adam")
        assert len(adams) > MENTION_ROWS
        await type_mention(page, "hi @adam")
        await until(page, f"{CANDIDATES}.length === {MENTION_ROWS}", "the first candidates")
        assert await page.evaluate(CANDIDATES) == adams[:MENTION_ROWS]
        assert await page.evaluate(CANDIDATE_NAMES) == [group.name(int(u)) for u in adams[:MENTION_ROWS]]
        # Avatars: only for candidate rows that were visible (the list shows about 6 of 10).
        await asyncio.sleep(0.5)
        visible = set(await page.evaluate(visible_avatars("#mention-list li.candidate", "#mention-list")))
        asked = await page.evaluate("window.__sp.viewAvatarLoads.mentions")
        assert asked and set(asked) <= visible and len(asked) < MENTION_ROWS, (asked, visible)
        assert await all_candidates(page, len(adams)) == adams
        last = group.avatar(int(adams[-1]))
        await until(page, f"window.__sp.viewAvatarLoads.mentions.includes('{last}')", "the last row's avatar")
        asked = await page.evaluate("window.__sp.viewAvatarLoads.mentions")
        assert len(asked) < len(adams), "rows scrolled past (never visible) had their avatars loaded"
        # A shorter prefix: Ada and Adam (the prefix is over the whole name, case folded).
        await type_mention(page, "hi @Ada")
        assert await all_candidates(page, len(matching("ada"))) == matching("ada")

        # One store: the drawer's members, never requested again, the very same objects.
        assert len(net.log) == requests_before, net.log[requests_before:]
        assert await page.evaluate(PAGE_MEMBER_REQUESTS) == counters_before
        assert await page.evaluate(
            "window.__sp.picker.store === window.__sp.store && window.__sp.picker.matches.every("
            "(m) => m === window.__sp.store.member(m.memberRef))"
        )

        # Choosing one (Enter on the first): its name goes into the text, the picker closes.
        await type_mention(page, "hi @adam")
        await until(page, f"{CANDIDATES}.length === {MENTION_ROWS}")
        await page.keyboard.press("ArrowDown")
        await page.keyboard.press("Enter")
        assert await page.input_value("#compose-text") == f"hi @{group.name(int(adams[1]))} "
        assert await page.locator("#mentioned").get_attribute("data-refs") == adams[1]
        assert await page.locator("#mention-list").is_hidden()
        await type_mention(page, "@zz")
        await until(
            page, "document.getElementById('mention-status').textContent === 'no member matches \"@zz\"'"
        )

        # On the server: an Adam leaves, a Cy is renamed "Adamo", USER notes a Bea as "Adam's sister".
        gone = int(adams[0])
        renamed = next(u for u in group.ids if group.first_names[u] == "Cy")
        noted = next(u for u in group.ids if group.first_names[u] == "Bea")
        await group.leave_and_rename(gone, renamed, f"Adamo {renamed}")
        await remark(api, "PUT", USER, noted, "Adam's sister")
        await page.click("#member-refresh")
        await until(page, "window.__sp.store.counters.traversalsCompleted >= 2", "the re-read")
        await until(page, "window.__sp.store.counters.removalsConfirmed === 1", "the removal")
        await type_mention(page, "@adam")
        expected = sorted([*(int(u) for u in adams[1:]), renamed, noted])
        assert await all_candidates(page, len(expected)) == [str(u) for u in expected]
        noted_row = f'#mention-list li[data-member-ref="{noted}"]'
        assert await page.locator(f"{noted_row} .name").text_content() == "Adam's sister"
        assert await page.locator(f"{noted_row} .also").text_content() == group.name(noted)
        assert await page.locator(f'#mention-list li[data-member-ref="{gone}"]').count() == 0
        assert await page.evaluate(f"window.__sp.store.member('{gone}')") is None
    finally:
        await context.close()
        api.stop()


READ_ROWS = "[...document.querySelectorAll('#{list} li.reader')].map((li) => li.dataset.memberRef)"
READ_PAGE = 50


async def test_the_read_view_pages_the_servers_read_facts_with_names_from_the_shared_store(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    _, api, group, token = await start(make_stack, tmp_path, "bread", VIEW_SIZE, NamedGroup)
    assert isinstance(group, NamedGroup)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        net = Network()
        await net.install(page)
        readers_requests: list[str] = []

        async def log_readers(route: Any) -> None:
            readers_requests.append(route.request.url)
            await route.continue_()

        await page.route("**/messages/*/readers*", log_readers)
        await sign_in_and_open(page, api, token, group.id, f"?readLimit={READ_PAGE}")
        await until(page, COMPLETE, "the drawer's roster with names")
        member_requests = len(net.log)

        await page.fill("#read-seq", str(READ_SEQ))
        await page.click("#read-open")
        await until(page, "document.getElementById('reads').dataset.pages === '1'", "the first read page")
        read, unread = group.read_truth(group.ids[:READ_PAGE])
        assert await page.evaluate(READ_ROWS.format(list="read-list")) == read
        assert await page.evaluate(READ_ROWS.format(list="unread-list")) == unread
        names = await page.locator("#read-list li.reader .name").all_text_contents()
        assert names == [group.name(int(u)) for u in read]  # from the drawer's store
        assert await page.locator("#read-error").is_hidden()  # a silent view: no "updating" line

        # Avatars only for the read rows that were visible.
        await page.evaluate("document.getElementById('read-list').scrollIntoView()")
        await asyncio.sleep(0.5)
        visible = set(await page.evaluate(visible_avatars("#reads li.reader", "#read-list")))
        visible |= set(await page.evaluate(visible_avatars("#reads li.reader", "#unread-list")))
        asked = await page.evaluate("window.__sp.viewAvatarLoads.reads")
        assert asked and set(asked) <= visible, (asked, visible)
        assert len(asked) < len(read) + len(unread)

        # Page on to the end: exactly the server's truth for the seq.
        while await page.locator("#read-more").is_visible():
            pages = await page.evaluate("document.getElementById('reads').dataset.pages")
            await page.click("#read-more")
            await until(page, f"document.getElementById('reads').dataset.pages === '{int(pages) + 1}'")
        read, unread = group.read_truth(group.ids)
        assert await page.evaluate(READ_ROWS.format(list="read-list")) == read
        assert await page.evaluate(READ_ROWS.format(list="unread-list")) == unread
        assert await page.locator("#read-count").text_content() == str(len(read))
        assert await page.locator("#unread-count").text_content() == str(len(unread))
        assert await page.evaluate("document.getElementById('reads').dataset.pages") == str(
            -(-VIEW_SIZE // READ_PAGE)
        )
        assert len(readers_requests) == -(-VIEW_SIZE // READ_PAGE)
        assert all("basic_only=true" in u and f"limit={READ_PAGE}" in u for u in readers_requests)
        # One store: the read view asked the server for no member the drawer had loaded.
        assert len(net.log) == member_requests, net.log[member_requests:]

        # An unknown message: the API's 404, said plainly, no rows.
        await page.fill("#read-seq", "999")
        await page.click("#read-open")
        await until(page, "document.getElementById('read-error').textContent !== ''", "the 404")
        await until(page, "document.getElementById('read-error').textContent !== 'loading…'", "the 404")
        assert await page.locator("#read-error").text_content() == "No message #999 in this conversation."
        assert await page.evaluate(READ_ROWS.format(list="read-list")) == []
        assert await page.locator("#read-more").is_hidden()
        # Not a message number: said before any request goes out.
        asked_before = len(readers_requests)
        await page.fill("#read-seq", "0")
        await page.click("#read-open")
        text = await page.locator("#read-error").text_content()
        assert text is not None and text.startswith('"0" is not a message number')
        assert len(readers_requests) == asked_before
    finally:
        await context.close()
        api.stop()
