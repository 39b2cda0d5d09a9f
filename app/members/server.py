"""The member read contract on the server: access checks, keyset pages, presentation with a
statistics budget, read receipts. Storage comes in through :class:`MemberReader` (Cassandra in
production, :class:`InMemoryMemberReader` in unit tests); HTTP lives in app/api/members.py.

Access is checked on every call, concurrently with the data read (the data is discarded when
access fails): 2001 when the caller has no ``active`` row in ``group_members``, 2002 when the
conversation has a row in ``conversations_disabled``. Nothing else ever produces those codes,
because the client drops its caches on exactly them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.members.model import (
    CONVERSATION_DISABLED,
    NOT_A_MEMBER,
    PAGE_LIMIT_MAX,
    BaseMember,
)
from app.members.source import MemberAccessDenied

log = logging.getLogger("projector.members.server")

STATS_BUDGET_S = 2.0


class MemberReader(Protocol):
    async def membership(self, conversation_id: str, user_id: int) -> BaseMember | None: ...

    async def disabled(self, conversation_id: str) -> bool: ...

    async def page(
        self, conversation_id: str, after_user_id: int | None, count: int, active_only: bool
    ) -> list[BaseMember]:
        """Up to ``count`` rows with ``user_id > after_user_id``, ascending (one partition)."""
        ...

    async def by_user_ids(self, conversation_id: str, user_ids: Sequence[int]) -> list[BaseMember]: ...

    async def stats(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``{user_id: (record_count, mention_count)}``; absent = no counted message yet."""
        ...

    async def active_members(self, conversation_id: str) -> list[BaseMember]: ...

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]: ...

    async def message_sender(self, conversation_id: str, conversation_seq: int) -> int | None: ...


@dataclass(frozen=True, slots=True)
class PageResult:
    items: list[BaseMember]
    has_more: bool
    next_user_id: int | None
    self_role: str


@dataclass(frozen=True, slots=True)
class Presentation:
    items: list[BaseMember]
    missing_user_ids: list[int]
    stats: dict[int, tuple[int, int]] | None  # None: dropped (late or failed), not zero
    self_role: str


@dataclass(frozen=True, slots=True)
class Readers:
    conversation_seq: int
    sender_id: int | None
    read: list[BaseMember]
    unread: list[BaseMember]
    read_seqs: dict[int, int]
    self_role: str


class MemberService:
    def __init__(self, reader: MemberReader, *, stats_budget_s: float = STATS_BUDGET_S) -> None:
        self.reader = reader
        self.stats_budget_s = stats_budget_s

    async def _access(self, conversation_id: str, caller: int) -> str:
        me, disabled = await asyncio.gather(
            self.reader.membership(conversation_id, caller), self.reader.disabled(conversation_id)
        )
        if me is None or me.state != "active":
            raise MemberAccessDenied(NOT_A_MEMBER, "the caller is not an active member of this group")
        if disabled:
            raise MemberAccessDenied(CONVERSATION_DISABLED, "this conversation is disabled")
        return me.role

    async def _with_access(self, conversation_id: str, caller: int, work: Any) -> tuple[str, Any]:
        """Run the access check and ``work`` concurrently; the work's result is only returned
        (and its failure only raised) once access is granted."""
        access = asyncio.ensure_future(self._access(conversation_id, caller))
        task = asyncio.ensure_future(work)
        try:
            role = await access
        except BaseException:
            task.cancel()
            # Its own failure (if it failed first) is moot once access is denied: retrieve it so
            # asyncio does not report it as never retrieved.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        return role, await task

    async def page(
        self,
        conversation_id: str,
        caller: int,
        after_user_id: int | None,
        limit: int,
        active_only: bool,
    ) -> PageResult:
        if not 1 <= limit <= PAGE_LIMIT_MAX:
            raise ValueError(f"limit must be 1..{PAGE_LIMIT_MAX}")
        # limit + 1 rows: the extra one only says whether there is a next page.
        role, rows = await self._with_access(
            conversation_id,
            caller,
            self.reader.page(conversation_id, after_user_id, limit + 1, active_only),
        )
        has_more = len(rows) > limit
        items = rows[:limit]
        return PageResult(
            items=items,
            has_more=has_more,
            next_user_id=items[-1].user_id if has_more else None,
            self_role=role,
        )

    async def present(
        self, conversation_id: str, caller: int, user_ids: Sequence[int], include_stats: bool
    ) -> Presentation:
        wanted = list(dict.fromkeys(user_ids))  # de-duplicated, first order kept
        stats_task = (
            asyncio.ensure_future(self.reader.stats(conversation_id, wanted)) if include_stats else None
        )
        try:
            role, rows = await self._with_access(
                conversation_id, caller, self.reader.by_user_ids(conversation_id, wanted)
            )
        except BaseException:
            if stats_task is not None:
                stats_task.cancel()
            raise
        found = {row.user_id for row in rows}
        stats = None
        if stats_task is not None:
            stats = await self._stats_within_budget(stats_task, found)
        return Presentation(
            items=rows,
            missing_user_ids=[u for u in wanted if u not in found],
            stats=stats,
            self_role=role,
        )

    async def _stats_within_budget(
        self, task: asyncio.Future[dict[int, tuple[int, int]]], found: set[int]
    ) -> dict[int, tuple[int, int]] | None:
        """The statistics, or None when they are late or failed: identities are never held
        back for them. A cancellation of *this request* is not caught: it stays a
        cancellation, never a success without statistics."""
        try:
            stats = await asyncio.wait_for(task, self.stats_budget_s)
        except TimeoutError:
            log.info("member statistics over the %.1fs budget: dropped", self.stats_budget_s)
            return None
        except Exception as exc:  # a store failure: identities still go out
            log.warning("member statistics failed: %s: %s", type(exc).__name__, exc)
            return None
        return {u: stats.get(u, (0, 0)) for u in found}

    async def readers(self, conversation_id: str, caller: int, conversation_seq: int) -> Readers:
        """Which active members have read up to ``conversation_seq`` and which have not.

        Candidates: active members who joined before the message (``joined_at < seq``: a later
        joiner never had it unread), minus its sender."""

        async def gather() -> tuple[list[BaseMember], int | None]:
            members, sender = await asyncio.gather(
                self.reader.active_members(conversation_id),
                self.reader.message_sender(conversation_id, conversation_seq),
            )
            return members, sender

        role, (members, sender) = await self._with_access(conversation_id, caller, gather())
        candidates = [
            m
            for m in members
            if m.user_id != sender and (m.joined_at is None or m.joined_at < conversation_seq)
        ]
        seqs = await self.reader.read_seqs(conversation_id, [m.user_id for m in candidates])
        read = [m for m in candidates if seqs.get(m.user_id, 0) >= conversation_seq]
        unread = [m for m in candidates if seqs.get(m.user_id, 0) < conversation_seq]
        return Readers(conversation_seq, sender, read, unread, seqs, role)


@dataclass
class InMemoryMemberReader:
    """:class:`MemberReader` over dicts (unit tests; same semantics as the Cassandra one)."""

    members: dict[str, dict[int, BaseMember]] = field(default_factory=dict)
    disabled_ids: set[str] = field(default_factory=set)
    stats_by_member: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    read_by_member: dict[tuple[str, int], int] = field(default_factory=dict)
    senders: dict[tuple[str, int], int] = field(default_factory=dict)
    stats_delay_s: float = 0.0
    stats_error: Exception | None = None

    def put(self, conversation_id: str, member: BaseMember) -> None:
        self.members.setdefault(conversation_id, {})[member.user_id] = member

    async def membership(self, conversation_id: str, user_id: int) -> BaseMember | None:
        return self.members.get(conversation_id, {}).get(user_id)

    async def disabled(self, conversation_id: str) -> bool:
        return conversation_id in self.disabled_ids

    async def page(
        self, conversation_id: str, after_user_id: int | None, count: int, active_only: bool
    ) -> list[BaseMember]:
        group = self.members.get(conversation_id, {})
        rows = [
            group[u]
            for u in sorted(group)
            if (after_user_id is None or u > after_user_id)
            and (not active_only or group[u].state == "active")
        ]
        return rows[:count]

    async def by_user_ids(self, conversation_id: str, user_ids: Sequence[int]) -> list[BaseMember]:
        group = self.members.get(conversation_id, {})
        return [group[u] for u in sorted(set(user_ids)) if u in group]

    async def stats(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        if self.stats_delay_s:
            await asyncio.sleep(self.stats_delay_s)
        if self.stats_error is not None:
            raise self.stats_error
        return {
            u: self.stats_by_member[(conversation_id, u)]
            for u in user_ids
            if (conversation_id, u) in self.stats_by_member
        }

    async def active_members(self, conversation_id: str) -> list[BaseMember]:
        group = self.members.get(conversation_id, {})
        return [group[u] for u in sorted(group) if group[u].state == "active"]

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]:
        return {
            u: self.read_by_member[(conversation_id, u)]
            for u in user_ids
            if (conversation_id, u) in self.read_by_member
        }

    async def message_sender(self, conversation_id: str, conversation_seq: int) -> int | None:
        return self.senders.get((conversation_id, conversation_seq))
