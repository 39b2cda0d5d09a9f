"""Bearer tokens: an HMAC-SHA256-signed payload naming the user and an expiry.

Format: ``v1.<payload>.<mac>``, both parts base64url without padding; payload = compact JSON
``{"sub": "<user_id as decimal string>", "exp": <unix seconds>}`` (the id as a string: a u64 does
not survive JavaScript's doubles). The MAC covers ``v1.<payload>`` exactly as sent, so
verification never re-serializes anything.

Keys are derived per purpose from the one server secret (``HMAC(secret, purpose)``): a token's
MAC and a page cursor's MAC are made with different keys, so one can never pass for the other.
Stdlib only; the clock is an argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Final

import orjson

VERSION: Final = "v1"
MAX_TOKEN_CHARS: Final = 512  # real tokens are ~90 chars; anything longer is refused unparsed
U64_MAX: Final = (1 << 64) - 1
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,19})")


class TokenError(ValueError):
    """The token is missing, malformed, forged or expired (the message says which; HTTP 401)."""


def derive_key(secret: str, purpose: str) -> bytes:
    if not secret:
        raise ValueError("the API secret is empty: set PROJECTOR_API_SECRET")
    return hmac.new(secret.encode(), f"session-projector/{purpose}".encode(), hashlib.sha256).digest()


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict, canonical base64url without padding (ValueError otherwise)."""
    if not _B64URL.fullmatch(text):
        raise ValueError("not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None
    # The last character may carry unused low bits: several texts decode to the same bytes.
    # Only the canonical one is accepted, so a cursor or token is exactly the text we issued.
    if b64url_encode(data) != text:
        raise ValueError("not canonical base64url")
    return data


class TokenSigner:
    """Tokens of one purpose: ``"token"`` (bearer tokens) or ``"stream-ticket"`` (the short-lived
    tickets that open /v1/stream from a browser). Each purpose has its own key, so a ticket is
    never a bearer token and a bearer token never a ticket."""

    def __init__(self, secret: str, purpose: str = "token", previous: str = "") -> None:
        self._key = derive_key(secret, purpose)
        # Secret rotation: what the previous secret signed is still accepted (never minted).
        self._keys = (self._key, derive_key(previous, purpose)) if previous else (self._key,)

    def mint(self, user_id: int, expires_at_s: int) -> str:
        if isinstance(user_id, bool) or not 0 <= user_id <= U64_MAX:
            raise ValueError(f"user_id must be a u64, got {user_id!r}")
        payload = b64url_encode(orjson.dumps({"sub": str(user_id), "exp": int(expires_at_s)}))
        signed = f"{VERSION}.{payload}"
        return f"{signed}.{b64url_encode(self._mac(signed))}"

    def verify(self, token: str, now_s: float) -> int:
        """The user the token names; TokenError when it is not a valid, unexpired token."""
        if len(token) > MAX_TOKEN_CHARS:
            raise TokenError("token is too long")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != VERSION or not _B64URL.fullmatch(parts[1]):
            # (the payload is checked before the MAC is computed over it: it must be ASCII)
            raise TokenError("token is malformed (expected v1.<payload>.<signature>)")
        try:
            mac = b64url_decode(parts[2])
        except ValueError:
            raise TokenError("token signature is not base64url") from None
        signed = f"{parts[0]}.{parts[1]}".encode("ascii")
        # Every key is tried (no early exit): the time taken does not say which one matched.
        matches = [
            hmac.compare_digest(mac, hmac.new(key, signed, hashlib.sha256).digest()) for key in self._keys
        ]
        if not any(matches):
            raise TokenError("token signature is invalid")
        # Only a payload this server signed is parsed at all.
        try:
            claims = orjson.loads(b64url_decode(parts[1]))
        except ValueError:
            raise TokenError("token payload is malformed") from None
        if not isinstance(claims, dict):
            raise TokenError("token payload is malformed")
        sub, exp = claims.get("sub"), claims.get("exp")
        if not isinstance(sub, str) or not _DECIMAL.fullmatch(sub) or int(sub) > U64_MAX:
            raise TokenError("token does not name a user")
        if isinstance(exp, bool) or not isinstance(exp, int):
            raise TokenError("token has no expiry")
        if now_s >= exp:
            raise TokenError("token has expired")
        return int(sub)

    def _mac(self, signed: str) -> bytes:
        return hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest()
