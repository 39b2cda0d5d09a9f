"""Opaque member page references (seed 004: "Host 将游标封装为账号/群绑定的不透明引用").

A reference is the session cursors' signed envelope (:class:`app.api.cursor.SignedEnvelope`,
its own key purpose ``member-page``) around a fixed 34-byte payload: format version, the group
(16 bytes), the account it was issued to, the last user id of the page (the keyset position)
and the ``active_only`` flag of the walk. A client never sees the user id position as such and
cannot forge, move or replay a reference into another account, group or walk; each misuse is a
400 with its own message (malformed / signature invalid / another account / another group /
another walk).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Final

from app.api.cursor import CursorError, SignedEnvelope

PURPOSE: Final = "member-page"
READERS_PURPOSE: Final = "member-readers"  # read-receipt pages: their own key, never mixed
_VERSION: Final = 1
_PAYLOAD: Final = struct.Struct(">B16sQQ?")


@dataclass(frozen=True, slots=True)
class MemberPageRef:
    account: int
    group: str  # canonical UUID text
    after_user_id: int
    active_only: bool


class MemberRefCodec:
    def __init__(self, secret: str, previous: str = "", *, purpose: str = PURPOSE) -> None:
        self._envelope = SignedEnvelope(secret, purpose, previous)

    def encode(self, ref: MemberPageRef) -> str:
        payload = _PAYLOAD.pack(
            _VERSION, uuid.UUID(ref.group).bytes, ref.account, ref.after_user_id, ref.active_only
        )
        return self._envelope.seal(payload)

    def decode(self, text: str, *, account: int, group: str, active_only: bool) -> MemberPageRef:
        """The reference's position, checked against the request; CursorError otherwise."""
        payload = self._envelope.open(text, "page_ref")
        if len(payload) != _PAYLOAD.size:
            raise CursorError("page_ref is malformed")
        version, group_bytes, ref_account, after, ref_active = _PAYLOAD.unpack(payload)
        if version != _VERSION:
            raise CursorError(f"page_ref has an unknown format version {version}")
        if ref_account != account:
            raise CursorError("page_ref was issued to another account")
        if uuid.UUID(bytes=group_bytes) != uuid.UUID(group):
            raise CursorError("page_ref was issued for another group")
        if bool(ref_active) != active_only:
            raise CursorError(f"page_ref was issued for a walk with active_only={bool(ref_active)}")
        return MemberPageRef(ref_account, group, after, bool(ref_active))
