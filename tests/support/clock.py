"""A clock the test sets by hand (milliseconds), for code that takes an injected clock."""

from __future__ import annotations


class ManualClock:
    """Callable like the production clocks (`() -> now in ms`); tests move `now` themselves."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now
