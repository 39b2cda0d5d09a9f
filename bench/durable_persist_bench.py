"""One persist's changelog round trips and time, tables.durable against the four-step commit
(issue 31), on the real Kafka broker, side by side in one run.

A persist here is a flush cycle's worth of state: USERS user records, ROWS_PER_USER row records
each, a few waiting entries and the partition-level record (record sizes as the worker's msgpack
records: ~260 bytes a row, ~180 a user).

* durable: `Checkpointer.persist` — one append (one producer batch: the data then the
  checkpoint), one acknowledgement, then the local RocksDB write batch;
* four steps: the same records over four changelog topics (intent; rows and waiting; users;
  released and gate), each step sent and acknowledged before the next (app/worker/ports.py
  `commit_step`), without any local write (so the comparison favours it).

Both use the same producer settings (acks=all, idempotent, linger 0). The repetitions alternate
the two, so a busy machine slows both alike. Topics are made for the run and deleted after.

    PYTHONPATH=. python bench/durable_persist_bench.py [--users 450] [--rows-per-user 2] [--reps 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from tables.durable.checkpointer import Checkpointer, PersistBatch
from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic, input_identity
from tables.durable.records import WireRecord
from tables.durable.store import PartitionStore

ROW_BYTES = 260
USER_BYTES = 180


def conversation(index: int) -> str:
    h = f"{index:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_batch(users: int, rows_per_user: int, round_: int) -> PersistBatch:
    tag = round_.to_bytes(4, "big")
    rows = {
        (1_000 + u, conversation(u * rows_per_user + r)): tag + os.urandom(ROW_BYTES - 4)
        for u in range(users)
        for r in range(rows_per_user)
    }
    return PersistBatch(
        input_next_offset=(round_ + 1) * 4_000,
        rows=rows,
        users={1_000 + u: tag + os.urandom(USER_BYTES - 4) for u in range(users)},
        waiting={(1_000 + u, round_ * 10 + u): b"w" * 200 for u in range(5)},
        meta=os.urandom(300),
    )


def four_steps(batch: PersistBatch) -> list[list[WireRecord]]:
    """The same records as the four-step commit delivers them, one list per step."""
    none = ()
    intent = [WireRecord(b"gate-intent", os.urandom(200), none)]
    rows = [WireRecord(b"r%d%s" % (u, c.encode()), v, none) for (u, c), v in batch.rows.items()]
    rows += [WireRecord(b"p%d.%d" % k, v, none) for k, v in batch.waiting.items()]
    users = [WireRecord(b"u%d" % u, v, none) for u, v in batch.users.items()]
    gate = [WireRecord(b"gate", batch.meta, none)]
    return [intent, rows, users, gate]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("PROJECTOR_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--users", type=int, default=450)
    parser.add_argument("--rows-per-user", type=int, default=2)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()

    prefix = f"bench-durable-{uuid.uuid4().hex[:8]}"
    durable_topic = f"{prefix}-changelog"
    step_topics = [f"{prefix}-{name}" for name in ("gates-intent", "rows", "users", "gates")]
    input_topic = f"{prefix}-mailbox"
    for topic in (durable_topic, *step_topics, input_topic):
        await ensure_changelog_topic(args.bootstrap, topic, partitions=1, min_compaction_lag_ms=3_600_000)
    durable = KafkaChangelog(args.bootstrap, durable_topic)
    steps = [KafkaChangelog(args.bootstrap, topic) for topic in step_topics]
    folder = Path(tempfile.mkdtemp(prefix="durable-bench-"))
    store = PartitionStore.open(folder / "p0")
    try:
        for changelog in (durable, *steps):
            await changelog.start()
        checkpointer = Checkpointer(store, durable, 0, await input_identity(args.bootstrap, input_topic))
        await checkpointer.claim()
        new_ms: list[float] = []
        old_ms: list[float] = []
        new_trips: list[int] = []
        records = 0
        for rep in range(-3, args.reps):  # 3 warm-up rounds, not counted
            batch = make_batch(args.users, args.rows_per_user, rep + 3)
            records = len(batch.rows) + len(batch.users) + len(batch.waiting) + 1  # + the checkpoint
            order = ("new", "old") if rep % 2 == 0 else ("old", "new")
            for which in order:
                started = time.perf_counter()
                if which == "new":
                    trips = checkpointer.round_trips
                    await checkpointer.persist(batch)
                    elapsed = time.perf_counter() - started
                    if rep >= 0:
                        new_ms.append(elapsed * 1000)
                        new_trips.append(checkpointer.round_trips - trips)
                else:
                    for changelog, step in zip(steps, four_steps(batch), strict=True):
                        await changelog.append(0, step)  # acknowledged before the next step
                    if rep >= 0:
                        old_ms.append((time.perf_counter() - started) * 1000)
    finally:
        for changelog in (durable, *steps):
            await changelog.stop()
        store.close()
        PartitionStore.destroy(folder)
        admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([durable_topic, *step_topics, input_topic])
        finally:
            await admin.close()

    def p95(values: list[float]) -> float:
        return sorted(values)[max(0, round(0.95 * len(values)) - 1)]

    print(f"persist of {args.users} users x {args.rows_per_user} rows ({records} records), {args.reps} reps")
    print(f"{'':34}{'round trips':>12}{'median ms':>11}{'p95 ms':>9}{'min ms':>9}")
    print(
        f"{'durable (one append + RocksDB)':34}{statistics.median(new_trips):>12.0f}"
        f"{statistics.median(new_ms):>11.2f}{p95(new_ms):>9.2f}{min(new_ms):>9.2f}"
    )
    print(
        f"{'four acknowledged steps':34}{4:>12}"
        f"{statistics.median(old_ms):>11.2f}{p95(old_ms):>9.2f}{min(old_ms):>9.2f}"
    )
    print(f"median ratio four steps / durable: {statistics.median(old_ms) / statistics.median(new_ms):.2f}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
