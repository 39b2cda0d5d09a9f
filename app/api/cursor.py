"""Page cursors: base64url of a protobuf ``PageCursor`` (proto/cursor.proto), signed and bound.

The position (docs/contract.md §5: snapshot_revision, zone, pin_rank, last_activity_id, conversation_id)
travels as a serialized ``CursorPosition`` inside the envelope, with the user and folder it was
issued for; the envelope's MAC (HMAC-SHA256 with the cursor key, truncated to 16 bytes) covers
those exact bytes. Hence, in the order they are checked, each a 400 with its own message:

* not base64url / not a PageCursor / wrong sizes          -> "malformed";
* MAC mismatch (any byte changed, or another server's key) -> "signature is invalid";
* valid MAC but another user                               -> "issued to another user";
* valid MAC but another folder                             -> "issued for folder ...".

A cursor names no expiry of its own: it is only good while its snapshot revision is live, and
a stale one is answered with the first page of a new revision, not an error.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from app.api import cursor_pb2 as pb
from app.api.tokens import b64url_decode, b64url_encode, derive_key
from app.domain.listing import ACTIVITY_BYTES, CONVERSATION_BYTES, Folder, Position, Zone

MAC_BYTES: Final = 16  # 128-bit tags: forging one blindly is 2^-128 per try
MAX_CURSOR_CHARS: Final = 256  # real cursors are ~100 chars; longer input is refused unparsed

_ZONE_TO_PB: Final = {Zone.PINNED: pb.PINNED, Zone.NORMAL: pb.NORMAL}
_ZONE_FROM_PB: Final = {v: k for k, v in _ZONE_TO_PB.items()}
_FOLDER_TO_PB: Final = {Folder.MAIN: pb.MAIN, Folder.ARCHIVED: pb.ARCHIVED}
_FOLDER_FROM_PB: Final = {v: k for k, v in _FOLDER_TO_PB.items()}


class CursorError(ValueError):
    """The cursor cannot be used (the message says why; HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    revision: int
    user_id: int
    folder: Folder
    position: Position
    # The snapshot's random id (app/api/snapshots.py): with the revision, names one snapshot of
    # the fleet; any instance honours it. Travels in the protobuf field `server_epoch`.
    snapshot_id: int


class SignedEnvelope:
    """The signing mechanism of every opaque reference this API hands out: base64url of a
    ``PageCursor`` envelope whose MAC (HMAC-SHA256 with the purpose's key, 16 bytes) covers the
    payload bytes exactly as sent. Each purpose derives its own key, so a session cursor never
    passes for a member page reference, nor the reverse; the previous secret still verifies
    (rotation) but never signs."""

    def __init__(self, secret: str, purpose: str, previous: str = "") -> None:
        self._key = derive_key(secret, purpose)
        self._keys = (self._key, derive_key(previous, purpose)) if previous else (self._key,)

    def seal(self, payload: bytes) -> str:
        envelope = pb.PageCursor(position=payload, mac=self.mac(payload))
        return b64url_encode(envelope.SerializeToString())

    def open(self, text: str, what: str = "cursor") -> bytes:
        """The payload this API signed; CursorError (malformed / signature invalid) otherwise."""
        if not text:
            raise CursorError(f"{what} is empty (omit the parameter for the first page)")
        if len(text) > MAX_CURSOR_CHARS:
            raise CursorError(f"{what} is malformed (too long)")
        try:
            envelope = pb.PageCursor.FromString(b64url_decode(text))
        except (ValueError, DecodeError):
            raise CursorError(f"{what} is malformed (not a {what} this API issued)") from None
        if len(envelope.mac) != MAC_BYTES:
            raise CursorError(f"{what} is malformed (no signature)")
        # Every key is tried (no early exit): the time taken does not say which one matched.
        macs = [hmac.new(key, envelope.position, hashlib.sha256).digest()[:MAC_BYTES] for key in self._keys]
        if not any([hmac.compare_digest(envelope.mac, mac) for mac in macs]):
            raise CursorError(f"{what} signature is invalid (tampered, or not issued by this API)")
        return bytes(envelope.position)

    def mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:MAC_BYTES]


class CursorCodec:
    def __init__(self, secret: str, previous: str = "") -> None:
        # Secret rotation: a cursor the previous secret signed still pages (until it is removed).
        self._envelope = SignedEnvelope(secret, "cursor", previous)

    def encode(self, cursor: Cursor) -> str:
        p = cursor.position
        position = pb.CursorPosition(
            snapshot_revision=cursor.revision,
            zone=_ZONE_TO_PB[p.zone],
            pin_rank=p.pin_rank,
            last_activity_id=p.last_activity_id or b"",
            conversation_id=p.conversation_id,
            user_id=cursor.user_id,
            folder=_FOLDER_TO_PB[cursor.folder],
            server_epoch=cursor.snapshot_id,
        ).SerializeToString()
        return self._envelope.seal(position)

    def decode(self, text: str, user_id: int, folder: Folder) -> Cursor:
        signed = self._envelope.open(text)
        # Signed by us: what follows can only fail for a cursor of another user/folder (or a bug).
        try:
            position = pb.CursorPosition.FromString(signed)
        except DecodeError:
            raise CursorError("cursor is malformed") from None
        if position.user_id != user_id:
            raise CursorError("cursor was issued to another user")
        cursor_folder = _FOLDER_FROM_PB.get(position.folder)
        if cursor_folder is not folder:
            name = cursor_folder.value if cursor_folder else "?"
            raise CursorError(f"cursor was issued for folder {name!r}, not {folder.value!r}")
        zone = _ZONE_FROM_PB.get(position.zone)
        activity = bytes(position.last_activity_id)
        if (
            zone is None
            or position.snapshot_revision < 1
            or len(activity) not in (0, ACTIVITY_BYTES)
            or len(position.conversation_id) != CONVERSATION_BYTES
            or (zone is Zone.NORMAL and position.pin_rank != 0)
        ):
            raise CursorError("cursor is malformed")
        return Cursor(
            revision=position.snapshot_revision,
            user_id=user_id,
            folder=folder,
            position=Position.checked(
                zone, position.pin_rank, activity or None, bytes(position.conversation_id)
            ),
            snapshot_id=position.server_epoch,
        )

    def _mac(self, position: bytes) -> bytes:
        return self._envelope.mac(position)
