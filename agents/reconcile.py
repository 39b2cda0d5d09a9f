"""Topic reconcile-request's fetches into the worker's `ReconcileRunner`; read from the group's
committed offset, nothing checkpointed (docs/decisions/0016-reconcile-on-request-in-the-owner.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import faust

from agents.batch_intake import ProjectorApp, RecordBatch, commit_offsets
from app.worker.reconcile import ReconcileRunner

log = logging.getLogger("projector.reconcile")


class ReconcileIntake:
    """The BatchSink of topic reconcile-request."""

    def __init__(self, app: faust.App, runner: ReconcileRunner, topic: str) -> None:
        self.app = app
        self.runner = runner
        self.topic = topic
        self.committed: dict[int, int] = {}
        self.stale_batches = 0

    async def deliver(self, batch: RecordBatch) -> None:
        if batch.generation != self.app.consumer_generation_id:
            self.stale_batches += 1  # fetched under an older assignment: read again after its seek
            return
        self.runner.offer(batch.records)

    def fetched(self, partition: int, fetch_to: int) -> None:
        """Nothing to check: a request never delivered is read again from the committed offset."""

    def placements(self, partitions: Iterable[int]) -> dict[int, int | None]:
        return {}  # the group's committed offset (else the log start): faust's own seek

    def placed(self, offsets: Mapping[int, int]) -> None:
        pass

    async def commit(self) -> None:
        """Commit the offsets of the requests handled (the worker's commit timer)."""
        due = self.runner.commit_due(self.committed)
        if not due:
            return
        try:
            if await commit_offsets(self.app, due, self.topic):
                self.committed.update(due)
        except Exception as exc:  # a failed commit only means handling a few requests again
            log.warning("reconcile-request offset commit failed: %s", exc)


def register_reconcile(app: ProjectorApp, topic: Any, intake: ReconcileIntake) -> None:
    app.route_batches(topic, intake)
