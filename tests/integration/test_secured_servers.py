"""The security settings against real secured servers (issue 32 item 6): a Kafka whose only client
listener is SASL_SSL with SCRAM-SHA-512 and a Cassandra with password authentication, permissions
and client TLS, both started for this module by scripts/secured_servers.py (certificates made by
the JDK's keytool; the project's user is not a Cassandra superuser). The Redis projection store is
the shared plain one (a password+TLS Redis: tests/integration/test_security_settings.py).

* the product runs through them with the PROJECTOR_* settings only: `projector bootstrap`,
  `projector simulate`, the worker, `projector api` (pages, badges, /readyz with its Cassandra
  session and the live stream's Kafka consumer) and `projector rebuild --by-replay`, and the
  projection equals `projector replay` of the same stream;
* a wrong Kafka SASL password, a CA file that did not sign the broker's certificate, a wrong
  Cassandra password and an untrusted CA for Cassandra: bootstrap, the worker, the API and the
  rebuild each exit non-zero with ONE line naming the setting to fix (no traceback, no
  "start the local servers" hint: the servers answered and refused).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.sdk import SessionsClient
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import (
    PROJECTOR,
    ROOT,
    Stack,
    assert_final_equals_replay,
    free_port,
    simulated,
    start_api,
)
from tests.support.api import SECRET, token
from tests.support.projection_files import as_replay_files
from tests.support.rows import listed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCRIPT = ROOT / "scripts" / "secured_servers.py"


@dataclass(frozen=True)
class Secured:
    env: dict[str, str]  # the PROJECTOR_* settings that reach both servers
    untrusted_ca: str  # a CA certificate that signed nothing the servers present
    folder: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured")
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "up", str(folder)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        )
        assert done.returncode == 0, f"scripts/secured_servers.py up failed:\n{done.stdout}{done.stderr}"
        state = json.loads((folder / "secured.json").read_text())
        yield Secured(env=state["env"], untrusted_ca=state["untrusted_ca"], folder=folder)
    finally:
        subprocess.run([sys.executable, str(SCRIPT), "down", str(folder)], cwd=ROOT, timeout=180, check=False)


@pytest.fixture(scope="module")
def run_tag() -> str:
    import uuid

    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def stack(secured: Secured, tmp_path_factory: pytest.TempPathFactory, run_tag: str) -> Iterator[Stack]:
    """One bootstrapped stack on the secured servers (its Redis namespace on the shared Redis)."""
    tmp = tmp_path_factory.mktemp("secured-stack")
    stack = Stack(f"t-secured-{run_tag}", tmp, partitions=2, lanes=2, **secured.env)
    done = stack.run("bootstrap")
    said = done.stdout.decode()
    assert f"keyspace {stack.settings.cassandra.cassandra_keyspace}: created" in said, said
    assert f"kafka: created {stack.settings.topics.topic_mailbox_tail}," in said, said
    try:
        yield stack
    finally:
        stack.stop_workers(signal.SIGKILL)
        base = stack.settings.redis.projection_namespace
        asyncio.run(_drop_namespaces(stack, [base, f"{base}-rb"]))


async def _drop_namespaces(stack: Stack, namespaces: list[str]) -> None:
    """The shared Redis keeps nothing of this module (Kafka and Cassandra go with their folder)."""
    for namespace in namespaces:
        store = RedisProjectionStore.from_settings(stack.settings.redis, namespace)
        try:
            await store.delete_all()
        finally:
            await store.aclose()


async def test_the_product_runs_through_sasl_ssl_kafka_and_a_tls_cassandra_with_passwords(
    stack: Stack, tmp_path: Path
) -> None:
    # simulate: the messages to Cassandra, the entries to Kafka; replay for the expected state.
    _, expected = simulated(stack, tmp_path, messages=300, seed=32)
    versions: dict[int, int] = expected["versions"]
    assert len(versions) >= 20

    stack.start_worker()
    await stack.wait_for_versions(versions, timeout=240, alive=stack.alive())
    await assert_final_equals_replay(stack, expected)
    stack.stop_workers()
    assert [proc.returncode for proc in stack.workers] == [0], stack.log_tail()

    # The API: Cassandra (member directory, fill-in, readiness) and Kafka (the live stream's
    # consumer, reconcile requests) through the same settings.
    port = free_port()
    api = await start_api(stack, port, tmp_path / "api.log", {"PROJECTOR_API_SECRET": SECRET})
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as resp:
            ready = await resp.text()
            assert resp.status == 200, ready
        badges = {b["user_id"]: b for b in expected["badges"]}
        for user_id in sorted(versions):
            async with SessionsClient(base, token(user_id)) as client:
                for limit in (3, 50):
                    main = await client.walk("main", limit, max_restarts=0)
                    archived = await client.walk("archived", limit, max_restarts=0)
                    assert main.rows == listed(expected["rows"], user_id, archived=False), (user_id, limit)
                    assert archived.rows == listed(expected["rows"], user_id, archived=True), (user_id, limit)
                badge = {k: v for k, v in badges[user_id].items() if k != "user_id"}
                assert await client.badge() == badge, user_id
    finally:
        api.send_signal(signal.SIGTERM)
        assert api.wait(timeout=60) == 0, (tmp_path / "api.log").read_text()[-3000:]

    # The rebuild re-reads mailbox-tail (Kafka) and the MessageStore (Cassandra).
    fresh = f"{stack.settings.redis.projection_namespace}-rb"
    report_path = tmp_path / "rebuild.json"
    stack.run(
        *("rebuild", "--by-replay", "--namespace", fresh, "--report", str(report_path), "--progress", "never")
    )
    report = orjson.loads(report_path.read_bytes())
    assert report["diff"]["identical"], report["diff"]
    store = RedisProjectionStore.from_settings(stack.settings.redis, fresh)
    try:
        assert await as_replay_files(store, sorted(versions)) == (expected["rows"], expected["badges"])
    finally:
        await store.aclose()


def _run(env: dict[str, str], *args: str) -> tuple[int, list[str], list[str]]:
    """Exit code, stdout lines, stderr lines of a `projector` command."""
    done = subprocess.run(
        [*PROJECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


KAFKA_LOGIN = (
    "check PROJECTOR_KAFKA_SASL_USERNAME, PROJECTOR_KAFKA_SASL_PASSWORD and PROJECTOR_KAFKA_SASL_MECHANISM"
)
CASSANDRA_LOGIN = "check PROJECTOR_CASSANDRA_USERNAME and PROJECTOR_CASSANDRA_PASSWORD"


def _refusals(secured: Secured) -> dict[str, tuple[dict[str, str], str, str, str]]:
    """case -> (settings changed, server ("kafka"/"cassandra"), the line's start, its end)."""
    kafka = secured.env["PROJECTOR_KAFKA_BOOTSTRAP"]
    cassandra = f"127.0.0.1:{secured.env['PROJECTOR_CASSANDRA_PORT']}"
    untrusted = "presented a TLS certificate this client does not trust ("
    return {
        "kafka-wrong-password": (
            {"PROJECTOR_KAFKA_SASL_PASSWORD": "not-the-password"},
            "kafka",
            f"Kafka at {kafka} refused the SASL login of 'projector' (SCRAM-SHA-512): ",
            KAFKA_LOGIN,
        ),
        "kafka-untrusted-ca": (
            {"PROJECTOR_KAFKA_SSL_CAFILE": secured.untrusted_ca},
            "kafka",
            f"Kafka at {kafka} {untrusted}",
            "): PROJECTOR_KAFKA_SSL_CAFILE must name the CA that signed it",
        ),
        "cassandra-wrong-password": (
            {"PROJECTOR_CASSANDRA_PASSWORD": "not-the-password"},
            "cassandra",
            f"Cassandra at {cassandra} refused the login: ",
            CASSANDRA_LOGIN,
        ),
        "cassandra-untrusted-ca": (
            {"PROJECTOR_CASSANDRA_SSL_CAFILE": secured.untrusted_ca},
            "cassandra",
            f"Cassandra at {cassandra} {untrusted}",
            "): PROJECTOR_CASSANDRA_SSL_CAFILE must name the CA that signed it",
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["kafka-wrong-password", "kafka-untrusted-ca", "cassandra-wrong-password", "cassandra-untrusted-ca"],
)
def test_a_refused_credential_is_one_line_and_a_non_zero_exit(
    secured: Secured, stack: Stack, tmp_path: Path, case: str
) -> None:
    changes, server, start, end = _refusals(secured)[case]
    env = {
        **stack.env,
        **changes,
        "PROJECTOR_DATA_DIR": str(tmp_path / "worker-data"),
        "PROJECTOR_API_SECRET": SECRET,
        "PROJECTOR_API_PORT": str(free_port()),
    }
    fresh = f"{stack.settings.redis.projection_namespace}-refused"
    commands: list[tuple[tuple[str, ...], str]] = [
        (("bootstrap", "--skip-kafka" if server == "cassandra" else "--skip-cassandra"), f"{server}: "),
        (("worker",), "projector worker: "),
        (("api",), "projector api: the live stream: " if server == "kafka" else "projector api: "),
        (("rebuild", "--by-replay", "--namespace", fresh, "--progress", "never"), "projector rebuild: "),
    ]
    seen: dict[str, Any] = {}
    for args, prefix in commands:
        code, out, err = _run(env, *args)
        seen[args[0]] = (code, out, err)
        assert code == 1, (args, code, out, err)
        # The one line: on stderr, nothing else on either stream.
        assert out == [] and len(err) == 1, (args, out, err)
        line = err[0]
        assert line.startswith(prefix + start) and line.endswith(end), (args, line)
        assert "make services-up" not in line
    # The four commands say the same thing about the server.
    reasons = {err[0].split(start, 1)[1] for _, _, err in seen.values()}
    assert len(reasons) == 1, reasons
