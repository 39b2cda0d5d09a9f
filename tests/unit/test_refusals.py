"""A server that answers and refuses the client (issue 32 item 6) is told apart from one that does
not answer: the line names the setting to fix (app/kafka/refusal.py, app.connections.tls_refusal,
app.stores.cassandra_session.refusal). The real refusals of a secured Kafka and Cassandra are in
tests/integration/test_secured_servers.py; here the parts that need no broker: TLS servers of
the test's own, and the Cassandra driver's errors as it raises them."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from cassandra import AuthenticationFailed  # type: ignore[attr-defined,unused-ignore]
from cassandra.cluster import NoHostAvailable

from app.connections import kafka_security_options
from app.kafka.refusal import kafka_refusal, kafka_unreachable
from app.settings import Settings
from app.stores.cassandra_session import refusal


def _closed_port() -> int:
    """A port nothing listens on (bound a moment ago, closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _tls_server(certificate: trustme.LeafCert) -> tuple[asyncio.Server, int]:
    """A TLS listener on 127.0.0.1 presenting `certificate` (it never speaks Kafka)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(context)

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def tls_port() -> AsyncIterator[tuple[int, trustme.CA]]:
    """A TLS server whose certificate (for 127.0.0.1) the returned CA signed."""
    ca = trustme.CA()
    server, port = await _tls_server(ca.issue_cert("127.0.0.1"))
    async with server:
        yield port, ca


def _sasl_ssl(bootstrap: str, cafile: str) -> Settings:
    return Settings.build(
        kafka_bootstrap=bootstrap,
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="projector",
        kafka_sasl_password="secret",
        kafka_ssl_cafile=cafile,
    )


async def test_a_certificate_from_another_ca_names_the_ca_file(
    tls_port: tuple[int, trustme.CA], tmp_path: Path
) -> None:
    port, _ = tls_port
    other = trustme.CA()
    cafile = str(tmp_path / "other-ca.pem")
    other.cert_pem.write_to_path(cafile)
    settings = _sasl_ssl(f"127.0.0.1:{port}", cafile)
    line = await kafka_refusal(settings.kafka.kafka_bootstrap, kafka_security_options(settings.kafka))
    assert line is not None
    assert line.startswith(
        f"Kafka at 127.0.0.1:{port} presented a TLS certificate this client does not trust ("
    )
    assert line.endswith("): PROJECTOR_KAFKA_SSL_CAFILE must name the CA that signed it")


async def test_a_certificate_for_another_name_says_so(tmp_path: Path) -> None:
    ca = trustme.CA()
    cafile = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(cafile)
    server, port = await _tls_server(ca.issue_cert("kafka.example.test"))
    async with server:
        settings = _sasl_ssl(f"127.0.0.1:{port}", cafile)
        line = await kafka_refusal(settings.kafka.kafka_bootstrap, kafka_security_options(settings.kafka))
    assert line is not None
    assert line.startswith(f"Kafka at 127.0.0.1:{port} presented a TLS certificate for another name (")
    assert "PROJECTOR_KAFKA_SSL_CAFILE" not in line


async def test_nothing_listening_or_plaintext_is_no_refusal_and_keeps_the_hint() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    secured = _sasl_ssl(bootstrap, "")
    assert await kafka_refusal(bootstrap, kafka_security_options(secured.kafka)) is None
    plain = Settings.build(kafka_bootstrap=bootstrap)
    assert await kafka_refusal(bootstrap, kafka_security_options(plain.kafka)) is None
    line = await kafka_unreachable(bootstrap, kafka_security_options(secured.kafka), OSError("refused"))
    assert line.startswith(f"cannot reach Kafka at {bootstrap} (") and line.endswith("`make services-up`")


def test_cassandra_login_refused_names_the_credentials() -> None:
    said = (
        "Failed to authenticate to 127.0.0.1:9142: Error from server: code=0100 [Bad credentials] "
        'message="Provided username projector and/or password are incorrect"'
    )
    exc = NoHostAvailable("Unable to connect to any servers", {"127.0.0.1:9142": AuthenticationFailed(said)})
    assert refusal(exc) == (
        "Cassandra at 127.0.0.1:9142 refused the login: Provided username projector and/or password are "
        "incorrect; check PROJECTOR_CASSANDRA_USERNAME and PROJECTOR_CASSANDRA_PASSWORD"
    )


def test_cassandra_certificate_not_trusted_names_the_ca_file() -> None:
    # The driver re-raises the failed handshake as a socket error with the text only.
    said = (
        "Tried connecting to [('127.0.0.1', 9142)]. Last error: [SSL: CERTIFICATE_VERIFY_FAILED] certificate "
        "verify failed: self-signed certificate in certificate chain (_ssl.c:1006)"
    )
    exc = NoHostAvailable("Unable to connect to any servers", {"127.0.0.1:9142": OSError(None, said)})
    assert refusal(exc) == (
        "Cassandra at 127.0.0.1:9142 presented a TLS certificate this client does not trust (self-signed "
        "certificate in certificate chain): PROJECTOR_CASSANDRA_SSL_CAFILE must name the CA that signed it"
    )


def test_cassandra_not_answering_is_no_refusal() -> None:
    exc = NoHostAvailable(
        "Unable to connect to any servers", {"127.0.0.1:9142": ConnectionRefusedError(111, "x")}
    )
    assert refusal(exc) is None
