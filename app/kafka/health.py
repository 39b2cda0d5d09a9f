"""Does Kafka answer, and is a topic there? One metadata request answers both.

The worker's start (app/runtime/preflight.py) asks once, before faust starts: a worker whose
source topic does not exist would otherwise join its group, log "Ignoring missing topic" and
"Worker ready", and idle. Its readiness (GET /readyz) asks again while it runs, through the same
probe: one small client of its own (faust's consumer is busy in its own thread), metadata kept
`max_age_s` so the two checks of one round (kafka, source_topic) cost one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiokafka.client import AIOKafkaClient

from app.connections import kafka_client_options, kafka_security_options
from app.kafka.refusal import kafka_unreachable
from app.settings import KafkaSettings


class KafkaUnreachable(RuntimeError):
    """No broker of the bootstrap list answered (the message says where and what to check)."""


class KafkaProbe:
    def __init__(
        self,
        kafka: KafkaSettings,
        app_id: str,
        *,
        request_timeout_s: float = 5.0,
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.app_id = app_id  # names the probe's client
        self.request_timeout_s = request_timeout_s
        self.max_age_s = max_age_s
        self.clock = clock
        self._client: AIOKafkaClient | None = None
        self._metadata: Any = None
        self._at = float("-inf")
        self._fetch: asyncio.Task[Any] | None = None

    async def topic_partitions(self, topic: str) -> int | None:
        """How many partitions `topic` has (None: no such topic). Raises KafkaUnreachable."""
        metadata = await self.metadata()
        partitions = metadata.partitions_for_topic(topic)
        return len(partitions) if partitions else None

    async def metadata(self) -> Any:
        """The cluster's metadata (aiokafka's ClusterMetadata), at most `max_age_s` old."""
        if self._metadata is not None and self.clock() - self._at < self.max_age_s:
            return self._metadata
        if self._fetch is None or self._fetch.done():
            self._fetch = asyncio.get_running_loop().create_task(self._fetch_metadata())
        return await asyncio.shield(self._fetch)

    async def _fetch_metadata(self) -> Any:
        from aiokafka.errors import KafkaError

        bootstrap = self.kafka.kafka_bootstrap
        try:
            client = await self._connected()
            metadata = await client.fetch_all_metadata()
        except (KafkaError, OSError) as exc:
            await self._drop_client()
            raise KafkaUnreachable(
                await kafka_unreachable(bootstrap, kafka_security_options(self.kafka), exc)
            ) from None
        self._metadata, self._at = metadata, self.clock()
        return metadata

    async def _connected(self) -> AIOKafkaClient:
        if self._client is None:
            client = AIOKafkaClient(
                **kafka_client_options(self.kafka),
                client_id=f"{self.app_id}-health",
                request_timeout_ms=int(self.request_timeout_s * 1000),
            )
            self._client = client
            await client.bootstrap()
        return self._client

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a client that never connected: nothing to keep
                await client.close()

    async def close(self) -> None:
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()
        await self._drop_client()
