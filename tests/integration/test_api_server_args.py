"""`projector api` as started (issue 32, item 5): the server settings reach aiohttp's request
handler. Before the fix `handler_args=` went to `web.AppRunner` as a keyword of its own; aiohttp
then failed to build each request handler with it, fell back to its defaults and logged a WARNING
per connection, logged every request (the access log `PROJECTOR_API_ACCESS_LOG=false` turns off)
and kept its own 8,190-byte line limit."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as redis

from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.support.api import SECRET, token
from tests.support.rows import flush, make_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
ME = 4343
MAX_HEADER_BYTES = 32 * 1024  # the API's own limit (431 above it)
BETWEEN = 20_000  # one header line longer than aiohttp's default 8,190, under our limit
ACCESS_LINE = re.compile(r"GET /v1/(sessions|badge) \d{3} ")


@pytest.fixture
def schema(servers: Settings, cassandra_session: Any) -> Iterator[str]:
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"t_args_{uuid.uuid4().hex[:12]}"
    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    yield keyspace
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


async def run_api(settings: Settings, schema: str, access_log: bool) -> tuple[list[tuple[int, str]], str]:
    """Starts `projector api`, sends requests over several connections; (status, code) of each
    and the process's whole log (stderr)."""
    run_env = {
        **os.environ,
        **settings.as_env(),
        "PROJECTOR_API_SECRET": SECRET,
        "PROJECTOR_CASSANDRA_KEYSPACE": schema,
        "PROJECTOR_API_FILL_FROM_STATE": "never",
        "PROJECTOR_GATEWAY_ENABLED": "false",
        "PROJECTOR_LOG_LEVEL": "INFO",  # an access line is INFO: it would show
        "PROJECTOR_LOG_FORMAT": "text",
        "PROJECTOR_API_ACCESS_LOG": "true" if access_log else "false",
        "PROJECTOR_API_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        "PROJECTOR_API_RATE_LIMIT_PER_S": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "api", "--port", "0"],
        cwd=ROOT,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results: list[tuple[int, str]] = []
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=90)
        match = re.search(r"http://[0-9.]+:\d+", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        auth = {"Authorization": f"Bearer {token(ME)}"}
        cases: list[dict[str, str]] = [
            {},
            {"X-Padding": "p" * BETWEEN},  # over aiohttp's default line, under ours: accepted
            {"X-Padding": "p" * (MAX_HEADER_BYTES + 100)},  # over ours: our 431
            {},
        ]
        for extra in cases:
            # A connection each: the WARNING came once per connection (handler creation).
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{match[0]}/v1/sessions", headers={**auth, **extra}) as resp,
            ):
                raw = await resp.read()
                try:  # ours is JSON; aiohttp's own parser refusal is a bare 400
                    code = str(orjson.loads(raw).get("error", {}).get("code", ""))
                except (orjson.JSONDecodeError, AttributeError):
                    code = "not json"
                results.append((resp.status, code))
    finally:
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err
    return results, err


async def test_projector_api_applies_its_server_settings(servers: Settings, schema: str) -> None:
    namespace = f"t-args-{uuid.uuid4().hex[:8]}"
    settings = servers.replace(projection_namespace=namespace)
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, namespace)
    try:
        await store.write([flush(ME, [make_row(ME, 1, act=1)], 1, 1)])
        for access_log in (False, True):
            results, log = await run_api(settings, schema, access_log)
            assert results == [(200, ""), (200, ""), (431, "headers_too_large"), (200, "")], results
            assert "Failed to create request handler" not in log, log[-2000:]
            assert not [line for line in log.splitlines() if "WARNING" in line], log[-2000:]
            access = [line for line in log.splitlines() if ACCESS_LINE.search(line)]
            # Off: not one line (the padded request's header never appears either way).
            assert len(access) == (4 if access_log else 0), log[-2000:]
            assert "ppppp" not in log
    finally:
        await store.delete_all()
        await client.aclose()
