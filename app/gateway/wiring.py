"""Build the gateway of one API process from the settings (``projector api``; tests; the bench).

    async with open_gateway(settings, redis_client) as gateway:   # None when disabled
        deps.extra["stream"] = gateway

Starts, in order: the Kafka frame source (positioned at the end of the frame topics before any
stream can open), the push producer (its consumer group over the badge topic), the gateway's
housekeeping loops; stops them in reverse. A missing topic or an unreachable Kafka is a
:class:`GatewayStartError` with one clear line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any

from app.gateway.hub import FrameHub
from app.gateway.kafka_frames import KafkaFrameSource
from app.gateway.presence import RedisPresence
from app.gateway.push import PushProducer
from app.gateway.recent_frames import RECENT_SETTLE_S, RecentFrames
from app.gateway.service import Gateway
from app.settings import GatewaySettings, Settings


def instance_id() -> str:
    """Unique per process (presence claims are per instance)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def hub_from(gateway: GatewaySettings) -> FrameHub:
    return FrameHub(
        buffer_bytes=gateway.gateway_buffer_bytes,
        resume_frames=gateway.gateway_resume_frames,
        resume_bytes=gateway.gateway_resume_bytes,
        resume_window_s=gateway.gateway_resume_window_ms / 1000,
        resume_users=gateway.gateway_resume_users,
        max_connections=gateway.gateway_max_connections,
        recent=RecentFrames(capacity_bytes=gateway.gateway_recent_frames_bytes, settle_s=RECENT_SETTLE_S),
    )


@contextlib.asynccontextmanager
async def open_gateway(settings: Settings, redis_client: Any) -> AsyncIterator[Gateway | None]:
    config = settings.gateway
    if not config.gateway_enabled:
        yield None
        return
    partitions = config.partition_set
    hub = hub_from(config)
    instance = instance_id()
    presence = RedisPresence(
        redis_client, settings.redis.projection_namespace, instance, config.gateway_presence_ttl_ms
    )
    source = KafkaFrameSource(settings.kafka, settings.topics, hub, partitions)
    await source.start()
    push = None
    try:
        if config.push_enabled:
            push = PushProducer(settings.kafka, settings.topics, config.push_window_ms, presence.online)
            await push.start()
        gateway = Gateway(
            hub,
            heartbeat_s=config.gateway_heartbeat_ms / 1000,
            presence=presence,
            presence_refresh_s=config.gateway_presence_ttl_ms / 3000,
            partition_of=source.partition_of,
            partitions=partitions,
            instance=instance,
        )
        gateway.source_stats = source.stats
        gateway.push_stats = push.stats if push is not None else None
        gateway.push = push
        gateway.parts["frame topics"] = source.alive
        if push is not None:
            gateway.parts["push producer"] = push.alive
        gateway.start()
        try:
            yield gateway
        finally:
            await gateway.stop()
    finally:
        if push is not None:
            await push.stop()
        await source.stop()
