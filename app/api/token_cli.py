"""`projector token USER_ID [--ttl SECONDS]`: mint a bearer token for the query API.

Signed with PROJECTOR_API_SECRET (the API must run with the same value); printed alone on
stdout so `TOKEN=$(projector token 42)` works.
"""

from __future__ import annotations

import argparse
import sys
import time

from app.settings import Settings

U64_MAX = (1 << 64) - 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("user_id", help="the user the token names (u64)")
    parser.add_argument(
        "--ttl", type=int, help="seconds until it expires (default: PROJECTOR_API_TOKEN_TTL_S)"
    )


def run(args: argparse.Namespace) -> int:
    from app.api.tokens import TokenSigner

    settings = Settings.from_env()  # a SettingsError is reported by app.cli.main
    if not settings.api_secret:
        print("projector token: PROJECTOR_API_SECRET is not set (the API's signing key)", file=sys.stderr)
        return 2
    text = str(args.user_id)
    if not text.isascii() or not text.isdigit() or int(text) > U64_MAX:
        print(f"projector token: USER_ID must be an integer in [0, 2^64), got {text!r}", file=sys.stderr)
        return 2
    ttl = settings.api_token_ttl_s if args.ttl is None else args.ttl
    if ttl < 1:
        print(f"projector token: --ttl must be >= 1 second, got {ttl}", file=sys.stderr)
        return 2
    print(TokenSigner(settings.api_secret).mint(int(text), int(time.time()) + ttl))
    return 0
