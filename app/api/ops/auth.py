"""Who may open the operator console, and the CSRF defence of its actions (issue 17).

**The credential.** An operator token is ``op1.<payload>.<mac>``: payload ``{"op": "<name>",
"exp": <unix s>}``, HMAC-SHA256 under a key derived from ``PROJECTOR_OPS_SECRET`` (a secret of
its own, which settings refuse to be the API secret). A user token (``v1.``, the API secret) can
therefore never verify as an operator token, whatever its claims; the console recognises one
anyway, to answer 403 ("authenticated, not an operator") instead of 401.

A request presents the token either as ``Authorization: Bearer <token>`` (curl, scripts) or as
the ``ops_session`` cookie, set by ``POST /ops/login`` from the login form: HttpOnly (no script
reads it), ``SameSite=Strict`` (no other site's page sends it), ``Path=/ops/``, ``Secure`` when
served over https.

**CSRF: a signed double-submit token, plus an Origin check.** Every POST (the actions, logout,
login) is refused with 403 when it carries an ``Origin`` (or, lacking one, a ``Referer``) that is
not this server's own origin. A POST authenticated by the cookie must also carry
``X-CSRF-Token`` equal to the ``ops_csrf`` cookie, and both must equal
``HMAC(csrf key, session token)``: a page of another origin can neither read the cookie nor set
a header on a cross-site form post, and a cookie planted by a sibling domain does not carry the
right MAC. A POST authenticated by a bearer header needs no CSRF token: browsers never attach
that header on their own. Actions are POST only; GET never changes anything.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from app.api.tokens import MAX_TOKEN_CHARS, TokenError, TokenSigner, b64url_decode, b64url_encode, derive_key

VERSION: Final = "op1"
SESSION_COOKIE: Final = "ops_session"
CSRF_COOKIE: Final = "ops_csrf"
CSRF_HEADER: Final = "X-CSRF-Token"
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


class OperatorTokenError(ValueError):
    """Not a valid, unexpired operator token (the message says why)."""


class OperatorSigner:
    def __init__(self, secret: str) -> None:
        self._key = derive_key(secret, "operator-token")
        self._csrf_key = derive_key(secret, "operator-csrf")

    def mint(self, operator: str, expires_at_s: int) -> str:
        if not _NAME.fullmatch(operator):
            raise ValueError(f"operator name must be 1-64 of [A-Za-z0-9._@-], got {operator!r}")
        payload = b64url_encode(orjson.dumps({"op": operator, "exp": int(expires_at_s)}))
        signed = f"{VERSION}.{payload}"
        return f"{signed}.{b64url_encode(self._mac(signed))}"

    def verify(self, token: str, now_s: float) -> str:
        """The operator the token names; OperatorTokenError otherwise."""
        if len(token) > MAX_TOKEN_CHARS:
            raise OperatorTokenError("token is too long")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != VERSION or not _B64URL.fullmatch(parts[1]):
            raise OperatorTokenError("not an operator token (expected op1.<payload>.<signature>)")
        try:
            mac = b64url_decode(parts[2])
        except ValueError:
            raise OperatorTokenError("token signature is not base64url") from None
        if not hmac.compare_digest(mac, self._mac(f"{parts[0]}.{parts[1]}")):
            raise OperatorTokenError("token signature is invalid")
        try:
            claims = orjson.loads(b64url_decode(parts[1]))
        except ValueError:
            raise OperatorTokenError("token payload is malformed") from None
        if not isinstance(claims, dict):
            raise OperatorTokenError("token payload is malformed")
        name, exp = claims.get("op"), claims.get("exp")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise OperatorTokenError("token does not name an operator")
        if isinstance(exp, bool) or not isinstance(exp, int):
            raise OperatorTokenError("token has no expiry")
        if now_s >= exp:
            raise OperatorTokenError("token has expired")
        return name

    def csrf_token(self, session_token: str) -> str:
        """The CSRF token bound to one session token (its MAC under a key of its own)."""
        digest = hmac.new(self._csrf_key, session_token.encode(), hashlib.sha256).digest()
        return b64url_encode(digest)

    def _mac(self, signed: str) -> bytes:
        return hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    token: str
    by_cookie: bool  # the CSRF token is required on POST


class Denied(Exception):
    """401 (no or bad credential) or 403 (a user token, or a failed CSRF/Origin check)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Gatekeeper:
    def __init__(self, operators: OperatorSigner, users: TokenSigner | None) -> None:
        self.operators = operators
        self.users = users  # to recognise a user token (403) rather than call it garbage (401)

    def authenticate(self, request: web.Request, now_s: float) -> Operator:
        header = request.headers.get("Authorization")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Denied(401, "Authorization must be 'Bearer <operator token>'")
            return Operator(self.verify(token.strip(), now_s), token.strip(), by_cookie=False)
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            return Operator(self.verify(cookie, now_s), cookie, by_cookie=True)
        raise Denied(401, "an operator token is required (projector token --operator NAME)")

    def verify(self, token: str, now_s: float) -> str:
        """The operator a token names; Denied(403) for a user token, Denied(401) otherwise."""
        try:
            return self.operators.verify(token, now_s)
        except OperatorTokenError as exc:
            if self.users is not None:
                try:
                    self.users.verify(token, now_s)
                except TokenError:
                    pass
                else:
                    raise Denied(403, "a user token cannot open the operator console") from None
            raise Denied(401, str(exc)) from None

    def check_post(self, request: web.Request, operator: Operator | None) -> None:
        """Origin check on every POST; the signed double-submit token when the cookie
        authenticates it."""
        check_origin(request)
        if operator is None or not operator.by_cookie:
            return
        sent = request.headers.get(CSRF_HEADER, "")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        expected = self.operators.csrf_token(operator.token)
        if not sent or not hmac.compare_digest(sent, cookie) or not hmac.compare_digest(sent, expected):
            raise Denied(403, f"CSRF check failed: {CSRF_HEADER} must match the {CSRF_COOKIE} cookie")


def own_origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def check_origin(request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is None:
        referer = request.headers.get("Referer")
        if referer:
            parts = urlsplit(referer)
            origin = f"{parts.scheme}://{parts.netloc}"
    # No Origin and no Referer: not a browser's cross-site post (browsers send Origin on every
    # POST), e.g. curl with a bearer token; the cookie path still needs the CSRF token.
    if origin is not None and origin != own_origin(request):
        raise Denied(403, f"cross-origin POST refused (Origin {origin[:100]!r})")
