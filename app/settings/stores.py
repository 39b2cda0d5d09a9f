"""The store sections: the Redis projection store (`RedisSettings`) and Cassandra
(`CassandraSettings`), each with its security and topology."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from app.redis_url import parse_redis_url
from app.settings.base import Section, bounded, port_problem
from app.settings.kafka import tls_file_problems

# An unquoted CQL identifier (Cassandra caps keyspace names at 48 characters).
_KEYSPACE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A contact point written as host:port (or [v6]:port); a bare IPv6 address has several colons.
_HOST_WITH_PORT_RE = re.compile(r"(?:[^\s:\[\]]+|\[[0-9A-Fa-f:.]+\]):\d+")
_DC_RF_RE = re.compile(r"(?P<dc>[A-Za-z0-9._-]{1,64}):(?P<rf>[0-9]{1,3})")


@dataclass(frozen=True, slots=True)
class RedisSettings(Section):
    """The projection store: where it is, how to log in, its key namespace and write pacing."""

    # One server (redis://, rediss://, unix://) or a Redis Cluster
    # (redis+cluster://host:port[,host:port...]); every form in app/redis_url.py.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # ACL user and password (or the URL's), TLS with a rediss:// URL (CA and client certificate
    # files as for Kafka).
    redis_username: str = ""
    redis_password: str = dataclasses.field(default="", repr=False)
    redis_ssl_cafile: str = ""
    redis_ssl_certfile: str = ""
    redis_ssl_keyfile: str = ""
    # How long the worker, the audit and `projector rebuild` keep retrying (exponential backoff
    # with jitter) a store call that failed in a way that passes (refused, reset, a timeout,
    # CLUSTERDOWN, TRYAGAIN): long enough to ride out a cluster failover. The API never waits:
    # it answers 503. 0 = no retries.
    redis_retry_budget_ms: int = bounded(30_000, 0, 600_000)
    # Key prefix of the serving projection; a rebuild writes another namespace and swaps.
    projection_namespace: str = "proj"
    # Count persistent writes per (user, conversation) (audit of docs/contract.md §3.9's bound).
    projection_count_writes: bool = False
    # Users written to the projection store per pipelined round trip.
    flush_batch_size: int = bounded(512, 1)

    def _problems(self) -> list[str]:
        p: list[str] = []
        try:
            parse_redis_url(self.redis_url)
        except ValueError as exc:  # the message never repeats the URL: it may hold a password
            p.append(f"redis_url: {exc}")
        if not _NAMESPACE_RE.fullmatch(self.projection_namespace):
            p.append(f"projection_namespace: {self.projection_namespace!r} must match [A-Za-z0-9._-]{{1,64}}")
        # rediss:// (and a TLS cluster scheme such as rediss+cluster://, should one be added).
        tls_url = self.redis_url.partition("://")[0].startswith("rediss")
        files = (self.redis_ssl_cafile, self.redis_ssl_certfile, self.redis_ssl_keyfile)
        p += tls_file_problems("redis", *files, tls_url, "a rediss:// URL")
        if self.redis_password and "@" in self.redis_url.partition("://")[2].partition("/")[0]:
            # redis-py lets the URL's credentials win: one of the two would be ignored.
            p.append("redis_password: the redis_url carries credentials too; give them in one place")
        if self.redis_username and not self.redis_password:
            p.append("redis_username: needs redis_password")
        return p


@dataclass(frozen=True, slots=True)
class CassandraSettings(Section):
    """The MessageStore's and the state mirror's cluster: contact points, keyspace, login, TLS,
    the local data center and the replication bootstrap creates the keyspace with."""

    cassandra_contact_points: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
    cassandra_keyspace: str = "session_projector"
    # SimpleStrategy replication factor used when bootstrap creates the keyspace (1 = one node).
    cassandra_replication_factor: int = bounded(1, 1)
    # Password authentication, TLS (CA and client certificate files as for Kafka), and the local
    # data center: queries go to its nodes first, and bootstrap creates the keyspace with
    # NetworkTopologyStrategy, cassandra_replication_factor copies in the local DC, or exactly
    # cassandra_replication_per_dc ("dc1:3,dc2:3") when that is set.
    cassandra_username: str = ""
    cassandra_password: str = dataclasses.field(default="", repr=False)
    cassandra_ssl: bool = False
    cassandra_ssl_cafile: str = ""
    cassandra_ssl_certfile: str = ""
    cassandra_ssl_keyfile: str = ""
    cassandra_local_dc: str = ""
    cassandra_replication_per_dc: tuple[str, ...] = ()
    # Partitions per UNLOGGED batch of the state mirror's writes, only partitions on the same
    # replicas (1: a batch per partition). Ten is Cassandra's default warn threshold.
    cassandra_batch_partitions: int = bounded(10, 1, 100)

    @property
    def replication_per_dc(self) -> dict[str, int]:
        """``("dc1:3", "dc2:3")`` -> ``{"dc1": 3, "dc2": 3}``."""
        return replication_per_dc(self.cassandra_replication_per_dc)

    def _problems(self) -> list[str]:
        p: list[str] = []
        points = self.cassandra_contact_points
        if not points or any(not h or h != h.strip() or "," in h for h in points):
            p.append(f"cassandra_contact_points: {points!r} needs host names")
        with_port = [h for h in points if _HOST_WITH_PORT_RE.fullmatch(h)]
        if with_port:
            # The driver takes bare hosts and one port for all: "10.0.0.1:9042" is not resolvable.
            p.append(
                f"cassandra_contact_points: {', '.join(map(repr, with_port))} is host:port, but a "
                f"contact point is a host only: the port goes in cassandra_port (now {self.cassandra_port})"
            )
        if not _KEYSPACE_RE.fullmatch(self.cassandra_keyspace):
            p.append(
                f"cassandra_keyspace: {self.cassandra_keyspace!r} is not a CQL identifier "
                "(letter, then letters/digits/_; at most 48)"
            )
        return p + port_problem("cassandra_port", self.cassandra_port) + self._security_problems()

    def _security_problems(self) -> list[str]:
        p: list[str] = []
        if bool(self.cassandra_username) != bool(self.cassandra_password):
            p.append("cassandra_username/cassandra_password: give both or neither")
        files = (self.cassandra_ssl_cafile, self.cassandra_ssl_certfile, self.cassandra_ssl_keyfile)
        p += tls_file_problems("cassandra", *files, self.cassandra_ssl, "cassandra_ssl=true")
        local = self.cassandra_local_dc
        if local and not _DC_RF_RE.fullmatch(f"{local}:1"):
            p.append(f"cassandra_local_dc: {local!r} is not a data center name ([A-Za-z0-9._-])")
        entries = self.cassandra_replication_per_dc
        bad = [e for e in entries if not _DC_RF_RE.fullmatch(e) or e.endswith(":0")]
        if bad:
            p.append(f"cassandra_replication_per_dc: {bad} are not DC:RF (RF 1..999), e.g. dc1:3,dc2:3")
        per_dc = self.replication_per_dc
        if entries and not local:
            p.append("cassandra_replication_per_dc: needs cassandra_local_dc (the DC this process talks to)")
        elif per_dc and local not in per_dc:
            p.append(
                f"cassandra_local_dc: {local!r} holds no replica in cassandra_replication_per_dc "
                f"({', '.join(per_dc)})"
            )
        return p


def replication_per_dc(entries: tuple[str, ...]) -> dict[str, int]:
    """``("dc1:3", "dc2:3")`` -> ``{"dc1": 3, "dc2": 3}`` (entries validated by CassandraSettings)."""
    out: dict[str, int] = {}
    for entry in entries:
        m = _DC_RF_RE.fullmatch(entry)
        if m is not None:
            out[m["dc"]] = int(m["rf"])
    return out
