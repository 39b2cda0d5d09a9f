"""Frames, member notices and dead letters to their Kafka topics: the worker core's `Outbox` port."""

from __future__ import annotations

from collections.abc import Sequence

from app.kafka.batches import BatchSender
from app.settings import TopicSettings


class KafkaOutbox:
    """Frames and dead letters to their topics (raw bytes, keyed by user id), in batches."""

    def __init__(self, sender: BatchSender, topics: TopicSettings) -> None:
        self.sender = sender
        self.topics = topics

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        keyed = [(key or b"", value) for key, value in letters]
        await self.sender.send_keyed(self.topics.topic_dead_letter, keyed)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        # Same key, same partition: each user's frames stay in version order on each topic.
        await self.sender.send_keyed(self.topics.topic_session_delta, session_deltas)
        await self.sender.send_keyed(self.topics.topic_badge, badges)

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        # The session-delta topic, keyed by user: the gateway reads one topic per user stream
        # and a notice keeps its place among the user's SESSION_DELTA frames.
        await self.sender.send_keyed(self.topics.topic_session_delta, notices)
