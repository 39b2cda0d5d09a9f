"""When to try a failing dependency again: exponential backoff over a failure streak, logged
once when it starts and once when it ends (docs/decisions/0012-store-outage-holds-flushes.md).
No I/O and no clock of its own: the caller passes the time."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Streak:
    """A failure streak that ended: how many attempts failed, over how long."""

    failures: int
    duration_ms: int
    last_error: str


@dataclass(slots=True)
class Backoff:
    """Delays 1x, 2x, 4x ... `first_delay_ms`, capped at `max_delay_ms`, each drawn from its upper
    half (a fleet of workers that lost the same server does not come back in lockstep)."""

    first_delay_ms: int = 250
    max_delay_ms: int = 30_000
    rng: random.Random = field(default_factory=random.Random, repr=False)
    failures: int = 0  # in the current streak
    since_ms: int | None = None  # first failure of the current streak
    retry_at_ms: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.first_delay_ms <= self.max_delay_ms:
            raise ValueError("backoff needs 0 < first_delay_ms <= max_delay_ms")

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def ready(self, now_ms: int) -> bool:
        """May the dependency be tried now?"""
        return not self.failures or now_ms >= self.retry_at_ms

    def delay_ms(self, failures: int) -> int:
        """The wait after the `failures`-th failure in a row (before jitter)."""
        return min(self.max_delay_ms, self.first_delay_ms << min(failures - 1, 30))

    def failed(self, now_ms: int, error: str) -> bool:
        """An attempt failed; True when it starts a streak (the one to log)."""
        self.failures += 1
        started = self.since_ms is None
        if started:
            self.since_ms = now_ms
        self.last_error = error
        full = self.delay_ms(self.failures)
        self.retry_at_ms = now_ms + full // 2 + int(self.rng.random() * (full - full // 2))
        return started

    def succeeded(self, now_ms: int) -> Streak | None:
        """An attempt succeeded: the streak it ends, if there was one."""
        if not self.failures:
            return None
        since = now_ms if self.since_ms is None else self.since_ms
        streak = Streak(self.failures, now_ms - since, self.last_error)
        self.failures = 0
        self.since_ms = None
        self.retry_at_ms = 0
        self.last_error = ""
        return streak
