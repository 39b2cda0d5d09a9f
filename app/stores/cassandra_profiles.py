"""Public member profiles (names, avatars) in Cassandra: the table ``member_profiles``
(app/stores/schema.py), the real :class:`~app.members.source.ProfileSource` behind
``POST /api/v1/users/profiles`` (seed 004: "公开资料批量接口").

The project owns the table: the chat backend (or an operator) loads it with
``projector profiles load FILE.jsonl`` (app/cli/profiles.py), one JSON object a line:
``{"user_id": "42", "display_name": "Zoë", "avatar_url": "https://…"}``. A batch read is one
single-table ``user_id IN (...)`` query of 1 to 50 keys (the partition key: Cassandra asks each
replica set once per key; no scan). A user without a row is simply absent from the answer, which
the member store treats as "this profile failed": it keeps the old avatar and never invents one.
Remarks (备注) are the viewer's own, not public: they are not kept here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from app.members.model import BY_IDS_MAX, Profile
from app.stores.cassandra_exec import checked_keyspace, one_page, prepare_statement
from app.stores.schema import check_user_id

MAX_NAME_CHARS: Final = 256
MAX_URL_CHARS: Final = 2048


@dataclass(frozen=True, slots=True)
class ProfileRow:
    user_id: int
    display_name: str | None
    avatar_url: str | None

    def __post_init__(self) -> None:
        check_user_id(self.user_id)
        if self.display_name is not None and len(self.display_name) > MAX_NAME_CHARS:
            raise ValueError(f"user {self.user_id}: display_name over {MAX_NAME_CHARS} characters")
        if self.avatar_url is not None:
            if len(self.avatar_url) > MAX_URL_CHARS:
                raise ValueError(f"user {self.user_id}: avatar_url over {MAX_URL_CHARS} characters")
            if not self.avatar_url.startswith(("https://", "http://")):
                raise ValueError(f"user {self.user_id}: avatar_url must be an http(s) URL")


class CassandraProfileStore:
    """Batch reads (the :class:`ProfileSource` port) and writes of ``member_profiles``."""

    def __init__(self, session: Any, keyspace: str) -> None:

        self.session = session
        ks = checked_keyspace(keyspace)
        # Only the checked keyspace is spliced in; every value is a bind marker.
        read = "SELECT user_id, display_name, avatar_url FROM {ks}.member_profiles WHERE user_id IN ?"
        write = (
            "INSERT INTO {ks}.member_profiles (user_id, display_name, avatar_url, updated_at)"
            " VALUES (?, ?, ?, ?)"
        )
        self._read = prepare_statement(session, ks, "profile", read)
        self._write = prepare_statement(session, ks, "profile", write)

    async def profiles(self, user_ids: Sequence[int]) -> dict[int, Profile]:
        ids = sorted({check_user_id(u) for u in user_ids})
        if not ids:
            return {}
        if len(ids) > BY_IDS_MAX:
            raise ValueError(f"at most {BY_IDS_MAX} profiles a batch, got {len(ids)}")
        rows = await self._execute(self._read, (ids,), "profiles")
        return {
            int(row.user_id): Profile(display_name=row.display_name, avatar_url=row.avatar_url)
            for row in rows
        }

    async def put(self, rows: Iterable[ProfileRow], updated_at_ms: int, *, concurrency: int = 32) -> int:
        """Upsert profiles (a later load replaces a row whole); returns how many were written."""
        slots = asyncio.Semaphore(concurrency)

        async def one(row: ProfileRow) -> None:
            async with slots:
                params = (row.user_id, row.display_name, row.avatar_url, updated_at_ms)
                await self._execute(self._write, params, "profile write")

        todo = list(rows)
        await asyncio.gather(*(one(row) for row in todo))
        return len(todo)

    async def _execute(self, statement: Any, params: tuple[Any, ...], what: str) -> list[Any]:
        return await one_page(self.session, statement, params, what)


def parse_profile_line(line: str, number: int) -> ProfileRow:
    """One line of a profile load file; ValueError naming the line when it is not one."""
    import json

    try:
        item = json.loads(line)
    except ValueError:
        raise ValueError(f"line {number}: not JSON") from None
    if not isinstance(item, dict):
        raise ValueError(f"line {number}: not a JSON object")
    unknown = sorted(set(item) - {"user_id", "display_name", "avatar_url"})
    if unknown:
        raise ValueError(f"line {number}: unknown field(s) {unknown}")
    from app.members.model import parse_user_id

    try:
        user_id = parse_user_id(item.get("user_id"))
    except ValueError as exc:
        raise ValueError(f"line {number}: {exc}") from None
    name, avatar = item.get("display_name"), item.get("avatar_url")
    for field, value in (("display_name", name), ("avatar_url", avatar)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"line {number}: {field} must be a string or null")
    try:
        return ProfileRow(user_id, name, avatar)
    except ValueError as exc:
        raise ValueError(f"line {number}: {exc}") from None
