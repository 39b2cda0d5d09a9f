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

from app.domain.fast_lane import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_MAX_MEMBERS_MAX,
    FAST_LANE_MAX_MEMBERS_MIN,
    FAST_LANE_PER_USER_PER_S,
    FAST_LANE_PER_USER_PER_S_MAX,
    FAST_LANE_PER_USER_PER_S_MIN,
)
from app.domain.projector import (
    MAX_DIRTY_ROWS_MIN,
    UNREAD_PRECISE_LIMIT_MIN,
    WINDOW_MS_MIN,
)
from app.redis_url import parse_redis_url

ENV_PREFIX = "PROJECTOR_"

_LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
_FILL_MODES = frozenset({"never", "empty", "always"})
_RATE_STORE_ERROR_MODES = frozenset({"open", "closed"})
_LOG_FORMATS = frozenset({"text", "json"})
# HMAC-SHA256 keys shorter than this are guessable in practice; 32 chars of token_urlsafe = 192 bits.
API_SECRET_MIN_CHARS = 32
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# Kafka's legal topic characters; the length bound leaves room for faust's changelog suffixes.
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
# An unquoted CQL identifier (Cassandra caps keyspace names at 48 characters).
_KEYSPACE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_PARTITION_RANGE_RE = re.compile(r"(?P<low>[0-9]{1,6})(?:-(?P<high>[0-9]{1,6}))?")
_HOST_PORT_RE = re.compile(r"(?P<host>[^\s:,]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
# A contact point written as host:port (or [v6]:port); a bare IPv6 address has several colons.
_HOST_WITH_PORT_RE = re.compile(r"(?:[^\s:\[\]]+|\[[0-9A-Fa-f:.]+\]):\d+")


_T = typing.TypeVar("_T", int, float)


def bounded(default: _T, low: int | float, high: int | float | None = None) -> _T:
    """A numeric field and its range, declared together (checked with every other problem)."""
    return dataclasses.field(default=default, metadata={"range": (low, high)})


class SettingsError(ValueError):
    """The environment does not describe a valid configuration; the message lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:  # one mistake, one line
            super().__init__(f"invalid settings: {self.problems[0]}")
        else:
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
    cassandra_replication_factor: int = bounded(1, 1)

    # --- Kafka consumer group (the workers of one app_id share mailbox-tail's partitions) --------
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
    # --- security and topology (README "Deploying a fleet"; app/connections.py turns these into
    # each client's options: the one place every Kafka, Cassandra and Redis client is configured) --
    # Kafka: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; SASL takes PLAIN, SCRAM-SHA-256 or
    # SCRAM-SHA-512 with a username and password. TLS verifies the brokers against
    # kafka_ssl_cafile (PEM; empty = the system's CAs); a client certificate (mutual TLS) is
    # kafka_ssl_certfile + kafka_ssl_keyfile.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = dataclasses.field(default="", repr=False)
    kafka_ssl_cafile: str = ""
    kafka_ssl_certfile: str = ""
    kafka_ssl_keyfile: str = ""
    # Cassandra: password authentication, TLS (cassandra_ssl; CA and client certificate files as
    # for Kafka), and the local data center: queries go to its nodes first, and bootstrap creates
    # the keyspace with NetworkTopologyStrategy, cassandra_replication_factor copies in the local
    # DC, or exactly cassandra_replication_per_dc ("dc1:3,dc2:3") when that is set.
    cassandra_username: str = ""
    cassandra_password: str = dataclasses.field(default="", repr=False)
    cassandra_ssl: bool = False
    cassandra_ssl_cafile: str = ""
    cassandra_ssl_certfile: str = ""
    cassandra_ssl_keyfile: str = ""
    cassandra_local_dc: str = ""
    cassandra_replication_per_dc: tuple[str, ...] = ()
    # Redis: ACL user and password (or the URL's), TLS with a rediss:// URL (CA and client
    # certificate files as for Kafka).
    redis_username: str = ""
    redis_password: str = dataclasses.field(default="", repr=False)
    redis_ssl_cafile: str = ""
    redis_ssl_certfile: str = ""
    redis_ssl_keyfile: str = ""

    # --- topics (names become changelog/consumer identities: never rename casually) -------------
    topic_mailbox_tail: str = "mailbox-tail"
    topic_session_delta: str = "session-delta"
    topic_badge: str = "badge"
    topic_dead_letter: str = "mailbox-dead-letter"
    # Offline badge pushes (docs/contract.md §9): APNs/FCM-shaped records for users with no live stream.
    topic_push: str = "push"
    # Reconcile requests (docs/contract.md §10, "Reconcile on request"): the API produces one per
    # accepted login or POST /v1/reconcile, keyed by user like mailbox-tail and with its partition
    # count, so faust's assignor gives partition p of both topics to the same worker: the owner.
    topic_reconcile: str = "reconcile-request"
    # Every topic bootstrap creates gets this many partitions, so a table's changelog and its
    # source topic always agree (faust's co-partitioning requirement).
    topic_partitions: int = bounded(4, 1)
    topic_replication_factor: int = bounded(1, 1)
    # Standby copies of the state (tables/durable): 1 (default) keeps a warm local copy of every
    # partition this worker does not own, tailing its changelog with the recovery's own reader, so
    # a partition that moves here is claimed after reading only what it lacks. 0: none (a new
    # owner reads the partition's changelog from its local store's position, or all of it).
    table_standby_replicas: int = bounded(1, 0, 8)
    # The state changelog topic ({app_id}-state-changelog) never drops a superseded record younger
    # than this (docs/durability.md "Compaction"): above the longest a partition stays unowned or
    # a standby lags.
    changelog_min_compaction_lag_ms: int = bounded(86_400_000, 60_000)

    # --- processing (docs/contract.md §2-§3) ----------------------------------------------------------
    lanes: int = bounded(1, 1)
    projection_compaction_window_ms: int = bounded(5000, WINDOW_MS_MIN)
    max_dirty_rows: int = bounded(100_000, MAX_DIRTY_ROWS_MIN)
    # docs/contract.md §10, the fast lane (app/domain/fast_lane.py): an applied mention, urgent
    # message, read, mark_unread, or message whose member_count is at most
    # fast_lane_max_members (2: direct messages) flushes its user at once instead of at the
    # window's end; at most fast_lane_per_user_per_s such flushes per user and second (beyond:
    # the window; 0 turns the fast lane off). `projector replay` has the same two options.
    fast_lane_max_members: int = bounded(
        FAST_LANE_MAX_MEMBERS, FAST_LANE_MAX_MEMBERS_MIN, FAST_LANE_MAX_MEMBERS_MAX
    )
    fast_lane_per_user_per_s: int = bounded(
        FAST_LANE_PER_USER_PER_S, FAST_LANE_PER_USER_PER_S_MIN, FAST_LANE_PER_USER_PER_S_MAX
    )
    include_muted: bool = False
    # docs/contract.md §10: the badge mode of a user who sent no badge_preferences entry (with
    # include_muted above: the deployment's defaults).
    badge_mode: str = "messages"  # or "conversations"
    # Users written to the projection store per pipelined round trip during one flush.
    flush_batch_size: int = bounded(512, 1)
    # Worker intake: one fetch of one partition is one batch for the core. Bigger batches cost
    # less per entry (faust's per-event path runs once per batch) and hold more in memory; the
    # records' total size is also capped per partition and fetch by intake_fetch_max_bytes.
    intake_batch_max_records: int = bounded(20_000, 1)
    intake_fetch_max_bytes: int = bounded(4 * 1024 * 1024, 1024)
    # The worker's hot set: at most this many (user, conversation) rows per partition stay in
    # memory; the rest live in the RocksDB changelog tables and are read on first touch (one
    # multi-get per batch). 570-830 bytes of Python memory, 0.7-1.1 KB of RSS, per resident row
    # (README "Sizing a worker's state", measured by bench/state_bench.py): the default is
    # 0.35-0.55 GiB per partition at most. Clean rows beyond it leave memory after a persist.
    hot_rows: int = bounded(500_000, 1000)
    # Time between the starts of two Cassandra mirror rounds, ms: repeated writes to one key
    # within it merge into one statement. The mirror is off the flush path either way (what it
    # has not written is recorded in the changelog), so this only trades Cassandra load for lag.
    mirror_spacing_ms: int = bounded(100, 0, 60_000)
    # Partitions per UNLOGGED batch of the mirror's writes, only partitions on the same replicas
    # (1: a batch per partition). Ten is Cassandra's default warn threshold; one request per
    # user's row cost the driver ~5x the CPU of a row in a ten-partition batch.
    cassandra_batch_partitions: int = bounded(10, 1, 100)
    # Beyond this distance between base and latest, unread becomes inexact (shown as 99+).
    unread_precise_limit: int = bounded(200, UNREAD_PRECISE_LIMIT_MIN)

    # --- projection store (Redis) -----------------------------------------------------------------
    # Key prefix of the serving projection; a rebuild writes another namespace and swaps.
    projection_namespace: str = "proj"
    # Count persistent writes per (user, conversation) in the store (audit of docs/contract.md §3.9's bound).
    projection_count_writes: bool = False
    # How long the worker, the audit and `projector rebuild` keep retrying (exponential backoff
    # with jitter) a store call that failed in a way that passes: connection refused/reset, a
    # timeout, CLUSTERDOWN, TRYAGAIN, a redirection loop. Long enough to ride out a cluster
    # failover (node timeout + election: ~5 s on the local cluster); then the error is raised.
    # The API never waits: it answers 503. 0 = no retries.
    redis_retry_budget_ms: int = 30_000
    # A worker whose projection-store writes fail holds its flushes (never lost: the changelog
    # keeps them unflushed) and tries again after 0.25 s, 0.5 s, 1 s ... at most this far apart
    # (README "Deploying a fleet", failure behaviours).
    worker_store_retry_max_ms: int = bounded(30_000, 250, 600_000)
    # Meanwhile it goes on reading, applying and committing (its changelog keeps the held users
    # "not flushed") until its held flushes carry this many rows; then it stops fetching until
    # the store writes again (memory stays bounded however long the outage). 0 = stop at once.
    worker_held_rows_max: int = bounded(100_000, 0)
    # Cyclic GC for a streaming worker (app/runtime/gc_tuning.py). Python's default first
    # threshold (700 allocations) runs a young collection every few hundred objects a batch
    # creates, and the full collections that follow walk the whole resident state (issue 14
    # measured 23% of the worker's Python time in the collector). `worker_gc_threshold` is the
    # first generation's threshold (0 = Python's own thresholds); `worker_gc_freeze` moves what
    # start-up and a partition's restore allocated out of the collector's reach (gc.freeze).
    worker_gc_threshold: int = bounded(50_000, 0, 10_000_000)
    worker_gc_freeze: bool = True
    # Flushes overlap the intake (issue 14, item 5): a persist awaits the changelog without
    # holding up batches, and batches leave their flushes to the flush scheduler, so the next
    # window is read and applied while the previous flush is persisted and written (lower
    # latency; bench figures in bench/README.md). On by default since 2026-12-02: it had been
    # opt-in while crash runs with it failed; both causes found since were faust behaviours that
    # serial runs had too (a superseded recovery's completion, changelog records faust cleared
    # unapplied, in faust's table layer the worker no longer uses), and with both fixed every
    # crash run with it on passed (CI-size, the harder 16-kill variant, the full-size SIGKILL
    # scenario and full-size crash runs; counts in CHANGELOG.md). false = serial: a batch
    # publishes its own flushes, a persist holds the intake until the changelog has it.
    worker_overlap_flushes: bool = True
    # Flushes are visible before they are durable (issue 33, the fast lane): a flush goes to the
    # projection store and the frames at once, and the partition's persist follows within a
    # window, instead of every publish persisting the whole partition first (a persist per fast
    # flush was ~70 ms of a direct message's latency). A crash re-reads from the checkpoint and
    # reproduces each published version with the same values (docs/durability.md, "Visible
    # before durable"). false = durable before visible.
    worker_visible_before_durable: bool = True
    # Dead letters are always counted and always sent to their topic; their log lines are capped
    # at this many per second (the rest summed up in one "N more suppressed" line a second at most;
    # 0 = only those summaries).
    dead_letter_log_per_s: int = bounded(5, 0, 10_000)

    # --- projection repair (issue 18; app/worker/repair.py) ---------------------------------------
    # Every `store_check_interval_ms` the worker asks the projection store whether it lost data
    # (its markers for the worker's partitions gone, or a server's run id changed: a restart, a
    # failover) and, if so, writes the projection of those partitions again from its own state,
    # `restore_chunk_users` users per step (each step holds the flush lock for one round trip
    # or two, then lets flushes and batches go on). 0 turns the checks off (the restore too).
    store_check_interval_ms: int = bounded(2_000, 0, 3_600_000)
    restore_chunk_users: int = bounded(256, 1, 100_000)

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
    # count (20,000 per 10 min = 33 reads/s per worker at most). docs/contract.md §3.4 ("Unread audit").
    # Rows at 0 unread have a rate of their own (`unread_audit_zero_sample_rate`, below).
    unread_audit_sample_rate: float = bounded(0.005, 0, 1)
    unread_audit_interval_ms: int = bounded(600_000, 1000, 86_400_000)
    # "No change for 24 h" (issue 7): a row still changing is not worth a read (its next entry
    # recomputes it anyway), and the MessageStore has long caught up with what it received.
    unread_audit_idle_ms: int = bounded(86_400_000, 0)
    # At most this many rows recounted per round (a round that draws them stops there; the next
    # round's sweep goes on from that row, so the cap slows the sweep and never skips rows).
    unread_audit_max_rows: int = bounded(20_000, 1)
    # Rows at 0 unread (exact, idle, within one bounded read) are audited too, at this rate per
    # round: a row whose counts drifted to 0 is where a missed message hides, and a stored row
    # that drifted away from 0 is found only through its row. Most rows sit at 0, so the rate is
    # lower: 0.001 x 144 rounds = each such row 0.144 times a day (found within a week with 63 %,
    # within a month with 99 %); a worker holding 10 million rows recounts ~17 of them per second
    # (one that nothing arrived in since its read costs no MessageStore read: the range is empty).
    # Each round reads the highest rate's share of the rows from RocksDB (off the event loop):
    # docs/contract.md §3.4 ("Unread audit").
    unread_audit_zero_sample_rate: float = bounded(0.001, 0, 1)

    # --- reconcile on request (docs/contract.md §10; app/api/reconcile.py, app/worker/reconcile.py)
    # A login (a first page without cursor, the live stream's hello) and POST /v1/reconcile ask
    # the worker that owns the user for a reconcile: the user's rows recomputed from its state and
    # the MessageStore, what differs corrected in place (correction frames), missing rows filled,
    # the badge recomputed in full. At most one per user per `reconcile_min_interval_s`, fleet-wide
    # (one atomic SET NX PX under the user's hash tag); POST /v1/reconcile within it is a 429 with
    # Retry-After, a login within it asks nothing. The worker drops a request older than the
    # interval (and at least a minute) (a worker that was away catches up with fresh requests, not a backlog).
    reconcile_min_interval_s: int = bounded(300, 1, 86_400)
    # Whether a login asks for a reconcile (POST /v1/reconcile always can).
    reconcile_on_login: bool = True

    # --- fault injection (tests of crash safety; 0 = off) ----------------------------------------
    # SIGKILL the worker itself right after its Nth projection-store write, before that flush's
    # frames are produced: the crash window of acceptance J-7.
    fault_kill_after_store_writes: int = bounded(0, 0)

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
    # "text" (one readable line per record) or "json" (one JSON object per line, the same fields
    # for the worker, faust's own records included, and the API: app/logs.py).
    log_format: str = "text"
    # One log line per API request (aiohttp's access log, in log_format). Off by default: at
    # thousands of pages a second the lines would cost more than the pages.
    api_access_log: bool = False

    # --- query API (docs/contract.md §5; `projector api`, `projector token`) -----------------------------
    # HMAC-SHA256 key for bearer tokens and page cursors. Empty = not configured: `projector api`
    # and `projector token` refuse to start, so no deployment runs on a guessable default.
    # Generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.
    api_secret: str = dataclasses.field(default="", repr=False)  # never in logs or tracebacks
    # Secret rotation: the previous api_secret, still accepted (tokens, stream tickets, page
    # cursors) while it is set; everything new is signed with api_secret. Rotate: set this to the
    # old secret and api_secret to the new one on every API process, then remove it once every
    # token signed with the old one has expired (api_token_ttl_s, or the longest --ttl minted).
    api_secret_previous: str = dataclasses.field(default="", repr=False)
    # Lifetime of a token minted by `projector token` when --ttl is not given.
    api_token_ttl_s: int = bounded(3600, 1)
    # Request limits (app/api/guard.py): a body over api_max_body_bytes is answered 413, request
    # headers over api_max_header_bytes (all of them together, the request line included) 431.
    api_max_body_bytes: int = bounded(64 * 1024, 1024, 16 * 1024 * 1024)
    api_max_header_bytes: int = bounded(16 * 1024, 1024, 1024 * 1024)
    # The TypeScript SDK's browser build the page at /app/ imports (app/api/web_client.py): a
    # packed tgz (`make sdk` writes .local/sdk/session-projector-sdk-*.tgz) or a built dist/
    # folder. Empty = the checkout's sdk-ts/dist when built, else the newest tgz in .local/sdk/.
    api_web_sdk: str = ""
    # Per-user request rate of the API fleet: a token bucket of api_rate_limit_burst requests
    # refilled at api_rate_limit_per_s; over it, 429 with Retry-After. 0 = no limit. The bucket
    # lives in the projection store (one atomic script per request), so N API processes behind a
    # balancer enforce this rate together, not N times it (issue 32).
    api_rate_limit_per_s: float = bounded(100.0, 0)
    api_rate_limit_burst: int = bounded(200, 1)
    # When the store cannot answer the rate check: "open" lets the request through (default: the
    # limit protects the store, and a store that is down answers the request 503 anyway), "closed"
    # answers 503 with Retry-After. Either way counted (projector_api_rate_limit_store_errors).
    api_rate_limit_on_store_error: str = "open"
    # A snapshot (one user's ordered list) lives this long after its load, then is reloaded.
    api_snapshot_ttl_ms: int = bounded(300_000, 1)
    # At most this many rows go into one user's snapshot (the seed's max_conversations_per_user).
    api_snapshot_max_rows: int = bounded(5000, 1)
    # LRU bound on the rows held by all snapshots together (memory: ~1 KB per row).
    api_snapshot_cache_rows: int = 500_000
    # The API's cyclic GC (app/runtime/gc_tuning.py, as the worker's): the held snapshots are a
    # large long-lived heap, and with Python's default first threshold a cold page (~25,000 new
    # objects) ran a full collection over it every few loads: cold-page CPU p99 55-59 ms against
    # 21-25 ms at 50,000 (40 held 5,000-row snapshots, issue 32). 0 = Python's own thresholds.
    api_gc_threshold: int = bounded(50_000, 0, 10_000_000)
    # When the API fills rows missing from the projection store from Cassandra (docs/contract.md §5):
    # "empty" = only when the store holds nothing for the user (projection lost, user not yet
    # flushed), "always" = join UserConversationState on every snapshot load (also catches
    # single lost rows; one Cassandra partition read per load), "never".
    api_fill_from_state: str = "empty"

    # --- member directory (docs/contract.md §8, seed 004) ---------------------------------------------------
    # Time the presentation call may spend on record_count/mention_count before answering without
    # them (identities are never held back). The seed's budget is 2 s.
    members_stats_budget_ms: int = bounded(2000, 1, 60_000)

    # --- live stream gateway (issue 16; GET /v1/stream in the API process, app/gateway) --------
    # The API process also serves /v1/stream: it reads the session-delta and badge topics and
    # forwards each connected user's frames. false = pages and badge only (no Kafka consumer).
    gateway_enabled: bool = True
    # Which partitions of the frame topics this instance reads: "" = all (any instance serves any
    # user), or a list/ranges ("0,1", "0-3,8"): only those partitions' users (a user of another
    # partition gets 421 Misdirected Request naming the partition). docs/gateway.md, "Scaling".
    gateway_partitions: str = ""
    # A heartbeat event on every connection this often (keeps proxies and NATs open; lets the
    # client notice a dead connection after ~3 missed beats).
    gateway_heartbeat_ms: int = bounded(15_000, 100, 300_000)
    # Bytes of events one connection may have queued; beyond, the client is too slow: it gets a
    # `repull` event and the connection is closed (memory stays bounded).
    gateway_buffer_bytes: int = bounded(1_048_576, 4096, 1 << 30)
    # Resume after a short disconnect without a re-pull: per user, the last frames (count and
    # bytes) are kept while connected and for gateway_resume_window_ms after, for at most
    # gateway_resume_users disconnected users (oldest dropped first).
    gateway_resume_frames: int = bounded(64, 0, 100_000)
    gateway_resume_bytes: int = bounded(262_144, 0, 1 << 30)
    gateway_resume_window_ms: int = bounded(120_000, 0, 86_400_000)
    gateway_resume_users: int = bounded(50_000, 0, 10_000_000)
    # Behind a load balancer a reconnect lands on any instance: each instance also keeps the last
    # frames of the users it holds no log for (raw, this many bytes, oldest dropped first), so a
    # Last-Event-ID resumes on an instance the user never streamed from. 0 = off (such a
    # reconnect re-pulls). docs/gateway.md, "Resume and gaps".
    gateway_recent_frames_bytes: int = bounded(33_554_432, 0, 1 << 36)
    # Browsers' EventSource cannot send headers: POST /v1/stream/ticket (bearer) gives a ticket for
    # ?access_token= that opens /v1/stream only and expires after this many seconds.
    gateway_ticket_ttl_s: int = bounded(60, 5, 3600)
    # Streams one process holds at most (more: 503 with Retry-After).
    gateway_max_connections: int = bounded(20_000, 1, 10_000_000)
    # Presence in Redis (who has a live stream, on any instance): an entry per (user, instance)
    # refreshed every third of the TTL; a crashed instance's users count as offline after it.
    gateway_presence_ttl_ms: int = bounded(30_000, 1000, 3_600_000)
    # Offline badge pushes: the API processes share the badge topic's partitions in one consumer
    # group (exactly one producer per user), and send at most one record per user per window.
    push_enabled: bool = True
    push_window_ms: int = bounded(2000, 10, 3_600_000)
    # --- operator console (issue 17; app/api/ops, served by `projector api` under /ops/) ----------
    # Signs operator tokens (`projector token --operator NAME`); separate from api_secret so a user
    # token can never open the console. Empty = the console is not served (/ops/ is 404).
    ops_secret: str = dataclasses.field(default="", repr=False)
    # Lifetime of an operator token minted without --ttl (a working shift).
    ops_token_ttl_s: int = bounded(28_800, 1)
    # The workers' (and a running rebuild's) Prometheus endpoints the fleet view scrapes,
    # comma-separated http(s) URLs (each worker's PROJECTOR_WORKER_METRICS_PORT). Configured, not
    # discovered: the consumer group does not know where a member serves /metrics.
    ops_metrics_urls: tuple[str, ...] = ()
    # Records read back per topic partition for "the user's last frames" and the dead-letter
    # browser (a bound on what one console request may read from Kafka).
    ops_scan_records: int = bounded(2000, 1, 100_000)
    # The charts: the console samples the fleet this often and keeps the last 120 samples.
    ops_sample_interval_ms: int = bounded(5000, 500, 3_600_000)

    env_prefix: ClassVar[str] = ENV_PREFIX

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            # Every message names the environment variable an operator sets, never the field.
            raise SettingsError([_with_env_names(problem) for problem in problems])

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
                problems.append(f"{key}: {exc}, got {env[key]!r}")
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

    @classmethod
    def topic_env(cls, prefix: str) -> dict[str, str]:
        """Every topic setting named after `prefix` (``PROJECTOR_TOPIC_PUSH: "{prefix}-push"``...):
        what a test stack or a benchmark passes its processes. Derived from the fields, so a topic
        added later is covered too: a run that named only the topics it knew left the product's
        default `push` on the shared broker with its own partition count, and the next
        `projector bootstrap` there refused the mismatch."""
        return {
            ENV_PREFIX + f.name.upper(): f"{prefix}-{f.name.removeprefix('topic_').replace('_', '-')}"
            for f in dataclasses.fields(cls)
            if f.name.startswith("topic_") and f.type in (str, "str")
        }

    @property
    def changelog_topic(self) -> str:
        """The worker state's changelog topic: one partition per mailbox-tail partition."""
        return f"{self.app_id}-state-changelog"

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the product owns (bootstrap creates them all)."""
        return (
            self.topic_mailbox_tail,
            self.topic_session_delta,
            self.topic_badge,
            self.topic_dead_letter,
            self.topic_push,
            self.topic_reconcile,
        )

    # ------------------------------------------------------------------------------------------
    def _gateway_problems(self) -> list[str]:
        p: list[str] = []
        try:
            parts = gateway_partition_set(self.gateway_partitions)
        except ValueError as exc:
            p.append(f"gateway_partitions: {exc}")
        else:
            if parts is not None and max(parts) >= self.topic_partitions:
                p.append(
                    f"gateway_partitions: {max(parts)} is not a partition of the frame topics "
                    f"(0..{self.topic_partitions - 1})"
                )
        return p

    def _problems(self) -> list[str]:
        p: list[str] = []
        for f in dataclasses.fields(self):
            bounds = f.metadata.get("range")
            if bounds is None:
                continue
            low, high = bounds
            value = getattr(self, f.name)
            if high is None and not value >= low:
                p.append(f"{f.name}: {value} must be >= {low}")
            elif high is not None and not low <= value <= high:  # also refuses nan
                p.append(f"{f.name}: {value} is not in {low}..{high}")
        if not self.kafka_bootstrap.strip():
            p.append("kafka_bootstrap: empty")  # one problem, not also "'' is not HOST:PORT"
        else:
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
        with_port = [h for h in self.cassandra_contact_points if _HOST_WITH_PORT_RE.fullmatch(h)]
        if with_port:
            # The driver takes bare hosts and one port for all: "10.0.0.1:9042" is not resolvable
            # as a host name and failed at the first connect with `UnresolvableContactPoints: {}`.
            p.append(
                f"cassandra_contact_points: {', '.join(map(repr, with_port))} is host:port, but a "
                f"contact point is a host only: the port goes in cassandra_port (now {self.cassandra_port})"
            )
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
            (
                "topic_mailbox_tail",
                "topic_session_delta",
                "topic_badge",
                "topic_dead_letter",
                "topic_push",
                "topic_reconcile",
            ),
            topics,
            strict=True,
        ):
            if not _TOPIC_RE.fullmatch(topic):
                p.append(f"{name}: {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1..200)")
        if len(set(topics)) != len(topics):
            p.append(f"topic names must be distinct: {topics}")
        if not 100 <= self.kafka_heartbeat_interval_ms <= self.kafka_session_timeout_ms // 3:
            p.append(
                f"kafka_heartbeat_interval_ms: {self.kafka_heartbeat_interval_ms} is not in "
                f"100..{self.kafka_session_timeout_ms // 3} (a third of kafka_session_timeout_ms)"
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
        if self.api_secret_previous:
            if not self.api_secret:
                p.append("api_secret_previous: set without api_secret (the secret that signs new tokens)")
            if len(self.api_secret_previous) < API_SECRET_MIN_CHARS:
                p.append(
                    f"api_secret_previous: {len(self.api_secret_previous)} characters; use at least "
                    f"{API_SECRET_MIN_CHARS}"
                )
            if self.api_secret_previous == self.api_secret:
                p.append("api_secret_previous: equals api_secret (nothing is being rotated)")
            if self.api_secret_previous == self.ops_secret:
                p.append("api_secret_previous: must differ from ops_secret")
        if self.api_snapshot_cache_rows < self.api_snapshot_max_rows:
            # Otherwise one heavy user's snapshot could never be cached at all.
            p.append(
                f"api_snapshot_cache_rows: {self.api_snapshot_cache_rows} must be >= "
                f"api_snapshot_max_rows ({self.api_snapshot_max_rows})"
            )
        if self.api_rate_limit_on_store_error not in _RATE_STORE_ERROR_MODES:
            mode = self.api_rate_limit_on_store_error
            p.append(f"api_rate_limit_on_store_error: {mode!r} is not one of open, closed")
        if self.badge_mode not in ("messages", "conversations"):
            p.append(f"badge_mode: {self.badge_mode!r} is not one of messages, conversations")
        if self.api_fill_from_state not in _FILL_MODES:
            p.append(f"api_fill_from_state: {self.api_fill_from_state!r} is not one of always, empty, never")
        p.extend(_ops_problems(self))
        p.extend(self._gateway_problems())
        if self.log_format not in _LOG_FORMATS:
            p.append(f"log_format: {self.log_format!r} is not one of json, text")
        p.extend(_security_problems(self))
        if self.log_level not in _LOG_LEVELS:
            levels = ", ".join(sorted(_LOG_LEVELS))
            p.append(f"log_level: {self.log_level!r} is not one of {levels}")
        return p


# A field name (or a `prefix_*` family of them) in a problem message, outside quoted values.
_MESSAGE_WORD_RE = re.compile(r"'[^']*'|\"[^\"]*\"|\b[a-z][a-z0-9_]*\*?")


def _with_env_names(message: str) -> str:
    """``kafka_bootstrap: ...`` -> ``PROJECTOR_KAFKA_BOOTSTRAP: ...``: the problems are written
    with field names (short, next to the code); the operator reads the variables they set.
    Quoted values are left alone (a topic may be called like a field)."""
    fields = {f.name for f in dataclasses.fields(Settings)}

    def name(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in fields:
            return ENV_PREFIX + word.upper()
        if word.endswith("_*") and any(f.startswith(word[:-1]) for f in fields):
            return ENV_PREFIX + word.upper()
        return word

    return _MESSAGE_WORD_RE.sub(name, message)


def gateway_partition_set(text: str) -> frozenset[int] | None:
    """``gateway_partitions`` as a set (None = every partition); ValueError when malformed."""
    if not text.strip():
        return None
    out: set[int] = set()
    for part in text.split(","):
        m = _PARTITION_RANGE_RE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"{part.strip()!r} is not a partition or a range (e.g. 0,3 or 0-3)")
        low = int(m["low"])
        high = int(m["high"]) if m["high"] is not None else low
        if high < low or high > 100_000:
            raise ValueError(f"{part.strip()!r} is not a range of partitions")
        out.update(range(low, high + 1))
    return frozenset(out)


_KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_DC_RF_RE = re.compile(r"(?P<dc>[A-Za-z0-9._-]{1,64}):(?P<rf>[0-9]{1,3})")


def replication_per_dc(entries: tuple[str, ...]) -> dict[str, int]:
    """``("dc1:3", "dc2:3")`` -> ``{"dc1": 3, "dc2": 3}`` (entries validated by Settings)."""
    out: dict[str, int] = {}
    for entry in entries:
        m = _DC_RF_RE.fullmatch(entry)
        if m is not None:
            out[m["dc"]] = int(m["rf"])
    return out


def _security_problems(s: Settings) -> list[str]:
    """The security and topology fields: each combination that would connect differently than
    it reads (TLS files without TLS, half a client certificate, SASL without credentials) is an
    error, never a silent plaintext connection."""
    p: list[str] = []
    protocol = s.kafka_security_protocol
    if protocol not in _KAFKA_PROTOCOLS:
        p.append(f"kafka_security_protocol: {protocol!r} is not one of {', '.join(_KAFKA_PROTOCOLS)}")
    sasl = protocol.startswith("SASL_")
    if sasl:
        if s.kafka_sasl_mechanism not in _SASL_MECHANISMS:
            p.append(
                f"kafka_sasl_mechanism: {s.kafka_sasl_mechanism!r} is not one of "
                f"{', '.join(_SASL_MECHANISMS)} (needed with {protocol})"
            )
        if not s.kafka_sasl_username or not s.kafka_sasl_password:
            p.append(f"kafka_sasl_username/kafka_sasl_password: both needed with {protocol}")
    elif s.kafka_sasl_mechanism or s.kafka_sasl_username or s.kafka_sasl_password:
        p.append(
            f"kafka_sasl_*: set, but kafka_security_protocol {protocol!r} is not SASL_PLAINTEXT/SASL_SSL"
        )
    kafka_tls = protocol in ("SSL", "SASL_SSL")
    p += _tls_file_problems(
        "kafka",
        s.kafka_ssl_cafile,
        s.kafka_ssl_certfile,
        s.kafka_ssl_keyfile,
        kafka_tls,
        "kafka_security_protocol SSL or SASL_SSL",
    )
    if bool(s.cassandra_username) != bool(s.cassandra_password):
        p.append("cassandra_username/cassandra_password: give both or neither")
    p += _tls_file_problems(
        "cassandra",
        s.cassandra_ssl_cafile,
        s.cassandra_ssl_certfile,
        s.cassandra_ssl_keyfile,
        s.cassandra_ssl,
        "cassandra_ssl=true",
    )
    if s.cassandra_local_dc and not _DC_RF_RE.fullmatch(f"{s.cassandra_local_dc}:1"):
        p.append(f"cassandra_local_dc: {s.cassandra_local_dc!r} is not a data center name ([A-Za-z0-9._-])")
    bad = [e for e in s.cassandra_replication_per_dc if not _DC_RF_RE.fullmatch(e) or e.endswith(":0")]
    if bad:
        p.append(f"cassandra_replication_per_dc: {bad} are not DC:RF (RF 1..999), e.g. dc1:3,dc2:3")
    per_dc = replication_per_dc(s.cassandra_replication_per_dc)
    if s.cassandra_replication_per_dc and not s.cassandra_local_dc:
        p.append("cassandra_replication_per_dc: needs cassandra_local_dc (the DC this process talks to)")
    elif per_dc and s.cassandra_local_dc not in per_dc:
        p.append(
            f"cassandra_local_dc: {s.cassandra_local_dc!r} holds no replica in cassandra_replication_per_dc "
            f"({', '.join(per_dc)})"
        )
    # rediss:// (and a TLS cluster scheme such as rediss+cluster://, should one be added).
    tls_url = s.redis_url.partition("://")[0].startswith("rediss")
    p += _tls_file_problems(
        "redis", s.redis_ssl_cafile, s.redis_ssl_certfile, s.redis_ssl_keyfile, tls_url, "a rediss:// URL"
    )
    if s.redis_password and "@" in s.redis_url.partition("://")[2].partition("/")[0]:
        # redis-py lets the URL's credentials win: one of the two would be ignored.
        p.append("redis_password: the redis_url carries credentials too; give them in one place")
    if s.redis_username and not s.redis_password:
        p.append("redis_username: needs redis_password")
    return p


def _tls_file_problems(
    server: str, cafile: str, certfile: str, keyfile: str, tls: bool, needs: str
) -> list[str]:
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


def _ops_problems(settings: Settings) -> list[str]:
    p: list[str] = []
    if settings.ops_secret:
        if len(settings.ops_secret) < API_SECRET_MIN_CHARS:
            p.append(
                f"ops_secret: {len(settings.ops_secret)} characters; use at least {API_SECRET_MIN_CHARS}"
            )
        if settings.ops_secret == settings.api_secret:
            # One secret for both would make every user token an operator credential's sibling.
            p.append("ops_secret: must differ from api_secret")
    for url in settings.ops_metrics_urls:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            p.append(f"ops_metrics_urls: {url!r} is not an http(s) URL")
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
