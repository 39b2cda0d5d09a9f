"""stop_read_loop: the reading task ends before its consumer is stopped."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from app.gateway.read_loop import stop_read_loop


class _Consumer:
    """Records what happened by the time `stop` was awaited."""

    def __init__(self) -> None:
        self.stopped = False
        self.task_done_at_stop: bool | None = None
        self.task: asyncio.Task[None] | None = None

    async def getone(self) -> None:
        if self.stopped:
            raise AssertionError("fetched from a stopped consumer")
        await asyncio.sleep(3600)

    async def stop(self) -> None:
        assert self.task is not None
        self.task_done_at_stop = self.task.done()
        self.stopped = True


async def test_the_task_is_cancelled_and_awaited_before_the_consumer_stops() -> None:
    consumer = _Consumer()

    async def read() -> None:
        while True:
            await consumer.getone()

    consumer.task = asyncio.create_task(read())
    await asyncio.sleep(0)  # the task is inside getone()
    await stop_read_loop(consumer.task, cast(Any, consumer))
    assert consumer.task.cancelled()
    assert consumer.stopped and consumer.task_done_at_stop is True


async def test_nothing_started_is_a_no_op() -> None:
    await stop_read_loop(None, None)


async def test_a_consumer_without_a_task_is_still_stopped() -> None:
    consumer = _Consumer()
    consumer.task = asyncio.create_task(asyncio.sleep(0))
    await consumer.task
    await stop_read_loop(None, cast(Any, consumer))
    assert consumer.stopped
