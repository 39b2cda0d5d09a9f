"""FrameHub: the connected users, their connections' bounded buffers and their recent frames.

Frames come in through :meth:`FrameHub.publish` (the Kafka adapter calls it for every frame of a
user the hub :meth:`wants`); each frame is encoded once as a Server-Sent Event (ids as decimal
strings, docs/contract.md §9) and queued on every live connection of its user. Everything here runs on
the event loop and never awaits while it changes state, so a frame is either before or after a
connection's start, never half of both.

Why each piece is there:

* **Bounded buffers.** Each connection queues at most ``buffer_bytes`` of events. A client that
  reads slower than its frames arrive overflows it: the queue is dropped whole (memory stays
  bounded) and the connection is told to re-pull and closed (:meth:`Connection.take` returns
  nothing). It never silently loses a frame in the middle of a stream.
* **Resume.** A client reconnects with the last ``projection_mailbox_seq`` it applied (SSE
  ``Last-Event-ID``). Per user the hub keeps the last frames (``resume_frames`` /
  ``resume_bytes``) while the user is connected and for ``resume_window_s`` after: the *user
  log*. The log holds every frame with a version above ``covers_after`` (the store version
  read right after the log was created: a frame of a newer version was produced after that
  read, because the worker writes the store before it emits a flush's frames, so it was
  consumed, and logged, after the log existed) unless one was evicted (``evicted`` then says up
  to which version the log is incomplete). :meth:`start` replays what the client missed when
  the log covers it and the missed SESSION_DELTA frames chain from the client's version by the
  seed's ``prev_projection_mailbox_seq`` rule; otherwise it says ``repull``. Never a skip.
* **Heartbeats.** :meth:`beat` queues a ``heartbeat`` event on every connection that sent
  nothing for a beat: proxies keep the stream open, a client notices a dead connection, and a
  write to a vanished client fails (so it is detached).

Stdlib + orjson only: the API process imports this module (app/api must not import Kafka).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from app.domain.wire_ids import U64_MAX, frame_to_client
from app.gateway.recent_frames import RecentFrames

SESSION_DELTA: Final = "SESSION_DELTA"
BADGE_UPDATE: Final = "BADGE_UPDATE"
MEMBER_NOTICE: Final = "MEMBER_NOTICE"
FRAME_TYPES: Final = frozenset({SESSION_DELTA, BADGE_UPDATE, MEMBER_NOTICE})

HEARTBEAT_EVENT: Final = b"event: heartbeat\ndata: {}\n\n"

# Statuses of a stream's start (the `hello` event's `status`).
FRESH: Final = "fresh"  # no Last-Event-ID: pull the list, then apply the frames that follow
RESUMED: Final = "resumed"  # the frames after your version follow: nothing to pull
REPULL: Final = "repull"  # frames after your version cannot be replayed: pull, then apply


class FrameError(ValueError):
    """A frame that is not a well-formed SESSION_DELTA / BADGE_UPDATE / MEMBER_NOTICE."""


class TooManyConnections(RuntimeError):
    """This process holds ``max_connections`` streams already."""


def encode_event(name: str, data: bytes, event_id: int | None = None) -> bytes:
    """One SSE event. ``data`` is compact JSON (orjson never writes a newline)."""
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + b"event: " + name.encode("ascii") + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class Entry:
    """One frame as the hub keeps and sends it."""

    kind: str
    version: int  # the frame's projection_mailbox_seq
    prev: int | None  # prev_projection_mailbox_seq (SESSION_DELTA, BADGE_UPDATE); None: notice
    correction: bool  # an audit correction restating `version` (docs/contract.md §4, "Correction frames")
    event: bytes  # the SSE event, encoded once for every connection of the user

    @property
    def chained(self) -> bool:
        """A step of the user's SESSION_DELTA chain (what Last-Event-ID positions)."""
        return self.kind == SESSION_DELTA and not self.correction


def _uint(frame: Mapping[str, Any], key: str, high: int = U64_MAX) -> int:
    value = frame.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise FrameError(f"{key!r} must be an unsigned integer, got {value!r}")
    return value


def entry_of(frame: Mapping[str, Any]) -> tuple[int, Entry]:
    """``(user_id, entry)`` for a frame as the worker produces it (ids as numbers)."""
    kind = frame.get("type")
    if kind not in FRAME_TYPES:
        raise FrameError(f"not a client frame: type {kind!r}")
    user_id = _uint(frame, "user_id")
    version = _uint(frame, "projection_mailbox_seq")
    correction = frame.get("correction", False)
    if not isinstance(correction, bool):
        raise FrameError("'correction' must be a boolean")
    prev: int | None = None
    if kind == MEMBER_NOTICE:
        if not isinstance(frame.get("conversation_id"), str):
            raise FrameError("'conversation_id' must be a string")
        _uint(frame, "kind")
        _uint(frame, "conversation_seq")
        correction = False
    else:
        prev = _uint(frame, "prev_projection_mailbox_seq")
        if correction and prev != version:
            raise FrameError("a correction restates its version: prev must equal it")
        if not correction and prev >= version:
            raise FrameError(f"prev_projection_mailbox_seq {prev} must be below {version}")
        if kind == SESSION_DELTA and not isinstance(frame.get("conversations"), list):
            raise FrameError("'conversations' must be a list")
    data = orjson.dumps(frame_to_client(frame))
    # Only chain steps carry an SSE id: the browser's Last-Event-ID is then always a version the
    # client has the rows of (a badge or notice can arrive before its flush's SESSION_DELTA).
    event_id = version if kind == SESSION_DELTA and not correction else None
    return user_id, Entry(kind, version, prev, correction, encode_event(kind, data, event_id))


class Connection:
    """One stream's queue of encoded events, bounded in bytes."""

    __slots__ = (
        "_limit",
        "_queue",
        "_queued",
        "_wake",
        "attach_mark",
        "closed",
        "floor",
        "live",
        "overflowed",
        "sent_at",
        "user_id",
    )

    def __init__(self, user_id: int, limit_bytes: int, now: float) -> None:
        self.user_id = user_id
        self._limit = limit_bytes
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self.live = False  # frames are queued once start() has decided where the client is
        self.floor = 0  # chain versions at or below it are stale for this client: not sent
        self.overflowed = False
        self.closed = False
        self.sent_at = now  # when something was last queued (heartbeats fill the silences)
        self.attach_mark = 0  # the user log's arrival count when this connection attached

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def offer(self, data: bytes, now: float) -> bool:
        """Queue ``data``; False (and the connection marked overflowed) when the buffer is full."""
        if self.overflowed or self.closed:
            return False
        if self._queued + len(data) > self._limit:
            self.overflowed = True
            self._queue.clear()  # bounded memory: what the client could not take is dropped whole
            self._queued = 0
            self._wake.set()
            return False
        self._queue.append(data)
        self._queued += len(data)
        self.sent_at = now
        self._wake.set()
        return True

    async def take(self) -> list[bytes]:
        """Everything queued, waiting until there is something. Empty = stop: the buffer
        overflowed (send ``repull`` and close) or the connection was closed."""
        while not self._queue and not self.overflowed and not self.closed:
            self._wake.clear()
            await self._wake.wait()
        if self.overflowed or self.closed:
            return []
        out = list(self._queue)
        self._queue.clear()
        self._queued = 0
        return out

    def close(self) -> None:
        self.closed = True
        self._wake.set()


@dataclass(slots=True)
class UserLog:
    """One user's connections and recent frames (see the module docstring, "Resume")."""

    entries: deque[tuple[int, Entry]] = field(default_factory=deque)  # (arrival number, frame)
    size: int = 0  # bytes of the events held
    appended: int = 0  # frames ever appended (arrival numbers)
    covers_after: int | None = None  # set by the first store read after the log was created
    evicted: int = 0  # the highest version dropped from (or never kept in) the log
    connections: list[Connection] = field(default_factory=list)
    detached_at: float | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """Where a stream starts (the ``hello`` event says it to the client)."""

    status: str  # FRESH, RESUMED or REPULL
    position: int  # the version the stream continues from (the hello's SSE id)
    reason: str | None  # why REPULL: "gap" (frames missed that cannot be replayed), "ahead"
    replayed: int  # frames queued from the user log


@dataclass(slots=True)
class HubCounters:
    frames: int = 0  # frames of wanted users published
    malformed: int = 0
    delivered: int = 0  # events queued on connections (one frame to two tabs = 2)
    stale_skipped: int = 0
    overflows: int = 0
    heartbeats: int = 0
    starts: dict[str, int] = field(default_factory=lambda: {FRESH: 0, RESUMED: 0, REPULL: 0})
    replayed: int = 0
    logs_expired: int = 0
    seeded: int = 0  # new user logs that took another instance's stream's frames from `recent`


class FrameHub:
    def __init__(
        self,
        *,
        buffer_bytes: int = 1 << 20,
        resume_frames: int = 64,
        resume_bytes: int = 256 * 1024,
        resume_window_s: float = 120.0,
        resume_users: int = 50_000,
        max_connections: int = 20_000,
        clock: Callable[[], float] = time.monotonic,
        recent: RecentFrames | None = None,
    ) -> None:
        self.buffer_bytes = buffer_bytes
        # Frames of users without a log here, to seed a log when one of them attaches (a
        # reconnect that a load balancer sent to this instance): app/gateway/recent_frames.py.
        self.recent = recent
        self.resume_frames = resume_frames
        self.resume_bytes = resume_bytes
        self.resume_window_s = resume_window_s
        self.resume_users = resume_users
        self.max_connections = max_connections
        self.clock = clock
        self.connections = 0
        self.counters = HubCounters()
        self._users: dict[int, UserLog] = {}
        self._detached: OrderedDict[int, None] = OrderedDict()  # logs without a connection, oldest first

    # -- reading ---------------------------------------------------------------------------

    def wants(self, user_id: int) -> bool:
        """Whether frames of this user are of use here (connected, or resumable)."""
        return user_id in self._users

    def connected_users(self) -> list[int]:
        return [u for u, log in self._users.items() if log.connections]

    def is_connected(self, user_id: int) -> bool:
        log = self._users.get(user_id)
        return log is not None and bool(log.connections)

    @property
    def logs_held(self) -> int:
        return len(self._users)

    # -- frames ----------------------------------------------------------------------------

    def hold(self, user_id: int, raw: bytes) -> None:
        """A frame of a user this hub does not want (:meth:`wants`), undecoded: kept in
        :attr:`recent` (if any) in case the user's reconnect comes here."""
        if self.recent is not None:
            self.recent.hold(user_id, raw)

    def publish(self, frame: Mapping[str, Any], expected_user: int | None = None) -> int:
        """Record and deliver one frame; returns how many connections it was queued on. A
        malformed frame (or one whose user_id is not the record key's) is counted and dropped."""
        try:
            user_id, entry = entry_of(frame)
            if expected_user is not None and user_id != expected_user:
                raise FrameError(f"frame of user {user_id} under the key of user {expected_user}")
        except FrameError:
            self.counters.malformed += 1
            return 0
        log = self._users.get(user_id)
        if log is None:
            return 0
        self.counters.frames += 1
        self._record(log, entry)
        now = self.clock()
        delivered = 0
        for conn in log.connections:
            if not conn.live or conn.overflowed or conn.closed:
                continue  # not started: start() takes it from the log; over: ending
            if (
                entry.kind != MEMBER_NOTICE
                and entry.version <= conn.floor
                and not (entry.correction and entry.version == conn.floor)
            ):
                self.counters.stale_skipped += 1
                continue
            if conn.offer(entry.event, now):
                delivered += 1
            elif conn.overflowed:
                self.counters.overflows += 1
        self.counters.delivered += delivered
        return delivered

    def _record(self, log: UserLog, entry: Entry) -> None:
        log.appended += 1
        if self.resume_frames == 0 or len(entry.event) > self.resume_bytes:
            log.evicted = max(log.evicted, entry.version)
            return
        log.entries.append((log.appended, entry))
        log.size += len(entry.event)
        while len(log.entries) > self.resume_frames or log.size > self.resume_bytes:
            _, old = log.entries.popleft()
            log.size -= len(old.event)
            log.evicted = max(log.evicted, old.version)

    # -- connections -----------------------------------------------------------------------

    def attach(self, user_id: int) -> Connection:
        """A new stream of ``user_id``: from now on its frames are logged. Not live until
        :meth:`start` (call it after reading the user's store version)."""
        if self.connections >= self.max_connections:
            raise TooManyConnections(f"this process holds {self.connections} streams already")
        log = self._users.get(user_id)
        if log is None:
            log = self._users[user_id] = self._seeded_log(user_id)
        elif log.detached_at is not None:
            log.detached_at = None
            self._detached.pop(user_id, None)
        conn = Connection(user_id, self.buffer_bytes, self.clock())
        conn.attach_mark = log.appended
        log.connections.append(conn)
        self.connections += 1
        return conn

    def _seeded_log(self, user_id: int) -> UserLog:
        """A new user log holding the user's frames from :attr:`recent`. Its ``covers_after`` is
        the first settled SESSION_DELTA's prev (everything above it is held: see
        app/gateway/recent_frames.py); without one the first store read sets it, as for any new
        log."""
        log = UserLog()
        if self.recent is None:
            return log
        frames, evicted = self.recent.take(user_id)
        floor = None
        for raw, settled in frames:
            try:
                frame = orjson.loads(raw)
                if not isinstance(frame, dict):
                    raise FrameError("not an object")
                owner, entry = entry_of(frame)
                if owner != user_id:
                    raise FrameError(f"frame of user {owner} under the key of user {user_id}")
            except (orjson.JSONDecodeError, FrameError):
                self.counters.malformed += 1
                continue
            self._record(log, entry)
            if floor is None and settled and entry.chained and entry.prev is not None:
                floor = entry.prev  # no frame has a version between a delta's prev and its own
        log.evicted = max(log.evicted, evicted)
        if floor is not None:
            log.covers_after = floor
            self.counters.seeded += 1
        return log

    def start(self, conn: Connection, store_version: int, last_event_id: int | None) -> Start:
        """Decide where the stream starts and queue what the client missed; the connection is
        live afterwards. ``store_version`` must have been read after :meth:`attach`."""
        log = self._users[conn.user_id]
        if log.covers_after is None or store_version < log.covers_after:
            log.covers_after = store_version
        covered = max(log.covers_after, log.evicted)
        v = last_event_id
        resumed = None
        if v is not None and covered <= v <= store_version:
            resumed = self._resume_entries(log, v)
        if v is not None and resumed is not None:
            replay = resumed
            start = Start(RESUMED, v, None, len(replay))
        else:
            replay = self._fresh_entries(log, conn, store_version)
            if v is None:
                start = Start(FRESH, store_version, None, len(replay))
            else:
                # "ahead": the client holds a version the store does not (it lost a write);
                # "gap": frames after the client's version are not all held here.
                start = Start(REPULL, store_version, "ahead" if v > store_version else "gap", len(replay))
        now = self.clock()
        for entry in replay:
            conn.offer(entry.event, now)
        if conn.overflowed:
            self.counters.overflows += 1
        conn.floor = start.position
        conn.live = True
        self.counters.starts[start.status] += 1
        self.counters.replayed += len(replay)
        return start

    @staticmethod
    def _resume_entries(log: UserLog, v: int) -> list[Entry] | None:
        """The logged frames after version ``v`` if their deltas chain from ``v``; else None."""
        expected = v
        after_v = 0  # arrival number of the delta at v, when logged: notices after it are news
        for arrival, entry in log.entries:
            if entry.chained and entry.version == v:
                after_v = arrival
        out: list[Entry] = []
        for arrival, entry in log.entries:
            if entry.chained and entry.version > v:
                if entry.prev != expected:
                    return None  # the client's version is not where this chain goes on from
                expected = entry.version
                out.append(entry)
            elif entry.kind == MEMBER_NOTICE:
                if (after_v and arrival > after_v) or (not after_v and entry.version > v):
                    out.append(entry)
            elif entry.version > v or (entry.correction and entry.version == v):
                out.append(entry)
        return out

    @staticmethod
    def _fresh_entries(log: UserLog, conn: Connection, store_version: int) -> list[Entry]:
        """Frames logged since the attach that a client pulling at >= ``store_version`` still
        needs (its pull supersedes every older chain step)."""
        return [
            entry
            for arrival, entry in log.entries
            if arrival > conn.attach_mark
            and (
                entry.kind == MEMBER_NOTICE
                or entry.version > store_version
                or (entry.correction and entry.version == store_version)
            )
        ]

    def detach(self, conn: Connection) -> bool:
        """The stream ended; True when it was the user's last one here."""
        conn.close()
        log = self._users.get(conn.user_id)
        if log is None or conn not in log.connections:
            return False
        log.connections.remove(conn)
        self.connections -= 1
        if log.connections:
            return False
        if self.resume_window_s <= 0 or self.resume_users <= 0:
            del self._users[conn.user_id]
            return True
        log.detached_at = self.clock()
        self._detached[conn.user_id] = None
        while len(self._detached) > self.resume_users:
            oldest, _ = self._detached.popitem(last=False)
            del self._users[oldest]
            self.counters.logs_expired += 1
        return True

    # -- housekeeping ----------------------------------------------------------------------

    def beat(self, interval_s: float) -> int:
        """Queue a heartbeat on every live connection silent for ``interval_s``."""
        now = self.clock()
        beats = 0
        for log in self._users.values():
            for conn in log.connections:
                if conn.live and now - conn.sent_at >= interval_s and conn.offer(HEARTBEAT_EVENT, now):
                    beats += 1
        self.counters.heartbeats += beats
        return beats

    def sweep(self) -> int:
        """Forget the logs of users disconnected longer than the resume window."""
        now = self.clock()
        expired = 0
        while self._detached:
            user_id = next(iter(self._detached))
            log = self._users[user_id]
            if log.detached_at is None or now - log.detached_at < self.resume_window_s:
                break
            del self._detached[user_id]
            del self._users[user_id]
            expired += 1
        self.counters.logs_expired += expired
        return expired

    def close_all(self) -> None:
        for log in self._users.values():
            for conn in log.connections:
                conn.close()
