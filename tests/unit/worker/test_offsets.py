"""The worker applies the log without a hole: a batch that would skip offsets is taken only when a
read from the expected offset shows the same hole again (app/worker/offsets.py; issue 11's second
loss: an empty fetch whose positions straddled a seek moved a partition 7,571 offsets on)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.offsets import Verdict, first_hole
from app.worker.ports import RawRecord
from tests.support.clock import ManualClock
from tests.support.worker import RecordingOutbox, make_core


def test_first_hole_finds_the_first_offset_a_batch_would_skip() -> None:
    assert first_hole(10, [10, 11, 12], 13) is None
    assert first_hole(10, [], 10) is None
    assert first_hole(10, [], 50) == 10  # an empty fetch that moved the position
    assert first_hole(10, [12, 13], 14) == 10  # a hole before the first record
    assert first_hole(10, [10, 11, 13], 14) == 12  # a hole between two records
    assert first_hole(10, [10, 11], 40) == 12  # the position moved past the last record


def _batch(offsets: list[int]) -> list[RawRecord]:
    return [RawRecord("mailbox-tail", 0, offset, b"k", b"not json") for offset in offsets]


def test_a_hole_is_taken_only_when_a_read_from_the_expected_offset_shows_it_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = make_core(
        1, MemoryTables(), InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )

    async def run() -> None:
        core.start_at(0, 0)
        assert (await core.on_batch(0, _batch(list(range(10))), 0, 10)).verdict is Verdict.APPLY
        # An empty fetch that "moved" the position 40 offsets on (a seek racing the fetch):
        # refused; the state still expects offset 10.
        assert (await core.on_batch(0, [], 10, 50)).verdict is Verdict.GAP
        assert core.expected_offset(0) == 10
        # The read from 10 returns the records: nothing was skipped.
        assert (await core.on_batch(0, _batch(list(range(10, 20))), 10, 20)).verdict is Verdict.APPLY
        assert core.expected_offset(0) == 20
        # A real hole (offset 22 holds no record for a consumer): refused once, then taken when
        # the read from 20 shows it again.
        holey = _batch([20, 21, 23])
        assert (await core.on_batch(0, holey, 20, 24)).verdict is Verdict.GAP
        assert core.expected_offset(0) == 20
        with caplog.at_level(logging.WARNING, logger="projector.worker"):
            assert (await core.on_batch(0, holey, 20, 24)).verdict is Verdict.APPLY
        assert core.expected_offset(0) == 24
        # Taking it is said: on a log of plain producers a hole is never expected.
        taken = [r.getMessage() for r in caplog.records if "hold no record" in r.getMessage()]
        assert taken == [
            "partition 0: offsets from 22 on hold no record (read twice from 20): 1 skipped up to 24"
        ]
        # Contiguous batches never need a second read.
        assert (await core.on_batch(0, _batch([24, 25]), 24, 26)).verdict is Verdict.APPLY
        assert core.expected_offset(0) == 26
        assert core.stats.intake_gaps_refused == 2

    asyncio.run(run())
