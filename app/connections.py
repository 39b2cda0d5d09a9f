"""Each client's connection options from its settings section: where security and topology are applied.

Every Kafka client the product builds (aiokafka's consumer, producer and admin client; faust's
broker connection, through `faust_credentials` beside the faust App), every Cassandra cluster
and every Redis client takes its options from a function here, so a SASL password, a CA file or
a local data center set in the environment reaches all of them, and a new client cannot forget
one. The settings are validated by their sections in app/settings/ (TLS files exist, SASL has
credentials, ...); this module only translates.

The client libraries are imported inside the functions: importing this module stays cheap, and
``app.api`` (which must not import faust or aiokafka) can use the Redis and Cassandra parts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import CassandraSettings, KafkaSettings, RedisSettings


def tls_context(cafile: str = "", certfile: str = "", keyfile: str = "") -> ssl.SSLContext:
    """A client TLS context that verifies the server (against ``cafile``, else the system's CAs)
    and checks its host name; with ``certfile`` + ``keyfile`` it also presents a client
    certificate (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile or None)
    if certfile:
        context.load_cert_chain(certfile, keyfile or None)
    return context


# -- Kafka ----------------------------------------------------------------------------------------


def kafka_tls(kafka: KafkaSettings) -> ssl.SSLContext | None:
    if kafka.kafka_security_protocol not in ("SSL", "SASL_SSL"):
        return None
    return tls_context(kafka.kafka_ssl_cafile, kafka.kafka_ssl_certfile, kafka.kafka_ssl_keyfile)


def kafka_client_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for aiokafka's AIOKafkaConsumer/AIOKafkaProducer/AIOKafkaAdminClient:
    the bootstrap servers and the security options (``**`` them into the constructor)."""
    return {"bootstrap_servers": kafka.kafka_bootstrap, **kafka_security_options(kafka)}


def kafka_security_options(kafka: KafkaSettings) -> dict[str, Any]:
    """The security part of :func:`kafka_client_options` (for code given the servers apart)."""
    options: dict[str, Any] = {"security_protocol": kafka.kafka_security_protocol}
    context = kafka_tls(kafka)
    if context is not None:
        options["ssl_context"] = context
    if kafka.kafka_security_protocol.startswith("SASL_"):
        options["sasl_mechanism"] = kafka.kafka_sasl_mechanism
        options["sasl_plain_username"] = kafka.kafka_sasl_username
        options["sasl_plain_password"] = kafka.kafka_sasl_password
    return options


def cassandra_cluster_options(cassandra: CassandraSettings) -> dict[str, Any]:
    """Keyword arguments for ``cassandra.cluster.Cluster``: authentication and TLS."""
    options: dict[str, Any] = {}
    if cassandra.cassandra_username:
        from cassandra.auth import PlainTextAuthProvider

        options["auth_provider"] = PlainTextAuthProvider(
            username=cassandra.cassandra_username, password=cassandra.cassandra_password
        )
    if cassandra.cassandra_ssl:
        options["ssl_context"] = tls_context(
            cassandra.cassandra_ssl_cafile, cassandra.cassandra_ssl_certfile, cassandra.cassandra_ssl_keyfile
        )
    return options


def keyspace_replication(cassandra: CassandraSettings) -> dict[str, int] | None:
    """Copies per data center when bootstrap creates the keyspace (NetworkTopologyStrategy), or
    None for SimpleStrategy with ``cassandra_replication_factor`` (one DC, no DC named)."""
    per_dc = cassandra.replication_per_dc
    if per_dc:
        return per_dc
    if cassandra.cassandra_local_dc:
        return {cassandra.cassandra_local_dc: cassandra.cassandra_replication_factor}
    return None


# -- Redis ----------------------------------------------------------------------------------------


def redis_client_options(redis: RedisSettings) -> dict[str, Any]:
    """Keyword arguments for redis-py's ``from_url`` (a plain or a cluster client) next to
    ``redis.redis_url``: credentials, and the TLS files of a rediss:// URL."""
    options: dict[str, Any] = {}
    if redis.redis_password:
        options["password"] = redis.redis_password
        if redis.redis_username:
            options["username"] = redis.redis_username
    if redis.redis_ssl_cafile:
        options["ssl_ca_certs"] = redis.redis_ssl_cafile
    if redis.redis_ssl_certfile:
        options["ssl_certfile"] = redis.redis_ssl_certfile
        options["ssl_keyfile"] = redis.redis_ssl_keyfile
    return options


# -- where the servers are ------------------------------------------------------------------------

LOCAL_SERVERS_HINT = "start the local servers with `make services-up`"


def is_loopback(host: str) -> bool:
    """This machine: ``localhost``, 127.0.0.0/8, ``::1`` (brackets allowed)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def kafka_hosts(bootstrap: str) -> list[str]:
    """The host of each ``host:port`` of a bootstrap list."""
    return [_host_of(part.strip()) for part in bootstrap.split(",") if part.strip()]


def redis_hosts(url: str) -> list[str]:
    """The host(s) of a Redis URL (a cluster URL may list several; a unix socket is local)."""
    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        return ["localhost"]
    netloc = rest.partition("/")[0].partition("?")[0].rpartition("@")[2]
    return [_host_of(part) for part in netloc.split(",") if part] or ["localhost"]


def _host_of(address: str) -> str:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> the host."""
    if address.startswith("["):
        return address[: address.find("]") + 1]
    return address.rpartition(":")[0] if address.count(":") == 1 else address


def unreachable_hint(hosts: list[str] | tuple[str, ...]) -> str:
    """What to do about a server that does not answer: for servers on this machine, the local
    servers are probably not started; for a remote address, that hint would mislead (the
    network, the address or the server is the problem), so none is given."""
    if hosts and all(is_loopback(host) for host in hosts):
        return f"; {LOCAL_SERVERS_HINT}"
    return "; check the address and that the server runs and is reachable from here"


def kafka_error_text(exc: BaseException) -> str:
    """An aiokafka error in a few words: its str() repeats the class name and, for a bootstrap
    that failed, lists socket address tuples."""
    text = str(exc)
    if "Unable to bootstrap" in text:
        return "no broker answered"
    return text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"


def tls_refusal(server: str, address: str, exc: BaseException | str, cafile_setting: str) -> str:
    """The line for a server certificate the client refused (``exc``: the verification error or
    its text): not trusted (the CA file), or not naming the address (the certificate)."""
    reason = getattr(exc, "verify_message", None) or _verify_text(str(exc))
    if "hostname mismatch" in reason.lower() or "ip address mismatch" in reason.lower():
        return (
            f"{server} at {address} presented a TLS certificate for another name ({reason}): connect by a "
            "name or address its certificate lists"
        )
    return (
        f"{server} at {address} presented a TLS certificate this client does not trust ({reason}): "
        f"{cafile_setting} must name the CA that signed it"
    )


def _verify_text(text: str) -> str:
    """ "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: X (_ssl.c:1006)" -> "X"."""
    reason = text.partition("certificate verify failed: ")[2] or text
    return reason.split(" (_ssl.c")[0].strip()


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.CRITICAL) -> Iterator[None]:
    """Raise a library logger's level for a block: a failed connect the caller reports in one
    line of its own must not also print the library's line per attempt."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
