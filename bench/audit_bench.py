"""The unread audit's stall on the event loop (issue 33 item 3), the former full scan against the
key-range sweep, side by side in one run, on a real partition store of ROWS rows.

The store: one partition's RocksDB database as the worker keeps it (tables/durable/store.py's
options and key layout, `r` + user id + conversation UUID), ROWS_PER_USER rows a user, row records
as the worker writes them (msgpack {"s": ConversationState.dump()}); UNREAD_SHARE of the rows have
unread, the others are at 0, all idle. Written once in sorted batches without the WAL and kept in
`--dir` (a later run with the same size reuses it). Opened read-only through `CheckpointedTables`
(the worker's tables, no changelog needed for reads) and `TablesSource`, as the worker reads it.

What a round does here is the part that reads the state (the part issue 33 found stalling; the
recount and the verdict that follow are the same for both and bounded by `max_rows`):

* full scan (the former sampler, main at 132d55b, kept here verbatim in `full_scan_round`): every
  row key, then every row read and decoded on the event loop, yielding every 20,000 rows, each
  offered to `Sampler` (the rows with unread at `sample_rate`);
* sweep (app/worker/audit.sweep_round, as the worker runs it): the round's share of the rows
  (the highest rate's) in ticks of at most 500 rows, each tick read, decoded and drawn in a worker
  thread; rows at 0 drawn at `zero_sample_rate` too.

The stall: a probe on the same loop sleeps PROBE_MS and records how late it wakes (the loop-lag
measure: a timer's lateness is how long the loop could not run anything). Reported per sampler:
lag p50 / p99 / max while its rounds run, and the probe alone (no audit) as the floor; per round:
rows read, CPU seconds in the process (all threads) and on the loop's thread, wall seconds.

    PYTHONPATH=. python bench/audit_bench.py [--rows 10000000] [--sweep-rounds 20]
        [--full-scan-max-rows 10000000] [--dir bench/out/audit]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
from rocksdict import Rdict, WriteBatch, WriteOptions

from app.domain import seqs
from app.domain.audit import AuditPolicy, Sampler, keyed_draw
from app.domain.conversation import ConversationState
from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig
from app.domain.residency import ROW_STATE_KEY
from app.settings import Settings
from app.stores.memory_messages import InMemoryMessageStore
from app.worker.audit import AuditReport, sweep_round
from app.worker.core import PartitionState
from app.worker.state_source import TablesSource
from tables.durable.records import Kind
from tables.durable.store import PartitionStore, store_options
from tables.durable.tables import CheckpointedTables

ROWS_PER_USER = 50
UNREAD_SHARE = 0.1
PROBE_MS = 1.0
DAY_MS = 86_400_000
NOW_MS = 1_700_000_000_000
# The former round's scan slice (app/worker/audit.py at 132d55b).
FULL_SCAN_SLICE = 20_000
WRITE_BATCH_ROWS = 100_000


# -- the store ---------------------------------------------------------------------------------------


def row_templates(count: int = 64) -> list[bytes]:
    """Row records: UNREAD_SHARE with 1-20 unread, the others read up to their head (at 0)."""
    rnd = random.Random(1)
    out = []
    for n in range(count):
        row = ConversationState(0, "00000000-0000-4000-8000-000000000000")
        head = rnd.randint(20, 5_000)
        unread = rnd.randint(1, 20) if n < count * UNREAD_SHARE else 0
        row.head_seq = head
        row.read_seq = row.base = head - unread
        row.received = seqs.add_range(None, max(1, head - 60), head + 1)
        if unread:
            row.counting = seqs.add_range(None, head - unread + 1, head + 1)
        row.floor = max(0, head - 60)
        row.unread_count = unread
        row.version = rnd.randint(1, 10**9)
        row.changed_at = NOW_MS - 3 * DAY_MS
        row.set_head_ids(f"m-{n}", f"{n:032x}")
        out.append(msgspec.msgpack.encode({ROW_STATE_KEY: row.dump()}))
    return out


def build_store(path: Path, rows: int) -> float:
    """The partition's store with `rows` rows (reused when built before); seconds spent."""
    marker = path / "BUILT"
    if marker.exists() and marker.read_text() == str(rows):
        return 0.0
    PartitionStore.destroy(path)
    started = time.perf_counter()
    templates = row_templates()
    rnd = random.Random(rows)
    db = Rdict(str(path), store_options())
    unlogged = WriteOptions()
    # A property in rocksdict 0.3 (its stub says a method): setattr keeps mypy and the runtime agreed.
    setattr(unlogged, "disable_wal", True)  # noqa: B010
    prefix = Kind.ROW.value
    batch = WriteBatch(raw_mode=True)
    in_batch = written = 0
    user = 0
    while written < rows:
        user_key = prefix + (user * 8).to_bytes(8, "big")  # user ids of one partition of 8
        uuids = sorted(rnd.randbytes(16) for _ in range(min(ROWS_PER_USER, rows - written)))
        for uuid in uuids:
            batch.put(user_key + uuid, templates[written % len(templates)])
            written += 1
            in_batch += 1
        user += 1
        if in_batch >= WRITE_BATCH_ROWS:
            db.write(batch, unlogged)
            batch, in_batch = WriteBatch(raw_mode=True), 0
    if in_batch:
        db.write(batch, unlogged)
    db.flush()
    db.close()
    marker.write_text(str(rows))
    return time.perf_counter() - started


def open_tables(folder: Path) -> CheckpointedTables:
    """The worker's tables over the built store, for reads only (no changelog: nothing is
    claimed or persisted)."""
    tables = CheckpointedTables(folder, cast(Any, None), cast(Any, None), cast(Any, None))
    tables.stores[0] = PartitionStore.open(folder / "partition-0")
    return tables


# -- the loop's lag ----------------------------------------------------------------------------------


class LoopLag:
    """A timer every PROBE_MS on the loop; its lateness in ms, per wake-up."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = False

    async def run(self) -> None:
        interval = PROBE_MS / 1000
        while not self._stop:
            started = time.perf_counter()
            await asyncio.sleep(interval)
            self.samples.append((time.perf_counter() - started - interval) * 1000)

    def stop(self) -> None:
        self._stop = True


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


@dataclass
class Figures:
    sampler: str
    rows: int
    rounds: int = 0
    rows_read_per_round: float = 0.0
    drawn_per_round: float = 0.0
    cpu_s_per_round: float = 0.0  # the process: every thread
    loop_cpu_s_per_round: float = 0.0  # the event loop's thread (the probe's own share included)
    wall_s_per_round: float = 0.0
    lag_p50_ms: float = 0.0
    lag_p99_ms: float = 0.0
    lag_max_ms: float = 0.0
    lag_samples: int = 0
    per_round: list[dict[str, float]] = field(default_factory=list)


async def measure(name: str, rows: int, rounds: int, one_round: Any) -> Figures:
    """Run `rounds` rounds back to back with the probe on the loop."""
    probe = LoopLag()
    task = asyncio.ensure_future(probe.run())
    await asyncio.sleep(0.05)
    probe.samples.clear()
    figures = Figures(name, rows)
    for n in range(rounds):
        cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
        read, drawn = await one_round(n)
        figures.per_round.append(
            {
                "rows_read": read,
                "drawn": drawn,
                "cpu_s": time.process_time() - cpu,
                "loop_cpu_s": time.thread_time() - loop_cpu,
                "wall_s": time.perf_counter() - wall,
            }
        )
    probe.stop()
    await task
    figures.rounds = rounds
    for attr, key in (
        ("rows_read_per_round", "rows_read"),
        ("drawn_per_round", "drawn"),
        ("cpu_s_per_round", "cpu_s"),
        ("loop_cpu_s_per_round", "loop_cpu_s"),
        ("wall_s_per_round", "wall_s"),
    ):
        setattr(figures, attr, statistics.fmean(r[key] for r in figures.per_round))
    lags = probe.samples
    figures.lag_p50_ms, figures.lag_p99_ms = percentile(lags, 0.5), percentile(lags, 0.99)
    figures.lag_max_ms, figures.lag_samples = max(lags, default=0.0), len(lags)
    return figures


async def idle_floor(seconds: float) -> Figures:
    """The probe alone: the loop's lag with nothing else on it (the floor of both)."""

    async def one_round(n: int) -> tuple[int, int]:
        await asyncio.sleep(seconds)
        return 0, 0

    return await measure("probe alone", 0, 1, one_round)


# -- the two samplers --------------------------------------------------------------------------------


def full_scan_rows(tables: CheckpointedTables, source: TablesSource) -> Iterator[ConversationState]:
    """The former `Residency.cold_rows` (app/domain/residency.py at 132d55b) with nothing in
    memory: every row key first, then the rows read 512 at a time and decoded, one by one."""
    picked: list[tuple[int, str]] = []
    for user_id, conversation_id in tables.row_keys(0):
        picked.append((user_id, conversation_id))
    for start in range(0, len(picked), 512):
        chunk = picked[start : start + 512]
        for (user_id, conversation_id), record in source.get_rows(chunk).items():
            yield ConversationState.load(record[ROW_STATE_KEY], user_id, conversation_id)


async def full_scan_round(
    tables: CheckpointedTables, source: TablesSource, policy: AuditPolicy, salt: int
) -> tuple[int, int]:
    """The former round's scan (app/worker/audit._round at 132d55b): every row offered to the
    Sampler on the event loop, a yield every FULL_SCAN_SLICE rows."""
    sampler = Sampler(policy, NOW_MS, keyed_draw(salt))
    scanned = total = 0
    for row in full_scan_rows(tables, source):
        sampler.offer(row)
        scanned += 1
        total += 1
        if scanned >= FULL_SCAN_SLICE:
            scanned = 0
            await asyncio.sleep(0)
    return total, len(sampler.chosen())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings()
    folder = Path(args.dir) / f"rows-{args.rows}"
    folder.mkdir(parents=True, exist_ok=True)
    built_s = build_store(folder / "partition-0", args.rows)
    print(f"store: {args.rows:,} rows in {folder} (built in {built_s:.1f} s; 0 = reused)", flush=True)
    tables = open_tables(folder)
    source = TablesSource(tables, 0)
    # The partition's processor as the worker restores it (nothing in memory: every row cold).
    processor = PartitionProcessor.restore_lazily(
        ProjectorConfig(), InMemoryMessageStore(), source, None, [], [], track_changes=True, hot_rows=500_000
    )
    residency = processor.residency
    assert residency is not None
    print(f"RocksDB's estimate of its keys: {tables.estimated_rows(0):,}", flush=True)
    limit = settings.processing.unread_precise_limit
    old_policy = AuditPolicy(
        settings.audit.unread_audit_sample_rate,
        settings.audit.unread_audit_idle_ms,
        settings.audit.unread_audit_max_rows,
        limit,
    )
    new_policy = AuditPolicy(
        settings.audit.unread_audit_sample_rate,
        settings.audit.unread_audit_idle_ms,
        settings.audit.unread_audit_max_rows,
        limit,
        settings.audit.unread_audit_zero_sample_rate,
    )
    results: list[Figures] = [await idle_floor(args.floor_s)]
    rng = random.Random(7)
    state = PartitionState(0, processor)

    async def sweep(n: int) -> tuple[int, int]:
        report = AuditReport()
        draw = keyed_draw(rng.getrandbits(128))
        room = new_policy.max_rows
        drawn = await sweep_round(state, residency, new_policy, NOW_MS, draw, rng, room, report)
        return report.read, len(drawn)

    async def full_scan(n: int) -> tuple[int, int]:
        return await full_scan_round(tables, source, old_policy, rng.getrandbits(128))

    results.append(await measure("sweep (new)", args.rows, args.sweep_rounds, sweep))
    if args.rows <= args.full_scan_max_rows:
        results.append(await measure("full scan (old)", args.rows, 1, full_scan))
    tables.close()
    return {"rows": args.rows, "figures": [asdict(f) for f in results]}


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'sampler':<16} {'rows':>11} {'rounds':>6} {'read/round':>11} {'drawn':>7} {'cpu s':>8} "
        f"{'loop cpu s':>10} {'wall s':>8} {'lag p50':>8} {'lag p99':>9} {'lag max':>9}"
    ]
    for f in report["figures"]:
        lines.append(
            f"{f['sampler']:<16} {f['rows']:>11,} {f['rounds']:>6} {f['rows_read_per_round']:>11,.0f} "
            f"{f['drawn_per_round']:>7,.0f} {f['cpu_s_per_round']:>8.3f} {f['loop_cpu_s_per_round']:>10.3f} "
            f"{f['wall_s_per_round']:>8.3f} {f['lag_p50_ms']:>8.3f} {f['lag_p99_ms']:>9.3f} "
            f"{f['lag_max_ms']:>9.1f}"
        )
    by_name = {f["sampler"]: f for f in report["figures"]}
    new, old = by_name.get("sweep (new)"), by_name.get("full scan (old)")
    if new and old:
        lines.append(
            f"full scan / sweep: lag p99 x{old['lag_p99_ms'] / max(new['lag_p99_ms'], 1e-9):,.0f}, "
            f"lag max x{old['lag_max_ms'] / max(new['lag_max_ms'], 1e-9):,.0f}, "
            f"CPU per round x{old['cpu_s_per_round'] / max(new['cpu_s_per_round'], 1e-9):,.0f}, "
            f"rows read per round x{old['rows_read_per_round'] / max(new['rows_read_per_round'], 1):,.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--sweep-rounds", type=int, default=20)
    parser.add_argument("--full-scan-max-rows", type=int, default=10_000_000, help="skip the old one above")
    parser.add_argument("--floor-s", type=float, default=3.0, help="seconds of the probe alone")
    parser.add_argument("--dir", default="bench/out/audit")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
