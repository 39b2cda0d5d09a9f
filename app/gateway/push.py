"""Offline badge pushes (docs/contract.md §9, seed 000 §4: online -> BADGE_UPDATE, offline -> APNs/FCM badge).

Who produces them, and why exactly one party per user: the API processes (gateway instances)
form ONE consumer group (``{app_id}-push``) over the badge topic. Kafka gives each partition of
it to exactly one member at a time, and a user's BADGE_UPDATE frames all sit on one partition
(keyed by user), so each user's pushes come from one process, whichever instance the user's
device is connected to. Presence (app/gateway/presence.py) is shared through Redis, so that
process knows whether the user has a live stream anywhere.

What it sends, per tumbling window of ``push_window_ms``: for every user whose badge changed
in the window and who has no live stream at the window's end, ONE record on topic ``push``
(key = user id)::

    {"user_id": "<u64 as a decimal string>", "projection_mailbox_seq": V,
     "apns": {"aps": {"badge": total_unread}}, "fcm": {"notification_count": total_unread}}

with the newest badge of the window (coalesced: one push per user per window, not per message)
and its version V, so a delivery service drops a record whose version is not above the last
it delivered (a late or repeated one). Audit corrections (same version, docs/contract.md §4 notes) are
not pushed: the version rule would drop them anyway.

Delivery is at least once: the badge topic's offsets are committed after the window's records
are acknowledged; a crash or a rebalance re-reads the uncommitted frames and may send a record
again — with the same version, which the consumer drops. When Redis cannot say who is online,
everybody counts as offline: a redundant push sets the same badge; a missing one leaves a wrong
badge on the icon.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from app.connections import kafka_client_options
from app.domain.wire_ids import id_text
from app.gateway.kafka_frames import GatewayStartError
from app.gateway.read_loop import stop_read_loop
from app.settings import KafkaSettings, TopicSettings

log = logging.getLogger("projector.gateway.push")

OnlineCheck = Callable[[Sequence[int]], Awaitable[set[int] | None]]


def push_record(user_id: int, version: int, total_unread: int) -> dict[str, Any]:
    return {
        "user_id": id_text(user_id),
        "projection_mailbox_seq": version,
        "apns": {"aps": {"badge": total_unread}},
        "fcm": {"notification_count": total_unread},
    }


@dataclass(slots=True)
class _Held:
    version: int
    total_unread: int
    partition: int


@dataclass(slots=True)
class PushStats:
    frames: int = 0  # BADGE_UPDATE frames read
    malformed: int = 0
    windows: int = 0
    sent: int = 0  # push records produced
    skipped_online: int = 0  # badge changes of users with a live stream (delivered there)
    presence_unknown: int = 0  # windows where Redis could not say who was online
    produce_errors: int = 0


class PushCoalescer:
    """The newest badge per user within the current window (pure; the Kafka loop drives it)."""

    def __init__(self) -> None:
        self._held: dict[int, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, frame: Any, partition: int) -> bool:
        """Take a decoded badge frame; False when it is not a usable BADGE_UPDATE."""
        if not isinstance(frame, dict) or frame.get("type") != "BADGE_UPDATE":
            return False
        user_id, version, unread = (
            frame.get(k) for k in ("user_id", "projection_mailbox_seq", "total_unread")
        )
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (user_id, version, unread)
        ):
            return False
        if frame.get("correction") is True:
            return True  # valid, but restates a version: never pushed (see the module docstring)
        assert isinstance(user_id, int) and isinstance(version, int) and isinstance(unread, int)
        held = self._held.get(user_id)
        if held is None or held.version < version:
            self._held[user_id] = _Held(version, unread, partition)
        return True

    def users(self) -> list[int]:
        return list(self._held)

    def forget_partitions(self, partitions: Iterable[int]) -> None:
        """Another member owns these now: it re-reads them from the last commit."""
        gone = set(partitions)
        self._held = {u: h for u, h in self._held.items() if h.partition not in gone}

    def take(self, online: set[int]) -> tuple[list[tuple[bytes, bytes]], int]:
        """The window's push records (users not online) and how many were skipped as online;
        the window is emptied."""
        records = [
            (id_text(u).encode(), orjson.dumps(push_record(u, h.version, h.total_unread)))
            for u, h in sorted(self._held.items())
            if u not in online
        ]
        skipped = len(self._held) - len(records)
        self._held = {}
        return records, skipped


class _Rebalances(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, coalescer: PushCoalescer) -> None:
        self.coalescer = coalescer
        self.consumer: AIOKafkaConsumer | None = None

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self.coalescer.forget_partitions(tp.partition for tp in revoked)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        # A partition the group never committed starts at its end ("latest"). Commit that
        # position now, so a later owner (after a rebalance or a crash) goes on from here
        # instead of from a newer end, skipping what came in between.
        consumer = self.consumer
        if consumer is None:
            return
        fresh = {}
        for tp in assigned:
            if await consumer.committed(tp) is None:
                fresh[tp] = await consumer.position(tp)
        if fresh:
            await consumer.commit(fresh)


class PushProducer:
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        window_ms: int,
        online: OnlineCheck,
        *,
        window_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.topics = topics
        self.online = online
        self.window_s = window_ms / 1000 if window_s is None else window_s
        self.clock = clock
        self.group = f"{topics.app_id}-push"
        self.coalescer = PushCoalescer()
        self.stats = PushStats()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        kafka, topics = self.kafka, self.topics
        consumer = AIOKafkaConsumer(
            **kafka_client_options(kafka),  # servers, SASL/TLS (app/connections.py)
            group_id=self.group,
            client_id=f"{topics.app_id}-push",
            enable_auto_commit=False,
            # A new group starts at the end: badges from before this deployment are history.
            auto_offset_reset="latest",
            fetch_max_wait_ms=100,
        )
        producer = AIOKafkaProducer(
            **kafka_client_options(kafka), client_id=f"{topics.app_id}-push", linger_ms=5, acks="all"
        )
        try:
            await consumer.start()
            await producer.start()
            known = await consumer.topics()
            missing = [t for t in (topics.topic_badge, topics.topic_push) if t not in known]
            if missing:
                raise GatewayStartError(
                    f"topic(s) {missing} not found on {kafka.kafka_bootstrap}: run `projector bootstrap` "
                    "(or set PROJECTOR_PUSH_ENABLED=false)"
                )
            listener = _Rebalances(self.coalescer)
            listener.consumer = consumer
            consumer.subscribe([topics.topic_badge], listener=listener)
        except BaseException:
            await consumer.stop()
            await producer.stop()
            raise
        self._consumer, self._producer = consumer, producer
        self._task = asyncio.create_task(self._run(consumer, producer))

    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def assigned(self) -> set[int]:
        """The badge topic's partitions this process produces pushes for now."""
        consumer = self._consumer
        return set() if consumer is None else {tp.partition for tp in consumer.assignment()}

    async def _run(self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer) -> None:
        window_end = self.clock() + self.window_s
        read_since_commit = False
        while True:
            wait_ms = max(1, int((window_end - self.clock()) * 1000))
            try:
                batch = await consumer.getmany(timeout_ms=wait_ms, max_records=20_000)
            except KafkaError as exc:
                log.warning("push: badge topic fetch failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            for tp, records in batch.items():
                for record in records:
                    read_since_commit = True
                    try:
                        frame = orjson.loads(record.value) if record.value is not None else None
                    except orjson.JSONDecodeError:
                        frame = None
                    if self.coalescer.offer(frame, tp.partition):
                        self.stats.frames += 1
                    else:
                        self.stats.malformed += 1
            if self.clock() < window_end:
                continue
            window_end = self.clock() + self.window_s
            self.stats.windows += 1
            try:
                await self._emit(producer)
                if read_since_commit:
                    await consumer.commit()
                    read_since_commit = False
            except KafkaError as exc:
                # Nothing committed: the frames are read again (by us or the partition's next
                # owner) and their pushes sent then; a record already sent repeats its version.
                self.stats.produce_errors += 1
                log.warning("push: window not delivered (%s); it is re-read", exc)
                await consumer.seek_to_committed()
                self.coalescer.take(set())

    async def _emit(self, producer: AIOKafkaProducer) -> None:
        users = self.coalescer.users()
        if not users:
            return
        online = await self.online(users)
        if online is None:
            self.stats.presence_unknown += 1
            online = set()
        records, skipped = self.coalescer.take(online)
        self.stats.skipped_online += skipped
        sent = [await producer.send(self.topics.topic_push, value, key=key) for key, value in records]
        if sent:
            await asyncio.gather(*sent)
        self.stats.sent += len(sent)

    async def stop(self) -> None:
        await stop_read_loop(self._task, self._consumer)
        self._task = self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
