"""The browser client (app/web/, served at /app/) in a REAL browser: Debian's headless Chromium
driven by Playwright (installed by scripts/tools.d/chromium.sh), against `projector api` (with
its gateway) and the real worker on the local servers.

The page signs in with a token, shows the first page, walks on with the cursor; a message produced
through the worker moves its conversation to the top and changes the badge; a pin in the middle
of the walk restarts the list; member notices re-read the roster; a dropped connection resumes
from the gateway's log, and a killed gateway (frames missed while it was down) ends in a re-pull
with exactly the store's counts. The user id is a u64 JavaScript cannot hold as a number.

Set SP_DOCS_SCREENSHOT=1 to refresh docs/browser-client.png from this run.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.api.tokens import TokenSigner
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, store_messages
from tests.support.api import SECRET
from tests.support.builders import StreamBuilder
from tests.support.chromium import launched_chromium

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

USER = 11982011376358104761  # JavaScript would read 11982011376358105000
OTHER = 4242
CONVERSATIONS = [str(uuid.UUID(int=0xC0FFEE_000 + i)) for i in range(25)]
WAIT_MS = 45_000  # generous: a loaded 2-core CI machine; the page reacts in well under a second


class Traffic:
    """Mailbox entries for USER, one lane, activity ids increasing with every message."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stream = StreamBuilder(lanes=1)
        self.activity = 0
        self.conv_seq: dict[str, int] = {}

    def message(
        self, conversation: str, sender: int = 99, notification: int | None = None
    ) -> tuple[int, int]:
        """(conversation_seq, mailbox_seq); with `notification`: a member notice (counts not)."""
        seq = self.conv_seq[conversation] = self.conv_seq.get(conversation, 0) + 1
        self.activity += 1
        kind = {} if notification is None else {"notification": notification}
        mailbox_seq = self.stream.entry(
            "message",
            USER,
            conversation,
            conversation_seq=seq,
            message_id=f"m-{conversation[-4:]}-{seq}",
            activity_id=f"{self.activity:032x}",
            sender_id=sender,
            created_at=self.stream.ts,
            counts_unread=notification is None,
            mention=False,
            **kind,
        )
        return seq, mailbox_seq

    async def send(self) -> int:
        """Store the messages in the MessageStore (as the chat backend does first: the page's login
        reconcile recounts from there), produce the entries (then a marker) and wait until the
        worker stored them."""
        self.stream.marker(0)
        lines, self.stream.lines = self.stream.lines, []
        await asyncio.to_thread(store_messages, self.stack.settings, lines)
        await self.stack.produce(lines)
        await self.stack.wait_for_versions({USER: self.stream.seq}, timeout=120, alive=self.stack.alive())
        return self.stream.seq


class Api:
    """`projector api` (with its gateway) as a subprocess on a fixed port: killable, restartable."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.port = free_port()
        self.env = {
            **stack.env,
            "PROJECTOR_API_SECRET": SECRET,
            "PROJECTOR_API_FILL_FROM_STATE": "never",
            "PROJECTOR_GATEWAY_HEARTBEAT_MS": "1000",
            "PROJECTOR_GATEWAY_PRESENCE_TTL_MS": "5000",
            "PROJECTOR_PUSH_WINDOW_MS": "500",
        }
        self.log = tmp / "api.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 1  # "listening" lines the log must show once the current process is up

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*PROJECTOR, "api", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while self.log.read_text(errors="replace").count("projector api: listening on") < self.starts:
            if self.proc.poll() is not None:
                raise AssertionError(f"projector api exited:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"projector api did not start:\n{self.log.read_text()[-3000:]}")
            await asyncio.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.starts += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with launched_chromium() as chromium:
        yield chromium


async def js(page: Any, expression: str) -> Any:
    return await page.evaluate(expression)


async def until_js(page: Any, expression: str) -> None:
    # Polled from here: wait_for_function evaluates its predicate with eval() in the page, which
    # the client's Content-Security-Policy (rightly) forbids.
    deadline = time.monotonic() + WAIT_MS / 1000
    while not await page.evaluate(expression):
        if time.monotonic() > deadline:
            state = await page.evaluate(
                "JSON.stringify({list: window.__sp.list.stats, stream: window.__sp.stream.stats})"
            )
            raise AssertionError(f"not met after {WAIT_MS} ms: {expression}; {state}")
        await asyncio.sleep(0.1)


async def stored_badge(stack: Stack) -> tuple[int, dict[str, Any]]:
    rows, badges = await stack.projection([USER])
    [badge] = badges
    return badge["total_unread"], {r["conversation_id"]: r for r in rows}


async def test_the_browser_client_lists_follows_restarts_and_resumes(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    from playwright.async_api import expect

    stack = make_stack("gwb", partitions=2, lanes=1)
    traffic = Traffic(stack)
    first_group = CONVERSATIONS[0]
    for user in (USER, OTHER):  # a roster for the members panel (the worker mirrors joins)
        traffic.stream.entry("join", user, first_group, joined_at_conversation_seq=0)
    for conversation in CONVERSATIONS:
        traffic.message(conversation)
    stack.start_worker()
    await traffic.send()
    api = Api(stack, tmp_path)
    await api.start()
    token = TokenSigner(SECRET).mint(USER, int(time.time()) + 3600)
    page = await browser.new_page()
    try:
        await page.goto(f"{api.url}/app/?limit=10")
        await page.fill("#token", token)
        await page.click("#connect")
        rows = page.locator("#list li.row")

        # The first page renders: 10 rows, newest first, the badge, the exact u64 id.
        await expect(rows).to_have_count(10, timeout=WAIT_MS)
        await expect(rows.first).to_have_attribute("data-conversation-id", CONVERSATIONS[-1])
        await expect(page.locator("#badge")).to_have_text("25", timeout=WAIT_MS)
        await expect(page.locator("#user")).to_have_text(str(USER))

        # A message through the worker moves its (not yet loaded) conversation to the top.
        traffic.message(first_group)
        await traffic.send()
        await expect(rows.first).to_have_attribute("data-conversation-id", first_group, timeout=WAIT_MS)
        await expect(page.locator("#badge")).to_have_text("26", timeout=WAIT_MS)
        await expect(rows.first.locator(".unread")).to_have_text("2")

        # Walk on; a pin in the middle of the walk restarts the list at its first page.
        await page.click("#more")
        # Page 2 of the walk's snapshot (from before that message) + the row that moved up.
        await expect(rows).to_have_count(21, timeout=WAIT_MS)
        pinned = CONVERSATIONS[5]
        traffic.stream.entry("pin", USER, pinned, pin_rank=0)
        await traffic.send()
        await page.click("#more")
        await until_js(page, "window.__sp.list.stats.restarts === 1")
        await expect(rows).to_have_count(10, timeout=WAIT_MS)
        await expect(rows.first).to_have_attribute("data-conversation-id", pinned)
        await expect(rows.first).to_have_class(re.compile(r"\bpinned\b"))

        # Member notices, made by the worker from message entries that carry a kind (contract
        # §9): t=24 re-reads the shown roster, t=27 also drops the history window.
        await page.locator(f'#list li.row[data-conversation-id="{first_group}"]').click()
        await expect(page.locator("#roster-reads")).to_have_text("1", timeout=WAIT_MS)
        await expect(page.locator("#member-count")).to_have_text("2")
        await expect(page.locator("#member-list li .name").first).to_have_text(str(OTHER))
        traffic.message(first_group, sender=OTHER, notification=24)
        seq, mailbox_seq = traffic.message(first_group, sender=OTHER, notification=27)
        await traffic.send()
        # Each notice invalidates the group's one store: a traversal in flight is abandoned for a
        # new one, so two notices close together end in at least one more complete read.
        await until_js(page, "window.__sp.store.counters.traversalsCompleted >= 2 && window.__sp.store.fresh")
        await expect(page.locator("#history")).to_contain_text("dropped", timeout=WAIT_MS)
        reads = await js(page, "window.__sp.store.counters.traversalsCompleted")
        await expect(page.locator("#badge")).to_have_text("26")  # notices that do not count
        # At least once: a worker that died before persisting re-applies the entry and sends
        # the same notice again; the page reacts to it once.
        notice = {
            "type": "MEMBER_NOTICE",
            "user_id": USER,
            "conversation_id": first_group,
            "kind": 27,
            "conversation_seq": seq,
            "projection_mailbox_seq": mailbox_seq,
        }
        producer = await stack.open_producer()
        try:
            topic = stack.settings.topics.topic_session_delta
            await producer.send_and_wait(topic, orjson.dumps(notice), key=str(USER).encode())
        finally:
            await producer.stop()
        await until_js(page, "window.__sp.stream.stats.notices === 3")
        await expect(page.locator("#notices li")).to_have_count(2)
        await expect(page.locator("#roster-reads")).to_have_text(str(reads))

        # A dropped connection resumes from the gateway's log (frames missed meanwhile replayed).
        await js(page, "window.__sp.stream.drop()")
        traffic.message(CONVERSATIONS[3])
        await traffic.send()
        await until_js(page, "(window.__sp.stream.stats.hellos.resumed || 0) === 1")
        await expect(rows.nth(1)).to_have_attribute("data-conversation-id", CONVERSATIONS[3], timeout=WAIT_MS)
        await expect(page.locator("#badge")).to_have_text("27", timeout=WAIT_MS)
        # Notices are at least once (the resume replays those after the client's version); the
        # page reacts to each one once.
        await expect(page.locator("#notices li")).to_have_count(2)
        await expect(page.locator("#roster-reads")).to_have_text(str(reads))

        # The gateway dies; messages arrive while it is down; a new process has no log: the page
        # re-pulls, and shows exactly the store's counts (nothing missed, nothing counted twice).
        api.kill()
        late = CONVERSATIONS[7]
        traffic.message(late)
        traffic.message(late)
        await traffic.send()
        await api.start()
        total, stored = await stored_badge(stack)
        assert total == 29
        await until_js(page, "(window.__sp.stream.stats.hellos.repull || 0) >= 1")
        await expect(page.locator("#badge")).to_have_text(str(total), timeout=WAIT_MS)
        await expect(rows.nth(1)).to_have_attribute("data-conversation-id", late, timeout=WAIT_MS)
        await expect(rows.nth(1).locator(".unread")).to_have_text(str(stored[late]["unread_count"]))
        assert stored[late]["unread_count"] == 3
        shown = await js(page, "window.__sp.list.view.version")
        assert shown == traffic.stream.seq  # the page holds the store's version
        await page.screenshot(path=str(tmp_path / "browser-client.png"), full_page=True)
        if os.environ.get("SP_DOCS_SCREENSHOT"):
            await page.screenshot(path=str(ROOT / "docs" / "browser-client.png"), full_page=True)
    finally:
        await page.close()
        api.stop()


async def test_the_browser_client_shows_99_plus_and_a_marked_row(
    make_stack: Callable[..., Stack], tmp_path: Path, browser: Any
) -> None:
    """Seed 000 §3.3 and docs/contract.md §10 (issue 35): a count above 99 shows "99+" (the row and
    the badge), and a row the user marked unread on another device shows as unread."""
    from playwright.async_api import expect

    stack = make_stack("gw99", partitions=1, lanes=1)
    traffic = Traffic(stack)
    busy, quiet = CONVERSATIONS[0], CONVERSATIONS[1]
    traffic.message(quiet)
    traffic.stream.read(USER, 1, quiet)
    for _ in range(150):
        traffic.message(busy)
    stack.start_worker()
    await traffic.send()
    api = Api(stack, tmp_path)
    await api.start()
    token = TokenSigner(SECRET).mint(USER, int(time.time()) + 3600)
    page = await browser.new_page()
    try:
        await page.goto(f"{api.url}/app/?limit=10")
        await page.fill("#token", token)
        await page.click("#connect")
        busy_row = page.locator(f'#list li.row[data-conversation-id="{busy}"]')
        quiet_row = page.locator(f'#list li.row[data-conversation-id="{quiet}"]')
        await expect(busy_row.locator(".unread")).to_have_text("99+", timeout=WAIT_MS)
        await expect(page.locator("#badge")).to_have_text("99+", timeout=WAIT_MS)
        await expect(page.locator("#badge")).to_have_attribute("data-count", "150")
        await expect(quiet_row.locator(".unread")).to_be_hidden()
        # Marked unread on another device: shown as unread here, the badge counts it.
        traffic.stream.entry("mark_unread", USER, quiet)
        await traffic.send()
        await expect(quiet_row).to_have_class(re.compile(r"\bmarked\b"), timeout=WAIT_MS)
        await expect(quiet_row.locator(".unread")).to_be_visible()
        await expect(page.locator("#badge")).to_have_attribute("data-count", "151", timeout=WAIT_MS)
        await page.screenshot(path=str(tmp_path / "browser-client-99plus.png"), full_page=True)
        if os.environ.get("SP_DOCS_SCREENSHOT"):
            await page.screenshot(path=str(ROOT / "docs" / "browser-client-99plus.png"), full_page=True)
        # A read clears the mark.
        traffic.stream.read(USER, 1, quiet)
        await traffic.send()
        await expect(quiet_row).not_to_have_class(re.compile(r"\bmarked\b"), timeout=WAIT_MS)
        await expect(page.locator("#badge")).to_have_attribute("data-count", "150", timeout=WAIT_MS)
    finally:
        await page.close()
        api.stop()
