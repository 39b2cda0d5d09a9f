"""The member cache's rules: expiry, format version, signature, whitelist, capacity, failures."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.members.cache import DAY_MS, FIELDS, CacheKey, CacheLimits, SqliteMemberCache, _decode, _encode
from app.members.model import Member, stats_known
from app.members.testing import FakeClock

KEY = CacheKey("env", "42", "group-a")
SIGNING_KEY = b"runtime-key-0123456789"


def roster(n: int, name_len: int = 8) -> list[Member]:
    return [
        Member(
            user_id=2**64 - 1 - i,  # u64 ids beyond SQLite's int64
            display_name="n" * name_len,
            avatar_url="https://a/" + str(i),
            record_count=i,
            mention_count=0,
            stats_known=True,
            presented=True,
        )
        for i in range(n)
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cache_at(tmp_path: Path, clock: FakeClock, key: bytes = SIGNING_KEY, **limits: int) -> SqliteMemberCache:
    return SqliteMemberCache(tmp_path / "c.sqlite", key, clock_ms=clock.now_ms, limits=CacheLimits(**limits))


async def test_round_trip_keeps_whitelisted_fields_and_u64_ids(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    members = roster(3)
    assert await cache.store(KEY, members)
    loaded = await cache.load(KEY)
    assert loaded is not None and loaded.cached_at_ms == clock.now_ms()
    assert sorted(loaded.members, key=lambda m: m.user_id) == sorted(members, key=lambda m: m.user_id)
    await cache.close()


async def test_expired_after_14_days(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    await cache.store(KEY, roster(2))
    await clock.advance(14 * DAY_MS / 1000)
    assert await cache.load(KEY) is not None  # exactly 14 days: still valid
    await clock.advance(1)
    assert await cache.load(KEY) is None
    assert await cache.usage() == (0, 0)  # a useless roster is deleted, not kept
    await cache.close()


async def test_other_format_version_is_a_miss(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    await cache.store(KEY, roster(2))
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        db.execute("UPDATE member_rosters SET format_version = 2")
    assert await cache.load(KEY) is None
    await cache.close()


async def test_signature_binds_runtime_key_account_and_group(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    await cache.store(KEY, roster(2))
    await cache.close()
    other_key = cache_at(tmp_path, clock, key=b"another-runtime-key-xx")
    assert await other_key.load(KEY) is None  # written under another runtime key
    await other_key.close()

    cache = cache_at(tmp_path, clock)
    await cache.store(KEY, roster(2))
    with sqlite3.connect(tmp_path / "c.sqlite") as db:  # copy the roster to another account
        for table in ("member_rosters", "member_rows"):
            db.execute(f"UPDATE {table} SET account = '43'")  # test-only, fixed names
    assert await cache.load(CacheKey("env", "43", "group-a")) is None
    await cache.close()


async def test_edited_payload_is_a_miss(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    await cache.store(KEY, roster(2))
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        payload = db.execute("SELECT payload FROM member_rows WHERE position = 0").fetchone()[0]
        edited = payload.replace('"member"', '"owner"')  # same length, different role
        db.execute("UPDATE member_rows SET payload = ? WHERE position = 0", (edited,))
    assert await cache.load(KEY) is None
    await cache.close()


async def test_corrupt_database_file_is_a_miss(tmp_path: Path, clock: FakeClock) -> None:
    (tmp_path / "c.sqlite").write_bytes(b"this is not a database" * 100)
    cache = cache_at(tmp_path, clock)
    assert await cache.load(KEY) is None
    assert not await cache.store(KEY, roster(1))  # a write failure is reported, not raised
    await cache.close()


def test_only_whitelisted_fields_are_accepted() -> None:
    payload = json.loads(_encode(roster(1)[0]))
    assert set(payload) == set(FIELDS)
    assert _decode(json.dumps(payload)) is not None
    assert _decode(json.dumps({**payload, "can_remove_members": True})) is None
    missing = dict(payload)
    del missing["remark"]
    assert _decode(json.dumps(missing)) is None
    assert _decode(json.dumps({**payload, "role": "superuser"})) is None
    assert _decode("{not json") is None


def test_stats_known_only_for_two_non_negative_safe_integers() -> None:
    assert stats_known(0, 0)
    assert stats_known(2**53 - 1, 3)
    for bad in (None, -1, 2**53, 1.0, True, "3"):
        assert not stats_known(bad, 1)
        assert not stats_known(1, bad)
    payload = json.loads(_encode(roster(1)[0]))
    member = _decode(json.dumps({**payload, "record_count": -5}))
    assert member is not None and not member.stats_known and member.record_count is None


async def test_group_over_member_or_byte_limit_is_not_cached(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock, max_group_members=10, max_group_bytes=10_000)
    assert await cache.store(KEY, roster(10))
    assert not await cache.store(KEY, roster(11))  # never a truncated roster...
    assert await cache.load(KEY) is None  # ...and the older copy is known to be stale
    assert not await cache.store(KEY, roster(5, name_len=3000))  # 5 rows > 10,000 bytes
    assert await cache.usage() == (0, 0)
    await cache.close()


async def test_oldest_whole_groups_are_evicted_over_count_and_bytes(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock, max_groups=3, max_total_bytes=10**9)
    for i in range(5):
        await cache.store(CacheKey("env", "42", f"g{i}"), roster(4))
        await clock.advance(1)
    assert await cache.usage() == (3, (await cache.usage())[1])
    assert await cache.load(CacheKey("env", "42", "g0")) is None
    assert await cache.load(CacheKey("env", "42", "g1")) is None
    kept = await cache.load(CacheKey("env", "42", "g4"))
    assert kept is not None and len(kept.members) == 4  # whole, not truncated
    await cache.close()

    by_bytes = SqliteMemberCache(
        tmp_path / "b.sqlite",
        SIGNING_KEY,
        clock_ms=clock.now_ms,
        limits=CacheLimits(max_groups=100, max_total_bytes=5_000),
    )
    for i in range(4):
        await by_bytes.store(CacheKey("env", "42", f"g{i}"), roster(10))  # ~1.6 KB each
        await clock.advance(1)
    count, total = await by_bytes.usage()
    assert total <= 5_000 and count < 4
    assert await by_bytes.load(CacheKey("env", "42", "g3")) is not None
    assert await by_bytes.load(CacheKey("env", "42", "g0")) is None
    await by_bytes.close()


async def test_capacity_is_checked_from_headers_without_payloads(tmp_path: Path, clock: FakeClock) -> None:
    cache = cache_at(tmp_path, clock)
    members = roster(7)
    await cache.store(KEY, members)
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        rows_total = db.execute("SELECT SUM(payload_bytes) FROM member_rows").fetchone()[0]
        header_total = db.execute("SELECT payload_bytes FROM member_rosters").fetchone()[0]
    assert rows_total == header_total == sum(len(_encode(m).encode()) for m in members)
    assert (await cache.usage())[1] == header_total
    await cache.close()
