"""Member objects and the member API's wire shapes, shared by the client store and the server.

A :class:`Member` is immutable: the store replaces a member object only when one of its
fields really changes, so a UI that compares objects by identity re-renders exactly the rows
that changed (seed 004: "不替换未变化成员对象").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.domain.wire_ids import parse_id

U64_MAX: Final = 2**64 - 1
# JavaScript's Number.MAX_SAFE_INTEGER: statistics travel to JS clients, and a count that a
# client cannot represent exactly is as unknown as a missing one.
SAFE_INTEGER_MAX: Final = 2**53 - 1

PAGE_LIMIT_DEFAULT: Final = 50
PAGE_LIMIT_MAX: Final = 100
BY_IDS_MAX: Final = 50

# Error codes of the member read contract. Only these two mean "this roster is gone for you":
# the client drops its memory and disk caches on them and on nothing else (a general conflict
# or a network failure keeps the list).
NOT_A_MEMBER: Final = 2001
CONVERSATION_DISABLED: Final = 2002
ACCESS_CODES: Final = frozenset({NOT_A_MEMBER, CONVERSATION_DISABLED})

ROLES: Final = frozenset({"owner", "admin", "member"})
STATES: Final = frozenset({"active", "left", "removed"})


def is_safe_count(value: object) -> bool:
    """A statistic the client may show: a non-negative int (not a bool) a JS number holds."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SAFE_INTEGER_MAX


def stats_known(record_count: object, mention_count: object) -> bool:
    """Both statistics usable. One bad value makes both unknown: a row never shows a fake zero."""
    return is_safe_count(record_count) and is_safe_count(mention_count)


@dataclass(frozen=True, slots=True)
class Member:
    """One member as the client shows it.

    Base fields come from the paged roster (``/members/page``); presentation fields (names,
    avatar, statistics) come from the presentation call and are never erased by a base page.
    """

    user_id: int
    role: str = "member"
    state: str = "active"
    joined_at: int | None = None
    left_at: int | None = None
    # -- presentation ----------------------------------------------------------------------
    display_name: str | None = None
    remark: str | None = None
    avatar_url: str | None = None
    record_count: int | None = None  # None = unknown (never shown as 0)
    mention_count: int | None = None
    stats_known: bool = False
    profile_failed: bool = False  # the public profile lookup failed for this member
    presented: bool = False  # a presentation result has been applied at least once

    @property
    def active(self) -> bool:
        return self.state == "active"

    def with_base(self, base: BaseMember) -> Member:
        """This member with a roster page's fields; the same object when nothing changed."""
        if (self.role, self.state, self.joined_at, self.left_at) == (
            base.role,
            base.state,
            base.joined_at,
            base.left_at,
        ):
            return self
        return dataclasses.replace(
            self, role=base.role, state=base.state, joined_at=base.joined_at, left_at=base.left_at
        )

    def with_fields(self, **fields: Any) -> Member:
        """This member with ``fields``; the same object when every value is already there."""
        if all(getattr(self, name) == value for name, value in fields.items()):
            return self
        return dataclasses.replace(self, **fields)


@dataclass(frozen=True, slots=True)
class BaseMember:
    """One roster row of ``/members/page`` (and the identity part of ``/members/by-user-ids``)."""

    user_id: int
    role: str
    state: str
    joined_at: int | None
    left_at: int | None

    @classmethod
    def from_wire(cls, item: Mapping[str, Any]) -> BaseMember:
        user_id = _user_id(item.get("user_id"))
        role = item.get("role") or "member"
        state = item.get("state") or "active"
        if role not in ROLES:
            raise ValueError(f"member {user_id}: unknown role {role!r}")
        if state not in STATES:
            raise ValueError(f"member {user_id}: unknown state {state!r}")
        return cls(
            user_id=user_id,
            role=role,
            state=state,
            joined_at=_opt_int(item.get("joined_at_conversation_seq")),
            left_at=_opt_int(item.get("left_at_conversation_seq")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "role": self.role,
            "state": self.state,
            "active": self.state == "active",
            "joined_at_conversation_seq": self.joined_at,
            "left_at_conversation_seq": self.left_at,
        }


@dataclass(frozen=True, slots=True)
class MemberPage:
    """One ``/members/page`` answer."""

    items: tuple[BaseMember, ...]
    has_more: bool
    next_user_id: int | None
    self_role: str

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> MemberPage:
        items = tuple(BaseMember.from_wire(item) for item in body.get("items") or ())
        has_more = body.get("has_more")
        if not isinstance(has_more, bool):
            raise ValueError("page: has_more must be a boolean")
        next_user_id = body.get("next_user_id")
        if has_more and next_user_id is None:
            raise ValueError("page: has_more without next_user_id")
        return cls(
            items=items,
            has_more=has_more,
            next_user_id=None if next_user_id is None else _user_id(next_user_id),
            self_role=str(body.get("self_role") or "member"),
        )


@dataclass(frozen=True, slots=True)
class PresentedMember:
    """One ``/members/by-user-ids`` item: identity, activity, and (maybe) statistics."""

    base: BaseMember
    record_count: int | None
    mention_count: int | None

    @property
    def stats_known(self) -> bool:
        return stats_known(self.record_count, self.mention_count)

    @classmethod
    def from_wire(cls, item: Mapping[str, Any]) -> PresentedMember:
        record, mention = item.get("record_count"), item.get("mention_count")
        known = stats_known(record, mention)
        return cls(
            base=BaseMember.from_wire(item),
            # An invalid value is normalised to "unknown", never to a zero.
            record_count=record if known else None,
            mention_count=mention if known else None,
        )


@dataclass(frozen=True, slots=True)
class PresentationResult:
    """A ``/members/by-user-ids`` answer: the members found (active or not) and the ids the
    server does not know as members of the group at all."""

    items: tuple[PresentedMember, ...]
    missing_user_ids: tuple[int, ...]
    stats_included: bool

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> PresentationResult:
        return cls(
            items=tuple(PresentedMember.from_wire(item) for item in body.get("items") or ()),
            missing_user_ids=tuple(_user_id(u) for u in body.get("missing_user_ids") or ()),
            stats_included=bool(body.get("stats_included")),
        )

    def removed_user_ids(self) -> frozenset[int]:
        """Ids the server confirms are not (or no longer) active members."""
        gone = {item.base.user_id for item in self.items if item.base.state != "active"}
        return frozenset(gone | set(self.missing_user_ids))


@dataclass(frozen=True, slots=True)
class Profile:
    """Public profile fields (from a profile service the host provides; optional)."""

    display_name: str | None = None
    remark: str | None = None
    avatar_url: str | None = None


def _user_id(value: object) -> int:
    # Responses carry u64 ids as decimal strings (docs/contract.md §9: a JS number cannot hold them);
    # requests may too, or (older clients) JSON integers. Only the canonical decimal form: no
    # sign, space, leading zero or non-ASCII digit ('٣'.isdigit() is true).
    try:
        return parse_id(value)
    except ValueError:
        raise ValueError(f"user id must be a u64 (decimal string or int), got {value!r}") from None


def parse_user_id(value: object) -> int:
    """A u64 user id from JSON (int, or decimal string); ValueError otherwise."""
    return _user_id(value)


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an int, got {value!r}")
    return value
