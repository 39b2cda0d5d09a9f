"""Security and topology settings against real servers (issue 15):

* `projector bootstrap` with PROJECTOR_CASSANDRA_LOCAL_DC creates the keyspace with
  NetworkTopologyStrategy in that data center, and the stores work on it;
* the Redis projection store reaches a Redis that requires a password and TLS with a client
  certificate (a private Debian `redis-server` on a free port, certificates made by the test),
  only with the settings: without the password it is refused, without the CA it does not trust it.

Kafka SASL/TLS and Cassandra authentication/TLS against real secured servers (a SASL_SSL Kafka, a
Cassandra with passwords and client TLS, started by scripts/secured_servers.py): the whole product
through them and the refused credentials are in tests/integration/test_secured_servers.py; every
client constructor getting the settings in tests/unit/test_connections.py. The shared local Kafka
and Cassandra run without them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from app.settings import Settings
from tests.integration.stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bootstrap_creates_the_keyspace_in_the_local_data_center(
    servers: Settings, unique_name: Callable[..., str], cassandra_session: Any
) -> None:
    (dc,) = [row.data_center for row in cassandra_session.execute("SELECT data_center FROM system.local")]
    keyspace = unique_name("dc", sep="_")
    env = {
        **os.environ,
        "PROJECTOR_CASSANDRA_KEYSPACE": keyspace,
        "PROJECTOR_CASSANDRA_LOCAL_DC": dc,
        "PROJECTOR_CASSANDRA_REPLICATION_PER_DC": f"{dc}:1",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app", "bootstrap", "--skip-kafka"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        (row,) = cassandra_session.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
        )
        assert row.replication["class"].endswith("NetworkTopologyStrategy")
        assert row.replication[dc] == "1"
        # The driver's local DC is the one named: a session with it reads the new keyspace.
        from app.stores.cassandra_session import open_cluster

        cluster, session = open_cluster(
            Settings.from_env({k: v for k, v in env.items() if k.startswith("PROJECTOR_")}).cassandra
        )
        try:
            assert list(session.execute(f"SELECT * FROM {keyspace}.messages LIMIT 1")) == []
        finally:
            cluster.shutdown()
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


class TlsRedis:
    """A private redis-server: TLS only (client certificates required), a password."""

    def __init__(self, tmp: Path, password: str) -> None:
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("projector-client")
        self.files = {
            "ca": tmp / "ca.pem",
            "server": tmp / "server.pem",
            "server_key": tmp / "server.key",
            "client": tmp / "client.pem",
            "client_key": tmp / "client.key",
        }
        ca.cert_pem.write_to_path(str(self.files["ca"]))
        server.cert_chain_pems[0].write_to_path(str(self.files["server"]))
        server.private_key_pem.write_to_path(str(self.files["server_key"]))
        client.cert_chain_pems[0].write_to_path(str(self.files["client"]))
        client.private_key_pem.write_to_path(str(self.files["client_key"]))
        self.port = free_port()
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing (scripts/services.sh installs it)"
        self.log = tmp / "redis.log"
        self.proc = subprocess.Popen(
            [
                binary,
                *("--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1"),
                *(
                    "--tls-cert-file",
                    str(self.files["server"]),
                    "--tls-key-file",
                    str(self.files["server_key"]),
                ),
                *("--tls-ca-cert-file", str(self.files["ca"]), "--tls-auth-clients", "yes"),
                *("--requirepass", password, "--save", "", "--appendonly", "no", "--dir", str(tmp)),
                *("--logfile", str(self.log)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def settings(self, **changes: str) -> Settings:
        env = {
            "PROJECTOR_REDIS_URL": f"rediss://127.0.0.1:{self.port}/0",
            "PROJECTOR_REDIS_PASSWORD": "tls-redis-secret",
            "PROJECTOR_REDIS_SSL_CAFILE": str(self.files["ca"]),
            "PROJECTOR_REDIS_SSL_CERTFILE": str(self.files["client"]),
            "PROJECTOR_REDIS_SSL_KEYFILE": str(self.files["client_key"]),
            "PROJECTOR_PROJECTION_NAMESPACE": "tls",
        }
        env.update(changes)
        return Settings.from_env({k: v for k, v in env.items() if v})

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    server = TlsRedis(tmp_path, "tls-redis-secret")
    try:
        yield server
    finally:
        server.stop()


async def _ping(settings: Settings, timeout: float = 30) -> Any:
    """The store's client PINGs once the server listens; returns the reply or the exception."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from app.stores.redis_projection import RedisProjectionStore

    store = RedisProjectionStore.from_settings(settings.redis)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return await store.client.ping()
            except RedisConnectionError as exc:
                # Refused while the server starts; anything else (TLS, auth) is the answer.
                if "refused" not in str(exc).lower() or time.monotonic() > deadline:
                    return exc
            except Exception as exc:
                return exc
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()


async def test_the_store_reaches_a_tls_redis_with_a_password_only_with_the_settings(
    tls_redis: TlsRedis,
) -> None:
    from app.stores.redis_projection import RedisProjectionStore
    from tests.support.rows import flush, make_row

    settings = tls_redis.settings()
    assert await _ping(settings) is True
    store = RedisProjectionStore.from_settings(settings.redis, "tls")
    try:
        await store.write([flush(7, [make_row(7, 1, act=1)], 3, 1)])
        assert await store.versions([7]) == [3]
    finally:
        await store.aclose()
    no_password = await _ping(tls_redis.settings(PROJECTOR_REDIS_PASSWORD=""))
    assert "auth" in str(no_password).lower(), no_password
    wrong_ca = await _ping(tls_redis.settings(PROJECTOR_REDIS_SSL_CAFILE=str(tls_redis.files["client"])))
    assert "certificate" in str(wrong_ca).lower(), wrong_ca
