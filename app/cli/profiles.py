"""`projector profiles load FILE.jsonl`: load public member profiles (names, avatars) into
Cassandra's ``member_profiles`` table, which ``POST /api/v1/users/profiles`` serves to the member
store (app/stores/cassandra_profiles.py). One JSON object a line:
``{"user_id": "42", "display_name": "Zoë", "avatar_url": "https://cdn.example/42.png"}``
(``-`` reads standard input). The whole file is checked before anything is written: a bad line
is reported with its number and nothing is loaded. A later load replaces a user's row whole.

`projector profiles show USER_ID...`: print the stored profiles (JSON lines), to check a load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app.settings import CassandraSettings, Settings

if TYPE_CHECKING:
    from app.members.model import Profile
    from app.stores.cassandra_profiles import ProfileRow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    load = sub.add_parser("load", help="load profiles from a JSON-lines file ('-' = stdin)")
    load.add_argument("file", help="JSON lines: user_id, display_name, avatar_url")
    show = sub.add_parser("show", help="print the stored profiles of 1 to 50 users")
    show.add_argument("user_ids", nargs="+", help="u64 user ids")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from app.members.model import BY_IDS_MAX, parse_user_id

    if args.action == "load":
        try:
            if args.file == "-":
                rows = read_rows(sys.stdin)
            else:
                with Path(args.file).open(encoding="utf-8") as handle:
                    rows = read_rows(handle)
        except (OSError, ValueError) as exc:
            print(f"projector profiles load: {exc}", file=sys.stderr)
            return 2
        written = asyncio.run(_load(settings.cassandra, rows))
        table = f"{settings.cassandra.cassandra_keyspace}.member_profiles"
        print(f"projector profiles load: {written} profile(s) written to {table}")
        return 0
    try:
        ids = [parse_user_id(text) for text in args.user_ids]
    except ValueError as exc:
        print(f"projector profiles show: {exc}", file=sys.stderr)
        return 2
    if len(set(ids)) > BY_IDS_MAX:
        print(f"projector profiles show: at most {BY_IDS_MAX} users", file=sys.stderr)
        return 2
    found = asyncio.run(_show(settings.cassandra, ids))
    for user_id in ids:
        profile = found.get(user_id)
        line: dict[str, object] = {"user_id": str(user_id)}
        if profile is None:
            line["missing"] = True
        else:
            line.update(display_name=profile.display_name, avatar_url=profile.avatar_url)
        print(json.dumps(line, ensure_ascii=False))
    return 0


def read_rows(handle: TextIO) -> list[ProfileRow]:
    """Every line checked (ValueError naming the first bad line) before anything is written."""
    from app.stores.cassandra_profiles import parse_profile_line

    return [parse_profile_line(line, n) for n, line in enumerate(handle, 1) if line.strip()]


async def _load(cassandra: CassandraSettings, rows: list[ProfileRow]) -> int:
    from app.stores.cassandra_profiles import CassandraProfileStore
    from app.stores.cassandra_session import open_cluster

    cluster, session = await asyncio.to_thread(open_cluster, cassandra, require_keyspace=True)
    try:
        return await CassandraProfileStore(session, cassandra.cassandra_keyspace).put(
            rows, int(time.time() * 1000)
        )
    finally:
        await asyncio.to_thread(cluster.shutdown)


async def _show(cassandra: CassandraSettings, ids: list[int]) -> dict[int, Profile]:
    from app.stores.cassandra_profiles import CassandraProfileStore
    from app.stores.cassandra_session import open_cluster

    cluster, session = await asyncio.to_thread(open_cluster, cassandra, require_keyspace=True)
    try:
        return await CassandraProfileStore(session, cassandra.cassandra_keyspace).profiles(ids)
    finally:
        await asyncio.to_thread(cluster.shutdown)
