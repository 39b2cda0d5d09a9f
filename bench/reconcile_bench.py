"""What one reconcile on login costs (docs/contract.md §10): one user with N conversations, each with
a few unread messages, projected by the real WorkerCore into the real Redis projection store,
its messages in the real Cassandra MessageStore (a private keyspace and namespace on the local
servers, dropped afterwards). Then, per size, the worker's reconcile of that user
(app/worker/reconcile.py: every row read, the ones with an unread window recounted by one bounded
Cassandra read each, compared with the store under the flush lock, corrected in one atomic
script), timed end to end:

* clean: nothing drifted (the common login: all the reads, no write, no frame);
* drifted: 1 % of the rows drifted in the store and 1 % deleted from it (corrected and filled in
  one correction, one frame).

    python -m bench.reconcile_bench [--sizes 100,1000,5000] [--reps 5] [--unread-share 1.0] [--json out.json]

`--unread-share`: the share of the conversations left with unread messages (the rest are read to
the end: nothing to recount, only compared); 1.0, every row recounted, is the worst case.

Prints ms per reconcile (median, min) and µs per row; the MessageStore reads dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from app.cli.bootstrap import ensure_cassandra_schema
from app.domain.projector import ProjectorConfig
from app.domain.reconcile import Outcome, ReconcileRequest
from app.settings import Settings
from app.stores.cassandra_messages import CassandraMessageStore, ConversationHead, NewMessage
from app.stores.cassandra_session import open_cluster
from app.stores.memory_tables import MemoryTables
from app.stores.redis_projection import RedisProjectionStore
from app.worker.core import WorkerConfig, WorkerCore
from app.worker.ports import RawRecord
from app.worker.reconcile import ReconcileConfig, ReconcileRunner

USER = 424242
SENDER = 99
UNREAD = 3  # messages per conversation, all unread


class NoFrames:
    """The Outbox port: frames counted, not sent (Kafka is not what is measured)."""

    def __init__(self) -> None:
        self.sent = 0

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        pass

    async def frames(
        self, deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        self.sent += len(deltas) + len(badges)

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        pass


def stream(
    conversations: list[str], unread_share: float
) -> tuple[list[bytes], list[NewMessage], list[ConversationHead]]:
    """Every conversation gets UNREAD messages; all but the first `unread_share` of them are then
    read to the end (nothing to recount)."""
    lines: list[bytes] = []
    messages: list[NewMessage] = []
    heads: list[ConversationHead] = []
    seq, ts = 0, 1_700_000_000_000
    for conv in conversations:
        for cseq in range(1, UNREAD + 1):
            seq += 1
            ts += 1
            activity = f"{ts:032x}"
            mid = f"m-{conv[:8]}-{cseq}"
            lines.append(
                orjson.dumps(
                    {
                        "type": "message",
                        "mailbox_seq": seq,
                        "lane": 0,
                        "ts": ts,
                        "event_id": f"ev-{seq}",
                        "user_id": USER,
                        "conversation_id": conv,
                        "conversation_seq": cseq,
                        "message_id": mid,
                        "activity_id": activity,
                        "sender_id": SENDER,
                        "created_at": ts,
                        "counts_unread": True,
                        "mention": False,
                    }
                )
            )
            messages.append(NewMessage(conv, cseq, mid, activity, SENDER, ts))
        heads.append(ConversationHead(conv, UNREAD, messages[-1].message_id, messages[-1].activity_id))
    unread = round(len(conversations) * unread_share)
    for conv in conversations[unread:]:
        seq += 1
        ts += 1
        lines.append(
            orjson.dumps(
                {
                    "type": "read",
                    "mailbox_seq": seq,
                    "lane": 0,
                    "ts": ts,
                    "event_id": f"ev-{seq}",
                    "user_id": USER,
                    "conversation_id": conv,
                    "read_conversation_seq": UNREAD,
                }
            )
        )
    lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": ts + 1}))
    return lines, messages, heads


@dataclasses.dataclass
class Measured:
    rows: int
    case: str
    ms: list[float]
    recounted: int
    corrected: int
    filled: int

    def summary(self) -> dict[str, Any]:
        median = statistics.median(self.ms)
        return {
            "rows": self.rows,
            "case": self.case,
            "median_ms": round(median, 2),
            "min_ms": round(min(self.ms), 2),
            "us_per_row": round(median * 1000 / self.rows, 1),
            "recounted": self.recounted,
            "corrected": self.corrected,
            "filled": self.filled,
        }


async def measure(
    settings: Settings, session: Any, size: int, reps: int, unread_share: float
) -> list[Measured]:
    conversations = [str(uuid.UUID(int=(size << 64) + i, version=4)) for i in range(size)]
    lines, messages, heads = stream(conversations, unread_share)
    messages_store = CassandraMessageStore(session, settings.cassandra.cassandra_keyspace)
    await asyncio.to_thread(messages_store.put_messages, messages)
    await asyncio.to_thread(messages_store.update_heads, heads)
    projections = RedisProjectionStore.from_settings(
        settings.redis, f"{settings.redis.projection_namespace}-{size}"
    )
    outbox = NoFrames()
    core = WorkerCore(
        WorkerConfig(lanes=1, projector=ProjectorConfig(window_ms=100, max_dirty_rows=1_000_000)),
        message_store=messages_store,
        projection_store=projections,
        tables=MemoryTables(),
        outbox=outbox,
    )
    try:
        await core.on_records([RawRecord("mailbox-tail", 0, i, b"k", raw) for i, raw in enumerate(lines)])
        await core.flush_all()
        runner = ReconcileRunner(core, ReconcileConfig(max_age_ms=3_600_000, limit=200), lambda p: True)
        out = []
        for case in ("clean", "drifted"):
            timings: list[float] = []
            last = None
            for _ in range(reps):
                if case == "drifted":
                    stored = await projections.load(USER)
                    hit = max(1, size // 100)
                    wrong = conversations[:hit]
                    gone = conversations[hit : 2 * hit]
                    async with projections.client.pipeline(transaction=True) as drift:
                        for cid in wrong:
                            drift.hset(
                                projections.rows_key(USER),
                                cid,
                                orjson.dumps({**stored.rows[cid], "unread_count": 77}),
                            )
                        drift.hdel(projections.rows_key(USER), *gone)
                        await drift.execute()
                request = ReconcileRequest(USER, time.time_ns() // 1_000_000, "login")
                started = time.perf_counter()
                last = await runner.handle(0, request)
                timings.append((time.perf_counter() - started) * 1000)
                want = Outcome.CLEAN if case == "clean" else Outcome.CORRECTED
                if last.outcome is not want:
                    raise AssertionError(f"{size} rows, {case}: {last}")
            assert last is not None
            out.append(Measured(size, case, timings, last.recounted, last.corrected, last.filled))
        return out
    finally:
        await projections.delete_all()
        await projections.aclose()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--unread-share",
        type=float,
        default=1.0,
        help="share of the conversations left unread (1.0: the worst case)",
    )
    args = parser.parse_args(argv)
    name = f"rcbench{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env().replace(cassandra_keyspace=name, projection_namespace=name)
    await asyncio.to_thread(ensure_cassandra_schema, settings.cassandra)
    cluster, session = open_cluster(settings.cassandra)
    results: list[dict[str, Any]] = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for measured in await measure(settings, session, size, args.reps, args.unread_share):
                summary = measured.summary()
                results.append(summary)
                print(
                    f"{summary['rows']:>6} rows {summary['case']:<8} median {summary['median_ms']:>9.2f} ms "
                    f"(min {summary['min_ms']:.2f})  {summary['us_per_row']:>7.1f} us/row  "
                    f"recounted {summary['recounted']}, corrected {summary['corrected']}, "
                    f"filled {summary['filled']}",
                    flush=True,
                )
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
        cluster.shutdown()
    if args.json:
        with open(args.json, "wb") as out:
            out.write(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
