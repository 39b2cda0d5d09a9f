"""A rebuild's progress: one line on the terminal (or a line every few seconds) and the gauges."""

from __future__ import annotations

import sys
import time
from typing import IO

from app.metrics import RebuildMetrics


class Progress:
    """One line, rewritten in place on a terminal (else a line every few seconds): users done,
    rows, rate, ETA. Also the process's rebuild gauges (app/metrics/rebuild.py)."""

    def __init__(
        self,
        total: int,
        out: IO[str] | None = None,
        mode: str = "auto",
        unit: str = "users",
        metrics: RebuildMetrics | None = None,
    ) -> None:
        self.total = total
        self.unit = unit
        self.detail = ""  # extra text for the line (the replay's partitions done)
        self.out = out if out is not None else sys.stderr
        tty = self.out.isatty() if hasattr(self.out, "isatty") else False
        self.enabled = mode == "always" or (mode == "auto" and tty)
        self.tty = tty
        self.started = time.monotonic()
        self.printed_at = 0.0
        # Given: the ones a /metrics endpoint of the rebuild serves (`--metrics-port`); each
        # phase of a rebuild (a replay from a timestamp, then the users it did not name) is a
        # Progress of its own on the same gauges.
        self.metrics = metrics if metrics is not None else RebuildMetrics()
        self.metrics.update(0, total)

    def line(self, done: int, rows: int) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else 0.0
        share = done / self.total * 100 if self.total else 100.0
        return (
            f"rebuild: {done}/{self.total} {self.unit} ({share:.0f}%), {rows} rows{self.detail}, "
            f"{rate:.0f} {self.unit}/s, ETA {eta:.0f}s"
        )

    def update(self, done: int, rows: int, final: bool = False) -> None:
        self.metrics.update(done, self.total)
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self.printed_at < (0.2 if self.tty else 5.0):
            return
        self.printed_at = now
        end = "\n" if final or not self.tty else ""
        prefix = "\r" if self.tty else ""
        print(prefix + self.line(done, rows), end=end, file=self.out, flush=True)
