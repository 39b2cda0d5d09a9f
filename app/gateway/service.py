"""The gateway as the API's ``/v1/stream`` route sees it: the hub, presence, which users this
instance serves, and the background loops (heartbeats, presence refresh, resume-log expiry).

No Kafka here: the frames reach the hub through an adapter (app/gateway/kafka_frames.py) that
the process wiring starts next to this object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from app.gateway.hub import FrameHub

log = logging.getLogger("projector.gateway")

OPEN_CONCURRENCY = 32


class Presence(Protocol):
    async def claim(self, user_ids: list[int]) -> bool: ...

    async def release(self, user_ids: list[int]) -> bool: ...


class Gateway:
    def __init__(
        self,
        hub: FrameHub,
        *,
        heartbeat_s: float,
        presence: Presence | None = None,
        presence_refresh_s: float = 10.0,
        partition_of: Callable[[int], int] | None = None,
        partitions: frozenset[int] | None = None,
        instance: str | None = None,
        sweep_s: float = 5.0,
    ) -> None:
        self.hub = hub
        self.heartbeat_s = heartbeat_s
        self.presence = presence
        self.presence_refresh_s = presence_refresh_s
        self.partition_of = partition_of
        self.partitions = partitions
        self.instance = instance or secrets.token_hex(6)
        self.sweep_s = sweep_s
        self._tasks: list[asyncio.Task[None]] = []
        self.presence_failures = 0
        # Counters of the adapters the process wiring started next to it (for /metrics): a
        # dataclass of ints each (kafka_frames.SourceStats, push.PushStats), or None.
        self.source_stats: object | None = None
        self.push_stats: object | None = None
        self.push: Any = None  # the process's PushProducer, if it runs one (introspection, tests)
        self._presence_changed: set[int] = set()
        self._presence_due = asyncio.Event()
        # name -> "still running?" of the adapters started next to it (readiness)
        self.parts: dict[str, Callable[[], bool]] = {}
        # Stream starts read the store (the hello's badge and version) at most this many at a
        # time: after a gateway restart every client reconnects at once, and an unbounded herd
        # would exhaust the store client's connection pool (redis-py's default: 100, then
        # "Too many connections") and fail page requests of the same process too.
        self.starting = asyncio.Semaphore(OPEN_CONCURRENCY)

    # -- what the route asks ---------------------------------------------------------------

    def misdirected(self, user_id: int) -> int | None:
        """The partition of ``user_id`` when this instance does not serve it, else None."""
        if self.partitions is None or self.partition_of is None:
            return None
        partition = self.partition_of(user_id)
        return None if partition in self.partitions else partition

    def opened(self, user_id: int) -> None:
        """A stream of ``user_id`` is live here: its presence is claimed with the next batch."""
        if self.presence is not None:
            self._presence_changed.add(user_id)
            self._presence_due.set()

    def closed(self, user_id: int, last: bool) -> None:
        if last and self.presence is not None:
            self._presence_changed.add(user_id)
            self._presence_due.set()

    async def write_presence(self) -> None:
        """Write the presence changes since the last batch: each user as the hub has it NOW
        (connected: claim; not: release), so an open and a close in one batch cannot reorder."""
        if self.presence is None or not self._presence_changed:
            return
        changed, self._presence_changed = self._presence_changed, set()
        here = [u for u in changed if self.hub.is_connected(u)]
        gone = [u for u in changed if not self.hub.is_connected(u)]
        for ok in (
            not here or await self.presence.claim(here),
            not gone or await self.presence.release(gone),
        ):
            if not ok:
                self.presence_failures += 1

    async def ready(self) -> None:
        """A readiness check (GET /readyz): every part the process wiring started still runs."""
        dead = [name for name, alive in self.parts.items() if not alive()]
        if dead:
            raise RuntimeError(f"live stream parts stopped: {', '.join(dead)}")

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        loops = [self._every(self.heartbeat_s / 2, self._beat), self._every(self.sweep_s, self._sweep)]
        if self.presence is not None:
            loops.append(self._every(self.presence_refresh_s, self._refresh))
            loops.append(self._presence_batches())
        self._tasks = [asyncio.create_task(loop) for loop in loops]

    async def stop(self) -> None:
        self.hub.close_all()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.presence is not None:
            # This instance serves nobody any more: say so now rather than when the TTL runs out.
            leaving = sorted(set(self.hub.connected_users()) | self._presence_changed)
            self._presence_changed = set()
            if leaving and not await self.presence.release(leaving):
                self.presence_failures += 1

    async def _presence_batches(self, every_s: float = 0.1) -> None:
        while True:
            await self._presence_due.wait()
            self._presence_due.clear()
            await asyncio.sleep(every_s)  # what opens or closes meanwhile joins this batch
            try:
                await self.write_presence()
            except Exception:
                log.exception("presence batch failed")

    async def _every(self, interval_s: float, step: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # a housekeeping step must never end the loop
                log.exception("gateway housekeeping step failed")

    def _beat(self) -> None:
        self.hub.beat(self.heartbeat_s)

    def _sweep(self) -> None:
        self.hub.sweep()

    async def _refresh(self) -> None:
        assert self.presence is not None
        users = self.hub.connected_users()
        if users and not await self.presence.claim(users):
            self.presence_failures += 1
