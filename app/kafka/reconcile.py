"""The API's `ReconcileRequests` port (app/api/reconcile.py) on aiokafka: one producer, started on
first use (the API starts while Kafka is away), records keyed by the user on topic
reconcile-request with the default partitioner (murmur2 of the key, as mailbox-tail's producers):
the request lands in the partition of the user's entries, which the owning worker reads."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer

from app.connections import kafka_client_options
from app.domain.reconcile import ReconcileRequest, encode_request, request_key
from app.settings import KafkaSettings

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 10_000


class KafkaReconcileRequests:
    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic  # reconcile-request
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    **kafka_client_options(self.kafka),
                    acks="all",
                    linger_ms=2,
                    # A topic that is not there (not bootstrapped) fails a send in seconds (a POST
                    # answers 503 and gives the slot back) instead of aiokafka's 40 s.
                    request_timeout_ms=SEND_TIMEOUT_MS,
                    client_id="projector-api-reconcile",
                )
                try:
                    await producer.start()
                except Exception:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def send(self, request: ReconcileRequest) -> None:
        producer = await self._started()
        await producer.send_and_wait(self.topic, encode_request(request), key=request_key(request.user_id))

    async def aclose(self) -> None:
        if self._producer is not None:
            try:
                await self._producer.stop()
            except Exception as exc:  # closing is best effort
                log.debug("reconcile requests: closing the producer: %s", exc)
            self._producer = None
