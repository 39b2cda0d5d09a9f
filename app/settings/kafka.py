"""The Kafka sections: how to reach the brokers (`KafkaSettings`) and the product's names in
Kafka (`TopicSettings`: topics, partitions, the consumer group and changelog identity)."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from app.settings.base import ENV_PREFIX, TOPIC_RE, Section, bounded

_HOST_PORT_RE = re.compile(r"(?P<host>[^\s:,]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class KafkaSettings(Section):
    """The brokers, the client security every Kafka client applies (app/connections.py), and the
    worker's consumer-group timing."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    # How long the group waits for a silent worker before its partitions go to the others: a
    # SIGKILLed or partitioned worker's partitions (and their unflushed work) stand still this long.
    # Lower = faster take-over, but a worker stalled longer than this (a GC pause, a loaded host)
    # is thrown out and its partitions move (a rebalance; nothing is lost, work is re-read). The
    # broker only accepts values between its group.min/max.session.timeout.ms (6 s..30 min by
    # default).
    kafka_session_timeout_ms: int = bounded(30_000, 6_000, 1_800_000)
    # How often a worker tells the group it is alive; at most a third of the session timeout, so
    # two missed heartbeats never end a session.
    kafka_heartbeat_interval_ms: int = 3_000
    # Longest time between two fetches before the worker counts as stuck and leaves the group. A
    # batch, a flush or a revocation's persist must finish within it. Kafka's default.
    kafka_max_poll_interval_ms: int = bounded(300_000, 1_000, 86_400_000)
    # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; SASL takes PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    # with a username and password. TLS verifies the brokers against kafka_ssl_cafile (PEM; empty =
    # the system's CAs); a client certificate (mutual TLS) is kafka_ssl_certfile + kafka_ssl_keyfile.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = dataclasses.field(default="", repr=False)
    kafka_ssl_cafile: str = ""
    kafka_ssl_certfile: str = ""
    kafka_ssl_keyfile: str = ""

    @property
    def tls(self) -> bool:
        return self.kafka_security_protocol in ("SSL", "SASL_SSL")

    def _problems(self) -> list[str]:
        p: list[str] = []
        if not self.kafka_bootstrap.strip():
            p.append("kafka_bootstrap: empty")  # one problem, not also "'' is not HOST:PORT"
        else:
            for part in self.kafka_bootstrap.split(","):
                m = _HOST_PORT_RE.fullmatch(part.strip())
                if m is None or not 0 < int(m["port"]) < 65536:
                    p.append(f"kafka_bootstrap: {part.strip()!r} is not HOST:PORT")
        if not 100 <= self.kafka_heartbeat_interval_ms <= self.kafka_session_timeout_ms // 3:
            p.append(
                f"kafka_heartbeat_interval_ms: {self.kafka_heartbeat_interval_ms} is not in "
                f"100..{self.kafka_session_timeout_ms // 3} (a third of kafka_session_timeout_ms)"
            )
        return p + self._security_problems()

    def _security_problems(self) -> list[str]:
        """Each combination that would connect differently than it reads (TLS files without TLS,
        half a client certificate, SASL without credentials) is an error, never a silent
        plaintext connection."""
        p: list[str] = []
        protocol = self.kafka_security_protocol
        if protocol not in KAFKA_PROTOCOLS:
            p.append(f"kafka_security_protocol: {protocol!r} is not one of {', '.join(KAFKA_PROTOCOLS)}")
        if protocol.startswith("SASL_"):
            if self.kafka_sasl_mechanism not in SASL_MECHANISMS:
                p.append(
                    f"kafka_sasl_mechanism: {self.kafka_sasl_mechanism!r} is not one of "
                    f"{', '.join(SASL_MECHANISMS)} (needed with {protocol})"
                )
            if not self.kafka_sasl_username or not self.kafka_sasl_password:
                p.append(f"kafka_sasl_username/kafka_sasl_password: both needed with {protocol}")
        elif self.kafka_sasl_mechanism or self.kafka_sasl_username or self.kafka_sasl_password:
            p.append(
                f"kafka_sasl_*: set, but kafka_security_protocol {protocol!r} is not SASL_PLAINTEXT/SASL_SSL"
            )
        files = (self.kafka_ssl_cafile, self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
        return p + tls_file_problems("kafka", *files, self.tls, "kafka_security_protocol SSL or SASL_SSL")


def tls_file_problems(
    server: str, cafile: str, certfile: str, keyfile: str, tls: bool, needs: str
) -> list[str]:
    """TLS files given without TLS, half a client certificate, or a file that cannot be read."""
    p: list[str] = []
    given = {
        f"{server}_ssl_cafile": cafile,
        f"{server}_ssl_certfile": certfile,
        f"{server}_ssl_keyfile": keyfile,
    }
    if not tls and any(given.values()):
        names = ", ".join(name for name, value in given.items() if value)
        p.append(f"{names}: TLS files given, but TLS is off (needs {needs})")
    if bool(certfile) != bool(keyfile):
        p.append(f"{server}_ssl_certfile/{server}_ssl_keyfile: a client certificate needs both")
    for name, path in given.items():
        # Checked at start, with every other problem: not at the first connect, minutes later.
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            p.append(f"{name}: {path!r} is not a readable file")
    return p


@dataclass(frozen=True, slots=True)
class TopicSettings(Section):
    """Every name the product owns in Kafka (names become changelog and consumer identities:
    never rename casually) and how bootstrap creates the topics."""

    topic_mailbox_tail: str = "mailbox-tail"
    topic_session_delta: str = "session-delta"
    topic_badge: str = "badge"
    topic_dead_letter: str = "mailbox-dead-letter"
    # Offline badge pushes (docs/contract.md §9): APNs/FCM-shaped records for users with no live stream.
    topic_push: str = "push"
    # Reconcile requests (docs/contract.md §10): keyed by user like mailbox-tail and with its
    # partition count, so partition p of both topics goes to the same worker: the owner.
    topic_reconcile: str = "reconcile-request"
    # Every topic bootstrap creates gets this many partitions, so the state changelog and its
    # source topic always agree.
    topic_partitions: int = bounded(4, 1)
    topic_replication_factor: int = bounded(1, 1)
    # Standby copies of the state (tables/durable): 1 keeps a warm local copy of every partition
    # this worker does not own, so a partition that moves here is claimed after reading only what
    # it lacks; 0 = none (a new owner reads the partition's changelog).
    table_standby_replicas: int = bounded(1, 0, 8)
    # The state changelog never drops a superseded record younger than this (docs/durability.md
    # "Compaction"): above the longest a partition stays unowned or a standby lags.
    changelog_min_compaction_lag_ms: int = bounded(86_400_000, 60_000)
    # The consumer group of the workers, and the prefix of the changelog topic and client ids.
    app_id: str = "session-projector"

    @property
    def changelog_topic(self) -> str:
        """The worker state's changelog topic: one partition per mailbox-tail partition."""
        return f"{self.app_id}-state-changelog"

    @property
    def names(self) -> tuple[str, ...]:
        """Every topic the product owns (bootstrap creates them all)."""
        return tuple(getattr(self, name) for name in _TOPIC_FIELDS)

    @classmethod
    def topic_env(cls, prefix: str) -> dict[str, str]:
        """Every topic setting named after `prefix` (``PROJECTOR_TOPIC_PUSH: "{prefix}-push"``...):
        what a test stack or a benchmark passes its processes, so a topic added later is covered
        too and no run leaves a product topic at its default name on a shared broker."""
        return {
            ENV_PREFIX + name.upper(): f"{prefix}-{name.removeprefix('topic_').replace('_', '-')}"
            for name in _TOPIC_FIELDS
        }

    def _problems(self) -> list[str]:
        p: list[str] = []
        names = self.names
        for name, topic in zip(_TOPIC_FIELDS, names, strict=True):
            if not TOPIC_RE.fullmatch(topic):
                p.append(f"{name}: {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1..200)")
        if len(set(names)) != len(names):
            p.append(f"topic names must be distinct: {names}")
        if not self.app_id or not TOPIC_RE.fullmatch(self.app_id):
            # The changelog topic and the consumer group are named after the app id.
            p.append(f"app_id: {self.app_id!r} must be usable in a topic name ([A-Za-z0-9._-])")
        return p


_TOPIC_FIELDS = (
    "topic_mailbox_tail",
    "topic_session_delta",
    "topic_badge",
    "topic_dead_letter",
    "topic_push",
    "topic_reconcile",
)
