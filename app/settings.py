"""The one settings object: built once from the environment, frozen, passed down.

Nothing else in the code base reads ``os.environ``: every knob is a field here, set by the
environment variable ``PROJECTOR_<FIELD NAME IN UPPER CASE>`` (``PROJECTOR_KAFKA_BOOTSTRAP``,
``PROJECTOR_TOPIC_PARTITIONS``, ...). Defaults match the local servers that ``make services-up``
starts, and ``docker/compose.yaml`` (a unit test keeps the two in step).

Value syntax: ints in decimal; floats as decimal numbers (``0.005``); booleans
``true/false/1/0/yes/no/on/off``; lists (contact points) comma-separated. An unknown
``PROJECTOR_*`` variable is an error, so a typo cannot silently fall back to a default. All
problems are reported together in one :class:`SettingsError`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from app.redis_url import parse_redis_url

ENV_PREFIX = "PROJECTOR_"

_LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
_FILL_MODES = frozenset({"never", "empty", "always"})
# HMAC-SHA256 keys shorter than this are guessable in practice; 32 chars of token_urlsafe = 192 bits.
API_SECRET_MIN_CHARS = 32
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# Kafka's legal topic characters; the length bound leaves room for faust's changelog suffixes.
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
# An unquoted CQL identifier (Cassandra caps keyspace names at 48 characters).
_KEYSPACE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HOST_PORT_RE = re.compile(r"(?P<host>[^\s:,]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")


class SettingsError(ValueError):
    """The environment does not describe a valid configuration; the message lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid settings:\n  - " + "\n  - ".join(self.problems))


@dataclass(frozen=True, slots=True)
class Settings:
    # --- servers -------------------------------------------------------------------------------
    kafka_bootstrap: str = "127.0.0.1:9092"
    # One server (redis://, rediss://, unix://) or a Redis Cluster
    # (redis+cluster://host:port[,host:port...]); every form in app/redis_url.py.
    redis_url: str = "redis://127.0.0.1:6379/0"
    cassandra_contact_points: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
    cassandra_keyspace: str = "session_projector"
    # SimpleStrategy replication factor used when bootstrap creates the keyspace (1 = one node).
    cassandra_replication_factor: int = 1

    # --- Kafka consumer group (the workers of one app_id share mailbox-tail's partitions) --------
    # How long the group waits for a silent worker before its partitions go to the others: a
    # SIGKILLed or partitioned worker's partitions (and their unflushed work) stand still this long.
    # Lower = faster take-over, but a worker stalled longer than this (a GC pause, a loaded host)
    # is thrown out and its partitions move (a rebalance; nothing is lost, work is re-read). The
    # broker only accepts values between its group.min/max.session.timeout.ms (6 s..30 min by
    # default).
    kafka_session_timeout_ms: int = 30_000
    # How often a worker tells the group it is alive; at most a third of the session timeout, so
    # two missed heartbeats never end a session.
    kafka_heartbeat_interval_ms: int = 3_000
    # Longest time between two fetches before the worker counts as stuck and leaves the group. A
    # batch, a flush or a revocation's persist must finish within it. Kafka's default.
    kafka_max_poll_interval_ms: int = 300_000

    # --- topics (names become changelog/consumer identities: never rename casually) -------------
    topic_mailbox_tail: str = "mailbox-tail"
    topic_session_delta: str = "session-delta"
    topic_badge: str = "badge"
    topic_dead_letter: str = "mailbox-dead-letter"
    # Every topic bootstrap creates gets this many partitions, so a table's changelog and its
    # source topic always agree (faust's co-partitioning requirement).
    topic_partitions: int = 4
    topic_replication_factor: int = 1

    # --- processing (DESIGN.md §2-§3) ----------------------------------------------------------
    lanes: int = 1
    projection_compaction_window_ms: int = 5000
    max_dirty_rows: int = 100_000
    include_muted: bool = False
    # Users written to the projection store per pipelined round trip during one flush.
    flush_batch_size: int = 512
    # Worker intake: one fetch of one partition is one batch for the core. Bigger batches cost
    # less per entry (faust's per-event path runs once per batch) and hold more in memory; the
    # records' total size is also capped per partition and fetch by intake_fetch_max_bytes.
    intake_batch_max_records: int = 20_000
    intake_fetch_max_bytes: int = 4 * 1024 * 1024
    # Beyond this distance between base and latest, unread becomes inexact (shown as 99+).
    unread_precise_limit: int = 200

    # --- projection store (Redis) -----------------------------------------------------------------
    # Key prefix of the serving projection; a rebuild writes another namespace and swaps.
    projection_namespace: str = "proj"
    # Count persistent writes per (user, conversation) in the store (audit of DESIGN §3.9's bound).
    projection_count_writes: bool = False
    # How long the worker, the audit and `projector rebuild` keep retrying (exponential backoff
    # with jitter) a store call that failed in a way that passes: connection refused/reset, a
    # timeout, CLUSTERDOWN, TRYAGAIN, a redirection loop. Long enough to ride out a cluster
    # failover (node timeout + election: ~5 s on the local cluster); then the error is raised.
    # The API never waits: it answers 503. 0 = no retries.
    redis_retry_budget_ms: int = 30_000

    # --- unread audit (issue 7; app/worker/audit.py) ----------------------------------------------
    # Every `unread_audit_interval_ms` the worker samples the rows that have unread and have not
    # changed for `unread_audit_idle_ms`, recomputes each from the MessageStore (one bounded,
    # single-partition range read) and corrects what drifted. The sample rate is the share of
    # those rows each round draws; 0 turns the audit off.
    #
    # Default 0.005 per 10-minute round: 144 rounds/day x 0.5 % = each eligible row audited 0.72
    # times a day on average, so a drifted row is found within ~1.4 days on average and within a
    # week with 99.4 % probability (1 - e^(-0.72 d)). Cost: one <= 200-message read of one
    # Cassandra partition per audited row; a heavy user whose 5,000 conversations all sat unread
    # and idle costs 3,600 reads a day (one per 24 s), a worker holding 2 million such rows ~17
    # reads/s spread over the day, and `unread_audit_max_rows` caps any round whatever the row
    # count (20,000 per 10 min = 33 reads/s per worker at most). docs/contract-notes.md ("Unread audit").
    unread_audit_sample_rate: float = 0.005
    unread_audit_interval_ms: int = 600_000
    # "No change for 24 h" (issue 7): a row still changing is not worth a read (its next entry
    # recomputes it anyway), and the MessageStore has long caught up with what it received.
    unread_audit_idle_ms: int = 86_400_000
    # At most this many rows read per round (the sample's lowest draws: uniform, never biased
    # towards the users scanned first).
    unread_audit_max_rows: int = 20_000

    # --- fault injection (tests of crash safety; 0 = off) ----------------------------------------
    # SIGKILL the worker itself right after its Nth projection-store write, before that flush's
    # frames are produced: the crash window of acceptance J-7.
    fault_kill_after_store_writes: int = 0

    # --- processes -----------------------------------------------------------------------------
    app_id: str = "session-projector"
    # The worker's local state (faust's RocksDB stores); rebuilt from changelogs when lost.
    data_dir: str = ".local/worker"
    worker_web_host: str = "127.0.0.1"
    worker_web_port: int = 6066  # 0 disables the worker's web server (several workers per host)
    # The worker's Prometheus endpoint (GET /metrics on worker_web_host; its own small aiohttp
    # server, not faust's). 0 = off, the default: several workers per host need distinct ports.
    worker_metrics_port: int = 0
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    log_level: str = "INFO"

    # --- query API (DESIGN §5; `projector api`, `projector token`) -----------------------------
    # HMAC-SHA256 key for bearer tokens and page cursors. Empty = not configured: `projector api`
    # and `projector token` refuse to start, so no deployment runs on a guessable default.
    # Generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.
    api_secret: str = dataclasses.field(default="", repr=False)  # never in logs or tracebacks
    # Lifetime of a token minted by `projector token` when --ttl is not given.
    api_token_ttl_s: int = 3600
    # A snapshot (one user's ordered list) lives this long after its load, then is reloaded.
    api_snapshot_ttl_ms: int = 300_000
    # At most this many rows go into one user's snapshot (the seed's max_conversations_per_user).
    api_snapshot_max_rows: int = 5000
    # LRU bound on the rows held by all snapshots together (memory: ~1 KB per row).
    api_snapshot_cache_rows: int = 500_000
    # When the API fills rows missing from the projection store from Cassandra (DESIGN §5):
    # "empty" = only when the store holds nothing for the user (projection lost, user not yet
    # flushed), "always" = join UserConversationState on every snapshot load (also catches
    # single lost rows; one Cassandra partition read per load), "never".
    api_fill_from_state: str = "empty"

    # --- member directory (DESIGN §8, seed 004) ---------------------------------------------------
    # Time the presentation call may spend on record_count/mention_count before answering without
    # them (identities are never held back). The seed's budget is 2 s.
    members_stats_budget_ms: int = 2000

    env_prefix: ClassVar[str] = ENV_PREFIX

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise SettingsError(problems)

    # ------------------------------------------------------------------------------------------
    @classmethod
    def env_names(cls) -> dict[str, str]:
        """``{"PROJECTOR_KAFKA_BOOTSTRAP": "kafka_bootstrap", ...}`` for every field."""
        return {ENV_PREFIX + f.name.upper(): f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build the settings from ``environ`` (default: the process environment)."""
        env = os.environ if environ is None else environ
        names = cls.env_names()
        hints = typing.get_type_hints(cls)
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key in sorted(env):
            if not key.startswith(ENV_PREFIX):
                continue
            name = names.get(key)
            if name is None:
                problems.append(f"{key}: unknown setting (known: {', '.join(sorted(names))})")
                continue
            try:
                values[name] = _parse(hints[name], env[key])
                if name == "log_level":  # `info` is as clear as `INFO`
                    values[name] = values[name].upper()
            except ValueError as exc:
                problems.append(f"{key}={env[key]!r}: {exc}")
        if problems:
            raise SettingsError(problems)
        return cls(**values)

    def as_env(self) -> dict[str, str]:
        """The environment that reproduces these settings (for subprocesses and containers)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, tuple):
                text = ",".join(value)
            else:
                text = str(value)
            out[ENV_PREFIX + f.name.upper()] = text
        return out

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the product owns (bootstrap creates them all)."""
        return (
            self.topic_mailbox_tail,
            self.topic_session_delta,
            self.topic_badge,
            self.topic_dead_letter,
        )

    # ------------------------------------------------------------------------------------------
    def _problems(self) -> list[str]:
        p: list[str] = []
        if not self.kafka_bootstrap.strip():
            p.append("kafka_bootstrap: empty")
        for part in self.kafka_bootstrap.split(","):
            m = _HOST_PORT_RE.fullmatch(part.strip())
            if m is None or not 0 < int(m["port"]) < 65536:
                p.append(f"kafka_bootstrap: {part.strip()!r} is not HOST:PORT")
        try:
            parse_redis_url(self.redis_url)
        except ValueError as exc:  # the message never repeats the URL: it may hold a password
            p.append(f"redis_url: {exc}")
        if not 0 <= self.redis_retry_budget_ms <= 600_000:
            p.append(f"redis_retry_budget_ms: {self.redis_retry_budget_ms} is not in 0..600000")
        if not self.cassandra_contact_points or any(
            not h or h != h.strip() or "," in h for h in self.cassandra_contact_points
        ):
            p.append(f"cassandra_contact_points: {self.cassandra_contact_points!r} needs host names")
        if not _KEYSPACE_RE.fullmatch(self.cassandra_keyspace):
            p.append(
                f"cassandra_keyspace: {self.cassandra_keyspace!r} is not a CQL identifier "
                "(letter, then letters/digits/_; at most 48)"
            )
        for name in ("cassandra_port", "worker_web_port", "worker_metrics_port", "api_port"):
            port = getattr(self, name)
            lowest = 0 if name in ("worker_web_port", "worker_metrics_port") else 1
            if not lowest <= port < 65536:
                p.append(f"{name}: {port} is not a TCP port ({lowest}..65535)")
        if self.worker_metrics_port and self.worker_metrics_port == self.worker_web_port:
            p.append(
                f"worker_metrics_port: {self.worker_metrics_port} is also worker_web_port "
                "(one process cannot bind it twice)"
            )
        if not _NAMESPACE_RE.fullmatch(self.projection_namespace):
            p.append(f"projection_namespace: {self.projection_namespace!r} must match [A-Za-z0-9._-]{{1,64}}")
        topics = self.topics
        for name, topic in zip(
            ("topic_mailbox_tail", "topic_session_delta", "topic_badge", "topic_dead_letter"),
            topics,
            strict=True,
        ):
            if not _TOPIC_RE.fullmatch(topic):
                p.append(f"{name}: {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1..200)")
        if len(set(topics)) != len(topics):
            p.append(f"topic names must be distinct: {topics}")
        for name, low in (
            ("cassandra_replication_factor", 1),
            ("topic_partitions", 1),
            ("topic_replication_factor", 1),
            ("lanes", 1),
            ("projection_compaction_window_ms", 1),
            ("max_dirty_rows", 1),
            ("flush_batch_size", 1),
            ("intake_batch_max_records", 1),
            ("intake_fetch_max_bytes", 1024),
            ("unread_precise_limit", 1),
            ("fault_kill_after_store_writes", 0),
        ):
            if getattr(self, name) < low:
                p.append(f"{name}: {getattr(self, name)} must be >= {low}")
        if not 6_000 <= self.kafka_session_timeout_ms <= 1_800_000:
            p.append(
                f"kafka_session_timeout_ms: {self.kafka_session_timeout_ms} is not in 6000..1800000 "
                "(the broker's default group.min/max.session.timeout.ms)"
            )
        if not 100 <= self.kafka_heartbeat_interval_ms <= self.kafka_session_timeout_ms // 3:
            p.append(
                f"kafka_heartbeat_interval_ms: {self.kafka_heartbeat_interval_ms} is not in "
                f"100..{self.kafka_session_timeout_ms // 3} (a third of kafka_session_timeout_ms)"
            )
        if not 1_000 <= self.kafka_max_poll_interval_ms <= 86_400_000:
            p.append(
                f"kafka_max_poll_interval_ms: {self.kafka_max_poll_interval_ms} is not in 1000..86400000"
            )
        if not self.app_id or not _TOPIC_RE.fullmatch(self.app_id):
            # faust derives topic names (changelogs) from the app id.
            p.append(f"app_id: {self.app_id!r} must be usable in a topic name ([A-Za-z0-9._-])")
        if not self.data_dir.strip():
            p.append("data_dir: empty")
        for name in ("worker_web_host", "api_host"):
            if not getattr(self, name).strip():
                p.append(f"{name}: empty")
        if self.api_secret and len(self.api_secret) < API_SECRET_MIN_CHARS:
            p.append(f"api_secret: {len(self.api_secret)} characters; use at least {API_SECRET_MIN_CHARS}")
        for name in ("api_token_ttl_s", "api_snapshot_ttl_ms", "api_snapshot_max_rows"):
            if getattr(self, name) < 1:
                p.append(f"{name}: {getattr(self, name)} must be >= 1")
        if self.api_snapshot_cache_rows < self.api_snapshot_max_rows:
            # Otherwise one heavy user's snapshot could never be cached at all.
            p.append(
                f"api_snapshot_cache_rows: {self.api_snapshot_cache_rows} must be >= "
                f"api_snapshot_max_rows ({self.api_snapshot_max_rows})"
            )
        if self.api_fill_from_state not in _FILL_MODES:
            p.append(f"api_fill_from_state: {self.api_fill_from_state!r} is not one of always, empty, never")
        if not 1 <= self.members_stats_budget_ms <= 60_000:
            # Above a minute a "budget" would hold HTTP requests open instead of bounding them.
            p.append(f"members_stats_budget_ms: {self.members_stats_budget_ms} is not in 1..60000")
        if not 0.0 <= self.unread_audit_sample_rate <= 1.0:  # also refuses nan
            p.append(f"unread_audit_sample_rate: {self.unread_audit_sample_rate} is not in 0..1")
        if not 1000 <= self.unread_audit_interval_ms <= 86_400_000:
            # Below a second the rounds would scan the rows back to back; above a day they would
            # not be "periodic" in any useful sense.
            p.append(f"unread_audit_interval_ms: {self.unread_audit_interval_ms} is not in 1000..86400000")
        if self.unread_audit_idle_ms < 0:
            p.append(f"unread_audit_idle_ms: {self.unread_audit_idle_ms} must be >= 0")
        if self.unread_audit_max_rows < 1:
            p.append(f"unread_audit_max_rows: {self.unread_audit_max_rows} must be >= 1")
        if self.log_level not in _LOG_LEVELS:
            levels = ", ".join(sorted(_LOG_LEVELS))
            p.append(f"log_level: {self.log_level!r} is not one of {levels}")
        return p


def _parse(hint: Any, text: str) -> Any:
    """Turn one environment string into the field's type (ValueError with a reason otherwise)."""
    if hint is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("expected a boolean (true/false, 1/0, yes/no, on/off)")
    if hint is int:
        try:
            return int(text.strip(), 10)
        except ValueError:
            raise ValueError("expected a decimal integer") from None
    if hint is float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError("expected a decimal number") from None
        if not math.isfinite(value):  # "nan" and "inf" parse, but are never a setting
            raise ValueError("expected a finite decimal number")
        return value
    if typing.get_origin(hint) is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if hint is str:
        return text.strip()
    raise TypeError(f"unsupported settings type {hint!r}")  # a new field needs a parser here
