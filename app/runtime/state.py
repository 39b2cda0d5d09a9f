"""The worker's state on Kafka: the checkpointed tables (tables/durable) over the app's state
changelog topic, and the live input they check their checkpoints against."""

from __future__ import annotations

import logging
from pathlib import Path

from app.connections import kafka_security_options
from app.settings import Settings
from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic, input_identity
from tables.durable.records import InputIdentity
from tables.durable.tables import CheckpointedTables

log = logging.getLogger("projector.worker")


class WorkerState:
    """Owns the changelog client; started on first use (the first assignment), stopped with
    the worker."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.security = kafka_security_options(settings)
        self.changelog = KafkaChangelog(
            settings.kafka_bootstrap, settings.changelog_topic, security=self.security
        )
        folder = Path(settings.data_dir) / settings.app_id / "state"
        self.tables = CheckpointedTables(folder, self.changelog, self.identity, self.input_start)
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        settings = self.settings
        await ensure_changelog_topic(
            settings.kafka_bootstrap,
            settings.changelog_topic,
            settings.topic_partitions,
            settings.changelog_min_compaction_lag_ms,
            settings.topic_replication_factor,
            security=self.security,
        )
        await self.changelog.start()
        self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self.changelog.stop()
        self.tables.close()

    async def identity(self) -> InputIdentity:
        """The live mailbox-tail: cluster id, topic id, partition count."""
        await self.start()
        return await input_identity(
            self.settings.kafka_bootstrap, self.settings.topic_mailbox_tail, security=self.security
        )

    async def input_start(self, partition: int) -> int:
        """mailbox-tail's log start for the partition."""
        await self.start()
        return await self.changelog.topic_start_offset(self.settings.topic_mailbox_tail, partition)
