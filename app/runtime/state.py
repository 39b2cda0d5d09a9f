"""The worker's state on Kafka: the checkpointed tables (tables/durable) over the app's state
changelog topic, and the live input they check their checkpoints against."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from app.connections import kafka_security_options
from app.settings import KafkaSettings, TopicSettings
from tables.durable.changelog import Appended, LoggedRecord
from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic, input_identity
from tables.durable.records import InputIdentity, WireRecord
from tables.durable.tables import CheckpointedTables

log = logging.getLogger("projector.worker")


class StartedChangelog:
    """The `Changelog` port over a `KafkaChangelog` made and started at its first use: aiokafka's
    clients are made inside the running event loop, which the worker's assembly is not."""

    def __init__(self, start: Callable[[], Awaitable[KafkaChangelog]]) -> None:
        self._start = start

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        return await (await self._start()).append(partition, records)

    async def read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        return await (await self._start()).read(partition, start, end)

    async def end_offset(self, partition: int) -> int:
        return await (await self._start()).end_offset(partition)

    async def start_offset(self, partition: int) -> int:
        return await (await self._start()).start_offset(partition)


class WorkerState:
    """Owns the changelog client; started on first use (the first assignment), stopped with
    the worker."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings, data_dir: str) -> None:
        self.bootstrap = kafka.kafka_bootstrap
        self.topics = topics
        self.security = kafka_security_options(kafka)
        self._changelog: KafkaChangelog | None = None
        folder = Path(data_dir) / topics.app_id / "state"
        self.tables = CheckpointedTables(
            folder, StartedChangelog(self.start), self.identity, self.input_start
        )

    async def start(self) -> KafkaChangelog:
        if self._changelog is not None:
            return self._changelog
        topics = self.topics
        await ensure_changelog_topic(
            self.bootstrap,
            topics.changelog_topic,
            topics.topic_partitions,
            topics.changelog_min_compaction_lag_ms,
            topics.topic_replication_factor,
            security=self.security,
        )
        changelog = KafkaChangelog(self.bootstrap, topics.changelog_topic, security=self.security)
        await changelog.start()
        self._changelog = changelog
        return changelog

    async def stop(self) -> None:
        changelog, self._changelog = self._changelog, None
        if changelog is not None:
            await changelog.stop()
        self.tables.close()

    async def identity(self) -> InputIdentity:
        """The live mailbox-tail: cluster id, topic id, partition count."""
        await self.start()
        return await input_identity(self.bootstrap, self.topics.topic_mailbox_tail, security=self.security)

    async def input_start(self, partition: int) -> int:
        """mailbox-tail's log start for the partition."""
        changelog = await self.start()
        return await changelog.topic_start_offset(self.topics.topic_mailbox_tail, partition)

    async def input_end(self, partition: int) -> int:
        """mailbox-tail's end offset for the partition."""
        changelog = await self.start()
        return await changelog.topic_end_offset(self.topics.topic_mailbox_tail, partition)
