"""Common mistakes end in one line naming what to fix (issue 15), without the servers: the API's
secret is checked before anything connects, a contact point with a port is named as the mistake
it is, and the `make services-up` hint is given only for servers on this machine."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli import main
from app.connections import (
    LOCAL_SERVERS_HINT,
    is_loopback,
    kafka_error_text,
    kafka_hosts,
    redis_hosts,
    unreachable_hint,
)


def test_api_without_a_secret_fails_before_connecting_to_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def connect(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("connected before checking the secret")

    import app.gateway.wiring
    import app.stores.cassandra_session
    import app.stores.redis_projection

    monkeypatch.setattr(app.stores.cassandra_session, "open_cluster", connect)
    monkeypatch.setattr(app.gateway.wiring, "open_gateway", connect)
    monkeypatch.setattr(app.stores.redis_projection.RedisProjectionStore, "from_settings", connect)
    monkeypatch.delenv("PROJECTOR_API_SECRET", raising=False)
    assert main(["api"]) == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("projector api: PROJECTOR_API_SECRET is not set")


def test_a_contact_point_with_its_port_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROJECTOR_CASSANDRA_CONTACT_POINTS", "10.0.0.1:9042")
    assert main(["bootstrap"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "projector bootstrap: invalid settings: PROJECTOR_CASSANDRA_CONTACT_POINTS: '10.0.0.1:9042' is "
        "host:port, but a contact point is a host only: the port goes in PROJECTOR_CASSANDRA_PORT (now 9042)"
    ]


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
        ("kafka", False),
        ("redis.internal", False),
        ("fe80::1", False),
    ],
)
def test_loopback_addresses(host: str, local: bool) -> None:
    assert is_loopback(host) is local


def test_the_local_servers_hint_only_for_this_machine() -> None:
    assert unreachable_hint(["127.0.0.1"]) == f"; {LOCAL_SERVERS_HINT}"
    assert unreachable_hint(kafka_hosts("127.0.0.1:9092,localhost:9093")) == f"; {LOCAL_SERVERS_HINT}"
    for hosts in (
        ["10.0.0.1"],
        kafka_hosts("127.0.0.1:9092,kafka-2:9092"),
        redis_hosts("redis://cache:6379/0"),
    ):
        hint = unreachable_hint(hosts)
        assert "make services-up" not in hint and "check the address" in hint


def test_hosts_of_kafka_and_redis_addresses() -> None:
    assert kafka_hosts("a:1, [::1]:9092 ,b:2") == ["a", "[::1]", "b"]
    assert redis_hosts("redis://127.0.0.1:6379/0") == ["127.0.0.1"]
    assert redis_hosts("rediss://user:p@ss:w0rd@cache.example:6380/1") == [
        "cache.example"
    ]  # never the password
    assert redis_hosts("redis://[::1]:6379") == ["[::1]"]
    assert redis_hosts("redis+cluster://n1:7000,n2:7001") == ["n1", "n2"]
    assert redis_hosts("unix:///run/redis.sock") == ["localhost"]


def test_kafka_errors_in_a_few_words() -> None:
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

    bootstrap = KafkaConnectionError(
        "Unable to bootstrap from [('127.0.0.1', 1, <AddressFamily.AF_INET: 2>)]"
    )
    assert kafka_error_text(bootstrap) == "no broker answered"
    assert kafka_error_text(KafkaTimeoutError()) == "KafkaTimeoutError"
