"""The processing counts (app/domain/processor.py re-exports them).

A module of its own because it stays interpreted in the compiled build (setup.py): the worker's
WorkerStats extends ProcessingStats as a slotted dataclass, which a mypyc native class does not
allow (the subclass's slots would shadow the native attributes). Updated once per batch, so its
speed does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ProcessingStats:
    """Counts of what went through processors. One instance may be shared by all of a driver's
    processors (the worker's partitions come and go; its totals must not)."""

    records: int = 0  # every record read (markers included)
    entries: int = 0  # every record but valid markers (dead letters included)
    markers: int = 0
    applied: int = 0
    applied_messages: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    fast_flushes: int = 0  # user batches the fast lane flushed (docs/contract.md §10)
