"""Seeks faust's table recovery asks for: every one becomes a position aiokafka accepts (a
negative or missing offset stopped a worker in issue 18's 20-kill run)."""

from __future__ import annotations

import logging

import pytest
from aiokafka.consumer.consumer import AIOKafkaConsumer
from faust.types import TP

from agents.batch_intake import seekable_offsets

CHANGELOG = "app-rows-changelog"


def test_valid_offsets_are_kept_as_they_are() -> None:
    asked = {TP(CHANGELOG, 0): 0, TP(CHANGELOG, 1): 17, TP(CHANGELOG, 2): 2**40}
    assert seekable_offsets(asked) == asked


@pytest.mark.parametrize("offset", [-1, -2, -1001, None, 1.5, True])
def test_an_offset_aiokafka_refuses_reads_the_changelog_from_its_start(
    offset: object, caplog: pytest.LogCaptureFixture
) -> None:
    asked = {TP(CHANGELOG, 0): 5, TP(CHANGELOG, 1): offset}
    with caplog.at_level(logging.WARNING, logger="projector.worker"):
        seekable = seekable_offsets(asked)
    assert seekable == {TP(CHANGELOG, 0): 5, TP(CHANGELOG, 1): 0}
    assert [r.getMessage() for r in caplog.records] == [
        f"changelog {TP(CHANGELOG, 1)}: asked to seek to {offset!r}, read from its start instead"
    ]


def test_what_comes_out_is_what_aiokafka_seek_accepts() -> None:
    # aiokafka's own check, the one that raised: `seek` refuses before touching its fetcher.
    class Fetcher:
        def __init__(self) -> None:
            self.seeks: list[tuple[TP, int]] = []

        def seek_to(self, tp: TP, offset: int) -> None:
            self.seeks.append((tp, offset))

    consumer = AIOKafkaConsumer.__new__(AIOKafkaConsumer)
    consumer._fetcher = Fetcher()
    with pytest.raises(ValueError, match="positive integer"):
        consumer.seek(TP(CHANGELOG, 1), -2)
    for tp, offset in seekable_offsets({TP(CHANGELOG, 0): 3, TP(CHANGELOG, 1): -2}).items():
        consumer.seek(tp, offset)
    assert consumer._fetcher.seeks == [(TP(CHANGELOG, 0), 3), (TP(CHANGELOG, 1), 0)]
