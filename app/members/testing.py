"""Fakes for the member directory's tests: a virtual clock and an in-memory member server.

They live in the package (not under tests/) so every test layer, and the host's own tests,
can drive a :class:`~app.members.directory.MemberDirectory` without a network.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.members.model import (
    BY_IDS_MAX,
    NOT_A_MEMBER,
    BaseMember,
    MemberPage,
    PresentationResult,
    PresentedMember,
    Profile,
    capabilities,
    join_events,
)
from app.members.source import MemberAccessDenied, MemberRequestError, MemberUnavailable


class FakeClock:
    """Virtual time: ``sleep`` parks until :meth:`advance` moves time past its deadline."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self._now_s = start_ms / 1000
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        return round(self._now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._now_s + seconds, next(self._order), future))
        await future

    async def settle(self, rounds: int = 50) -> None:
        """Let every runnable task run (the loop is real; only time is virtual)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking each sleeper at its own deadline, in order."""
        target = self._now_s + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._timers)
            self._now_s = max(self._now_s, deadline)
            if not future.done():
                future.set_result(None)
            await self.settle()
        self._now_s = target
        await self.settle()


@dataclass
class FakeMemberServer:
    """The member read contract in memory, with a per-request latency on a :class:`FakeClock`.

    ``caller`` is the account asking; it must be an active member (else 2001).
    """

    clock: FakeClock
    caller: int
    members: dict[int, BaseMember] = field(default_factory=dict)
    record_counts: dict[int, int] = field(default_factory=dict)
    mention_counts: dict[int, int] = field(default_factory=dict)
    latency_s: float = 2.0
    stats_latency_s: float = 0.0  # > 2.0 makes statistics late (dropped)
    remarks: dict[int, str] = field(default_factory=dict)  # the caller's own remarks
    remarks_fail: bool = False  # the server could not read them: answered without remarks
    fail_next: list[Exception] = field(default_factory=list)
    disabled: bool = False
    page_calls: list[tuple[int | None, int]] = field(default_factory=list)
    by_ids_calls: list[tuple[tuple[int, ...], bool]] = field(default_factory=list)
    in_flight_by_ids: int = 0
    max_in_flight_by_ids: int = 0

    def add(self, user_id: int, role: str = "member", state: str = "active") -> None:
        self.members[user_id] = BaseMember(user_id, role, state, 1, None if state == "active" else 9)

    def _check_access(self) -> str:
        if self.fail_next:
            raise self.fail_next.pop(0)
        if self.disabled:
            raise MemberAccessDenied(2002, "conversation disabled")
        me = self.members.get(self.caller)
        if me is None or me.state != "active":
            raise MemberAccessDenied(NOT_A_MEMBER, "not a member")
        return me.role

    async def page(self, group: str, page_ref: str | None, limit: int, active_only: bool) -> MemberPage:
        # This fake's references are the position's decimal text (opaque to the store, which
        # only hands them back; the real server signs and binds them: app/api/member_refs.py).
        after_user_id = None if page_ref is None else int(page_ref)
        self.page_calls.append((after_user_id, limit))
        await self.clock.sleep(self.latency_s)
        if limit > 100:
            raise MemberRequestError(400, None, "limit above 100")
        role = self._check_access()
        ids = sorted(u for u in self.members if after_user_id is None or u > after_user_id)
        rows = [self.members[u] for u in ids if not active_only or self.members[u].state == "active"]
        chunk = rows[: limit + 1]
        has_more = len(chunk) > limit
        chunk = chunk[:limit]
        return MemberPage(
            items=tuple(chunk),
            has_more=has_more,
            next_ref=str(chunk[-1].user_id) if has_more else None,
            self_role=role,
            capabilities=capabilities(role, {}),
            join_events=tuple(join_events(chunk)),
        )

    async def by_user_ids(
        self, group: str, user_ids: Sequence[int], include_stats: bool
    ) -> PresentationResult:
        ids = tuple(user_ids)
        self.by_ids_calls.append((ids, include_stats))
        self.in_flight_by_ids += 1
        self.max_in_flight_by_ids = max(self.max_in_flight_by_ids, self.in_flight_by_ids)
        try:
            await self.clock.sleep(self.latency_s)
            if not 1 <= len(ids) <= BY_IDS_MAX:
                raise MemberRequestError(400, None, "1..50 user ids")
            self._check_access()
            stats = include_stats and self.stats_latency_s <= 2.0
            items = []
            for user_id in ids:
                base = self.members.get(user_id)
                if base is None:
                    continue
                items.append(
                    PresentedMember(
                        base=base,
                        record_count=self.record_counts.get(user_id, 0) if stats else None,
                        mention_count=self.mention_counts.get(user_id, 0) if stats else None,
                        remark=None if self.remarks_fail else self.remarks.get(user_id),
                    )
                )
            return PresentationResult(
                items=tuple(items),
                missing_user_ids=tuple(u for u in ids if u not in self.members),
                stats_included=stats,
                remarks_included=not self.remarks_fail,
            )
        finally:
            self.in_flight_by_ids -= 1


@dataclass
class FakeProfiles:
    clock: FakeClock
    profiles_by_id: dict[int, Profile] = field(default_factory=dict)
    latency_s: float = 2.0
    fail: Exception | None = None

    async def profiles(self, user_ids: Sequence[int]) -> dict[int, Profile]:
        await self.clock.sleep(self.latency_s)
        if self.fail is not None:
            raise self.fail
        return {u: self.profiles_by_id[u] for u in user_ids if u in self.profiles_by_id}


__all__ = ["FakeClock", "FakeMemberServer", "FakeProfiles", "MemberUnavailable"]
