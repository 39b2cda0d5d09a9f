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


class Presence(Protocol):
    async def claim(self, user_ids: list[int]) -> bool: ...

    async def release(self, user_id: int) -> bool: ...


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

    # -- what the route asks ---------------------------------------------------------------

    def misdirected(self, user_id: int) -> int | None:
        """The partition of ``user_id`` when this instance does not serve it, else None."""
        if self.partitions is None or self.partition_of is None:
            return None
        partition = self.partition_of(user_id)
        return None if partition in self.partitions else partition

    async def opened(self, user_id: int) -> None:
        """A stream of ``user_id`` is live here (claim presence on its first one)."""
        if self.presence is not None and not await self.presence.claim([user_id]):
            self.presence_failures += 1

    async def closed(self, user_id: int, last: bool) -> None:
        if last and self.presence is not None and not await self.presence.release(user_id):
            self.presence_failures += 1

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        loops = [self._every(self.heartbeat_s / 2, self._beat), self._every(self.sweep_s, self._sweep)]
        if self.presence is not None:
            loops.append(self._every(self.presence_refresh_s, self._refresh))
        self._tasks = [asyncio.create_task(loop) for loop in loops]

    async def stop(self) -> None:
        self.hub.close_all()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

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
