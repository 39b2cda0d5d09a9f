"""Micro-benchmark: one flush's projection writes through `RedisProjectionStore` vs a naive writer.

Each repetition writes one flush of N users x K rows to the real Redis three ways, interleaved
(the order rotates per repetition, so a busy machine slows all of them alike):

* `store`     — `RedisProjectionStore.write`: one Lua script per user (version check, rows, badge,
                version, atomically), many users pipelined per round trip. The product.
* `naive`     — one awaited HSET per row and one per user for the meta, no pipelining: a round
                trip per row, and no version check or atomicity at all (it does less work than
                the store and is still the slow one).
* `pipelined` — the naive writer's HSETs, pipelined the same way, without the script: shows what
                the atomic, versioned write costs over plain pipelined HSETs.

Prints rows/s (median over repetitions) per writer and the ratio store/naive. Not a test: run
`.venv/bin/python bench/projection_store_bench.py [--users N --rows K --reps R]` with the servers
up (`make services-up`). Each writer gets its own namespace, deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as redis
from redis.typing import EncodableT, FieldT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore


def make_flush(user_id: int, version: int, rows: int) -> UserFlush:
    """One user's batch of `rows` full docs/contract.md §4 rows (~500 bytes of JSON each)."""
    out: list[dict[str, Any]] = []
    for n in range(rows):
        out.append(
            {
                "user_id": user_id,
                "conversation_id": str(uuid.UUID(int=(user_id << 32) | n)),
                "listed": True,
                "membership": "active",
                "pinned": False,
                "pin_rank": None,
                "archived": False,
                "muted": False,
                "last_activity_id": f"{version:032x}",
                "latest_conversation_seq": version,
                "last_message_id": f"m-{version}",
                "unread_count": n,
                "unread_exact": True,
                "mention_count": 0,
                "mention_first_conversation_seq": None,
                "read_conversation_seq": 0,
                "hidden_before_conversation_seq": 0,
                "deleted_before_conversation_seq": 0,
                "joined_at_conversation_seq": 0,
                "left_at_conversation_seq": None,
                "projection_mailbox_seq": version,
            }
        )
    return UserFlush(user_id, out, Badge(rows, 0, 0), version, version - 1, 0, f"ev-{version}", version)


def meta_mapping(batch: UserFlush) -> dict[FieldT, EncodableT]:
    return {
        "version": batch.projection_mailbox_seq,
        "structure_version": batch.structure_version,
        "total_unread": batch.badge.total_unread,
        "total_mention": batch.badge.total_mention,
        "muted_unread": batch.badge.muted_unread,
    }


async def write_naive(client: redis.Redis, ns: str, batches: list[UserFlush]) -> None:
    for batch in batches:
        key = f"{ns}:rows:{{{batch.user_id}}}"
        for row in batch.rows:
            await client.hset(key, row["conversation_id"], orjson.dumps(row))
        await client.hset(f"{ns}:meta:{{{batch.user_id}}}", mapping=meta_mapping(batch))


async def write_pipelined(client: redis.Redis, ns: str, batches: list[UserFlush], per_trip: int) -> None:
    for start in range(0, len(batches), per_trip):
        pipe = client.pipeline(transaction=False)
        for batch in batches[start : start + per_trip]:
            key = f"{ns}:rows:{{{batch.user_id}}}"
            for row in batch.rows:
                pipe.hset(key, row["conversation_id"], orjson.dumps(row))
            pipe.hset(f"{ns}:meta:{{{batch.user_id}}}", mapping=meta_mapping(batch))
        await pipe.execute()


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=2000, help="users per flush (default 2000)")
    parser.add_argument("--rows", type=int, default=5, help="rows per user per flush (default 5)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--redis-url", default=None, help="default: PROJECTOR_REDIS_URL or the local server")
    args = parser.parse_args(argv)
    url = args.redis_url or Settings.from_env().redis.redis_url
    client = redis.Redis.from_url(url)
    tag = uuid.uuid4().hex[:8]
    store = RedisProjectionStore(client, f"bench-store-{tag}")
    naive_ns, pipelined_ns = f"bench-naive-{tag}", f"bench-pipelined-{tag}"
    total_rows = args.users * args.rows
    times: dict[str, list[float]] = {"store": [], "naive": [], "pipelined": []}
    try:
        await client.ping()
        for rep in range(args.reps):
            # Each repetition is the next flush: a newer version, so the store writes, not refuses.
            batches = [make_flush(u, rep + 1, args.rows) for u in range(args.users)]
            writers: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("store", functools.partial(store.write, batches)),
                ("naive", functools.partial(write_naive, client, naive_ns, batches)),
                ("pipelined", functools.partial(write_pipelined, client, pipelined_ns, batches, 256)),
            ]
            shift = rep % len(writers)
            for name, call in writers[shift:] + writers[:shift]:
                times[name].append(await timed(call))
        # The store must really have written every user at the last version.
        assert await store.versions(list(range(args.users))) == [args.reps] * args.users
    finally:
        await store.delete_all()
        for ns in (naive_ns, pipelined_ns):
            doomed = list({k async for k in client.scan_iter(match=f"{ns}:*", count=1000)})
            for start in range(0, len(doomed), 1000):
                await client.unlink(*doomed[start : start + 1000])
        await client.aclose()

    print(f"one flush = {args.users} users x {args.rows} rows = {total_rows} rows; {args.reps} reps; {url}")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, seconds in medians.items():
        print(f"  {name:<10} {seconds * 1000:9.1f} ms  {total_rows / seconds:12,.0f} rows/s")
    print(f"  ratio store/naive (rows/s): {medians['naive'] / medians['store']:.1f}x")
    print(f"  ratio store/pipelined (rows/s): {medians['pipelined'] / medians['store']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
