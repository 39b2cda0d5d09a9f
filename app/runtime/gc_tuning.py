"""Cyclic garbage collection tuned for a streaming worker (issue 14, item 3), and its cost measured.

Why: the worker holds a large, long-lived state (hot rows, users, the faust/aiokafka/Cassandra
machinery) and allocates hundreds of thousands of short-lived objects per second. With Python's
default thresholds (700, 10, 10) the collector runs a young collection every 700 net allocations,
and every so often a full collection that walks the whole resident state: issue 14 measured 23%
of the worker's Python time there, with ~70 ms full collections. Almost all of that state is
freed by reference counting or lives for the process's lifetime; cycles are rare.

What it does:
* a larger first threshold (`PROJECTOR_WORKER_GC_THRESHOLD`, default 50,000): young collections
  ~70x rarer, each still cheap (the young generation stays small against the heap), so fewer
  objects are promoted on the way and the full collections that follow are rarer too;
* `gc.freeze()` after start-up and after each partition assignment (`PROJECTOR_WORKER_GC_FREEZE`):
  what exists then (modules, clients, the restored state) moves to the permanent generation,
  which no collection walks. A full collection first, so no garbage is frozen. Frozen objects
  are still freed by reference counting; only a cycle among them would stay (none is expected
  in that state, and the next assignment's collect never frees it: a bounded, one-off cost).

`GcMonitor` times every collection (gc.callbacks), so the effect is measured, not assumed: the
totals are logged at a clean stop (the bench reads that line) and on request.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import WorkerSettings

log = logging.getLogger("projector.worker")

# Older generations: a collection of generation 1 after this many of generation 0, and so on
# (Python's own ratios; the full collection is further gated by Python's 25%-of-long-lived rule).
OLDER_RATIO = 10


@dataclass(frozen=True, slots=True)
class GcPolicy:
    threshold: int  # 0: Python's own thresholds, untouched
    freeze: bool

    @classmethod
    def from_settings(cls, worker: WorkerSettings) -> GcPolicy:
        return cls(threshold=worker.worker_gc_threshold, freeze=worker.worker_gc_freeze)

    def apply(self) -> None:
        """At start-up: the thresholds, then a first freeze of what start-up allocated."""
        if self.threshold > 0:
            gc.set_threshold(self.threshold, OLDER_RATIO, OLDER_RATIO)
        self.settle("start-up")

    def settle(self, why: str) -> None:
        """After start-up or an assignment: collect what is garbage now, freeze the rest."""
        if not self.freeze:
            return
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        log.info(
            "gc: froze %d objects after %s (%.0f ms)",
            gc.get_freeze_count(),
            why,
            (time.perf_counter() - started) * 1000,
        )


@dataclass(slots=True)
class GcMonitor:
    """Times every collection through gc.callbacks (on the thread that triggered it)."""

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    paused_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_pause_s: float = 0.0
    pauses_over_2ms: int = 0
    _started: float = 0.0
    installed: bool = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            gc.callbacks.remove(self._callback)
            self.installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        elapsed = time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        self.collections[generation] += 1
        self.paused_s[generation] += elapsed
        if elapsed > self.max_pause_s:
            self.max_pause_s = elapsed
        if elapsed >= 0.002:
            self.pauses_over_2ms += 1

    def summary(self) -> dict[str, Any]:
        return {
            "collections": list(self.collections),
            "paused_ms": [round(s * 1000, 1) for s in self.paused_s],
            "paused_ms_total": round(sum(self.paused_s) * 1000, 1),
            "max_pause_ms": round(self.max_pause_s * 1000, 2),
            "pauses_over_2ms": self.pauses_over_2ms,
            "thresholds": list(gc.get_threshold()),
            "frozen": gc.get_freeze_count(),
        }

    def log_summary(self, why: str) -> None:
        s = self.summary()
        # One parseable line (bench/worker_bench.py reads it from the worker's log).
        log.info(
            "gc (%s): collections gen0/1/2 %d/%d/%d, paused %.1f ms (gen2 %.1f ms), max %.2f ms, "
            "%d pauses >= 2 ms, thresholds %s, frozen %d",
            why,
            *s["collections"],
            s["paused_ms_total"],
            s["paused_ms"][2],
            s["max_pause_ms"],
            s["pauses_over_2ms"],
            "/".join(map(str, s["thresholds"])),
            s["frozen"],
        )
