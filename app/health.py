"""Readiness made of named checks: cheap, cached, each within a time budget, never blocking.

A check is an async callable that returns when its dependency answers and raises otherwise
(:class:`NotReady` with a short reason for a known state: ``missing``, ``rebalancing``...). The
checks run concurrently, each under ``budget_s`` (a check that runs longer counts as ``timeout``;
anything blocking runs in a thread inside the check). Results are kept ``max_age_s``: a probe
storm (several orchestrators, a load balancer) costs one round per ``max_age_s``, and concurrent
callers share the round in flight.

A check's change of outcome is logged once (not at every probe): a warning when it fails, info
when it answers again.

No client library here: the checks come from their adapters (app/kafka/health.py for Kafka,
the worker's runtime for the rest).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

log = logging.getLogger("projector.health")

OK: Final = "ok"
TIMEOUT: Final = "timeout"
UNAVAILABLE: Final = "unavailable"

Check = Callable[[], Awaitable[object]]


class NotReady(Exception):
    """A check's dependency is in a known not-ready state; `reason` is what /readyz shows."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class Readiness:
    def __init__(
        self,
        checks: Mapping[str, Check],
        *,
        budget_s: float = 2.0,
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.checks = dict(checks)
        self.budget_s = budget_s
        self.max_age_s = max_age_s
        self.clock = clock
        self._results: dict[str, str] = {}
        self._at = float("-inf")
        self._round: asyncio.Task[dict[str, str]] | None = None
        self._last: dict[str, str] = {}

    async def results(self) -> dict[str, str]:
        """Each check's outcome (``ok``, ``timeout``, ``unavailable`` or a NotReady reason)."""
        if self.clock() - self._at < self.max_age_s:
            return self._results
        if self._round is None or self._round.done():
            self._round = asyncio.get_running_loop().create_task(self._run_all())
        # Shielded: a caller that gives up (its HTTP client went away) does not cancel the round
        # the others wait for.
        return await asyncio.shield(self._round)

    async def ready(self) -> tuple[bool, dict[str, str]]:
        results = await self.results()
        return all(outcome == OK for outcome in results.values()), results

    async def _run_all(self) -> dict[str, str]:
        names = list(self.checks)
        outcomes = await asyncio.gather(*(self._run(name) for name in names))
        results = dict(zip(names, outcomes, strict=True))
        self._results, self._at = results, self.clock()
        return results

    async def _run(self, name: str) -> str:
        detail = ""
        try:
            await asyncio.wait_for(self.checks[name](), timeout=self.budget_s)
            outcome = OK
        except TimeoutError:
            outcome, detail = TIMEOUT, f"no answer within {self.budget_s:g} s"
        except NotReady as exc:
            outcome, detail = exc.reason, str(exc)
        except Exception as exc:  # any failure of a dependency is "not ready", never an error
            outcome, detail = UNAVAILABLE, f"{type(exc).__name__}: {exc}"
        self._note(name, outcome, detail)
        return outcome

    def _note(self, name: str, outcome: str, detail: str) -> None:
        before = self._last.get(name)
        self._last[name] = outcome
        if outcome == before:
            return
        if outcome == OK:
            if before is not None:
                log.info("readiness: %s answers again", name)
        else:
            log.warning("readiness: %s is %s (%s)", name, outcome, detail)


async def in_thread(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking call (a database driver's) off the event loop; the check's budget bounds the
    wait, the driver's own timeout (pass one) bounds the thread."""
    return await asyncio.to_thread(call, *args, **kwargs)
