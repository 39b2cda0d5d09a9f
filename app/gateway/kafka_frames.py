"""The Kafka adapter of the gateway: the frame topics (session-delta, badge) into the hub.

One consumer per process, without a consumer group: it assigns itself the partitions this
instance serves (all of them, or ``gateway_partitions``) of BOTH topics, starts at their end
(a stream begins with the store's version, see hub.py, so nothing older is needed) and reads
on. Frames are keyed by the user id (decimal): a record of a user with no stream and no resume
log here is skipped on its key alone, without decoding the value, which is what lets every
instance read whole partitions cheaply.

The partition of a user is Kafka's default partitioner on that key (murmur2, as the worker's
producer uses), so ``partition_of`` tells the API whether this instance serves a user. Both
frame topics must have the same partition count (bootstrap creates them so): a user's deltas
and badges are then on the same partition number of each.

aiokafka lives here and in push.py only; app/api never imports it (import-linter contract).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from app.connections import kafka_client_options, kafka_security_options, quiet_logger
from app.gateway.hub import FrameHub
from app.gateway.read_loop import stop_read_loop
from app.kafka.refusal import kafka_unreachable
from app.settings import KafkaSettings, TopicSettings

log = logging.getLogger("projector.gateway.kafka")


class GatewayStartError(RuntimeError):
    """The gateway cannot start (a topic is missing, partitions disagree): one clear line."""


@dataclass(slots=True)
class SourceStats:
    records: int = 0  # records read from the frame topics
    skipped: int = 0  # of users with no stream or resume log here (key only, value not decoded)
    bad_keys: int = 0
    undecodable: int = 0
    fetch_errors: int = 0


def partition_of(user_id: int, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key bytes) for a record keyed by ``user_id``."""
    hashed: int = murmur2(str(user_id).encode())
    return (hashed & 0x7FFFFFFF) % partitions


async def topic_partitions(kafka: KafkaSettings, topics: Sequence[str]) -> dict[str, int]:
    """Partition counts of existing topics (the admin client's metadata)."""
    admin = AIOKafkaAdminClient(**kafka_client_options(kafka))
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described}


def _user_of(key: bytes | None) -> int | None:
    if key is None or not key.isdigit() or len(key) > 20:
        return None
    return int(key)


class KafkaFrameSource:
    def __init__(
        self, kafka: KafkaSettings, topics: TopicSettings, hub: FrameHub, partitions: frozenset[int] | None
    ) -> None:
        self.kafka = kafka
        self.app_id = topics.app_id  # names the consumer's client
        self.hub = hub
        self.wanted = partitions
        self.topics = (topics.topic_session_delta, topics.topic_badge)
        self.partitions = 0  # of each frame topic, known after start()
        self.stats = SourceStats()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    def partition_of(self, user_id: int) -> int:
        return partition_of(user_id, self.partitions)

    def alive(self) -> bool:
        """The read loop runs (it survives fetch errors; only a bug would end it)."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            **kafka_client_options(self.kafka),  # servers, SASL/TLS (app/connections.py)
            group_id=None,
            enable_auto_commit=False,
            client_id=f"{self.app_id}-gateway",
            fetch_max_wait_ms=100,  # an idle partition answers within 100 ms: low latency
        )
        try:
            with quiet_logger("aiokafka"):  # its line per failed connect: the error says it once
                await consumer.start()
        except (KafkaError, OSError) as exc:
            await consumer.stop()  # else asyncio reports an unclosed consumer at exit
            reason = await kafka_unreachable(
                self.kafka.kafka_bootstrap, kafka_security_options(self.kafka), exc
            )
            raise GatewayStartError(f"the live stream: {reason}") from None
        try:
            self.partitions = await self._partition_count(consumer)
            chosen = range(self.partitions) if self.wanted is None else sorted(self.wanted)
            tps = [TopicPartition(topic, p) for topic in self.topics for p in chosen]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the lazy seek now: a stream opened after start() sees every frame
                await consumer.position(tp)
            if self.hub.recent is not None:
                self.hub.recent.start()
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(consumer))
        log.info(
            "gateway reads partitions %s of %s",
            "all" if self.wanted is None else sorted(self.wanted),
            ", ".join(self.topics),
        )

    async def _partition_count(self, consumer: AIOKafkaConsumer) -> int:
        known = await consumer.topics()
        missing = [t for t in self.topics if t not in known]
        if missing:
            raise GatewayStartError(
                f"frame topic(s) {missing} not found on {self.kafka.kafka_bootstrap}: run "
                "`projector bootstrap` (or set PROJECTOR_GATEWAY_ENABLED=false)"
            )
        counts = await topic_partitions(self.kafka, self.topics)
        if len(set(counts.values())) != 1:
            raise GatewayStartError(
                f"the frame topics must have the same partition count (a user's frames share a "
                f"partition number), got {counts}"
            )
        count = counts[self.topics[0]]
        if self.wanted is not None and max(self.wanted) >= count:
            raise GatewayStartError(
                f"PROJECTOR_GATEWAY_PARTITIONS names partition {max(self.wanted)}, the frame "
                f"topics have {count}"
            )
        return count

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=1000, max_records=20_000)
            except KafkaError as exc:  # the broker blinked: keep the position, try again
                self.stats.fetch_errors += 1
                log.warning("frame topics: fetch failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            for records in batch.values():
                for record in records:
                    try:
                        self._one(record)
                    except Exception:  # one record must never stop every stream of the process
                        self.stats.undecodable += 1
                        log.exception("frame at %s:%d dropped", record.topic, record.offset)

    def _one(self, record: Any) -> None:
        self.stats.records += 1
        user_id = _user_of(record.key)
        if user_id is None:
            self.stats.bad_keys += 1
            return
        if not self.hub.wants(user_id):
            self.stats.skipped += 1
            if record.value is not None:
                self.hub.hold(user_id, record.value)
            return
        try:
            frame = orjson.loads(record.value) if record.value is not None else None
        except orjson.JSONDecodeError:
            frame = None
        if not isinstance(frame, dict):
            self.stats.undecodable += 1
            return
        self.hub.publish(frame, expected_user=user_id)

    async def stop(self) -> None:
        await stop_read_loop(self._task, self._consumer)
        self._task = self._consumer = None
