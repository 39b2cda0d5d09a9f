"""docs/contract.md §10 end to end on the local servers (issue 35): mailbox entries through the
real worker → Redis → the query API (two "devices": two API reads of one user).

A user marks a conversation unread on one device → the other device's list shows it marked and
the badge +1; a read clears it; switching the badge mode recomputes the badge and the folder
totals at once; the archived folder's totals move when an archived conversation receives a
message. Each step's latency (produce → visible through the API) is printed.

The first test runs with a flush window of an hour: every step it sees can only have travelled by
the fast lane (a `mark_unread`, a `read`, a message in a direct conversation flush their user at
once, §10). The second keeps the stacks' short window: a `badge_preferences` entry is not in the
fast lane (it waits for the window's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from tests.integration.stack import Stack
from tests.integration.test_api_worker_e2e import Api
from tests.support.api import token
from tests.support.builders import StreamBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ME = 11982011376358104761
OTHER = 99
MAIN = str(uuid.UUID(int=0x5EED_0010))
ARCHIVED = str(uuid.UUID(int=0x5EED_0011))
WAIT_S = 60.0


class Mailbox:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stream = StreamBuilder(lanes=1)
        self.seq: dict[str, int] = {}

    def message(self, conversation: str, **fields: Any) -> None:
        seq = self.seq[conversation] = self.seq.get(conversation, 0) + 1
        self.stream.entry(
            "message",
            ME,
            conversation,
            conversation_seq=seq,
            message_id=f"m-{seq}",
            activity_id=f"{seq + (0 if conversation == MAIN else 1000):032x}",
            sender_id=OTHER,
            created_at=self.stream.ts,
            counts_unread=True,
            mention=False,
            **fields,
        )

    async def send(self) -> float:
        self.stream.marker(0)
        lines, self.stream.lines = self.stream.lines, []
        await self.stack.produce(lines)
        return time.monotonic()


async def until(
    http: aiohttp.ClientSession, base: str, check: Callable[[dict[str, Any], dict[str, Any]], bool]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Poll /v1/badge and both folders' first page until `check(badge, rows by conversation)`."""
    headers = {"Authorization": f"Bearer {token(ME)}"}
    deadline = time.monotonic() + WAIT_S
    while True:
        async with http.get(f"{base}/v1/badge", headers=headers) as resp:
            badge = await resp.json()
        rows: dict[str, Any] = {}
        for folder in ("main", "archived"):
            async with http.get(f"{base}/v1/sessions", params={"folder": folder}, headers=headers) as resp:
                page = await resp.json()
            rows.update({row["conversation_id"]: row for row in page.get("items", [])})
        if check(badge, rows):
            return badge, rows
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached after {WAIT_S}s: badge {badge}, rows {rows}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def two_devices(stack: Stack) -> AsyncIterator[tuple[Mailbox, aiohttp.ClientSession, str, str]]:
    """The worker and two API instances ("devices" of ME), once ME has read a first message in
    MAIN: (mailbox, http, device A's base URL, device B's)."""
    mailbox = Mailbox(stack)
    stack.start_worker()
    api_a, api_b = Api(stack.settings, "never"), Api(stack.settings, "never")
    device_a, device_b = await api_a.start(), await api_b.start()
    try:
        async with aiohttp.ClientSession() as http:
            mailbox.message(MAIN)
            mailbox.stream.read(ME, 1, MAIN)  # the read takes the message with it
            await mailbox.send()
            await until(http, device_a, lambda b, r: MAIN in r and r[MAIN]["read_conversation_seq"] == 1)
            yield mailbox, http, device_a, device_b
    finally:
        await api_a.close()
        await api_b.close()


async def test_mark_read_and_a_direct_message_reach_the_other_device_by_the_fast_lane(
    make_stack: Callable[..., Stack],
) -> None:
    # An hour's window: nothing in this test is flushed by the window.
    stack = make_stack("fast", partitions=1, lanes=1, PROJECTOR_PROJECTION_COMPACTION_WINDOW_MS="3600000")
    latencies: dict[str, float] = {}
    async with two_devices(stack) as (mailbox, http, device_a, device_b):
        # Device A marks MAIN unread: device B sees it marked, the badge +1.
        mailbox.stream.entry("mark_unread", ME, MAIN)
        sent = await mailbox.send()
        await until(
            http, device_b, lambda b, r: r[MAIN].get("marked_unread") is True and b["total_unread"] == 1
        )
        latencies["mark"] = time.monotonic() - sent

        # A read clears it.
        mailbox.stream.read(ME, 1, MAIN)
        sent = await mailbox.send()
        await until(
            http, device_b, lambda b, r: r[MAIN].get("marked_unread") is False and b["total_unread"] == 0
        )
        latencies["read"] = time.monotonic() - sent

        # An archived direct conversation receives messages: the archived folder's totals move
        # (the archive entry itself waits for the window; the direct message's flush takes
        # the user's dirty rows with it).
        mailbox.stream.entry("archive", ME, ARCHIVED)
        mailbox.message(ARCHIVED, member_count=2)
        sent = await mailbox.send()
        badge, rows = await until(http, device_b, lambda b, r: b["archived_unread"] == 1)
        latencies["archived direct message"] = time.monotonic() - sent
        assert rows[ARCHIVED]["archived"] is True and badge["total_unread"] == 0
        mailbox.message(ARCHIVED, member_count=2)
        sent = await mailbox.send()
        await until(http, device_a, lambda b, r: b["archived_unread"] == 2)
        latencies["second archived direct message"] = time.monotonic() - sent
    print(f"\n§10 fast lane, produce -> visible through the API (s): {latencies}")


async def test_mark_read_badge_mode_and_archived_totals_through_the_worker(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack("sec10", partitions=1, lanes=1)
    latencies: dict[str, float] = {}
    async with two_devices(stack) as (mailbox, http, device_a, device_b):
        # Device A marks MAIN unread: device B sees it marked, the badge +1.
        mailbox.stream.entry("mark_unread", ME, MAIN)
        sent = await mailbox.send()
        badge, rows = await until(
            http, device_b, lambda b, r: r[MAIN].get("marked_unread") is True and b["total_unread"] == 1
        )
        latencies["mark"] = time.monotonic() - sent
        assert rows[MAIN]["unread_count"] == 0

        # A read (any value) clears it.
        mailbox.stream.read(ME, 0, MAIN)
        sent = await mailbox.send()
        await until(
            http, device_b, lambda b, r: r[MAIN].get("marked_unread") is False and b["total_unread"] == 0
        )
        latencies["read"] = time.monotonic() - sent

        # The archived folder's totals move when an archived conversation gets a message.
        mailbox.message(ARCHIVED)
        mailbox.stream.entry("archive", ME, ARCHIVED)
        await mailbox.send()
        await until(http, device_a, lambda b, r: b["archived_unread"] == 1)
        mailbox.message(ARCHIVED)
        mailbox.message(ARCHIVED)
        mailbox.message(MAIN)
        mailbox.message(MAIN)
        sent = await mailbox.send()
        badge, _ = await until(http, device_b, lambda b, r: b["archived_unread"] == 3)
        latencies["archived"] = time.monotonic() - sent
        assert (badge["total_unread"], badge["badge_mode"]) == (2, "messages")

        # Switching the badge mode recomputes the badge and the folder totals at once.
        mailbox.stream.entry("badge_preferences", ME, MAIN, badge_mode="conversations", include_muted=False)
        sent = await mailbox.send()
        badge, _ = await until(http, device_a, lambda b, r: b["badge_mode"] == "conversations")
        latencies["mode"] = time.monotonic() - sent
        assert (badge["total_unread"], badge["archived_unread"]) == (1, 1)
    print(f"\n§10 end to end, produce -> visible through the API (s): {latencies}")
