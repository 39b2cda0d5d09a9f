"""The sections of the API process: the query API (`ApiSettings`), its live stream gateway and
offline pushes (`GatewaySettings`), the operator console (`OpsSettings`), and the log output
every process shares (`LogSettings`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from app.settings.base import Section, bounded, choice_problem, port_problem

# HMAC-SHA256 keys shorter than this are guessable in practice; 32 chars of token_urlsafe = 192 bits.
API_SECRET_MIN_CHARS = 32
FILL_MODES = ("always", "empty", "never")
RATE_STORE_ERROR_MODES = ("open", "closed")
LOG_LEVELS = ("CRITICAL", "DEBUG", "ERROR", "INFO", "WARNING")
LOG_FORMATS = ("json", "text")
_PARTITION_RANGE_RE = re.compile(r"(?P<low>[0-9]{1,6})(?:-(?P<high>[0-9]{1,6}))?")


def secret_length_problem(name: str, secret: str) -> list[str]:
    if secret and len(secret) < API_SECRET_MIN_CHARS:
        return [f"{name}: {len(secret)} characters; use at least {API_SECRET_MIN_CHARS}"]
    return []


@dataclass(frozen=True, slots=True)
class ApiSettings(Section):
    """The query API (docs/contract.md §5; `projector api`, `projector token`) and the member
    directory it serves (§8)."""

    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # One log line per request (aiohttp's access log, in log_format). Off: at thousands of pages
    # a second the lines would cost more than the pages.
    api_access_log: bool = False
    # HMAC-SHA256 key for bearer tokens and page cursors. Empty = not configured: `projector api`
    # and `projector token` refuse to start. Never in logs or tracebacks.
    api_secret: str = dataclasses.field(default="", repr=False)
    # Rotation: the previous api_secret, still accepted while set; everything new is signed with
    # api_secret. Remove it once every token signed with it has expired.
    api_secret_previous: str = dataclasses.field(default="", repr=False)
    # Lifetime of a token minted by `projector token` without --ttl.
    api_token_ttl_s: int = bounded(3600, 1)
    # Request limits (app/api/guard.py): a larger body is answered 413, larger headers 431.
    api_max_body_bytes: int = bounded(64 * 1024, 1024, 16 * 1024 * 1024)
    api_max_header_bytes: int = bounded(16 * 1024, 1024, 1024 * 1024)
    # The SDK build the page at /app/ imports (app/api/web_client.py): a packed tgz or a built
    # dist/ folder. Empty = the checkout's sdk-ts/dist when built, else the newest .local/sdk/ tgz.
    api_web_sdk: str = ""
    # Per-user request rate of the whole API fleet (a token bucket in the projection store):
    # api_rate_limit_burst requests refilled at api_rate_limit_per_s; over it, 429. 0 = no limit.
    api_rate_limit_per_s: float = bounded(100.0, 0)
    api_rate_limit_burst: int = bounded(200, 1)
    # When the store cannot answer the rate check: "open" lets the request through, "closed"
    # answers 503 with Retry-After. Either way counted.
    api_rate_limit_on_store_error: str = "open"
    # A snapshot (one user's ordered list) lives this long after its load, then is reloaded.
    api_snapshot_ttl_ms: int = bounded(300_000, 1)
    # At most this many rows go into one user's snapshot.
    api_snapshot_max_rows: int = bounded(5000, 1)
    # LRU bound on the rows held by all snapshots together (memory: ~1 KB per row).
    api_snapshot_cache_rows: int = 500_000
    # The API's cyclic GC first threshold (app/runtime/gc_tuning.py; 0 = Python's own).
    api_gc_threshold: int = bounded(50_000, 0, 10_000_000)
    # When rows missing from the projection store are filled from Cassandra (docs/contract.md §5):
    # "empty" = only when the store holds nothing for the user, "always" = on every snapshot
    # load, "never".
    api_fill_from_state: str = "empty"
    # Time the member presentation may spend on record/mention counts before answering without.
    members_stats_budget_ms: int = bounded(2000, 1, 60_000)

    def _problems(self) -> list[str]:
        p = port_problem("api_port", self.api_port)
        if not self.api_host.strip():
            p.append("api_host: empty")
        p += secret_length_problem("api_secret", self.api_secret)
        if self.api_secret_previous:
            if not self.api_secret:
                p.append("api_secret_previous: set without api_secret (the secret that signs new tokens)")
            p += secret_length_problem("api_secret_previous", self.api_secret_previous)
            if self.api_secret_previous == self.api_secret:
                p.append("api_secret_previous: equals api_secret (nothing is being rotated)")
        if self.api_snapshot_cache_rows < self.api_snapshot_max_rows:
            # Otherwise one heavy user's snapshot could never be cached at all.
            p.append(
                f"api_snapshot_cache_rows: {self.api_snapshot_cache_rows} must be >= "
                f"api_snapshot_max_rows ({self.api_snapshot_max_rows})"
            )
        mode = self.api_rate_limit_on_store_error
        p += choice_problem("api_rate_limit_on_store_error", mode, RATE_STORE_ERROR_MODES)
        return p + choice_problem("api_fill_from_state", self.api_fill_from_state, FILL_MODES)


@dataclass(frozen=True, slots=True)
class GatewaySettings(Section):
    """The live stream (GET /v1/stream in the API process, app/gateway; docs/gateway.md) and the
    offline badge pushes."""

    # false = pages and badge only (no Kafka consumer).
    gateway_enabled: bool = True
    # Which partitions of the frame topics this instance reads: "" = all, or a list/ranges
    # ("0,1", "0-3,8"); a user of another partition gets 421 naming the partition.
    gateway_partitions: str = ""
    # A heartbeat event on every connection this often.
    gateway_heartbeat_ms: int = bounded(15_000, 100, 300_000)
    # Bytes of events one connection may have queued; beyond, it gets `repull` and is closed.
    gateway_buffer_bytes: int = bounded(1_048_576, 4096, 1 << 30)
    # Resume after a short disconnect: per user the last frames (count and bytes), kept while
    # connected and for gateway_resume_window_ms after, for at most gateway_resume_users users.
    gateway_resume_frames: int = bounded(64, 0, 100_000)
    gateway_resume_bytes: int = bounded(262_144, 0, 1 << 30)
    gateway_resume_window_ms: int = bounded(120_000, 0, 86_400_000)
    gateway_resume_users: int = bounded(50_000, 0, 10_000_000)
    # The last frames of users this instance holds no log for (raw bytes, oldest dropped), so a
    # Last-Event-ID resumes on any instance behind a balancer. 0 = off (such a reconnect re-pulls).
    gateway_recent_frames_bytes: int = bounded(33_554_432, 0, 1 << 36)
    # Lifetime of a stream ticket (?access_token= for EventSource, which cannot send headers).
    gateway_ticket_ttl_s: int = bounded(60, 5, 3600)
    # Streams one process holds at most (more: 503 with Retry-After).
    gateway_max_connections: int = bounded(20_000, 1, 10_000_000)
    # Presence in Redis: an entry per (user, instance) refreshed every third of the TTL.
    gateway_presence_ttl_ms: int = bounded(30_000, 1000, 3_600_000)
    # Offline badge pushes: one consumer group over the badge topic, at most one record per user
    # per window.
    push_enabled: bool = True
    push_window_ms: int = bounded(2000, 10, 3_600_000)

    @property
    def partition_set(self) -> frozenset[int] | None:
        """`gateway_partitions` as a set (None = every partition)."""
        return gateway_partition_set(self.gateway_partitions)

    def _problems(self) -> list[str]:
        try:
            gateway_partition_set(self.gateway_partitions)
        except ValueError as exc:
            return [f"gateway_partitions: {exc}"]
        return []


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


@dataclass(frozen=True, slots=True)
class OpsSettings(Section):
    """The operator console (app/api/ops, under /ops/ of `projector api`)."""

    # Signs operator tokens (`projector token --operator NAME`); never the api_secret, so a user
    # token cannot open the console. Empty = the console is not served (/ops/ is 404).
    ops_secret: str = dataclasses.field(default="", repr=False)
    # Lifetime of an operator token minted without --ttl (a working shift).
    ops_token_ttl_s: int = bounded(28_800, 1)
    # The Prometheus endpoints the fleet view scrapes (configured, not discovered).
    ops_metrics_urls: tuple[str, ...] = ()
    # Records read back per topic partition by one console request.
    ops_scan_records: int = bounded(2000, 1, 100_000)
    # The charts sample the fleet this often and keep the last 120 samples.
    ops_sample_interval_ms: int = bounded(5000, 500, 3_600_000)

    def _problems(self) -> list[str]:
        p = secret_length_problem("ops_secret", self.ops_secret)
        for url in self.ops_metrics_urls:
            if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
                p.append(f"ops_metrics_urls: {url!r} is not an http(s) URL")
        return p


@dataclass(frozen=True, slots=True)
class LogSettings(Section):
    """Every process's log output (app/logs.py)."""

    log_level: str = "INFO"
    # "text" (one readable line per record) or "json" (one JSON object per line).
    log_format: str = "text"

    def _problems(self) -> list[str]:
        p = choice_problem("log_format", self.log_format, LOG_FORMATS)
        return p + choice_problem("log_level", self.log_level, LOG_LEVELS)
