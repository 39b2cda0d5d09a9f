"""One persist's changelog round trips and time, tables.durable against the four-step commit
(issue 31), on the real Kafka broker, side by side in one run.

A persist here is a flush cycle's worth of state: USERS user records, ROWS_PER_USER row records
each, a few waiting entries and the partition-level record (record sizes as the worker's msgpack
records: ~260 bytes a row, ~180 a user).

* durable: `Checkpointer.persist` — one append (one producer batch: the data then the
  checkpoint), one acknowledgement, then the local RocksDB write batch;
* four steps: the same records (the worker's keys, no headers) over four changelog topics
  (intent; rows and waiting; users; released and gate), each step sent and acknowledged before
  the next (app/worker/ports.py `commit_step`), then one RocksDB write batch per table.

Both use the same producer settings (acks=all, idempotent, linger 0). The repetitions alternate
the two, so a busy machine slows both alike. Topics are made for the run and deleted after.

    PYTHONPATH=. python bench/durable_persist_bench.py [--users 450] [--rows-per-user 2] [--reps 40]
        [--link-latency-ms 2]   # also behind a slower link: a private broker behind toxiproxy
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from rocksdict import Options, Rdict, WriteBatch

from app.worker.ports import CHECKPOINT_KEY, pending_key, row_key, user_key
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
    """The same records as the four-step commit delivers them (the worker's keys), one list per
    step."""
    none = ()
    intent = [WireRecord(b"gate-intent", batch.meta[:200], none)]
    rows = [WireRecord(row_key(u, c), v, none) for (u, c), v in batch.rows.items()]
    rows += [WireRecord(pending_key(u, s), v, none) for (u, s), v in batch.waiting.items()]
    users = [WireRecord(user_key(u), v, none) for u, v in batch.users.items()]
    gate = [WireRecord(CHECKPOINT_KEY, batch.meta, none)]
    return [intent, rows, users, gate]


class FourStepTables:
    """The four-step commit's local side: a RocksDB database per table, one write batch per
    table after delivery (as faust's changelog apply and app/stores/rocks_tables.py write)."""

    def __init__(self, folder: Path) -> None:
        options = Options(raw_mode=True)
        self.dbs = [Rdict(str(folder / name), options) for name in ("gates", "rows", "users", "pending")]

    def write(self, steps: list[list[WireRecord]]) -> None:
        for db, records in zip(self.dbs, steps, strict=True):
            batch = WriteBatch(raw_mode=True)
            for record in records:
                batch.put(record.key, record.value or b"")
            db.write(batch)

    def close(self) -> None:
        for db in self.dbs:
            db.close()


@dataclass
class Figures:
    records: int
    durable_ms: list[float]
    durable_trips: list[int]
    steps_ms: list[float]


async def measure(bootstrap: str, users: int, rows_per_user: int, reps: int) -> Figures:
    prefix = f"bench-durable-{uuid.uuid4().hex[:8]}"
    durable_topic = f"{prefix}-changelog"
    step_topics = [f"{prefix}-{name}" for name in ("gates-intent", "rows", "users", "gates")]
    input_topic = f"{prefix}-mailbox"
    for topic in (durable_topic, *step_topics, input_topic):
        await ensure_changelog_topic(bootstrap, topic, partitions=1, min_compaction_lag_ms=3_600_000)
    durable = KafkaChangelog(bootstrap, durable_topic)
    steps = [KafkaChangelog(bootstrap, topic) for topic in step_topics]
    folder = Path(tempfile.mkdtemp(prefix="durable-bench-"))
    store = PartitionStore.open(folder / "p0")
    tables = FourStepTables(folder)
    figures = Figures(0, [], [], [])
    try:
        for changelog in (durable, *steps):
            await changelog.start()
        checkpointer = Checkpointer(store, durable, 0, await input_identity(bootstrap, input_topic))
        await checkpointer.claim()
        for rep in range(-3, reps):  # 3 warm-up rounds, not counted
            batch = make_batch(users, rows_per_user, rep + 3)
            figures.records = len(batch.rows) + len(batch.users) + len(batch.waiting) + 1  # + the checkpoint
            for which in ("new", "old") if rep % 2 == 0 else ("old", "new"):
                started = time.perf_counter()
                if which == "new":
                    trips = checkpointer.round_trips
                    await checkpointer.persist(batch)
                    if rep >= 0:
                        figures.durable_ms.append((time.perf_counter() - started) * 1000)
                        figures.durable_trips.append(checkpointer.round_trips - trips)
                else:
                    four = four_steps(batch)
                    for changelog, step in zip(steps, four, strict=True):
                        await changelog.append(0, step)  # acknowledged before the next step
                    tables.write(four)
                    if rep >= 0:
                        figures.steps_ms.append((time.perf_counter() - started) * 1000)
    finally:
        for changelog in (durable, *steps):
            await changelog.stop()
        store.close()
        tables.close()
        PartitionStore.destroy(folder)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([durable_topic, *step_topics, input_topic])
        finally:
            await admin.close()
    return figures


def report(title: str, figures: Figures) -> None:
    def p95(values: list[float]) -> float:
        return sorted(values)[max(0, round(0.95 * len(values)) - 1)]

    new, old = figures.durable_ms, figures.steps_ms
    print(title)
    print(f"  {'':38}{'round trips':>12}{'median ms':>11}{'p95 ms':>9}{'min ms':>9}")
    trips = statistics.median(figures.durable_trips)
    print(
        f"  {'durable: one append + 1 write batch':38}{trips:>12.0f}"
        f"{statistics.median(new):>11.2f}{p95(new):>9.2f}{min(new):>9.2f}"
    )
    print(
        f"  {'four acknowledged steps + 4 batches':38}{4:>12}"
        f"{statistics.median(old):>11.2f}{p95(old):>9.2f}{min(old):>9.2f}"
    )
    print(f"  median four steps / durable: {statistics.median(old) / statistics.median(new):.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("PROJECTOR_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--users", type=int, default=450)
    parser.add_argument("--rows-per-user", type=int, default=2)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument(
        "--link-latency-ms",
        type=int,
        default=0,
        help="also run against a private broker behind toxiproxy adding this latency each way "
        "(needs `make tools`); 0: the shared broker only",
    )
    args = parser.parse_args()
    shape = f"{args.users} users x {args.rows_per_user} rows"
    figures = await measure(args.bootstrap, args.users, args.rows_per_user, args.reps)
    report(
        f"persist of {shape} ({figures.records} records), {args.reps} reps, broker {args.bootstrap}", figures
    )
    if args.link_latency_ms:
        slow = await measure_behind_latency(args.link_latency_ms, args.users, args.rows_per_user, args.reps)
        report(f"the same behind a link adding {args.link_latency_ms} ms each way (private broker)", slow)


async def measure_behind_latency(latency_ms: int, users: int, rows_per_user: int, reps: int) -> Figures:
    from tests.integration.stack import free_port
    from tests.support.private_kafka import PrivateKafka
    from tests.support.toxiproxy import Toxiproxy

    workdir = Path(tempfile.mkdtemp(prefix="durable-bench-link-"))
    try:
        with Toxiproxy.start(workdir) as toxi:
            listen = f"127.0.0.1:{free_port()}"
            broker = await asyncio.to_thread(PrivateKafka.start, workdir / "kafka", advertised=listen)
            try:
                proxy = toxi.proxy("kafka", broker.bootstrap, listen=listen)
                toxi.add_toxic(proxy, "latency", {"latency": latency_ms, "jitter": 0}, stream="downstream")
                toxi.add_toxic(proxy, "latency", {"latency": latency_ms, "jitter": 0}, stream="upstream")
                return await measure(proxy.address, users, rows_per_user, reps)
            finally:
                await asyncio.to_thread(broker.stop)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
