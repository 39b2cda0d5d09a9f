"""State beyond memory (issue 13): a worker owning 10,000,000 rows, side by side with a small one.

What runs is the worker's core (`app.worker.core.WorkerCore`: the offset rule, the processing
object, the lazy restore, the bounded hot set, the persist to the changelog tables, the flushes)
over the worker's table layout in RocksDB, opened with the RocksDB options of the worker's
partition stores (tables/durable/store.py: store_options). Each
measurement is a fresh process (its peak RSS is its own). What the worker does besides (Kafka
consumer and producer, Cassandra, Redis) costs the same whatever the state's size and is left
out: the projection store is a sink that encodes every flush as the Redis store does and keeps
only each user's version; the MessageStore is in memory (the traffic's rows are exact and never
read it).

The state is written by a generator straight into the RocksDB databases (rows, users, gate), not
by replaying 10M entries through Kafka: at the worker's ~20-30k entries/s on this machine that
would take hours per state, and what the measurement needs is the state as the worker's tables
hold it. Rows are real: a handful of row shapes made by the real processing object from real
entries (read, unread, mentions, muted, pinned, archived, one past the packed-seq limit), stamped
onto every (user, conversation) with the conversation's own head message and activity ids (so
blocks do not compress better than real ones). A faust worker over such a store recovers nothing
from its changelog (the local store is as far as the changelog): the same state.

Users u = 0..U-1 (ids spread over the key space), each in C group conversations of G members
(conversation j*U/G + u//G in slot j). The live traffic touches every 100th user (1%): messages
(counting, 1 in 10 a mention) into that user's conversations, in random order, mailbox_seq
increasing, one lane with its marker every 500 entries; batches of BATCH records, as the
intake's fetches would give them.

Contenders, interleaved per repetition (order rotating):
* `big`: the generated state (U x C rows), restored lazily, hot set = PROJECTOR_HOT_ROWS default;
* `resident`: only the touched users' rows (a small state), every row read into memory before the
  traffic starts: everything resident, nothing read from disk while timed (the baseline);
* `empty`: no state at all (for the restart time only).

Reported: restart to first applied batch (process spawn -> the first batch applied, imports
included), entries/s over the rest of the traffic (wall and per CPU second), peak RSS (VmHWM),
rows read from disk, rows resident; resident memory per hot row (tracemalloc and RSS, 100k rows
read from the big state); disk bytes per row (the rows database after compaction); and the
replay of U' users x C' conversations (`projector replay`, in memory and with --state-dir) with
peak RSS per run.

    .venv/bin/python bench/state_bench.py          (or `make bench`; BENCH_STATE=0 skips it)

Sizes from the environment: SBENCH_USERS (200000) SBENCH_CONVERSATIONS (50) SBENCH_GROUP (10)
SBENCH_TRAFFIC (300000 entries) SBENCH_BATCH (5000) SBENCH_REPS (3) SBENCH_HOT_ROWS (the
setting's default) SBENCH_ROWMEM_USERS (2000 users x C rows for the per-row figure)
SBENCH_REPLAY_USERS (200000) SBENCH_REPLAY_CONVERSATIONS (5) SBENCH_REPLAY_MESSAGES (3 per
conversation) SBENCH_REPLAY=0 skips the replay part. The generated state is kept in
bench/out/state/ and reused when its sizes match (delete the folder to regenerate).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson

MODULE_STARTED = time.time()  # a child's restart time splits here: the interpreter is up
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The generated states, the replay stream and the scratch copies (SBENCH_OUT moves them).
OUT = Path(os.environ.get("SBENCH_OUT", str(ROOT / "bench" / "out" / "state")))
T0_MS = 1_767_225_600_000
USER_BASE = 1 << 40  # user ids: USER_BASE + u * USER_STRIDE (spread, 8 bytes big-endian keys)
USER_STRIDE = 7_919
STATE_SEQ = 10_000_000  # every generated user's projection_mailbox_seq (the traffic goes above)
HOT_EVERY = 100  # every 100th user is touched by the traffic (1%)
MARKER_EVERY = 500
TRAFFIC_CONV_SEQ = 1_000  # the traffic's conversation_seq start (templates stay below)


def log(message: str) -> None:
    print(f"[state-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def user_id(u: int) -> int:
    return USER_BASE + u * USER_STRIDE


def conversation_id(index: int) -> str:
    return str(uuid.UUID(int=(0x5EED << 112) | index))


def conversation_of(u: int, slot: int, users: int, group: int) -> int:
    return slot * (users // group) + u // group


def rocks_options() -> Any:
    """The worker's RocksDB options (a partition store's: tables/durable/store.py)."""
    from tables.durable.store import store_options

    return store_options()


# -- row shapes, made by the real processing object -------------------------------------------------


def _entry(kind: str, seq: int, uid: int, cid: str, **fields: Any) -> bytes:
    doc = {"type": kind, "mailbox_seq": seq, "lane": 0, "ts": T0_MS + seq, "event_id": f"e{seq}"}
    doc |= {"user_id": uid, "conversation_id": cid, **fields}
    return orjson.dumps(doc)


def _message(seq: int, uid: int, cid: str, cseq: int, *, mention: bool = False, sender: int = 7) -> bytes:
    return _entry(
        "message",
        seq,
        uid,
        cid,
        conversation_seq=cseq,
        message_id=f"m-{cid[:8]}-{cseq}",
        activity_id=f"{T0_MS + seq:012x}{cseq:020x}",
        sender_id=sender,
        created_at=T0_MS + seq,
        counts_unread=True,
        mention=mention,
    )


def row_shapes() -> list[list[Any]]:
    """Row records (ConversationState.dump()) of a few typical rows, made from real entries."""
    from app.replay import Replayer, ReplayOptions

    uid = 1
    plans: list[list[tuple[str, dict[str, Any]]]] = [
        [("msgs", {"n": 3}), ("read", {"upto": 3})],  # all read
        [("msgs", {"n": 5}), ("read", {"upto": 2})],  # 3 unread
        [("msgs", {"n": 4, "mention": 2})],  # 4 unread, a mention
        [("mute", {}), ("msgs", {"n": 2})],  # muted, 2 unread
        [("pin", {}), ("msgs", {"n": 10}), ("read", {"upto": 10})],  # pinned, read
        [("msgs", {"n": 1}), ("archive", {})],  # archived
        [("msgs", {"n": 60}), ("read", {"upto": 30})],  # past the packed-seq limit: roaring
        [],  # joined, nothing yet
    ]
    lines: list[bytes] = []
    seq = 0
    cids = [conversation_id(10_000_000 + i) for i in range(len(plans))]
    for cid, plan in zip(cids, plans, strict=True):
        seq += 1
        lines.append(_entry("join", seq, uid, cid, joined_at_conversation_seq=0))
        cseq = 0
        for kind, arg in plan:
            seq += 1
            if kind == "msgs":
                for _ in range(arg["n"]):
                    cseq += 1
                    lines.append(_message(seq, uid, cid, cseq, mention=cseq == arg.get("mention")))
                    seq += 1
            elif kind == "read":
                lines.append(_entry("read", seq, uid, cid, read_conversation_seq=arg["upto"]))
            elif kind == "mute":
                lines.append(_entry("mute", seq, uid, cid))
            elif kind == "pin":
                lines.append(_entry("pin", seq, uid, cid, pin_rank=1))
            elif kind == "archive":
                lines.append(_entry("archive", seq, uid, cid))
    lines.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
    replayer = Replayer(ReplayOptions(lanes=1), lambda frame: None)
    replayer.feed_many(lines)
    replayer.finish()
    user = replayer.processor.users[uid]
    return [user.rows[cid].dump() for cid in cids]


# -- the generator ------------------------------------------------------------------------------


def generate_state(
    folder: Path, users: int, conversations: int, group: int, only_hot: bool
) -> dict[str, Any]:
    """Write the rows, users and gate of partition 0 into `folder` (the worker's layout)."""
    from rocksdict import Rdict, WriteBatch

    from app.domain.badge import full_recompute
    from app.domain.conversation import _PLAIN_FIELDS, ConversationState
    from app.worker.ports import CHECKPOINT_KEY, row_key, user_key

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shapes = row_shapes()
    head_message = _PLAIN_FIELDS.index("head_message_id") + 1
    head_activity = _PLAIN_FIELDS.index("head_activity_id") + 1
    changed_at = _PLAIN_FIELDS.index("changed_at") + 1
    # Each user's badge: the sum of its rows' contributions (its shapes cycle with the slot).
    loaded = [ConversationState.load(shape, 0, conversation_id(0)) for shape in shapes]
    badges = {
        start: list(full_recompute([loaded[(start + s) % len(shapes)] for s in range(conversations)], False))
        for start in range(len(shapes))
    }
    rows_db = Rdict(str(folder / "rows-0"), rocks_options())
    users_db = Rdict(str(folder / "users-0"), rocks_options())
    encode = msgspec.msgpack.encode
    started = time.monotonic()
    batch = WriteBatch(raw_mode=True)
    written = 0
    hot = 0
    for u in range(users):
        if only_hot and u % HOT_EVERY:
            continue
        hot += u % HOT_EVERY == 0
        uid = user_id(u)
        for slot in range(conversations):
            index = conversation_of(u, slot, users, group)
            record = list(shapes[(u + slot) % len(shapes)])
            record[head_message] = f"m-{index:x}-h"
            record[head_activity] = f"{T0_MS + index:012x}{index:020x}"
            record[changed_at] = T0_MS + (u * 31 + slot) % 86_400_000
            batch.put(row_key(uid, conversation_id(index)), encode({"s": record}))
            written += 1
        if len(batch) >= 50_000:
            rows_db.write(batch)
            batch = WriteBatch(raw_mode=True)
        user_record = {
            "user_id": uid,
            "projection_mailbox_seq": STATE_SEQ,
            "flushed_seq": STATE_SEQ,
            "driving_event_id": f"e-{u}",
            "badge": badges[u % len(shapes)],
            "structure_version": 1,
        }
        users_db[user_key(uid)] = encode(user_record)
        if u % 20_000 == 0 and u:
            rate = written / (time.monotonic() - started)
            log(f"  {written:,} rows written ({rate:,.0f}/s)")
    rows_db.write(batch)
    rows_db.flush()
    users_db.flush()
    log("  compacting the rows database")
    rows_db.compact_range(None, None)
    rows_db.close()
    users_db.close()
    gates_db = Rdict(str(folder / "gates-0"), rocks_options())
    gates_db[CHECKPOINT_KEY] = encode({"marks": [STATE_SEQ], "hi": STATE_SEQ, "next_offset": 0})
    gates_db.close()
    rows_bytes = folder_bytes(folder / "rows-0")
    return {
        "users": users,
        "conversations": conversations,
        "group": group,
        "only_hot": only_hot,
        "rows": written,
        "state_users": hot if only_hot else users,
        "rows_db_bytes": rows_bytes,
        "disk_bytes": folder_bytes(folder),
        "disk_bytes_per_row": round(rows_bytes / max(written, 1), 1),
        "seconds": round(time.monotonic() - started, 1),
    }


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def clone(source: Path, target: Path) -> None:
    """A copy a run may change: SST files are immutable (hard links), the rest is copied."""
    if target.exists():
        shutil.rmtree(target)
    for path in source.rglob("*"):
        dest = target / path.relative_to(source)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".sst":
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    target.mkdir(parents=True, exist_ok=True)


# -- the traffic ----------------------------------------------------------------------------------


def traffic(users: int, conversations: int, group: int, entries: int, batch: int) -> Iterator[list[bytes]]:
    """Batches of records: messages to the hot users' conversations, the lane's markers."""
    rng = random.Random(13)
    hot = list(range(0, users, HOT_EVERY))
    next_cseq: dict[int, int] = {}
    seq = STATE_SEQ
    records: list[bytes] = []
    for n in range(1, entries + 1):
        u = rng.choice(hot)
        slot = rng.randrange(conversations)
        index = conversation_of(u, slot, users, group)
        cseq = next_cseq.get(index, TRAFFIC_CONV_SEQ) + 1
        next_cseq[index] = cseq
        seq += 1
        records.append(
            _message(
                seq, user_id(u), conversation_id(index), cseq, mention=n % 10 == 0, sender=user_id(u + 1)
            )
        )
        if n % MARKER_EVERY == 0 or n == entries:
            records.append(
                orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq})
            )
        if len(records) >= batch:
            yield records
            records = []
    if records:
        yield records


# -- one measured process ---------------------------------------------------------------------------


class VersionSink:
    """The projection store's place: every flush encoded as the Redis store encodes it, only
    each user's version kept (the refusal rule needs it)."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.rows = 0

    async def write(self, batches: Any) -> list[int | None]:
        from app.stores.projection_codec import encode_batches

        out: list[int | None] = []
        for batch in encode_batches(batches):
            previous = self.versions.get(batch.user_id, 0)
            if batch.version <= previous:
                out.append(None)
                continue
            self.versions[batch.user_id] = batch.version
            self.rows += len(batch.rows)
            out.append(previous)
        return out


class NullOutbox:
    async def dead_letters(self, letters: Any) -> None:
        return None

    async def frames(self, session_deltas: Any, badges: Any) -> None:
        return None

    async def notices(self, notices: Any) -> None:
        return None


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """The child: open the tables, restore partition 0, apply the traffic."""
    from app.domain.projector import ProjectorConfig
    from app.stores.memory_messages import InMemoryMessageStore
    from app.stores.rocks_tables import RocksTables
    from app.worker.core import WorkerConfig, WorkerCore
    from app.worker.ports import RawRecord

    gc.set_threshold(200_000, 50, 100)  # as the worker and replay run
    # faust is imported here (the worker has it imported before it opens a table), so that the
    # restart's split counts it among the imports, not in opening the tables.
    rocks_options()
    opening = time.time()
    tables = RocksTables(Path(args.state), rocks_options)
    config = WorkerConfig(
        lanes=1, hot_rows=args.hot_rows, projector=ProjectorConfig(window_ms=args.window_ms)
    )
    core = WorkerCore(
        config,
        message_store=InMemoryMessageStore(),
        projection_store=VersionSink(),  # type: ignore[arg-type]
        tables=tables,
        outbox=NullOutbox(),
    )
    state = core.partition(0)
    if state.next_offset is None:
        core.start_at(0, 0)
    processor = state.processor
    restored = time.time()
    if args.mode == "resident":
        # Everything in memory before the clock starts: every user and all their rows.
        projector = processor.projector
        for uid, _ in tables.users(0):
            user = projector.user(uid)
            assert user is not None
            projector.complete(user)
    offset = 0
    batches = traffic(args.users, args.conversations, args.group, args.entries, args.batch)
    first = next(batches)
    first_started, first_cpu = time.time(), time.process_time()
    records = [RawRecord("mailbox-tail", 0, offset + i, None, v) for i, v in enumerate(first)]
    await core.on_batch(0, records, offset, offset + len(records))
    offset += len(records)
    first_applied, first_cpu = time.time(), time.process_time() - first_cpu
    restart_cpu = time.process_time()
    reads_at_first = processor.residency.reads if processor.residency else 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    entries = 0
    for values in batches:
        records = [RawRecord("mailbox-tail", 0, offset + i, None, v) for i, v in enumerate(values)]
        await core.on_batch(0, records, offset, offset + len(records))
        offset += len(records)
        entries += sum(1 for v in values if not v.startswith(b'{"type":"watermark"'))
        await core.flush_due(core.clock())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    await core.flush_all()
    residency = processor.residency
    stats = core.stats
    result = {
        "mode": args.mode,
        "first_applied_at": first_applied,
        # Where the restart time goes: interpreter start -> this module, imports, opening the
        # tables and restoring partition 0, the first batch (after loading everything, in
        # `resident` mode).
        "module_started_at": MODULE_STARTED,
        "imports_s": opening - MODULE_STARTED,
        "open_restore_s": restored - opening,
        "first_batch_s": first_applied - first_started,
        "first_batch_cpu_s": first_cpu,
        # Of the whole process up to the first batch applied (interpreter start included).
        "restart_cpu_s": restart_cpu,
        "entries_timed": entries,
        "wall_s": wall,
        "cpu_s": cpu,
        "entries_per_s": entries / wall if entries else 0.0,
        "entries_per_cpu_s": entries / cpu if entries else 0.0,
        "peak_rss": vm_hwm(),
        "rss_end": vm_rss(),
        "rows_read": residency.reads if residency else 0,
        "rows_read_first_batch": reads_at_first,
        "resident_rows": processor.resident_rows,
        "applied": stats.applied,
        "duplicates": stats.duplicates,
        "flushes": stats.flushes,
        "projection_writes": stats.projection_writes,
    }
    tables.close()
    return result


def run_rowmem(args: argparse.Namespace) -> dict[str, Any]:
    """Resident memory per hot row: users' rows read from the big state into memory through the
    hot set (UserState, its rows dict, the rows), measured with tracemalloc or (in another
    process) as RSS. Two cases:
    `spread` (every 100th user, as the traffic picks them: one member per group conversation in
    memory, so each row holds its own copy of the conversation's id and head strings) and
    `groups` (consecutive users: whole groups in memory, their rows share those interned strings,
    as when a conversation's members are hot on one partition)."""
    import tracemalloc

    from app.domain.projector import ProjectorConfig
    from app.stores.memory_messages import InMemoryMessageStore
    from app.stores.rocks_tables import RocksTables
    from app.worker.core import WorkerConfig, WorkerCore

    tables = RocksTables(Path(args.state), rocks_options)
    core = WorkerCore(
        WorkerConfig(lanes=1, hot_rows=10_000_000, projector=ProjectorConfig()),
        message_store=InMemoryMessageStore(),
        projection_store=VersionSink(),  # type: ignore[arg-type]
        tables=tables,
        outbox=NullOutbox(),
    )
    projector = core.partition(0).processor.projector

    def load(wanted: list[int]) -> int:
        for uid in wanted:
            user = projector.user(uid)
            assert user is not None
            projector.complete(user)
        gc.collect()
        return sum(len(projector.users[uid].rows) for uid in wanted)

    load([user_id(args.users - 1)])  # the read path warm (imports, first blocks), not measured
    n = args.rowmem_users
    if args.case == "spread":
        wanted = [user_id(u) for u in range(HOT_EVERY // 2, args.users, HOT_EVERY)][:n]
    else:
        wanted = [user_id(u) for u in range(args.users // 3, min(args.users, args.users // 3 + n))]
    if args.measure == "traced":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        rows = load(wanted)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    else:  # RSS, in a process that never ran tracemalloc (its bookkeeping is not counted)
        before = vm_rss()
        rows = load(wanted)
        used = vm_rss() - before
    tables.close()
    return {
        "case": args.case,
        "measure": args.measure,
        "users": len(wanted),
        "rows": rows,
        "bytes_per_row": round(used / rows, 1),
    }


# -- the replay part ------------------------------------------------------------------------------


def write_replay_stream(path: Path, users: int, conversations: int, group: int, messages: int) -> int:
    """U users x C group conversations of G members: every membership's join, then `messages`
    messages per conversation fanned out to its members, the lane's marker after each."""
    seq = 0
    count = 0
    groups = users * conversations // group
    with open(path, "wb") as out:
        buffer: list[bytes] = []

        def put(line: bytes) -> None:
            buffer.append(line)
            if len(buffer) >= 8192:
                out.write(b"\n".join(buffer) + b"\n")
                buffer.clear()

        for slot in range(conversations):
            for u in range(users):
                seq += 1
                index = conversation_of(u, slot, users, group)
                put(_entry("join", seq, user_id(u), conversation_id(index), joined_at_conversation_seq=0))
                count += 1
                if seq % MARKER_EVERY == 0:  # the lane reports as it writes (nothing waits long)
                    put(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
        put(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
        for m in range(1, messages + 1):
            for index in range(groups):
                slot, first = divmod(index, users // group)
                members = range(first * group, first * group + group)
                sender = user_id(members[m % group])
                for u in members:
                    seq += 1
                    put(_message(seq, user_id(u), conversation_id(index), m, mention=m == 2, sender=sender))
                    count += 1
                put(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": T0_MS + seq}))
        if buffer:
            out.write(b"\n".join(buffer) + b"\n")
    return count


def measured(argvs: list[list[str]], timeout: float) -> list[tuple[int, float, int]]:
    """Run the commands side by side; per command (exit code, seconds, peak RSS bytes of that
    process alone, from wait4)."""
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL) for argv in argvs]
    results: dict[int, tuple[int, float, int]] = {}
    while len(results) < len(procs):
        for index, proc in enumerate(procs):
            if index in results:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if not pid and time.perf_counter() - started > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                results[index] = (proc.returncode, time.perf_counter() - started, usage.ru_maxrss * 1024)
        time.sleep(0.2)
    return [results[index] for index in range(len(procs))]


def projector_argv() -> list[str]:
    script = Path(sys.executable).parent / "projector"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


def replay_part(args: argparse.Namespace, report: dict[str, Any]) -> bool:
    # (v2: the joins' lane reports every MARKER_EVERY entries; v1 reported once after all of
    # them, so a million joins waited in the gate's memory)
    sizes = f"{args.replay_users}x{args.replay_conversations}x{args.replay_messages}"
    stream = OUT / f"replay-v2-{sizes}.jsonl"
    if not stream.exists():
        log(f"writing the replay stream {stream.name}")
        tmp = stream.with_suffix(".tmp")
        write_replay_stream(
            tmp, args.replay_users, args.replay_conversations, args.group, args.replay_messages
        )
        tmp.rename(stream)
    runs: dict[str, list[dict[str, Any]]] = {"in_memory": [], "state_dir": []}
    ok = True
    for _ in range(args.replay_reps):
        # Side by side (both at once): peak RSS is each process's own; the times share the cores.
        argvs = []
        for mode in runs:
            out = OUT / f"replay-out-{mode}"
            argv = [*projector_argv(), "replay", "--input", str(stream), "--out", str(out)]
            argv += ["--progress", "never"]
            if mode == "state_dir":
                shutil.rmtree(OUT / "replay-state", ignore_errors=True)
                argv += ["--state-dir", str(OUT / "replay-state")]
            argvs.append(argv)
        for mode, (code, seconds, peak) in zip(runs, measured(argvs, args.timeout), strict=True):
            out = OUT / f"replay-out-{mode}"
            stats = json.loads((out / "stats.json").read_text()) if code == 0 else {}
            run = {"exit": code, "seconds": round(seconds, 1), "peak_rss": peak, "stats": stats}
            if mode == "state_dir":
                run["state_dir_bytes"] = folder_bytes(OUT / "replay-state")
                run["state_dir_rows_bytes"] = folder_bytes(OUT / "replay-state" / "rows-0")
                shutil.rmtree(OUT / "replay-state", ignore_errors=True)
            runs[mode].append(run)
            ok = ok and code == 0
            log(f"  replay {mode}: exit {code}, {seconds:.0f} s, peak RSS {peak / 2**20:.0f} MiB")
    same = _same_outputs(OUT / "replay-out-in_memory", OUT / "replay-out-state_dir")
    report["replay"] = {
        "stream": {
            "users": args.replay_users,
            "conversations": args.replay_conversations,
            "group": args.group,
            "messages_per_conversation": args.replay_messages,
            "lines": _count_lines(stream),
        },
        "runs": runs,
        "outputs_equal": same,
    }
    return ok and same


def _count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def _same_outputs(a: Path, b: Path) -> bool:
    return all(
        (a / name).read_bytes() == (b / name).read_bytes() for name in ("projections.jsonl", "badges.jsonl")
    )


# -- the orchestrator -------------------------------------------------------------------------------


def spawn_worker(
    args: argparse.Namespace, mode: str, state: Path, first_batch_only: bool = False
) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "child",
        "--mode",
        mode,
        "--state",
        str(state),
        "--users",
        str(args.users),
        "--conversations",
        str(args.conversations),
        "--group",
        str(args.group),
        "--entries",
        str(args.batch if first_batch_only else args.entries),
        "--batch",
        str(args.batch),
        "--hot-rows",
        str(args.hot_rows),
    ]
    spawned = time.time()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
    result: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    result["restart_s"] = result["first_applied_at"] - spawned
    result["interpreter_s"] = result["module_started_at"] - spawned
    return result


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(args: argparse.Namespace) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    report_path = OUT.parent / f"{OUT.name}_report.json"  # bench/out/state_report.json
    # Parts run alone (--parts) update the report of an earlier full run.
    report: dict[str, Any] = orjson.loads(report_path.read_bytes()) if report_path.exists() else {}
    report["sizes"] = {k: v for k, v in vars(args).items() if k != "func"}
    big, small = OUT / "big", OUT / "small"
    want = {"users": args.users, "conversations": args.conversations, "group": args.group}
    for folder, only_hot in ((big, False), (small, True)):
        meta_path = folder.with_suffix(".meta.json")
        meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else None
        if meta is None or any(meta.get(k) != v for k, v in want.items()):
            log(
                f"generating {folder.name}: {args.users:,} users x {args.conversations} conversations"
                + (" (touched users only)" if only_hot else "")
            )
            meta = generate_state(folder, args.users, args.conversations, args.group, only_hot)
            meta_path.write_bytes(orjson.dumps(meta))
            log(
                f"  {meta['rows']:,} rows, {mib(meta['disk_bytes'])} on disk "
                f"({meta['disk_bytes_per_row']} B/row), {meta['seconds']} s"
            )
        report[f"state_{folder.name}"] = meta
    summary: dict[str, Any] = report.setdefault("summary", {})
    med = statistics.median
    if "traffic" in parts:
        log(f"live traffic: big (lazy) vs small (resident), {args.reps} interleaved repetitions")
        runs = interleaved(args, ["big", "resident"], args.reps, {"big": big, "resident": small})
        pairs = list(zip(runs["big"], runs["resident"], strict=True))
        summary |= {
            "big_entries_per_s": med(r["entries_per_s"] for r in runs["big"]),
            "resident_entries_per_s": med(r["entries_per_s"] for r in runs["resident"]),
            "big_entries_per_cpu_s": med(r["entries_per_cpu_s"] for r in runs["big"]),
            "resident_entries_per_cpu_s": med(r["entries_per_cpu_s"] for r in runs["resident"]),
            "speed_ratio": med(b["entries_per_s"] / r["entries_per_s"] for b, r in pairs),
            "speed_ratio_cpu": med(b["entries_per_cpu_s"] / r["entries_per_cpu_s"] for b, r in pairs),
            "big_peak_rss": max(r["peak_rss"] for r in runs["big"]),
            "resident_peak_rss": max(r["peak_rss"] for r in runs["resident"]),
        }
        report["runs"] = runs
    if "restart" in parts:
        log(f"restart to the first applied batch: big vs empty, {args.restart_reps} interleaved repetitions")
        restarts = interleaved(args, ["big", "empty"], args.restart_reps, {"big": big}, first_batch_only=True)
        pairs = list(zip(restarts["big"], restarts["empty"], strict=True))
        summary |= {
            "big_restart_s": med(r["restart_s"] for r in restarts["big"]),
            "empty_restart_s": med(r["restart_s"] for r in restarts["empty"]),
            "restart_ratio": med(b["restart_s"] / e["restart_s"] for b, e in pairs),
            "restart_ratio_cpu": med(b["restart_cpu_s"] / e["restart_cpu_s"] for b, e in pairs),
            "big_restart_cpu_s": med(r["restart_cpu_s"] for r in restarts["big"]),
            "empty_restart_cpu_s": med(r["restart_cpu_s"] for r in restarts["empty"]),
            "big_first_batch_s": med(r["first_batch_s"] for r in restarts["big"]),
            "empty_first_batch_s": med(r["first_batch_s"] for r in restarts["empty"]),
        }
        report["restarts"] = restarts
    if "rowmem" in parts:
        log("measuring resident memory per hot row")
        work = OUT / "work-rowmem"
        clone(big, work)
        figures: dict[str, dict[str, Any]] = {}
        for case in ("spread", "groups"):
            for measure in ("traced", "rss"):
                argv = [sys.executable, str(Path(__file__).resolve()), "rowmem", "--state", str(work)]
                argv += ["--users", str(args.users), "--rowmem-users", str(args.rowmem_users)]
                argv += ["--case", case, "--measure", measure]
                done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=args.timeout, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"rowmem failed:\n{done.stderr.decode()[-3000:]}")
                result = orjson.loads(done.stdout.splitlines()[-1])
                entry = figures.setdefault(case, {"users": result["users"], "rows": result["rows"]})
                entry[f"{measure}_bytes_per_row"] = result["bytes_per_row"]
        shutil.rmtree(work, ignore_errors=True)
        report["row_memory"] = figures
    ok = True
    if "replay" in parts and args.replay:
        log("replay of the state-dir stream, in memory and with --state-dir")
        ok = replay_part(args, report)
    report_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print_table(report)
    return 0 if ok else 1


def interleaved(
    args: argparse.Namespace,
    modes: list[str],
    reps: int,
    states: dict[str, Path],
    first_batch_only: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Each mode once per repetition, the order rotating; every run on a fresh copy of its state
    (an empty folder for `empty`)."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rep in range(reps):
        for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
            work = OUT / f"work-{mode}"
            if mode in states:
                clone(states[mode], work)
            else:
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
            result = spawn_worker(args, mode, work, first_batch_only)
            shutil.rmtree(work, ignore_errors=True)
            runs[mode].append(result)
            line = (
                f"  rep {rep + 1} {mode}: restart {result['restart_s']:.2f} s (interpreter "
                f"{result['interpreter_s']:.2f}, imports {result['imports_s']:.2f}, open+restore "
                f"{result['open_restore_s']:.2f}, first batch {result['first_batch_s']:.2f}; CPU "
                f"{result['restart_cpu_s']:.2f} s, first batch {result['first_batch_cpu_s']:.2f})"
            )
            if not first_batch_only:
                line += (
                    f", {result['entries_per_s']:,.0f} entries/s ({result['entries_per_cpu_s']:,.0f}/CPU s), "
                    f"peak RSS {mib(result['peak_rss'])}, rows read {result['rows_read']:,}, "
                    f"resident {result['resident_rows']:,}"
                )
            log(line)
    return runs


def print_table(report: dict[str, Any]) -> None:
    """The figures with their goals (issue 13); parts not run yet are left out."""
    s = report.get("summary", {})
    big = report["state_big"]
    print(
        f"\nState bench: {big['rows']:,} rows ({big['users']:,} users x {big['conversations']} "
        f"conversations), {mib(big['disk_bytes'])} on disk, {big['disk_bytes_per_row']} B/row (rows db)"
    )
    if "speed_ratio" in s:
        print(
            f"  live traffic touching 1% of users, {report['sizes']['entries']:,} entries, hot rows "
            f"{report['sizes']['hot_rows']:,}:"
        )
        print(f"  {'':24} {'big (lazy)':>14} {'small, resident':>16}")
        for label, key, fmt in (
            ("entries/s (median)", "entries_per_s", "{:,.0f}"),
            ("entries per CPU s", "entries_per_cpu_s", "{:,.0f}"),
        ):
            b, r = fmt.format(s[f"big_{key}"]), fmt.format(s[f"resident_{key}"])
            print(f"  {label:24} {b:>14} {r:>16}")
        print(f"  {'peak RSS (max)':24} {mib(s['big_peak_rss']):>14} {mib(s['resident_peak_rss']):>16}")
        print(
            f"  speed big/resident {s['speed_ratio']:.3f} wall, {s['speed_ratio_cpu']:.3f} CPU "
            "(goal >= 0.9); "
            f"peak RSS {mib(s['big_peak_rss'])} (goal <= 1024 MiB)"
        )
    if "restart_ratio_cpu" in s:
        print(
            f"  restart -> first applied batch: big {s['big_restart_s']:.2f} s (goal <= 10 s), empty "
            f"{s['empty_restart_s']:.2f} s, big/empty {s['restart_ratio']:.2f} (goal <= 1.5); first batch "
            f"alone {s['big_first_batch_s']:.2f} s vs {s['empty_first_batch_s']:.2f} s; CPU "
            f"{s['big_restart_cpu_s']:.2f} s vs {s['empty_restart_cpu_s']:.2f} s, "
            f"{s['restart_ratio_cpu']:.2f}"
        )
    for name, figures in report.get("row_memory", {}).items():
        print(
            f"  resident memory per hot row, {name}: {figures['traced_bytes_per_row']} B traced "
            f"(goal <= 600), {figures['rss_bytes_per_row']} B RSS ({figures['rows']:,} rows, "
            f"{figures['users']:,} users)"
        )
    replay = report.get("replay")
    if replay:
        for mode, runs in replay["runs"].items():
            peak = max(r["peak_rss"] for r in runs)
            secs = statistics.median(r["seconds"] for r in runs)
            goal = "300 MiB" if mode == "state_dir" else "1024 MiB"
            print(f"  replay {mode}: peak RSS {mib(peak)} (goal <= {goal}), {secs:.0f} s median")
        print(f"  replay outputs equal (in memory vs --state-dir): {replay['outputs_equal']}")


def parse(argv: list[str]) -> argparse.Namespace:
    from app.settings import Settings

    default_hot = Settings().processing.hot_rows
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", default="main", choices=("main", "child", "rowmem"))
    parser.add_argument("--mode", default="big")
    parser.add_argument("--case", choices=("spread", "groups"), default="spread")
    parser.add_argument("--measure", choices=("traced", "rss"), default="traced")
    parser.add_argument("--state", default="")
    parser.add_argument("--users", type=int, default=env_int("SBENCH_USERS", 200_000))
    parser.add_argument("--conversations", type=int, default=env_int("SBENCH_CONVERSATIONS", 50))
    parser.add_argument("--group", type=int, default=env_int("SBENCH_GROUP", 10))
    parser.add_argument("--entries", type=int, default=env_int("SBENCH_TRAFFIC", 300_000))
    parser.add_argument("--batch", type=int, default=env_int("SBENCH_BATCH", 5000))
    parser.add_argument("--reps", type=int, default=env_int("SBENCH_REPS", 3))
    parser.add_argument("--restart-reps", type=int, default=env_int("SBENCH_RESTART_REPS", 5))
    parser.add_argument(
        "--parts",
        default=os.environ.get("SBENCH_PARTS", "traffic,restart,rowmem,replay"),
        help="which parts to run (comma-separated); parts run alone update bench/out/state_report.json",
    )
    parser.add_argument("--hot-rows", type=int, default=env_int("SBENCH_HOT_ROWS", int(default_hot)))
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--rowmem-users", type=int, default=env_int("SBENCH_ROWMEM_USERS", 2000))
    parser.add_argument("--replay-users", type=int, default=env_int("SBENCH_REPLAY_USERS", 200_000))
    parser.add_argument("--replay-conversations", type=int, default=env_int("SBENCH_REPLAY_CONVERSATIONS", 5))
    parser.add_argument("--replay-messages", type=int, default=env_int("SBENCH_REPLAY_MESSAGES", 3))
    parser.add_argument("--replay-reps", type=int, default=env_int("SBENCH_REPLAY_REPS", 1))
    parser.add_argument(
        "--no-replay",
        dest="replay",
        action="store_false",
        default=os.environ.get("SBENCH_REPLAY", "1") != "0",
    )
    parser.add_argument("--timeout", type=float, default=float(env_int("SBENCH_TIMEOUT", 3600)))
    return parser.parse_args(argv)


if __name__ == "__main__":
    parsed = parse(sys.argv[1:])
    if parsed.command == "child":
        print(orjson.dumps(asyncio.run(run_worker(parsed))).decode())
    elif parsed.command == "rowmem":
        print(orjson.dumps(run_rowmem(parsed)).decode())
    else:
        sys.exit(main(parsed))
