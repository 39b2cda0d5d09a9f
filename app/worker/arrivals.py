"""The arrival reconciliation's log (docs/contract.md §9): one line when a lane of an owned
partition starts (or changes) missing entries, one when nothing is missing any more."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.worker.core import WorkerCore

log = logging.getLogger("projector.arrivals")


class MissingLog:
    def __init__(self) -> None:
        self.reported: dict[tuple[int, int], int] = {}

    def check(self, core: WorkerCore) -> None:
        """Compare every owned partition's lanes with what was last logged (the flush timer)."""
        seen: set[tuple[int, int]] = set()
        for partition, state in list(core.partitions.items()):
            ledger = state.processor.arrivals
            for lane in range(ledger.lanes):
                key = (partition, lane)
                seen.add(key)
                missing = ledger.missing(lane)
                before = self.reported.get(key, 0)
                if missing == before:
                    continue
                self.reported[key] = missing
                if missing:
                    log.warning(
                        "partition %d, lane %d: %d entries missing: the lane's marker at watermark %d "
                        "counts %d sent here, this partition received %d of them (nothing is held "
                        "back; see projector_entries_missing)",
                        partition,
                        lane,
                        missing,
                        ledger.covered[lane],
                        (ledger.expected[lane] or 0) - ledger.base[lane],
                        ledger.counted[lane],
                    )
                else:
                    log.info("partition %d, lane %d: no entry missing any more", partition, lane)
        for key in set(self.reported) - seen:  # revoked: its new owner reports it
            del self.reported[key]
