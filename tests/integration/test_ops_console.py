"""The operator console (issue 17) in a real browser against the real stack.

Kafka, Redis and Cassandra (the local servers), a real worker (`projector worker`) projecting
simulated traffic and one bad record, and `projector api` serving the console with its operator
secret and the worker's /metrics URL. Headless Chromium (Debian's `chromium`, installed by
scripts/tools.d/chromium.sh) driven by Playwright for Python:

* sign in through the 401 page's form with an operator token;
* drift injected into one stored row in Redis → the inspector highlights exactly that field;
  "Reconcile this user" → the row is right again in Redis, the inspector shows no drift, and a
  correction frame for the user is on the session-delta topic;
* the conversation view: the head from the MessageStore, the members with their unread and read
  positions;
* the fleet view while the worker runs: every partition owned by the worker, its gate and lag,
  the charts filling;
* the dead-letter browser: the bad record's reason and raw text (rendered as text: the markup it
  carries never runs).

And over plain HTTP against the same server: no token → 401 and a user token → 403 on every
/ops/ route and action, a cookie-authenticated POST without the CSRF token → 403.

Screenshots go to the test's tmp dir, or to $OPS_SCREENSHOTS_DIR when set (the ones in docs/ were
taken with OPS_SCREENSHOTS_DIR=docs), so a test run leaves the checkout as it was.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest

from app.api.ops.auth import OperatorSigner
from app.api.tokens import TokenSigner
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until, start_api
from tests.support.chromium import CHROMIUM, CHROMIUM_FLAGS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

API_SECRET = "integration-api-secret-0123456789-abcdef"
OPS_SECRET = "integration-ops-secret-0123456789-abcdef"
BAD_RECORD = b'{"type":"message","user_id":7,"lane":0,"note":"<img src=x onerror=window.__pwned=1>"}'
WAIT_MS = 60_000


async def start_console_api(stack: Stack, port: int, metrics_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        "PROJECTOR_API_SECRET": API_SECRET,
        "PROJECTOR_OPS_SECRET": OPS_SECRET,
        "PROJECTOR_OPS_METRICS_URLS": metrics_url,
        "PROJECTOR_OPS_SAMPLE_INTERVAL_MS": "1000",
    }
    return await start_api(stack, port, log, env)


async def check_http_security(base: str) -> None:
    """Every route and action over the real server: 401 without a token, 403 with a user's."""
    user = TokenSigner(API_SECRET).mint(7, int(time.time()) + 600)
    operator = OperatorSigner(OPS_SECRET).mint("ci", int(time.time()) + 600)
    gets = [
        "/ops/",
        "/ops/static/console.js",
        "/ops/api/whoami",
        "/ops/api/user/7",
        "/ops/api/fleet",
        "/ops/api/series",
        "/ops/api/dead-letters",
        "/ops/api/conversation/00000000-0000-4000-8000-000000000001",
    ]
    posts = ["/ops/api/user/7/reconcile", "/ops/api/user/7/rebuild", "/ops/logout"]
    async with aiohttp.ClientSession() as http:
        for method, path in [("GET", p) for p in gets] + [("POST", p) for p in posts]:
            async with http.request(method, base + path) as resp:
                assert resp.status == 401, (method, path, resp.status)
            async with http.request(method, base + path, headers={"Authorization": f"Bearer {user}"}) as resp:
                assert resp.status == 403, (method, path, resp.status)
        # The session cookie without the CSRF header: refused before the action runs.
        csrf = OperatorSigner(OPS_SECRET).csrf_token(operator)
        async with http.post(
            base + "/ops/api/user/7/reconcile", headers={"Cookie": f"ops_session={operator}; ops_csrf={csrf}"}
        ) as resp:
            assert resp.status == 403
            assert "CSRF" in (await resp.json())["error"]["message"]


def pick_victim(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The listed rows with unread, users with several rows first (visible, ordinary cases), in
    the order the test tries them (it takes the first whose projection agrees with the
    recompute)."""
    by_user: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_user.setdefault(row["user_id"], []).append(row)
    candidates = [r for r in rows if r["listed"] and r["unread_count"] > 0 and r["unread_exact"]]
    candidates.sort(key=lambda r: (-len(by_user[r["user_id"]]), r["user_id"], r["conversation_id"]))
    return candidates


async def test_console_in_a_real_browser(make_stack: Callable[..., Stack], tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    shots = Path(os.environ.get("OPS_SCREENSHOTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    metrics_port, api_port = free_port(), free_port()
    stack = make_stack("opsc", partitions=2, lanes=2, PROJECTOR_WORKER_METRICS_PORT=str(metrics_port))
    stream = tmp_path / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "30", "--conversations", "8", "--group-size", "12", "--messages", "200"),
        *("--rate", "0", "--lanes", "2", "--seed", "5", "--out", str(stream), "--progress", "never"),
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    expected_rows = read_jsonl(out / "projections.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in read_jsonl(out / "badges.jsonl")}
    await stack.produce([BAD_RECORD])  # keyed by user 7: a dead letter ("missing field")

    stack.start_worker()
    alive = stack.alive()
    await stack.wait_for_versions(versions, timeout=240, alive=alive)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    await scrape_until(metrics_url, lambda t: "projector_watermark_hi{" in t, 60, alive)
    api = await start_console_api(stack, api_port, metrics_url, tmp_path / "api.log")
    base = f"http://127.0.0.1:{api_port}"
    store = RedisProjectionStore.from_settings(
        stack.settings.redis, stack.settings.redis.projection_namespace
    )
    try:
        await check_http_security(base)
        operator = OperatorSigner(OPS_SECRET).mint("ci-operator", int(time.time()) + 3600)
        # A user whose stored rows all agree with the recompute (the inspector's baseline).
        victim: dict[str, Any] | None = None
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {operator}"}) as http:
            for row in pick_victim(expected_rows):
                async with http.get(f"{base}/ops/api/user/{row['user_id']}") as resp:
                    assert resp.status == 200, await resp.text()
                    body = await resp.json()
                if body["counts"]["drifted"] == 0 and body["counts"]["missing_in_store"] == 0:
                    victim = row
                    break
        assert victim is not None, "no user whose projection agrees with the recompute"
        user_id, cid = victim["user_id"], victim["conversation_id"]
        right = (await store.load(user_id)).rows[cid]

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            try:
                # Sign in through the 401 page's form.
                response = await page.goto(base + "/ops/")
                assert response is not None and response.status == 401
                await page.fill("#token", operator)
                await page.click("#sign-in")
                await expect(page.locator("#whoami")).to_have_text("operator: ci-operator", timeout=WAIT_MS)

                # Drift in Redis, then the inspector.
                wrong = {**right, "unread_count": cast(int, right["unread_count"]) + 7}
                await store.client.hset(store.rows_key(user_id), cid, orjson.dumps(wrong))
                await page.fill("#user-id", str(user_id))
                await page.click("#inspect")
                drifted = page.locator(f'details.row[data-cid="{cid}"]')
                await expect(drifted).to_have_attribute("data-status", "drifted", timeout=WAIT_MS)
                cell = drifted.locator('tr.diff[data-field="unread_count"]')
                await expect(cell).to_have_count(1)
                await expect(cell.locator("td.stored")).to_have_text(str(wrong["unread_count"]))
                await expect(cell.locator("td.recomputed")).to_have_text(str(right["unread_count"]))
                await expect(page.locator("details.row[data-status=drifted]")).to_have_count(1)
                await expect(page.locator("#gate-hi")).not_to_have_text("—")
                await page.screenshot(path=str(shots / "ops-console-inspector-drift.png"), full_page=True)

                await page.click("#reconcile")
                await expect(page.locator("#action-result")).to_have_attribute(
                    "data-done", "reconcile", timeout=WAIT_MS
                )
                await expect(page.locator("details.row[data-status=drifted]")).to_have_count(
                    0, timeout=WAIT_MS
                )
                await expect(drifted).to_have_attribute("data-status", "same")
                assert (await store.load(user_id)).rows[cid] == right
                frames = await stack.consume(
                    stack.settings.topics.topic_session_delta,
                    lambda fs: any(f.get("correction") and f["user_id"] == user_id for f in fs),
                    60,
                )
                (correction,) = [f for f in frames if f.get("correction") and f["user_id"] == user_id]
                assert [r["conversation_id"] for r in correction["conversations"]] == [cid]
                assert correction["conversations"][0]["unread_count"] == right["unread_count"]
                # The inspector reloads after the action (its output is hidden while it loads): the
                # frame list read then shows the correction frame (published before the answer).
                await expect(page.locator("#user-out")).to_be_visible(timeout=WAIT_MS)
                correction_frames = page.locator('#frames-delta details.frame[data-correction="1"]')
                await expect(correction_frames).to_have_count(1, timeout=WAIT_MS)
                await expect(correction_frames).to_be_visible()
                await page.screenshot(
                    path=str(shots / "ops-console-inspector-reconciled.png"), full_page=True
                )

                # The conversation: its head, its members with their read and unread positions.
                await page.goto(base + f"/ops/#conversation={cid}")
                await expect(page.locator("#conv-head-seq b")).to_have_text(
                    str(right["latest_conversation_seq"]), timeout=WAIT_MS
                )
                member = page.locator(f'#members tr[data-user="{user_id}"] td')
                await expect(member.nth(6)).to_have_text(str(right["unread_count"]))
                await expect(member.nth(9)).to_have_text(str(right["read_conversation_seq"]))
                await page.screenshot(path=str(shots / "ops-console-conversation.png"), full_page=True)

                # The fleet while the worker runs.
                await page.goto(base + "/ops/#fleet")
                for partition in range(stack.settings.topics.topic_partitions):
                    partition_row = page.locator(f'#partitions tr[data-partition="{partition}"]')
                    await expect(partition_row.locator("td.owner")).to_have_text(metrics_url, timeout=WAIT_MS)
                    await expect(partition_row.locator("td.lag")).to_have_text("0", timeout=WAIT_MS)
                await expect(page.locator("#serving")).to_have_text(stack.settings.redis.projection_namespace)
                # At least 3 samples in the charts (the page's CSP forbids eval: no wait_for_function).
                await expect(page.locator("#tab-fleet")).to_have_attribute(
                    "data-samples", re.compile(r"^([3-9]|[1-9][0-9]+)$"), timeout=WAIT_MS
                )
                await page.screenshot(path=str(shots / "ops-console-fleet.png"), full_page=True)

                # A dead letter, opened.
                await page.goto(base + "/ops/#dead-letters")
                first = page.locator("#dead-letters tbody tr").first
                await expect(first.locator("td.reason")).not_to_be_empty(timeout=WAIT_MS)
                await first.locator("button.open-dl").click()
                await expect(page.locator("#dl-detail")).to_be_visible()
                reason = await page.locator("#dl-reason").text_content()
                assert reason and "missing" in reason, reason
                await expect(page.locator("#dl-record")).to_have_text(BAD_RECORD.decode())
                assert await page.evaluate("window.__pwned") is None  # shown as text, never run
                await page.screenshot(path=str(shots / "ops-console-dead-letter.png"), full_page=True)
                assert errors == []
            finally:
                await browser.close()
        async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
            text = await resp.text()
        assert 'projector_ops_actions_total{action="reconcile",outcome="written"} 1.0' in text
    finally:
        await store.aclose()
        api.terminate()
        try:
            api.wait(timeout=30)
        except subprocess.TimeoutExpired:
            api.kill()
        stack.stop_workers()
