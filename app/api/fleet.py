"""What the API instances of a fleet share (issue 32): a port with the Redis adapter
(app/stores/redis_fleet.py) and an in-memory one for unit tests (shared by every app over the same
InMemoryProjectionStore, as instances over one Redis share theirs).

* :meth:`FleetState.take_token`: the per-user token bucket, one atomic step per request;
* :meth:`FleetState.claim_reconcile`: at most one reconcile per user per interval (docs/contract.md
  §10, "Reconcile on request"), one atomic step; :meth:`FleetState.release_reconcile` gives the
  slot back when the request could not be sent; the slot is per projection epoch
  (:meth:`FleetState.projection_epoch`, bumped by a retention overrun: app/domain/retention.py);
* :attr:`FleetState.snapshots`: the walks' frozen records (app/api/snapshots.py): ``publish``
  gives a new snapshot its revision (the user's counter, fleet-wide) and makes it the live one;
  ``record`` is what any instance reads to serve a cursor of a snapshot it does not hold.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from app.domain.retention import slot_reopened, slot_value
from app.stores.memory_projection import InMemoryProjectionStore

# Buckets kept at most by a RateLimiter (the least recently used beyond it are dropped: a dropped
# bucket is full again, which only ever errs towards letting a request through).
BUCKETS_MAX: Final = 100_000


class RateLimiter:
    """Token buckets per user: `rate` tokens a second up to `burst`; the clock (ms) is injected."""

    def __init__(self, rate: float, burst: int, clock_ms: Callable[[], int]) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock_ms = clock_ms
        self.buckets: OrderedDict[int, tuple[float, int]] = OrderedDict()  # user -> (tokens, at ms)
        self.limited = 0

    def take(self, user_id: int) -> float:
        """0 when the request may go; else the seconds until the user's next token."""
        now = self.clock_ms()
        tokens, at = self.buckets.pop(user_id, (self.burst, now))
        tokens = min(self.burst, tokens + max(0, now - at) * self.rate / 1000)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
            self.limited += 1
        self.buckets[user_id] = (tokens, now)
        if len(self.buckets) > BUCKETS_MAX:
            self.buckets.popitem(last=False)
        return wait


class SnapshotRecords(Protocol):
    async def publish(self, user_id: int, snapshot_id: int, header: str, record: bytes, ttl_ms: int) -> int:
        """Store `record` (kept `ttl_ms`), make `header` the user's live snapshot; the new revision."""
        ...

    async def record(self, user_id: int, snapshot_id: int) -> bytes | None:
        """The record of that snapshot, None when it is gone (expired, replaced twice)."""
        ...


class FleetState(Protocol):
    @property
    def snapshots(self) -> SnapshotRecords: ...

    async def take_token(self, user_id: int, burst: float, per_s: float, now_ms: int) -> int:
        """0: the request may go (a token was taken); else the ms until the user's next token."""
        ...

    async def claim_reconcile(
        self, user_id: int, token: str, interval_ms: int, now_ms: int, epoch: int = 0
    ) -> int:
        """0: the user's reconcile slot was free and is now `token`'s for `interval_ms`; -1: the
        same, the slot having been held since an earlier projection `epoch` (which frees it:
        app.domain.retention.slot_reopened); else the ms until it is free again (nothing changed)."""
        ...

    async def release_reconcile(self, user_id: int, token: str, epoch: int = 0) -> None:
        """Free the slot if `token` still holds it (its request was never sent)."""
        ...

    async def projection_epoch(self) -> int:
        """The projection epoch (app/stores/redis_epoch.py; 0 before any retention overrun)."""
        ...


class MemorySnapshots:
    """redis_fleet.RedisSnapshots in a dict: the live header per user, two records per user.
    Records do not expire here (each process's cache applies the TTL on its injected clock)."""

    def __init__(self) -> None:
        self._revisions: dict[int, int] = {}
        self._live: dict[int, str] = {}
        self._records: dict[int, list[tuple[int, bytes]]] = {}  # user -> [(id, record)], oldest first

    async def publish(self, user_id: int, snapshot_id: int, header: str, record: bytes, ttl_ms: int) -> int:
        revision = self._revisions.get(user_id, 0) + 1
        self._revisions[user_id] = revision
        records = [r for r in self._records.get(user_id, []) if r[0] != snapshot_id]
        self._records[user_id] = [*records[-1:], (snapshot_id, record)]
        self._live[user_id] = f"{revision}:{header}"
        return revision

    async def record(self, user_id: int, snapshot_id: int) -> bytes | None:
        return next((r for i, r in self._records.get(user_id, []) if i == snapshot_id), None)

    def live(self, user_id: int) -> str | None:
        return self._live.get(user_id)


class MemoryFleetState:
    """The same semantics in this process (unit tests: apps over one in-memory store)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[float, float], RateLimiter] = {}
        self._now = 0
        self.snapshots = MemorySnapshots()
        # user -> (slot value, free again at ms, epoch claimed in)
        self._reconcile: dict[int, tuple[str, int, int]] = {}
        self.epoch = 0  # the projection epoch (tests set it)

    async def claim_reconcile(
        self, user_id: int, token: str, interval_ms: int, now_ms: int, epoch: int = 0
    ) -> int:
        held = self._reconcile.get(user_id)
        claimed = (slot_value(epoch, token), now_ms + interval_ms, epoch)
        if held is not None and held[1] > now_ms:
            if not slot_reopened(held[2], epoch):
                return held[1] - now_ms
            self._reconcile[user_id] = claimed
            return -1
        self._reconcile[user_id] = claimed
        return 0

    async def release_reconcile(self, user_id: int, token: str, epoch: int = 0) -> None:
        held = self._reconcile.get(user_id)
        if held is not None and held[0] == slot_value(epoch, token):
            del self._reconcile[user_id]

    async def projection_epoch(self) -> int:
        return self.epoch

    async def take_token(self, user_id: int, burst: float, per_s: float, now_ms: int) -> int:
        limiter = self._buckets.get((burst, per_s))
        if limiter is None:
            limiter = self._buckets[(burst, per_s)] = RateLimiter(per_s, int(burst), lambda: self._now)
        self._now = now_ms
        wait_s = limiter.take(user_id)
        return 0 if wait_s <= 0 else max(1, -int(-wait_s * 1000 // 1))


_MEMORY: weakref.WeakKeyDictionary[InMemoryProjectionStore, MemoryFleetState] = weakref.WeakKeyDictionary()


def memory_fleet(store: InMemoryProjectionStore) -> MemoryFleetState:
    """The fleet state of every app over `store`."""
    fleet = _MEMORY.get(store)
    if fleet is None:
        fleet = _MEMORY[store] = MemoryFleetState()
    return fleet
