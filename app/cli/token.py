"""`projector token USER_ID [--ttl SECONDS]`: mint a bearer token for the query API.

Signed with PROJECTOR_API_SECRET (the API must run with the same value); printed alone on
stdout so `TOKEN=$(projector token 42)` works.

`projector token --operator NAME [--ttl SECONDS]`: an operator token for the console under
/ops/ (issue 17), signed with PROJECTOR_OPS_SECRET instead (app/api/ops/auth.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from app.settings import Settings

U64_MAX = (1 << 64) - 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "user_id", help="the user the token names (u64); with --operator, the operator's name"
    )
    parser.add_argument(
        "--operator",
        action="store_true",
        help="mint an operator-console token (PROJECTOR_OPS_SECRET; default ttl PROJECTOR_OPS_TOKEN_TTL_S)",
    )
    parser.add_argument(
        "--ttl", type=int, help="seconds until it expires (default: PROJECTOR_API_TOKEN_TTL_S)"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    from app.api.tokens import TokenSigner

    if args.operator:
        return _operator(settings, args)
    if not settings.api.api_secret:
        print("projector token: PROJECTOR_API_SECRET is not set (the API's signing key)", file=sys.stderr)
        return 2
    text = str(args.user_id)
    if not text.isascii() or not text.isdigit() or int(text) > U64_MAX:
        print(f"projector token: USER_ID must be an integer in [0, 2^64), got {text!r}", file=sys.stderr)
        return 2
    ttl = settings.api.api_token_ttl_s if args.ttl is None else args.ttl
    if ttl < 1:
        print(f"projector token: --ttl must be >= 1 second, got {ttl}", file=sys.stderr)
        return 2
    print(TokenSigner(settings.api.api_secret).mint(int(text), int(time.time()) + ttl))
    return 0


def _operator(settings: Settings, args: argparse.Namespace) -> int:
    from app.api.ops.auth import OperatorSigner

    if not settings.ops.ops_secret:
        print("projector token: PROJECTOR_OPS_SECRET is not set (the console's signing key)", file=sys.stderr)
        return 2
    ttl = settings.ops.ops_token_ttl_s if args.ttl is None else args.ttl
    if ttl < 1:
        print(f"projector token: --ttl must be >= 1 second, got {ttl}", file=sys.stderr)
        return 2
    try:
        print(OperatorSigner(settings.ops.ops_secret).mint(str(args.user_id), int(time.time()) + ttl))
    except ValueError as exc:
        print(f"projector token: {exc}", file=sys.stderr)
        return 2
    return 0
