"""The mailbox-tail agent: batches of raw records in, the worker core does the rest.

No business branching here: decode, gating, state and flushing live in `app.worker.core` and
the pure core under it.
"""

from __future__ import annotations

from typing import Any

import faust

from app.worker.core import WorkerCore
from app.worker.ports import RawRecord
from tables.state import FaustStateTables

# Batches amortize per-event costs: one table write per touched row per batch, not per entry.
BATCH_MAX = 4096
BATCH_WITHIN_S = 0.05


def register_agent(
    app: faust.App, topic: Any, core_ref: dict[str, WorkerCore], tables: FaustStateTables
) -> Any:
    @app.agent(topic, name="project-mailbox")
    async def project(stream: Any) -> None:
        # (partition, offset, key, raw value) per event → one WorkerCore batch
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
            records = []
            for event in events:
                message = event.message
                tables.remember(stream, event)
                records.append(
                    RawRecord(message.topic, message.partition, message.offset, message.key, message.value)
                )
            await core_ref["core"].on_records(records)

    return project
