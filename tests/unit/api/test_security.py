"""Bearer tokens and page cursors: round trips, and every way a bad one is refused."""

from __future__ import annotations

import base64
import uuid

import pytest

from app.api import cursor_pb2 as pb
from app.api.cursor import Cursor, CursorCodec, CursorError
from app.api.tokens import TokenError, TokenSigner, b64url_encode
from app.domain.listing import Folder, Position, Zone
from tests.support.api import SECRET

NOW = 1_800_000_000


def test_a_token_names_its_user_until_it_expires() -> None:
    signer = TokenSigner(SECRET)
    token = signer.mint(2**64 - 1, NOW + 60)
    assert signer.verify(token, NOW) == 2**64 - 1
    assert signer.verify(token, NOW + 59.9) == 2**64 - 1
    with pytest.raises(TokenError, match="expired"):
        signer.verify(token, NOW + 60)


@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        ("", "malformed"),
        ("abc", "malformed"),
        ("v2.a.b", "malformed"),
        ("v1.a.b.c", "malformed"),
        ("v1.e30.!!!", "not base64url"),
        ("v1.é.AAAA", "malformed"),
        ("v1..AAAA", "malformed"),
        ("v1.e30." + b64url_encode(b"x" * 32), "signature is invalid"),
        ("v1." + "A" * 600, "too long"),
    ],
)
def test_bad_tokens_are_refused_with_a_reason(token: str, fragment: str) -> None:
    with pytest.raises(TokenError, match=fragment):
        TokenSigner(SECRET).verify(token, NOW)


def test_tokens_of_another_secret_or_edited_are_refused() -> None:
    token = TokenSigner("another-secret-" * 3).mint(1, NOW + 60)
    with pytest.raises(TokenError, match="signature"):
        TokenSigner(SECRET).verify(token, NOW)
    good = TokenSigner(SECRET).mint(1, NOW + 60)
    version, _payload, mac = good.split(".")
    forged_payload = b64url_encode(b'{"sub":"2","exp":9999999999}')
    with pytest.raises(TokenError, match="signature"):
        TokenSigner(SECRET).verify(f"{version}.{forged_payload}.{mac}", NOW)


def test_signed_but_meaningless_payloads_are_refused() -> None:
    signer = TokenSigner(SECRET)
    for payload, fragment in [
        (b"[]", "malformed"),
        (b"{", "malformed"),
        (b'{"sub":"-1","exp":9999999999}', "does not name a user"),
        (b'{"sub":"18446744073709551616","exp":9999999999}', "does not name a user"),
        (b'{"sub":7,"exp":9999999999}', "does not name a user"),
        (b'{"sub":"7","exp":"soon"}', "no expiry"),
    ]:
        signed = "v1." + b64url_encode(payload)
        token = f"{signed}.{b64url_encode(signer._mac(signed))}"
        with pytest.raises(TokenError, match=fragment):
            signer.verify(token, NOW)


# --------------------------------------------------------------------------------------------

POSITION = Position(Zone.PINNED, 3, bytes(range(16)), uuid.UUID(int=99).bytes)
CURSOR = Cursor(revision=4, user_id=42, folder=Folder.MAIN, position=POSITION, snapshot_id=777)


def test_a_cursor_round_trips_as_base64url_protobuf() -> None:
    codec = CursorCodec(SECRET)
    text = codec.encode(CURSOR)
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert codec.decode(text, 42, Folder.MAIN) == CURSOR
    envelope = pb.PageCursor.FromString(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    position = pb.CursorPosition.FromString(envelope.position)
    assert position.snapshot_revision == 4 and position.zone == pb.PINNED and position.pin_rank == 3
    assert position.last_activity_id == bytes(range(16)) and len(position.conversation_id) == 16
    normal = Cursor(4, 42, Folder.ARCHIVED, Position(Zone.NORMAL, 0, None, bytes(16)), 1)
    assert codec.decode(codec.encode(normal), 42, Folder.ARCHIVED) == normal  # null activity


def test_every_changed_byte_is_detected() -> None:
    codec = CursorCodec(SECRET)
    raw = bytearray(base64.urlsafe_b64decode(codec.encode(CURSOR) + "=="))
    for i in range(len(raw)):
        tampered = bytearray(raw)
        tampered[i] ^= 0x01
        with pytest.raises(CursorError):
            codec.decode(b64url_encode(bytes(tampered)), 42, Folder.MAIN)


def test_cursor_binding_to_user_folder_and_key() -> None:
    codec = CursorCodec(SECRET)
    text = codec.encode(CURSOR)
    with pytest.raises(CursorError, match="another user"):
        codec.decode(text, 43, Folder.MAIN)
    with pytest.raises(CursorError, match="folder 'main', not 'archived'"):
        codec.decode(text, 42, Folder.ARCHIVED)
    with pytest.raises(CursorError, match="signature is invalid"):
        CursorCodec("other-secret-" * 4).decode(text, 42, Folder.MAIN)


def test_token_and_cursor_keys_differ() -> None:
    # A cursor MAC made with the token key must not verify (domain separation).
    signer = TokenSigner(SECRET)
    position = pb.CursorPosition(
        snapshot_revision=1, zone=pb.NORMAL, conversation_id=bytes(16), user_id=1, folder=pb.MAIN
    ).SerializeToString()
    import hashlib
    import hmac

    mac = hmac.new(signer._key, position, hashlib.sha256).digest()[:16]
    text = b64url_encode(pb.PageCursor(position=position, mac=mac).SerializeToString())
    with pytest.raises(CursorError, match="signature"):
        CursorCodec(SECRET).decode(text, 1, Folder.MAIN)


def _signed(codec: CursorCodec, position: pb.CursorPosition) -> str:
    body = position.SerializeToString()
    return b64url_encode(pb.PageCursor(position=body, mac=codec._mac(body)).SerializeToString())


@pytest.mark.parametrize(
    "fields",
    [
        {"zone": pb.ZONE_UNSPECIFIED},
        {"zone": 9},
        {"snapshot_revision": 0},
        {"last_activity_id": b"short"},
        {"conversation_id": b"x" * 17},
        {"zone": pb.NORMAL, "pin_rank": 5},
        {"folder": pb.FOLDER_UNSPECIFIED},
    ],
)
def test_signed_cursors_with_impossible_positions_are_malformed(fields: dict[str, object]) -> None:
    codec = CursorCodec(SECRET)
    base: dict[str, object] = {
        "snapshot_revision": 1,
        "zone": pb.PINNED,
        "pin_rank": 1,
        "last_activity_id": bytes(16),
        "conversation_id": bytes(16),
        "user_id": 42,
        "folder": pb.MAIN,
    }
    text = _signed(codec, pb.CursorPosition(**{**base, **fields}))  # type: ignore[arg-type]
    with pytest.raises(CursorError, match=r"malformed|folder"):
        codec.decode(text, 42, Folder.MAIN)


@pytest.mark.parametrize(
    "text", ["", "!", "a", "ab=", "____", "A" * 300, b64url_encode(b"\xff\xff\xff"), "é"]
)
def test_garbage_cursors_are_malformed_or_empty(text: str) -> None:
    with pytest.raises(CursorError, match=r"malformed|empty|signature"):
        CursorCodec(SECRET).decode(text, 42, Folder.MAIN)


def test_only_canonical_base64url_is_accepted() -> None:
    from app.api.tokens import b64url_decode

    assert b64url_decode("QQ") == b"A"
    with pytest.raises(ValueError, match="canonical"):
        b64url_decode("QR")  # same bytes, unused low bits set: not a text we would issue
    codec = CursorCodec(SECRET)
    text = codec.encode(CURSOR)
    last = text[-1]
    sibling = next(
        (
            c
            for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
            if c != last
            and base64.urlsafe_b64decode(text[:-1] + c + "=" * (-len(text) % 4))
            == base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        ),
        None,
    )
    if sibling is not None:  # the length leaves spare bits in the last character
        with pytest.raises(CursorError, match="malformed"):
            codec.decode(text[:-1] + sibling, 42, Folder.MAIN)
