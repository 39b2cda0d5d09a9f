"""Member objects and the member API's wire shapes, shared by the client store and the server.

A :class:`Member` is immutable: the store replaces a member object only when one of its
fields really changes, so a UI that compares objects by identity re-renders exactly the rows
that changed (seed 004: "不替换未变化成员对象").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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
_RANK: Final = {"owner": 3, "admin": 2, "member": 1}

# Admin capabilities come only from the group's settings (seed 004: "管理操作能力只取自
# group.settings，不能从缓存角色推断"): each setting names the lowest role allowed to do it
# (``owner``, ``admin``, ``member``) or ``nobody``; a group without the setting has the default.
CAPABILITY_DEFAULTS: Final = {
    "invite": "member",
    "remove_members": "admin",
    "edit_info": "admin",
    "manage_admins": "owner",
}
CAPABILITY_LEVELS: Final = frozenset({"owner", "admin", "member", "nobody"})


def capabilities(self_role: str, settings: Mapping[str, str]) -> dict[str, bool]:
    """What the caller (with the role its access check just read) may do in the group."""
    rank = _RANK.get(self_role, 0)
    out: dict[str, bool] = {}
    for name, default in CAPABILITY_DEFAULTS.items():
        level = settings.get(name, default)
        if level not in CAPABILITY_LEVELS:
            level = default  # a value this server does not know never grants anything new
        out[name] = level != "nobody" and rank >= _RANK[level]
    return out


@dataclass(frozen=True, slots=True)
class JoinEvent:
    """One join event of a roster page: the members (invitees) who joined the group with the
    same entry position. Clients merge the events of several pages by ``event_ref`` and their
    invitees by memberRef (seed 004: "跨页同一入群事件按 memberRef 合并 invitees")."""

    event_ref: str
    joined_at: int
    invitees: tuple[int, ...]


def join_events(members: Sequence[BaseMember]) -> list[JoinEvent]:
    by_seq: dict[int, list[int]] = {}
    for member in members:
        if member.joined_at is not None:
            by_seq.setdefault(member.joined_at, []).append(member.user_id)
    return [JoinEvent(f"join:{seq}", seq, tuple(ids)) for seq, ids in sorted(by_seq.items())]


def merge_join_events(known: Mapping[str, JoinEvent], page: Sequence[JoinEvent]) -> dict[str, JoinEvent]:
    """``known`` with a page's events merged in: one event per ``event_ref``, invitees by id
    (never by name), first-seen order kept."""
    out = dict(known)
    for event in page:
        old = out.get(event.event_ref)
        if old is None:
            out[event.event_ref] = event
        else:
            merged = tuple(dict.fromkeys((*old.invitees, *event.invitees)))
            out[event.event_ref] = (
                old if merged == old.invitees else dataclasses.replace(old, invitees=merged)
            )
    return out


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
    remark: str | None = None  # the viewer's own remark (备注), from the presentation
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
    """One ``/members/page`` answer. ``next_ref`` is opaque: the server signs it and binds it to
    the account, the group and the walk; a client only hands it back."""

    items: tuple[BaseMember, ...]
    has_more: bool
    next_ref: str | None
    self_role: str
    capabilities: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    join_events: tuple[JoinEvent, ...] = ()

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> MemberPage:
        items = tuple(BaseMember.from_wire(item) for item in body.get("items") or ())
        has_more = body.get("has_more")
        if not isinstance(has_more, bool):
            raise ValueError("page: has_more must be a boolean")
        next_ref = body.get("next_page_ref")
        if next_ref is not None and not isinstance(next_ref, str):
            raise ValueError("page: next_page_ref must be a string")
        if has_more and not next_ref:
            raise ValueError("page: has_more without next_page_ref")
        raw_caps = body.get("capabilities") or {}
        if not isinstance(raw_caps, Mapping):
            raise ValueError("page: capabilities must be an object")
        events = []
        for event in body.get("join_events") or ():
            events.append(
                JoinEvent(
                    event_ref=str(event["event_ref"]),
                    joined_at=int(event["joined_at_conversation_seq"]),
                    invitees=tuple(_user_id(u) for u in event.get("invitee_refs") or ()),
                )
            )
        return cls(
            items=items,
            has_more=has_more,
            next_ref=next_ref if has_more else None,
            self_role=str(body.get("self_role") or "member"),
            # Only true booleans grant anything.
            capabilities={str(k): v is True for k, v in raw_caps.items()},
            join_events=tuple(events),
        )


@dataclass(frozen=True, slots=True)
class PresentedMember:
    """One ``/members/by-user-ids`` item: identity, activity, (maybe) statistics, and the
    caller's own remark (meaningful only when the result's ``remarks_included``)."""

    base: BaseMember
    record_count: int | None
    mention_count: int | None
    remark: str | None = None

    @property
    def stats_known(self) -> bool:
        return stats_known(self.record_count, self.mention_count)

    @classmethod
    def from_wire(cls, item: Mapping[str, Any]) -> PresentedMember:
        record, mention = item.get("record_count"), item.get("mention_count")
        known = stats_known(record, mention)
        remark = item.get("remark")
        if remark is not None and not isinstance(remark, str):
            raise ValueError(f"member {item.get('user_id')!r}: remark must be a string or null")
        return cls(
            base=BaseMember.from_wire(item),
            # An invalid value is normalised to "unknown", never to a zero.
            record_count=record if known else None,
            mention_count=mention if known else None,
            remark=remark,
        )


@dataclass(frozen=True, slots=True)
class PresentationResult:
    """A ``/members/by-user-ids`` answer: the members found (active or not) and the ids the
    server does not know as members of the group at all."""

    items: tuple[PresentedMember, ...]
    missing_user_ids: tuple[int, ...]
    stats_included: bool
    # True: each item's ``remark`` is the server's word (None = the caller has none: clear it).
    # False (remarks late or failed, or an older server): keep the remarks already known.
    remarks_included: bool = False

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> PresentationResult:
        return cls(
            items=tuple(PresentedMember.from_wire(item) for item in body.get("items") or ()),
            missing_user_ids=tuple(_user_id(u) for u in body.get("missing_user_ids") or ()),
            stats_included=bool(body.get("stats_included")),
            remarks_included=body.get("remarks_included") is True,
        )

    def removed_user_ids(self) -> frozenset[int]:
        """Ids the server confirms are not (or no longer) active members."""
        gone = {item.base.user_id for item in self.items if item.base.state != "active"}
        return frozenset(gone | set(self.missing_user_ids))


@dataclass(frozen=True, slots=True)
class ReadReceiptsPage:
    """One page of ``/messages/{seq}/readers`` (seed 004's ``source.read-receipts.detail``):
    the server's read facts for up to ``limit`` active members; names and avatars come from the
    member store, not from here. ``next_ref`` is opaque (bound to the account and group)."""

    conversation_seq: int
    sender_id: int | None
    read_user_ids: tuple[int, ...]
    unread_user_ids: tuple[int, ...]
    basic_only: bool
    has_more: bool
    next_ref: str | None
    read_seqs: Mapping[int, int] = dataclasses.field(default_factory=dict)  # unless basic_only

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> ReadReceiptsPage:
        seq = body.get("conversation_seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ValueError("readers: conversation_seq must be an integer")
        sender = body.get("sender_id")
        has_more = body.get("has_more") is True
        next_ref = body.get("next_page_ref")
        if has_more and not isinstance(next_ref, str):
            raise ValueError("readers: has_more without next_page_ref")
        seqs: dict[int, int] = {}
        for name in ("read", "unread"):
            for item in body.get(name) or ():
                seqs[_user_id(item.get("user_id"))] = int(item.get("read_conversation_seq") or 0)
        return cls(
            conversation_seq=seq,
            sender_id=None if sender is None else _user_id(sender),
            read_user_ids=tuple(_user_id(u) for u in body.get("read_user_ids") or ()),
            unread_user_ids=tuple(_user_id(u) for u in body.get("unread_user_ids") or ()),
            basic_only=body.get("basic_only") is True,
            has_more=has_more,
            next_ref=next_ref if has_more else None,
            read_seqs=seqs,
        )


@dataclass(frozen=True, slots=True)
class Profile:
    """Public profile fields (from a profile service the host provides; optional). Remarks are
    not public: they are the viewer's own and come with the presentation (PresentedMember)."""

    display_name: str | None = None
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
