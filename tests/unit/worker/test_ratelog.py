"""Dead-letter log lines capped per second (app/worker/ratelog.py): a burst logs a few lines a
second and one "N more suppressed" line per interval; every dead letter is still counted and
sent (the core's counts and outbox), only the lines are capped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.domain.projector import ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from app.worker.ports import RawRecord
from app.worker.ratelog import RateLimitedLog
from tests.support.clock import ManualClock
from tests.support.worker import RecordingOutbox


class SecondsClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_logs_the_cap_per_second_and_sums_up_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    clock = SecondsClock()
    limited = RateLimitedLog(logging.getLogger("t.ratelog"), 3, "dead letters", clock=clock)
    with caplog.at_level(logging.WARNING, logger="t.ratelog"):
        logged = [limited.log("letter %d", i) for i in range(10)]
        assert logged == [True] * 3 + [False] * 7
        clock.now += 0.5
        assert not limited.log("letter %d", 10)  # same interval
        limited.tick()  # the interval has not ended: no summary yet
        clock.now += 0.6
        assert limited.log("letter %d", 11)  # a new interval: the summary first, then the line
        clock.now += 5
        for i in range(5):
            limited.log("letter %d", 12 + i)
        clock.now += 1.5
        limited.tick()  # the burst ended: its count is not held back until the next line
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "letter 0",
        "letter 1",
        "letter 2",
        "8 more dead letters suppressed (at most 3 lines/s; every one is counted in the metrics)",
        "letter 11",
        "letter 12",
        "letter 13",
        "letter 14",
        "2 more dead letters suppressed (at most 3 lines/s; every one is counted in the metrics)",
    ]
    assert limited.suppressed_total == 10 and limited.suppressed == 0


def test_the_core_counts_and_sends_every_dead_letter_and_logs_a_few(caplog: pytest.LogCaptureFixture) -> None:
    config = WorkerConfig(
        lanes=1,
        projector=ProjectorConfig(
            window_ms=100, max_dirty_rows=1000, include_muted=False, unread_precise_limit=200
        ),
        dead_letter_log_per_s=2,
    )
    outbox = RecordingOutbox()
    core = WorkerCore(
        config,
        message_store=InMemoryMessageStore(),
        projection_store=InMemoryProjectionStore(),
        tables=MemoryTables(),
        outbox=outbox,
        clock=ManualClock(),
    )
    bad = [RawRecord("mailbox-tail", 0, offset, b"k", b"{not json") for offset in range(50)]
    with caplog.at_level(logging.WARNING, logger="projector.worker"):
        asyncio.run(core.on_records(bad))
    assert len(outbox.letters) == 50
    assert sum(core.stats.dead_letter_kinds.values()) == 50
    dead_lines = [r for r in caplog.records if r.getMessage().startswith("dead letter ")]
    assert len(dead_lines) == 2
    assert core.dead_letter_log.suppressed == 48
