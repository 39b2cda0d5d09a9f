"""The shape every issue-18 fault scenario shares: a private stack on the real servers, workers
whose links can differ from the stack's own (a worker through a proxy while the simulator, the
checks and the clean-up talk to the servers directly), a simulated stream at a steady rate in
the background, and the end state compared with `projector replay` of the exact stream.

Used by tests/integration/test_chaos_*.py at a CI size and by `make chaos` at full size."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from app.metrics import sample
from tests.integration.crash_stress import unread_drift
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, read_jsonl


@dataclass(frozen=True)
class Traffic:
    users: int = 40
    conversations: int = 30
    group_size: int = 15
    messages: int = 600
    rate: float = 20.0  # messages/s
    seed: int = 18


@dataclass
class Expected:
    rows: list[dict[str, Any]]
    badges: list[dict[str, Any]]
    entries: int

    @property
    def versions(self) -> dict[int, int]:
        return {b["user_id"]: b["projection_mailbox_seq"] for b in self.badges}


@dataclass
class Outcome:
    mismatched_rows: int = 0
    mismatched_badges: int = 0
    lost: int = 0
    double_counted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return (self.mismatched_rows, self.mismatched_badges, self.lost, self.double_counted) == (0, 0, 0, 0)


def metrics_env() -> dict[str, str]:
    return {"PROJECTOR_WORKER_METRICS_PORT": str(free_port())}


def start_worker(stack: Stack, index: int = 0, **env: str) -> subprocess.Popen[bytes]:
    """Like Stack.start_worker, with `env` on top of the stack's (a proxied link, a knob)."""
    log = (stack.tmp / f"worker-{index}.log").open("ab")
    full = {**stack.env, "PROJECTOR_DATA_DIR": str(stack.tmp / f"worker-{index}-data"), **env}
    proc = subprocess.Popen(
        [*PROJECTOR, "worker"], cwd=ROOT, env=full, stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    stack.workers.append(proc)
    return proc


async def wait_ready(stack: Stack, index: int = 0, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while "Worker ready" not in stack.log_tail(index, 100_000):
        stack.alive(index)()
        if time.monotonic() > deadline:
            raise AssertionError(f"worker {index} not ready after {timeout}s:\n{stack.log_tail(index)}")
        await asyncio.sleep(0.3)


def traffic_task(stack: Stack, tmp: Path, t: Traffic) -> tuple[asyncio.Task[Any], Path]:
    """`projector simulate` at t.rate in the background (the stack's own, direct links)."""
    stream = tmp / f"chaos-stream-{t.seed}.jsonl"
    task = asyncio.create_task(
        asyncio.to_thread(
            stack.run,
            "simulate",
            *("--users", str(t.users), "--conversations", str(t.conversations)),
            *("--group-size", str(t.group_size), "--messages", str(t.messages)),
            *("--rate", str(t.rate), "--lanes", str(stack.settings.processing.lanes), "--seed", str(t.seed)),
            *("--out", str(stream), "--progress", "never"),
            timeout=t.messages / max(t.rate, 1) + 900,
        )
    )
    return task, stream


def replay(stack: Stack, stream: Path, tmp: Path) -> Expected:
    out = tmp / f"replay-{stream.stem}"
    lanes = str(stack.settings.processing.lanes)
    # The stream's size follows the machine (overload offers twice the capacity measured here:
    # 14M entries, 6.9 GB on a quiet 2-core machine), so does the time allowed: at least 5 MB/s
    # while workers catching up share the cores (replay alone reads ~50 MB/s).
    timeout = max(300.0, stream.stat().st_size / 5e6)
    argv = ("replay", "--input", str(stream), "--out", str(out), "--lanes", lanes, "--progress", "never")
    stack.run(*argv, timeout=timeout)
    with stream.open("rb") as lines:  # line by line: the stream may not fit in memory twice
        entries = sum(1 for line in lines if line.strip() and b'"watermark"' not in line)
    return Expected(read_jsonl(out / "projections.jsonl"), read_jsonl(out / "badges.jsonl"), entries)


async def compare(stack: Stack, expected: Expected) -> Outcome:
    rows, badges = await stack.projection(sorted(expected.versions))
    outcome = Outcome()
    mine = {(r["user_id"], r["conversation_id"]): r for r in rows}
    theirs = {(r["user_id"], r["conversation_id"]): r for r in expected.rows}
    outcome.mismatched_rows = sum(1 for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    got_badges = {b["user_id"]: b for b in badges}
    want_badges = {b["user_id"]: b for b in expected.badges}
    outcome.mismatched_badges = sum(
        1 for k in got_badges.keys() | want_badges.keys() if got_badges.get(k) != want_badges.get(k)
    )
    outcome.lost, outcome.double_counted = unread_drift(rows, expected.rows)
    return outcome


async def scrape(port: int | str) -> str:
    """One /metrics text of a worker (empty when it does not answer)."""
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r,
        ):
            return await r.text() if r.status == 200 else ""
    except (TimeoutError, aiohttp.ClientError):
        return ""


def total(text: str, name: str) -> float:
    """The sum of a metric's samples over all label sets (0 when absent)."""
    found = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                found += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return found


def one(text: str, name: str) -> float:
    return float(sample(text, name) or 0)


async def mirror_diff(stack: Stack, tmp: Path, name: str) -> dict[str, Any]:
    """`projector rebuild --from-state` into a fresh namespace, diffed with the live one: the
    Cassandra mirror holds what the projection holds when the diff is identical."""
    import orjson

    from app.stores.redis_projection import RedisProjectionStore

    fresh = f"{stack.settings.redis.projection_namespace}-{name}"
    report = tmp / f"rebuild-{name}.json"
    try:
        await asyncio.to_thread(
            stack.run,
            "rebuild",
            "--from-state",
            "--namespace",
            fresh,
            "--all-known",
            "--report",
            str(report),
            timeout=900,
        )
        diff: dict[str, Any] = orjson.loads(report.read_bytes())["diff"]
        return diff
    finally:
        store = RedisProjectionStore.from_settings(stack.settings.redis, fresh)
        try:
            await store.delete_all()
        finally:
            await store.aclose()


# The UserConversationState columns a projection row carries too, by the same name: where the
# mirror must hold exactly what replay's rows say once it has caught up.
MIRRORED_ROW_FIELDS = (
    "membership",
    "pin_rank",
    "archived",
    "muted",
    "read_conversation_seq",
    "hidden_before_conversation_seq",
    "deleted_before_conversation_seq",
    "joined_at_conversation_seq",
    "left_at_conversation_seq",
)


def mirror_state_diff(stack: Stack, expected: Expected) -> dict[str, Any]:
    """UserConversationState as Cassandra holds it (the stack's own link) against replay's rows,
    column by column (MIRRORED_ROW_FIELDS); every row replay has must be there, and no other."""
    from app.stores.cassandra_exec import checked_keyspace
    from app.stores.cassandra_session import open_cluster

    cluster, session = open_cluster(stack.settings.cassandra)
    try:
        keyspace = checked_keyspace(stack.settings.cassandra.cassandra_keyspace)
        stored = {
            (int(r.user_id), str(r.conversation_id)): r._asdict()
            for r in session.execute(f"SELECT * FROM {keyspace}.user_conversation_state")
        }
    finally:
        cluster.shutdown()
    want = {(int(r["user_id"]), str(r["conversation_id"])): r for r in expected.rows}
    fields: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    differing = 0
    for key in sorted(want.keys() & stored.keys()):
        wrong = {f: [want[key].get(f), stored[key].get(f)] for f in MIRRORED_ROW_FIELDS}
        wrong = {f: pair for f, pair in wrong.items() if pair[0] != pair[1]}
        if wrong:
            differing += 1
            for f in wrong:
                fields[f] = fields.get(f, 0) + 1
            if len(examples) < 5:
                examples.append({"user_id": key[0], "conversation_id": key[1], "replay_vs_mirror": wrong})
    missing, extra = want.keys() - stored.keys(), stored.keys() - want.keys()
    return {
        "equal": not (differing or missing or extra),
        "rows": len(stored),
        "rows_differing": differing,
        "rows_missing": len(missing),
        "rows_extra": len(extra),
        "fields_differing": fields,
        "examples": examples,
    }


def rows_with_a_leave(stream: Path) -> set[tuple[int, str]]:
    """(user, conversation) rows whose stream has a leave: a former member, or one that joined
    again. A rebuild from state cannot know what such a row received in an earlier membership,
    nor that a recall after the leave did not reach it (app/rebuild/from_state.py, README)."""
    import orjson

    rows: set[tuple[int, str]] = set()
    for line in stream.read_bytes().splitlines():
        if b'"leave"' in line:
            entry = orjson.loads(line)
            if entry.get("type") == "leave":
                rows.add((int(entry["user_id"]), str(entry["conversation_id"])))
    return rows


def unexplained_rebuild_differences(diff: dict[str, Any], leaves: set[tuple[int, str]]) -> list[str]:
    """What a `projector rebuild --from-state` diff shows beyond what state cannot know: rows
    added or removed, a changed row (or a badge of a user) without a leave in its history, more
    changed rows than rows with a leave. Empty when every difference is explained."""
    out: list[str] = []
    for kind in ("rows_added", "rows_removed"):
        if diff.get(kind, 0):
            out.append(f"{kind}: {diff[kind]}")
    if diff.get("rows_changed", 0) > len(leaves):
        out.append(f"rows_changed {diff['rows_changed']} > rows with a leave {len(leaves)}")
    examples = diff.get("examples", {})
    for row in examples.get("changed", []):
        if (int(row["user_id"]), str(row["conversation_id"])) not in leaves:
            out.append(f"changed without a leave: {row}")
    users = {user for user, _ in leaves}
    for badge in examples.get("badges", []):
        if int(badge["user_id"]) not in users:
            out.append(f"badge without a leave: {badge}")
    return out


def placed(lines: list[bytes], partitions: int) -> list[list[tuple[int, bytes | None, bytes]]]:
    """Per line, its records (partition, key, line) as Stack.produce would send them (entries keyed by
    user id through Kafka's default partitioner, markers to every partition), worked out once so
    a paced producer spends its time sending."""
    import orjson
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    out: list[list[tuple[int, bytes | None, bytes]]] = []
    for raw in lines:
        try:
            user = orjson.loads(raw).get("user_id")
        except (orjson.JSONDecodeError, AttributeError):
            user = None
        if isinstance(user, int):
            key = str(user).encode()
            out.append([(partitioner(key, every, every), key, raw)])
        else:
            out.append([(p, None, raw) for p in every])
    return out


async def send_batches(producer: Any, topic: str, records: list[tuple[int, bytes | None, bytes]]) -> None:
    """Send records in per-partition batches (each partition's order kept): several times the
    throughput of one send() per record, which matters when the load must outrun a worker on
    the same cores."""
    batches: dict[int, Any] = {}
    pending = []
    for partition, key, value in records:
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            pending.append(await producer.send_batch(batch, topic, partition=partition))
            batch = batches[partition] = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
    for partition, batch in batches.items():
        if batch.record_count():
            pending.append(await producer.send_batch(batch, topic, partition=partition))
    await asyncio.gather(*pending)
