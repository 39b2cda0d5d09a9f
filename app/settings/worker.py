"""The worker's sections: the projection rules every processor shares (`ProcessingSettings`:
the worker, `projector replay` and `projector rebuild`), the worker process itself
(`WorkerSettings`), the unread audit (`AuditSettings`) and reconcile on request
(`ReconcileSettings`, shared with the API)."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.fast_lane import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_MAX_MEMBERS_MAX,
    FAST_LANE_MAX_MEMBERS_MIN,
    FAST_LANE_PER_USER_PER_S,
    FAST_LANE_PER_USER_PER_S_MAX,
    FAST_LANE_PER_USER_PER_S_MIN,
)
from app.domain.projector import MAX_DIRTY_ROWS_MIN, UNREAD_PRECISE_LIMIT_MIN, WINDOW_MS_MIN
from app.settings.base import Section, bounded, choice_problem, port_problem

BADGE_MODES = ("messages", "conversations")


@dataclass(frozen=True, slots=True)
class ProcessingSettings(Section):
    """How entries become projections (docs/contract.md §2-§3, §10)."""

    lanes: int = bounded(1, 1)
    projection_compaction_window_ms: int = bounded(5000, WINDOW_MS_MIN)
    max_dirty_rows: int = bounded(100_000, MAX_DIRTY_ROWS_MIN)
    # The fast lane (app/domain/fast_lane.py): an applied mention, urgent message, read,
    # mark_unread, or message whose member_count is at most fast_lane_max_members (2: direct
    # messages) flushes its user at once instead of at the window's end; at most
    # fast_lane_per_user_per_s such flushes per user and second (beyond: the window; 0 = off).
    fast_lane_max_members: int = bounded(
        FAST_LANE_MAX_MEMBERS, FAST_LANE_MAX_MEMBERS_MIN, FAST_LANE_MAX_MEMBERS_MAX
    )
    fast_lane_per_user_per_s: int = bounded(
        FAST_LANE_PER_USER_PER_S, FAST_LANE_PER_USER_PER_S_MIN, FAST_LANE_PER_USER_PER_S_MAX
    )
    # The deployment's defaults for a user who sent no badge_preferences entry (docs/contract.md §10).
    include_muted: bool = False
    badge_mode: str = "messages"  # or "conversations"
    # Beyond this distance between base and latest, unread becomes inexact (shown as 99+).
    unread_precise_limit: int = bounded(200, UNREAD_PRECISE_LIMIT_MIN)
    # The hot set: at most this many (user, conversation) rows per partition stay in memory; the
    # rest are read from the local state on first touch. 0.7-1.1 KB of RSS per resident row
    # (README "Sizing a worker's state"). Clean rows beyond it leave memory after a persist.
    hot_rows: int = bounded(500_000, 1000)

    def _problems(self) -> list[str]:
        return choice_problem("badge_mode", self.badge_mode, BADGE_MODES)


@dataclass(frozen=True, slots=True)
class WorkerSettings(Section):
    """The worker process: intake, flush scheduling, store outages, GC, repair, its local state
    and its HTTP ports."""

    # One fetch of one partition is one batch for the core, at most this many records and bytes.
    intake_batch_max_records: int = bounded(20_000, 1)
    intake_fetch_max_bytes: int = bounded(4 * 1024 * 1024, 1024)
    # Time between the starts of two Cassandra mirror rounds, ms: repeated writes to one key
    # within it merge into one statement (the mirror is off the flush path either way).
    mirror_spacing_ms: int = bounded(100, 0, 60_000)
    # A failing projection-store write holds the flush (the changelog keeps it unflushed) and is
    # retried after 0.25 s, 0.5 s, 1 s ... at most this far apart.
    worker_store_retry_max_ms: int = bounded(30_000, 250, 600_000)
    # Meanwhile the worker reads on until its held flushes carry this many rows; then it stops
    # fetching until the store writes again. 0 = stop at once.
    worker_held_rows_max: int = bounded(100_000, 0)
    # Cyclic GC (app/runtime/gc_tuning.py): the first generation's threshold (0 = Python's own);
    # freeze moves what start-up and a partition's restore allocated out of the collector's reach.
    worker_gc_threshold: int = bounded(50_000, 0, 10_000_000)
    worker_gc_freeze: bool = True
    # Flushes overlap the intake: the next window is read and applied while the previous flush
    # is persisted and written. false = serial (a persist holds the intake).
    worker_overlap_flushes: bool = True
    # A flush goes to the store and the frames before its partition's persist (which follows
    # within a window; docs/durability.md, "Visible before durable"). false = durable first.
    worker_visible_before_durable: bool = True
    # Dead letters are always counted and sent; their log lines are capped at this many per
    # second (the rest summed up in one line a second at most; 0 = only those summaries).
    dead_letter_log_per_s: int = bounded(5, 0, 10_000)
    # Projection repair (app/worker/repair.py): every store_check_interval_ms the worker asks the
    # store whether it lost data and writes those partitions again, restore_chunk_users users
    # per step. 0 turns the checks off.
    store_check_interval_ms: int = bounded(2_000, 0, 3_600_000)
    restore_chunk_users: int = bounded(256, 1, 100_000)
    # Fault injection (crash-safety tests; 0 = off): SIGKILL the worker right after its Nth
    # projection-store write, before that flush's frames are produced.
    fault_kill_after_store_writes: int = bounded(0, 0)
    # The worker's local state; rebuilt from the changelog when lost.
    data_dir: str = ".local/worker"
    worker_web_host: str = "127.0.0.1"
    worker_web_port: int = 6066  # 0 disables the worker's web server (several workers per host)
    # The worker's Prometheus endpoint and health checks (GET /metrics on worker_web_host).
    # 0 = off, the default: several workers per host need distinct ports.
    worker_metrics_port: int = 0

    def _problems(self) -> list[str]:
        p = port_problem("worker_web_port", self.worker_web_port, lowest=0)
        p += port_problem("worker_metrics_port", self.worker_metrics_port, lowest=0)
        if self.worker_metrics_port and self.worker_metrics_port == self.worker_web_port:
            p.append(
                f"worker_metrics_port: {self.worker_metrics_port} is also worker_web_port "
                "(one process cannot bind it twice)"
            )
        if not self.data_dir.strip():
            p.append("data_dir: empty")
        if not self.worker_web_host.strip():
            p.append("worker_web_host: empty")
        return p


@dataclass(frozen=True, slots=True)
class AuditSettings(Section):
    """The unread audit (app/worker/audit.py, docs/contract.md §3.4 "Unread audit"): every
    interval the worker samples the rows idle for `unread_audit_idle_ms`, recounts each from the
    MessageStore (one bounded single-partition read) and corrects what drifted.

    The defaults audit each idle row with unread 0.72 times a day (0.005 x 144 rounds), rows at
    0 unread 0.144 times a day, at most `unread_audit_max_rows` per round (a capped round's sweep
    goes on from that row next round). A rate of 0 turns that part off."""

    unread_audit_sample_rate: float = bounded(0.005, 0, 1)
    unread_audit_interval_ms: int = bounded(600_000, 1000, 86_400_000)
    unread_audit_idle_ms: int = bounded(86_400_000, 0)
    unread_audit_max_rows: int = bounded(20_000, 1)
    unread_audit_zero_sample_rate: float = bounded(0.001, 0, 1)


@dataclass(frozen=True, slots=True)
class ReconcileSettings(Section):
    """Reconcile on request (docs/contract.md §10): a login or POST /v1/reconcile asks the owning
    worker to recompute the user's rows, at most once per user per `reconcile_min_interval_s`
    fleet-wide; the worker drops requests older than that (and at least a minute)."""

    reconcile_min_interval_s: int = bounded(300, 1, 86_400)
    # Whether a login asks for a reconcile (POST /v1/reconcile always can).
    reconcile_on_login: bool = True
