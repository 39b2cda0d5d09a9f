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
from typing import Any, Protocol, TypeVar

from app.members.model import (
    CONVERSATION_DISABLED,
    NOT_A_MEMBER,
    PAGE_LIMIT_MAX,
    BaseMember,
    JoinEvent,
    capabilities,
    join_events,
    stats_known,
)
from app.members.remarks import RemarkStore
from app.members.source import MemberAccessDenied, ProfileSource

log = logging.getLogger("projector.members.server")
_T = TypeVar("_T")

STATS_BUDGET_S = 2.0
REMARKS_BUDGET_S = 2.0
READERS_BUDGET_S = 2.0
READERS_LIMIT_DEFAULT = 100
READERS_LIMIT_MAX = 500


class UnknownMessage(LookupError):
    """The group has no such message (HTTP 404): never an answer with everyone "unread"."""


class ReadersTimeout(Exception):
    """The read facts of a readers page did not come within the budget (HTTP 503, retry)."""


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
        """``{user_id: (record_count, mention_count)}`` aggregated at query time from the
        group's messages (recalled and deleted ones excluded, @all as the entries say), for
        every id asked. An id left out is unknown, never zero."""
        ...

    async def group_settings(self, conversation_id: str) -> dict[str, str]:
        """The group's settings (``group.settings``); empty when it has none."""
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
    capabilities: dict[str, bool] = field(default_factory=dict)
    join_events: list[JoinEvent] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Presentation:
    items: list[BaseMember]
    missing_user_ids: list[int]
    stats: dict[int, tuple[int, int]] | None  # None: dropped (late or failed), not zero
    self_role: str
    # The caller's own remarks on the members found: ``{user_id: remark}``, a member without
    # one absent. None = not read (no remark store, or late or failed): the client keeps what it
    # has; a dict = the server's word for every member found (absent = no remark, clear it).
    remarks: dict[int, str] | None = None


@dataclass(frozen=True, slots=True)
class Readers:
    conversation_seq: int
    sender_id: int | None
    read: list[BaseMember]
    unread: list[BaseMember]
    read_seqs: dict[int, int]
    self_role: str
    has_more: bool = False
    next_user_id: int | None = None  # the keyset position of the next page (wrapped by the API)


class MemberService:
    def __init__(
        self,
        reader: MemberReader,
        *,
        stats_budget_s: float = STATS_BUDGET_S,
        readers_budget_s: float = READERS_BUDGET_S,
        profiles: ProfileSource | None = None,
        remarks: RemarkStore | None = None,
        remarks_budget_s: float = REMARKS_BUDGET_S,
    ) -> None:
        self.reader = reader
        self.stats_budget_s = stats_budget_s
        self.readers_budget_s = readers_budget_s
        # Public profiles (names, avatars): Cassandra's member_profiles in production
        # (app/stores/cassandra_profiles.py); None = this deployment serves none.
        self.profile_source = profiles
        # Per-viewer remarks (备注): Cassandra's member_remarks in production
        # (app/stores/cassandra_remarks.py); None = this deployment keeps none.
        self.remark_store = remarks
        self.remarks_budget_s = remarks_budget_s

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

        async def read() -> tuple[list[BaseMember], dict[str, str]]:
            # limit + 1 rows: the extra one only says whether there is a next page.
            rows, settings = await asyncio.gather(
                self.reader.page(conversation_id, after_user_id, limit + 1, active_only),
                self.reader.group_settings(conversation_id),
            )
            return rows, settings

        role, (rows, settings) = await self._with_access(conversation_id, caller, read())
        has_more = len(rows) > limit
        items = rows[:limit]
        return PageResult(
            items=items,
            has_more=has_more,
            next_user_id=items[-1].user_id if has_more else None,
            self_role=role,
            # From the group's settings and the role this page's access check read: never
            # from a cached role, never waiting for the caller's own row on a later page.
            capabilities=capabilities(role, settings),
            join_events=join_events(items),
        )

    async def present(
        self, conversation_id: str, caller: int, user_ids: Sequence[int], include_stats: bool
    ) -> Presentation:
        wanted = list(dict.fromkeys(user_ids))  # de-duplicated, first order kept
        stats_task = (
            asyncio.ensure_future(self.reader.stats(conversation_id, wanted)) if include_stats else None
        )
        # The caller's remarks: one read keyed by the caller (never by the group, never another
        # viewer's), concurrent with the rest and only handed out once access is granted.
        remarks_task = (
            asyncio.ensure_future(self.remark_store.remarks(caller, wanted))
            if self.remark_store is not None
            else None
        )
        try:
            role, rows = await self._with_access(
                conversation_id, caller, self.reader.by_user_ids(conversation_id, wanted)
            )
        except BaseException:
            for task in (stats_task, remarks_task):
                if task is not None:
                    task.cancel()
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        found = {row.user_id for row in rows}
        # Both budgets run at once: the answer waits for the slower one, never for their sum.
        stats, remarks = await asyncio.gather(
            self._stats_within_budget(stats_task, found) if stats_task is not None else _none(),
            self._remarks_within_budget(remarks_task, found) if remarks_task is not None else _none(),
        )
        return Presentation(
            items=rows,
            missing_user_ids=[u for u in wanted if u not in found],
            stats=stats,
            self_role=role,
            remarks=remarks,
        )

    async def _remarks_within_budget(
        self, task: asyncio.Future[dict[int, str]], found: set[int]
    ) -> dict[int, str] | None:
        """The caller's remarks on the members found, or None when they are late or failed (the
        answer then says "not included" and clients keep theirs: a failure never clears one)."""
        remarks = await _within_budget(task, self.remarks_budget_s, "member remarks", "not included")
        if remarks is None:
            return None
        return {u: remarks[u] for u in found if u in remarks}

    async def _stats_within_budget(
        self, task: asyncio.Future[dict[int, tuple[int, int]]], found: set[int]
    ) -> dict[int, tuple[int, int]] | None:
        """The statistics, or None when they are late or failed: identities are never held
        back for them."""
        stats = await _within_budget(task, self.stats_budget_s, "member statistics", "dropped")
        if stats is None:
            return None
        # Only two non-negative safe integers are known statistics; anything else is left out
        # (unknown), never turned into a zero.
        return {u: stats[u] for u in found if u in stats and stats_known(*stats[u])}

    async def readers(
        self,
        conversation_id: str,
        caller: int,
        conversation_seq: int,
        *,
        after_user_id: int | None = None,
        limit: int = READERS_LIMIT_DEFAULT,
    ) -> Readers:
        """One page of who has read up to ``conversation_seq`` and who has not.

        The roster is walked by the same ``user_id`` keyset as the member pages (``limit``
        active members per page); candidates are the members who joined before the message
        (``joined_at < seq``: a later joiner never had it unread), minus its sender. An unknown
        message is :class:`UnknownMessage`; read facts not read within the budget are
        :class:`ReadersTimeout` (never a guess)."""
        if not 1 <= limit <= READERS_LIMIT_MAX:
            raise ValueError(f"limit must be 1..{READERS_LIMIT_MAX}")

        async def gather() -> tuple[list[BaseMember], int | None]:
            members, sender = await asyncio.gather(
                self.reader.page(conversation_id, after_user_id, limit + 1, True),
                self.reader.message_sender(conversation_id, conversation_seq),
            )
            return members, sender

        role, (rows, sender) = await self._with_access(conversation_id, caller, gather())
        if sender is None:
            raise UnknownMessage(f"no message {conversation_seq} in this group")
        has_more = len(rows) > limit
        members = rows[:limit]
        candidates = [
            m
            for m in members
            if m.user_id != sender and (m.joined_at is None or m.joined_at < conversation_seq)
        ]
        try:
            seqs = await asyncio.wait_for(
                self.reader.read_seqs(conversation_id, [m.user_id for m in candidates]),
                self.readers_budget_s,
            )
        except TimeoutError:
            raise ReadersTimeout(
                f"read receipts of {len(candidates)} members not read within {self.readers_budget_s:.1f}s"
            ) from None
        read = [m for m in candidates if seqs.get(m.user_id, 0) >= conversation_seq]
        unread = [m for m in candidates if seqs.get(m.user_id, 0) < conversation_seq]
        return Readers(
            conversation_seq,
            sender,
            read,
            unread,
            seqs,
            role,
            has_more=has_more,
            next_user_id=members[-1].user_id if has_more else None,
        )


async def _none() -> None:
    return None


@dataclass
class InMemoryMemberReader:
    """:class:`MemberReader` over dicts (unit tests; same semantics as the Cassandra one)."""

    members: dict[str, dict[int, BaseMember]] = field(default_factory=dict)
    disabled_ids: set[str] = field(default_factory=set)
    stats_by_member: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    read_by_member: dict[tuple[str, int], int] = field(default_factory=dict)
    senders: dict[tuple[str, int], int] = field(default_factory=dict)
    settings_by_group: dict[str, dict[str, str]] = field(default_factory=dict)
    stats_delay_s: float = 0.0
    stats_error: Exception | None = None
    read_delay_s: float = 0.0

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
        # The aggregate a completed query-time count gives: a member without messages has a
        # real (0, 0).
        return {u: self.stats_by_member.get((conversation_id, u), (0, 0)) for u in user_ids}

    async def group_settings(self, conversation_id: str) -> dict[str, str]:
        return dict(self.settings_by_group.get(conversation_id, {}))

    async def active_members(self, conversation_id: str) -> list[BaseMember]:
        group = self.members.get(conversation_id, {})
        return [group[u] for u in sorted(group) if group[u].state == "active"]

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]:
        if self.read_delay_s:
            await asyncio.sleep(self.read_delay_s)
        return {
            u: self.read_by_member[(conversation_id, u)]
            for u in user_ids
            if (conversation_id, u) in self.read_by_member
        }

    async def message_sender(self, conversation_id: str, conversation_seq: int) -> int | None:
        return self.senders.get((conversation_id, conversation_seq))


async def _within_budget(task: asyncio.Future[_T], budget_s: float, what: str, when_late: str) -> _T | None:
    """`task`'s result, or None when it takes more than `budget_s` or fails (logged as `what`,
    the identities going out without it). A cancellation of *this request* is not caught: it
    stays a cancellation, never a success without the part."""
    try:
        return await asyncio.wait_for(task, budget_s)
    except TimeoutError:
        log.info("%s over the %.1fs budget: %s", what, budget_s, when_late)
        return None
    except Exception as exc:  # a store failure: identities still go out
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        return None
