"""Follow the frame topics (session-delta, badge) for one user and apply them to a LiveSessionList.

Start-up order matters: the consumer is positioned at the end of every partition *before* the
list is pulled. The worker writes the projection store before it emits a flush's frames, so
every frame newer than the pulled snapshot is produced after that position and will be seen;
older ones are simply stale to the view.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from app.domain.client import FrameError
from app.sdk.live import LiveSessionList

log = logging.getLogger(__name__)


class SessionDeltaFollower:
    def __init__(
        self, live: LiveSessionList, bootstrap_servers: str, topics: Sequence[str], **security: Any
    ) -> None:
        """``security``: aiokafka's security options for a SASL/TLS cluster (security_protocol,
        sasl_*, ssl_context), e.g. ``app.connections.kafka_security_options(settings)``."""
        self.live = live
        self.topics = list(topics)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False, **security
        )
        self.applied = 0
        self.frames = 0  # this user's frames seen
        self.malformed = 0
        self.notices = 0  # MEMBER_NOTICE frames of this user (skipped here)

    async def __aenter__(self) -> SessionDeltaFollower:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self, timeout_s: float = 30.0) -> None:
        await self.consumer.start()
        try:
            known = await self.consumer.topics()
            missing = [t for t in self.topics if t not in known]
            if missing:
                raise RuntimeError(f"topics not found: {missing} (has `projector bootstrap` run?)")
            # Without a group, a subscription is assigned every partition of its topics.
            self.consumer.subscribe(self.topics)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while {tp.topic for tp in self.consumer.assignment()} != set(self.topics):
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"no partitions assigned for {self.topics} after {timeout_s}s")
                await asyncio.sleep(0.05)
            partitions = sorted(self.consumer.assignment())
            await self.consumer.seek_to_end(*partitions)
            for tp in partitions:  # resolve the lazy seek now, before the pull
                await self.consumer.position(tp)
            await self.live.sync()
        except BaseException:  # __aexit__ does not run when __aenter__ fails: stop here
            await self.consumer.stop()
            raise

    async def stop(self) -> None:
        await self.consumer.stop()

    async def poll(self, timeout_ms: int = 500) -> int:
        """Apply the frames that arrived (this user's only); returns how many applied."""
        batch = await self.consumer.getmany(timeout_ms=timeout_ms)
        applied = 0
        for records in batch.values():
            for record in records:
                if record.value is None:
                    continue
                try:
                    frame = orjson.loads(record.value)
                except orjson.JSONDecodeError:
                    frame = None
                if not isinstance(frame, dict):
                    self.malformed += 1
                    continue
                if frame.get("user_id") != self.live.user_id:
                    continue
                if frame.get("type") == "MEMBER_NOTICE":
                    # Shares the session-delta topic; not a list frame (LiveStream's on_notice
                    # is where devices get them).
                    self.notices += 1
                    continue
                self.frames += 1
                try:
                    result = await self.live.apply(frame)
                except FrameError as exc:  # a bad frame is dropped, never half-applied
                    log.warning("dropped a malformed frame at %s:%d: %s", record.topic, record.offset, exc)
                    self.malformed += 1
                    continue
                if result.applied:
                    applied += 1
        self.applied += applied
        return applied

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
