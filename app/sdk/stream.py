"""A LiveSessionList kept current over the gateway's live stream (GET /v1/stream, SSE).

    async with SessionsClient(url, token) as api:
        live = LiveSessionList(api, user_id)
        stream = LiveStream(live, on_notice=members_to(registry))
        task = asyncio.create_task(stream.run(stop))   # live.main(), live.view.badge stay current

The protocol (docs/gateway.md): the first event is ``hello``; unless it says ``resumed`` the
list is pulled right then (the stream is registered before the hello, so every frame newer
than the pull follows it); frames are applied with the client rule (absolute rows, versions,
a ``prev_projection_mailbox_seq`` gap re-pulls); a ``repull`` event re-pulls; a dropped
connection reconnects with ``Last-Event-ID`` = the version the view holds, so the gateway
replays what was missed or says to re-pull. Ids arrive as decimal strings and are turned back
into ints (app/domain/wire_ids.py). No Kafka client: this is what a device runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from app.domain.client import FrameError, badge_of
from app.domain.wire_ids import frame_from_client
from app.sdk.client import ClientError
from app.sdk.live import LiveSessionList
from app.sdk.sse import SseEvent, SseParser

log = logging.getLogger(__name__)

Notice = Mapping[str, Any]


@dataclass(slots=True)
class StreamStats:
    connects: int = 0
    hellos: dict[str, int] = field(default_factory=dict)  # by status
    frames: int = 0
    applied: int = 0
    malformed: int = 0
    notices: int = 0
    notices_repeated: int = 0  # delivered again (at least once) and not passed on
    repull_events: int = 0
    heartbeats: int = 0
    disconnects: int = 0
    last_error: str = ""


def members_to(registry: Any) -> Callable[[Notice], None]:
    """``on_notice`` for a :class:`~app.members.directory.MemberDirectoryRegistry`: each
    MEMBER_NOTICE reaches the store of its group (t=24 re-reads the roster, t=27 also drops
    the history window)."""

    def forward(notice: Notice) -> None:
        conversation, kind = notice.get("conversation_id"), notice.get("kind")
        if isinstance(conversation, str) and isinstance(kind, int):
            registry.on_notice(conversation, kind)

    return forward


class LiveStream:
    def __init__(
        self,
        live: LiveSessionList,
        *,
        on_notice: Callable[[Notice], None] | None = None,
        read_timeout_s: float = 45.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.live = live
        self.on_notice = on_notice
        self.read_timeout_s = read_timeout_s  # ~3 heartbeats: a silent connection is dead
        self.max_backoff_s = max_backoff_s
        self.stats = StreamStats()
        self.synced = False  # the view holds a pull: reconnects say where it is
        self.connected = False
        self.last_hello: dict[str, Any] | None = None
        self._changed = asyncio.Event()
        self._notices_seen: dict[tuple[object, object, object], None] = {}  # insertion-ordered

    @property
    def url(self) -> str:
        return self.live.client.base_url + "/v1/stream"

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Follow the stream until ``stop`` is set, reconnecting (with backoff) when it drops."""
        stop = stop or asyncio.Event()
        backoff = 0.2
        while not stop.is_set():
            stopper = asyncio.ensure_future(stop.wait())
            follow = asyncio.ensure_future(self.follow_once())
            try:
                await asyncio.wait({stopper, follow}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (stopper, follow):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if follow.done() and not follow.cancelled() and follow.exception() is None:
                backoff = 0.2  # a stream that ended cleanly (slow close, server restart)
            self.stats.disconnects += 1
            self._notify()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    async def follow_once(self) -> None:
        """One connection, until the server ends it or it fails (raises on failure)."""
        headers = self.live.client.headers
        if self.synced:
            headers["Last-Event-ID"] = str(self.live.view.version)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.read_timeout_s)
        session = self.live.client.session
        self.stats.connects += 1
        try:
            async with session.get(self.url, headers=headers, timeout=timeout) as response:
                if response.status != 200:
                    body = await response.read()
                    raise ClientError(response.status, "stream", body[:200].decode(errors="replace"))
                self.connected = True
                parser = SseParser()
                async for chunk in response.content.iter_any():
                    for event in parser.feed(chunk):
                        await self._handle(event)
        except Exception as exc:
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.connected = False

    async def _handle(self, event: SseEvent) -> None:
        try:
            body = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self.stats.malformed += 1
            return
        name = event.event
        if name == "hello":
            await self._hello(body)
        elif name in ("SESSION_DELTA", "BADGE_UPDATE"):
            self.stats.frames += 1
            try:
                result = await self.live.apply(frame_from_client(body))
            except (FrameError, ValueError) as exc:
                log.warning("dropped a malformed frame: %s", exc)
                self.stats.malformed += 1
            else:
                self.stats.applied += int(result.applied)
        elif name == "MEMBER_NOTICE":
            self.stats.notices += 1
            try:
                notice = frame_from_client(body)
            except ValueError:
                self.stats.malformed += 1
            else:
                # At least once (a resume may replay one): (conversation, kind, seq) names it.
                key = (notice.get("conversation_id"), notice.get("kind"), notice.get("conversation_seq"))
                if key in self._notices_seen:
                    self.stats.notices_repeated += 1
                    return
                self._notices_seen[key] = None
                if len(self._notices_seen) > 1000:
                    del self._notices_seen[next(iter(self._notices_seen))]
                if self.on_notice is not None:
                    self.on_notice(notice)
        elif name == "repull":
            self.stats.repull_events += 1
            await self.live.sync()
        elif name == "heartbeat":
            self.stats.heartbeats += 1
        self._notify()

    async def _hello(self, hello: dict[str, Any]) -> None:
        status = str(hello.get("status"))
        self.stats.hellos[status] = self.stats.hellos.get(status, 0) + 1
        self.last_hello = hello
        badge = hello.get("badge")
        if isinstance(badge, dict):
            with contextlib.suppress(FrameError):
                self.live.view.offer_badge(badge_of(badge))
        if status != "resumed" or not self.synced:
            # Registered before the hello: every frame newer than this pull follows it.
            await self.live.sync()
            self.synced = True

    # -- waiting (tests, demos) ------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds (checked after every event and reconnect)."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._changed.wait()
