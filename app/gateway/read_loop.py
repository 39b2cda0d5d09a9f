"""The stop of a gateway consumer's read loop (the live-stream frames, the push producer)."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer


async def stop_read_loop(task: asyncio.Task[None] | None, consumer: AIOKafkaConsumer | None) -> None:
    """Cancel the task reading `consumer` and wait for it to end, then stop the consumer: in that
    order, so the task never fetches from a stopped consumer. None: never started (a no-op)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if consumer is not None:
        await consumer.stop()
