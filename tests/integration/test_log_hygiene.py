"""Issue 18: no user data or secrets in logs. A worker and `projector api` run at DEBUG (faust's,
aiokafka's and aiohttp's own records included), with the access log on, over a stream whose
message and event ids are known, and a client that uses bearer tokens, a stream ticket (in the
URL, as browsers send it), page cursors, bad tokens and bad records. Every line either process
wrote is then searched for the secret, every token, ticket and cursor, and every message and
event id."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import requests

from app.api.tokens import TokenSigner
from tests.integration.api_fuzz import ApiProcess
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SECRET = "hygiene-secret-" + uuid.uuid4().hex + "x" * 8
CONVERSATION = str(uuid.uuid4())
USERS = (11, 12)


def stream_lines(marker: str) -> tuple[list[bytes], list[str]]:
    """Messages with recognizable ids in one group of USERS, and a few bad records carrying the
    same ids (a dead letter's reason may quote a record: the log must not)."""
    lines: list[bytes] = []
    secrets_: list[str] = []
    seq = 0
    for n in range(1, 21):
        message_id = f"msgbody-{marker}-{n}"
        event_id = f"evtbody-{marker}-{n}"
        secrets_ += [message_id, event_id]
        for user in USERS:
            seq += 1
            lines.append(
                orjson.dumps(
                    {
                        "type": "message",
                        "mailbox_seq": seq,
                        "lane": 0,
                        "ts": 1_767_225_600_000 + n,
                        "event_id": event_id,
                        "user_id": user,
                        "conversation_id": CONVERSATION,
                        "conversation_seq": n,
                        "message_id": message_id,
                        "activity_id": f"{n:032x}",
                        "sender_id": USERS[n % 2],
                        "created_at": 1_767_225_600_000 + n,
                        "counts_unread": True,
                        "mention": False,
                    }
                )
            )
    bad_type = f"badtype-{marker}"
    bad_conversation = f"badconv-{marker}"
    secrets_ += [bad_type, bad_conversation]
    first = orjson.loads(lines[0])
    lines.append(orjson.dumps({**first, "type": bad_type}))
    lines.append(orjson.dumps({**first, "conversation_id": bad_conversation}))
    lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": 1_767_225_600_100}))
    return lines, secrets_


async def test_no_secret_token_or_user_data_in_any_log_line(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex[:12]
    stack = make_stack("hygiene", partitions=2, lanes=1, PROJECTOR_LOG_LEVEL="DEBUG")
    lines, user_data = stream_lines(marker)
    stack.start_worker()
    await stack.produce(lines)
    await stack.wait_for_versions({u: 40 - (u == USERS[0]) for u in USERS}, timeout=180, alive=stack.alive())

    api = ApiProcess(stack, tmp_path, PROJECTOR_API_SECRET=SECRET, PROJECTOR_API_ACCESS_LOG="true")
    signer = TokenSigner(SECRET)
    tokens = [signer.mint(user, int(time.time()) + 600) for user in USERS]
    shown: list[str] = [SECRET, *tokens]
    try:
        await asyncio.to_thread(api.wait_ready)
        base = api.base

        def client() -> None:
            with requests.Session() as http:
                for token in tokens:
                    auth = {"Authorization": f"Bearer {token}"}
                    page = http.get(f"{base}/v1/sessions", params={"limit": 1}, headers=auth, timeout=30)
                    assert page.status_code == 200, page.text
                    body = page.json()
                    assert body["items"][0]["last_message_id"].startswith("msgbody-")
                    cursor = body["next_cursor"]
                    if cursor is not None:
                        shown.append(cursor)
                        later = http.get(
                            f"{base}/v1/sessions", params={"cursor": cursor}, headers=auth, timeout=30
                        )
                        assert later.status_code == 200
                    assert http.get(f"{base}/v1/badge", headers=auth, timeout=30).status_code == 200
                    members = http.post(
                        f"{base}/api/v1/chats/members/page",
                        json={"chat_session_uid": CONVERSATION},
                        headers=auth,
                        timeout=30,
                    )
                    assert members.status_code in (200, 403), members.text
                    ticket = http.post(f"{base}/v1/stream/ticket", headers=auth, timeout=30).json()["ticket"]
                    shown.append(ticket)
                    with http.get(
                        f"{base}/v1/stream", params={"access_token": ticket}, stream=True, timeout=30
                    ) as stream:
                        assert stream.status_code == 200
                        next(stream.iter_content(chunk_size=None))
                    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
                    shown.append(forged)
                    refused = http.get(f"{base}/v1/badge", headers={"Authorization": f"Bearer {forged}"})
                    assert refused.status_code == 401
                    missing = http.get(f"{base}/v1/nothing-{marker}", headers=auth, timeout=30)
                    assert missing.status_code == 404

        await asyncio.to_thread(client)
        api.alive()
    finally:
        api.stop()
        stack.stop_workers()

    logs = {
        "api": api.log.read_text(errors="replace"),
        "worker": (stack.tmp / "worker-0.log").read_text(errors="replace"),
    }
    assert "DEBUG" in logs["worker"] and "/v1/sessions" in logs["api"]  # it did log, verbosely
    assert "dead letter" in logs["worker"]
    found = [
        f"{name} line {number}: {value[:40]}... in {line[:300]!r}"
        for name, text in logs.items()
        for number, line in enumerate(text.splitlines(), 1)
        for value in [*shown, *user_data]
        if value in line
    ]
    assert not found, f"{len(found)} log lines leak secrets or user data:\n" + "\n".join(found[:20])
