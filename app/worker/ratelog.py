"""Log lines capped per second, the rest summed up ("N more ... suppressed"); only the lines are
capped, the caller still counts and sends every record (docs/decisions/0011-dead-letter-log-rate-limit.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        per_second: int,
        what: str,
        *,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.per_second = per_second
        self.what = what  # "dead letters": names the suppressed lines in the summary
        self.level = level
        self.clock = clock
        self._interval_start = -1.0
        self._logged = 0  # lines in the current interval
        self.suppressed = 0  # since the last summary line
        self.suppressed_total = 0

    def log(self, msg: str, *args: object) -> bool:
        """Log the line if the cap allows (True), else count it as suppressed."""
        now = self.clock()
        if now - self._interval_start >= 1.0:
            self._interval_start = now
            self._logged = 0
            self.flush_summary()
        if self._logged >= self.per_second:
            self.suppressed += 1
            self.suppressed_total += 1
            return False
        self._logged += 1
        self.logger.log(self.level, msg, *args)
        return True

    def tick(self) -> None:
        """From a timer: the summary of an interval that ended, without waiting for a next line."""
        if self.suppressed and self.clock() - self._interval_start >= 1.0:
            self.flush_summary()

    def flush_summary(self) -> None:
        """The "N more suppressed" line for what the last interval(s) did not log."""
        if self.suppressed:
            self.logger.log(
                self.level,
                "%d more %s suppressed (at most %d lines/s; every one is counted in the metrics)",
                self.suppressed,
                self.what,
                self.per_second,
            )
            self.suppressed = 0
