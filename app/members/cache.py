"""The member directory's disk cache: SQLite, signed, bounded (seed 004 "本地缓存").

Rules, and why:

* **Format version 1 only.** A row written by another format is a miss, never read "as best
  we can": two readers of two formats is how a stale layout leaks into the UI.
* **Whitelisted display fields only** (:data:`FIELDS`). A payload with any other key is
  corrupt, hence a miss: the cache can never carry permissions or server facts it should not.
* **Signed.** Every roster carries an HMAC-SHA256 over (format, environment, account, group,
  cached_at, member count, digest of every row) under the runtime key. A roster copied from
  another account/group, edited on disk or written by a previous runtime key is a miss.
* **Bounded without reading payloads.** Each row stores ``payload_bytes`` and each roster its
  total, so capacity is a SUM over headers. Limits: 100 rosters and 32 MiB in all, 20,000
  members / 4 MB per roster, 14-day expiry. A roster over its own limit is not cached at all
  and over the global limits the oldest *whole* rosters go: a truncated roster would be
  presented as complete.
* **Failures are misses.** Any SQLite error on read is a miss; on write, ``store`` returns
  False. The store above keeps working from the server either way.
* **Generation-checked writes.** ``store`` takes a ``still_current`` predicate evaluated on the
  cache thread right before commit: a write started before a 2001/2002 clear can never land
  after it (clears and writes run one at a time on the same thread).

SQLite runs on one dedicated thread (stdlib ``sqlite3``; no async wrapper is installed), so
the connection never crosses threads and every operation is serialised.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from app.members.model import Member, is_safe_count

log = logging.getLogger("projector.members.cache")

FORMAT_VERSION: Final = 1
DAY_MS: Final = 86_400_000
# The display fields a cached member may carry, and nothing else.
FIELDS: Final = (
    "user_id",
    "role",
    "state",
    "joined_at",
    "left_at",
    "display_name",
    "remark",
    "avatar_url",
    "record_count",
    "mention_count",
    "stats_known",
)
_FIELD_SET: Final = frozenset(FIELDS)
# A cached_at this far in the future is a corrupt header (clocks do not jump a day).
_FUTURE_TOLERANCE_MS: Final = DAY_MS

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheLimits:
    max_groups: int = 100
    max_total_bytes: int = 32 * 1024 * 1024
    max_group_members: int = 20_000
    max_group_bytes: int = 4_000_000
    expiry_ms: int = 14 * DAY_MS


@dataclass(frozen=True, slots=True)
class CachedRoster:
    members: tuple[Member, ...]
    cached_at_ms: int


@dataclass(frozen=True, slots=True)
class CacheKey:
    environment: str
    account: str
    group: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS member_rosters (
    environment TEXT NOT NULL,
    account TEXT NOT NULL,
    group_id TEXT NOT NULL,
    format_version INTEGER NOT NULL,
    cached_at_ms INTEGER NOT NULL,
    member_count INTEGER NOT NULL,
    payload_bytes INTEGER NOT NULL,
    signature BLOB NOT NULL,
    PRIMARY KEY (environment, account, group_id)
);
CREATE TABLE IF NOT EXISTS member_rows (
    environment TEXT NOT NULL,
    account TEXT NOT NULL,
    group_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    payload_bytes INTEGER NOT NULL,
    PRIMARY KEY (environment, account, group_id, position)
);
"""


class SqliteMemberCache:
    """Disk cache of member rosters keyed by (environment, account, group)."""

    def __init__(
        self,
        path: str | Path,
        key: bytes,
        *,
        clock_ms: Callable[[], int],
        limits: CacheLimits | None = None,
    ) -> None:
        if len(key) < 16:
            raise ValueError("the cache signing key must be at least 16 bytes")
        self.path = str(path)
        self._key = key
        self._clock_ms = clock_ms
        self.limits = limits or CacheLimits()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="member-cache")
        self._db: sqlite3.Connection | None = None

    # -- public, async ---------------------------------------------------------------------

    async def load(self, key: CacheKey) -> CachedRoster | None:
        """The cached roster, or None on any kind of miss (absent, expired, corrupt, other
        format, bad signature, SQLite failure)."""
        now = self._clock_ms()
        try:
            return await self._run(self._load, key, now)
        except sqlite3.Error as exc:
            log.warning("member cache read failed (a miss): %s", exc)
            return None

    async def store(
        self, key: CacheKey, members: Sequence[Member], *, still_current: Callable[[], bool] = lambda: True
    ) -> bool:
        """Write a whole roster (replacing the previous one). False when it was not written:
        too large for one roster, no longer current, or a SQLite failure."""
        now = self._clock_ms()
        rows = [(m.user_id, _encode(m)) for m in sorted(members, key=lambda m: m.user_id)]
        try:
            return await self._run(self._store, key, rows, now, still_current)
        except sqlite3.Error as exc:
            log.warning("member cache write failed: %s", exc)
            return False

    async def delete(self, key: CacheKey) -> None:
        try:
            await self._run(self._delete_now, key)
        except sqlite3.Error as exc:
            log.warning("member cache delete failed: %s", exc)

    async def usage(self) -> tuple[int, int]:
        """(rosters, payload bytes) on disk, from the headers alone."""
        return await self._run(self._usage)

    async def close(self) -> None:
        try:
            await self._run(self._close)
        finally:
            self._executor.shutdown(wait=False)

    # -- the cache thread ------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.path, isolation_level=None)  # explicit BEGIN/COMMIT below
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _usage(self) -> tuple[int, int]:
        count, total = (
            self._conn()
            .execute("SELECT COUNT(*), COALESCE(SUM(payload_bytes), 0) FROM member_rosters")
            .fetchone()
        )
        return int(count), int(total)

    def _load(self, key: CacheKey, now: int) -> CachedRoster | None:
        db = self._conn()
        k = (key.environment, key.account, key.group)
        header = db.execute(
            "SELECT format_version, cached_at_ms, member_count, payload_bytes, signature"
            " FROM member_rosters WHERE environment = ? AND account = ? AND group_id = ?",
            k,
        ).fetchone()
        if header is None:
            return None
        version, cached_at, count, total, signature = header
        if version != FORMAT_VERSION:
            return self._miss(key, "format version %s", version)
        if cached_at > now + _FUTURE_TOLERANCE_MS:
            return self._miss(key, "cached_at %s in the future", cached_at)
        if now - cached_at > self.limits.expiry_ms:
            return self._miss(key, "expired (cached at %s)", cached_at)
        rows = db.execute(
            "SELECT user_id, payload, payload_bytes FROM member_rows"
            " WHERE environment = ? AND account = ? AND group_id = ? ORDER BY position",
            k,
        ).fetchall()
        if len(rows) != count or sum(r[2] for r in rows) != total:
            return self._miss(key, "row count/bytes disagree with the header")
        expected = self._sign(key, cached_at, [(r[0], r[1]) for r in rows])
        if not isinstance(signature, bytes) or not hmac.compare_digest(expected, signature):
            return self._miss(key, "bad signature")
        members = []
        for user_id, payload, size in rows:
            member = _decode(payload)
            if member is None or str(member.user_id) != user_id or size != len(payload.encode()):
                return self._miss(key, "corrupt row for user %s", user_id)
            members.append(member)
        return CachedRoster(members=tuple(members), cached_at_ms=cached_at)

    def _miss(self, key: CacheKey, why: str, *args: object) -> CachedRoster | None:
        # A roster that cannot be used is deleted at once: it would only cost space and reads.
        log.info("member cache miss for %s: " + why, key, *args)
        self._delete_now(key)
        return None

    def _store(
        self, key: CacheKey, rows: list[tuple[int, str]], now: int, still_current: Callable[[], bool]
    ) -> bool:
        limits = self.limits
        sizes = [len(payload.encode()) for _, payload in rows]
        total = sum(sizes)
        if len(rows) > limits.max_group_members or total > limits.max_group_bytes:
            # Never a truncated roster; and the older copy is now known to be out of date.
            log.info(
                "member roster %s not cached: %d members / %d bytes over the limit", key, len(rows), total
            )
            self._delete_now(key)
            return False
        signed_rows = [(str(user_id), payload) for user_id, payload in rows]
        signature = self._sign(key, now, signed_rows)
        k = (key.environment, key.account, key.group)
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            if not still_current():
                db.execute("ROLLBACK")
                return False
            self._delete_rows(db, key)
            db.execute(
                "INSERT INTO member_rosters (environment, account, group_id, format_version,"
                " cached_at_ms, member_count, payload_bytes, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*k, FORMAT_VERSION, now, len(rows), total, signature),
            )
            db.executemany(
                "INSERT INTO member_rows (environment, account, group_id, position, user_id, payload,"
                " payload_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (*k, position, user_id, payload, size)
                    for position, ((user_id, payload), size) in enumerate(
                        zip(signed_rows, sizes, strict=True)
                    )
                ],
            )
            self._evict(db, key)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return True

    def _evict(self, db: sqlite3.Connection, keep: CacheKey) -> None:
        """Oldest whole rosters out until the global limits hold (headers only: no payload read)."""
        limits = self.limits
        while True:
            count, total = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(payload_bytes), 0) FROM member_rosters"
            ).fetchone()
            if count <= limits.max_groups and total <= limits.max_total_bytes:
                return
            oldest = db.execute(
                "SELECT environment, account, group_id FROM member_rosters"
                " WHERE NOT (environment = ? AND account = ? AND group_id = ?)"
                " ORDER BY cached_at_ms ASC LIMIT 1",
                (keep.environment, keep.account, keep.group),
            ).fetchone()
            if oldest is None:
                return  # only the new roster is left, and it is within its own limits
            self._delete_rows(db, CacheKey(*oldest))

    def _delete_now(self, key: CacheKey) -> None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            self._delete_rows(db, key)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @staticmethod
    def _delete_rows(db: sqlite3.Connection, key: CacheKey) -> None:
        k = (key.environment, key.account, key.group)
        db.execute("DELETE FROM member_rosters WHERE environment = ? AND account = ? AND group_id = ?", k)
        db.execute("DELETE FROM member_rows WHERE environment = ? AND account = ? AND group_id = ?", k)

    def _sign(self, key: CacheKey, cached_at: int, rows: Sequence[tuple[str, str]]) -> bytes:
        digest = hashlib.sha256()
        for user_id, payload in rows:
            # Length-prefixed, so no two different row lists hash the same.
            for part in (user_id, payload):
                data = part.encode()
                digest.update(len(data).to_bytes(8, "big"))
                digest.update(data)
        header = json.dumps(
            [FORMAT_VERSION, key.environment, key.account, key.group, cached_at, len(rows)],
            separators=(",", ":"),
        ).encode()
        return hmac.new(self._key, header + digest.digest(), hashlib.sha256).digest()


def _encode(member: Member) -> str:
    payload = {name: getattr(member, name) for name in FIELDS}
    payload["user_id"] = str(member.user_id)  # u64: JSON readers elsewhere may not hold it as a number
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _decode(payload: str) -> Member | None:
    """A member from a cached payload, or None when the payload is not exactly format 1."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != _FIELD_SET:
        return None
    try:
        user_id = int(data["user_id"]) if str(data["user_id"]).isdigit() else -1
    except (TypeError, ValueError):
        return None
    if not 0 <= user_id < 2**64:
        return None
    for name in ("display_name", "remark", "avatar_url"):
        if data[name] is not None and not isinstance(data[name], str):
            return None
    for name in ("joined_at", "left_at"):
        value = data[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return None
    if data["role"] not in ("owner", "admin", "member") or data["state"] not in ("active", "left", "removed"):
        return None
    record, mention = data["record_count"], data["mention_count"]
    known = data["stats_known"] is True and is_safe_count(record) and is_safe_count(mention)
    return Member(
        user_id=user_id,
        role=data["role"],
        state=data["state"],
        joined_at=data["joined_at"],
        left_at=data["left_at"],
        display_name=data["display_name"],
        remark=data["remark"],
        avatar_url=data["avatar_url"],
        record_count=record if known else None,
        mention_count=mention if known else None,
        stats_known=known,
        presented=data["display_name"] is not None or known,
    )
