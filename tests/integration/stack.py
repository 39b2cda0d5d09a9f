"""A private copy of the product's stack for one test: unique topics, keyspace, Redis namespace,
consumer group and worker data dir on the shared local servers; workers as subprocesses."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from app.domain.badge import Badge
from app.settings import Settings
from tests.support.projection_files import as_replay_files

ROOT = Path(__file__).resolve().parents[2]
PROJECTOR = [sys.executable, "-m", "app"]
# SESSION_PROJECTOR_TEST_BUILD=compiled (issue 30; `make test` sets it for a second run of the
# worker tests that decide correctness): the workers run the mypyc-compiled build, what a fleet
# installed with `pip install .` runs. Everything else (replay for the expected state, simulate,
# bootstrap) stays the checkout's pure code, so the two builds are checked against each other.
WORKER_BUILD = os.environ.get("SESSION_PROJECTOR_TEST_BUILD", "pure")
COMPILED_SITE = ROOT / os.environ.get("COMPILED_BUILD_DIR", "build/compiled") / "site"


def worker_command(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The worker's command line and environment for the build under test."""
    if WORKER_BUILD == "pure":
        return [*PROJECTOR, "worker"], env
    _check_compiled_build()
    return [*COMPILED_PROJECTOR, "worker"], {**env, "PYTHONPATH": COMPILED_PATH}


COMPILED_PROJECTOR = [sys.executable, "-P", "-m", "app"]
COMPILED_PATH = os.pathsep.join([str(COMPILED_SITE), str(ROOT)])


@functools.cache
def _check_compiled_build() -> None:
    if WORKER_BUILD != "compiled":
        raise ValueError(f"SESSION_PROJECTOR_TEST_BUILD must be pure or compiled, not {WORKER_BUILD!r}")
    version = subprocess.run(
        [*COMPILED_PROJECTOR, "--version"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": COMPILED_PATH},
        capture_output=True,
        check=False,
        timeout=60,
    )
    said = (version.stdout + version.stderr).decode(errors="replace").strip()
    if "compiled" not in said:
        raise AssertionError(
            f"SESSION_PROJECTOR_TEST_BUILD=compiled but the worker would run {said!r} "
            "(scripts/test_compiled.sh --build-only makes the build)"
        )


class Stack:
    def __init__(self, name: str, tmp: Path, partitions: int = 2, lanes: int = 2, **overrides: str) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "PROJECTOR_APP_ID": f"{name}-app",
            **Settings.topic_env(name),
            "PROJECTOR_TOPIC_PARTITIONS": str(partitions),
            "PROJECTOR_CASSANDRA_KEYSPACE": name.replace("-", "_")[:48],
            "PROJECTOR_PROJECTION_NAMESPACE": name,
            "PROJECTOR_LANES": str(lanes),
            "PROJECTOR_PROJECTION_COMPACTION_WINDOW_MS": "300",
            "PROJECTOR_WORKER_WEB_PORT": "0",
            "PROJECTOR_LOG_LEVEL": "INFO",
            **overrides,
        }
        self.settings = Settings.from_env(self.env)
        self.workers: list[subprocess.Popen[bytes]] = []
        # Per (lane, partition): the distinct (user_id, mailbox_seq) entries `produce` sent there.
        self._sent: dict[tuple[int, int], set[tuple[int, int]]] = {}

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [*PROJECTOR, *args], cwd=ROOT, env=self.env, capture_output=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise AssertionError(
                f"projector {' '.join(args)} exited {done.returncode}:\n{done.stderr.decode()[-3000:]}"
            )
        return done

    def start_worker(self, index: int = 0) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"worker-{index}.log").open("ab")
        command, env = worker_command(
            {**self.env, "PROJECTOR_DATA_DIR": str(self.tmp / f"worker-{index}-data")}
        )
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.workers.append(proc)
        return proc

    def log_tail(self, index: int = 0, lines: int = 60) -> str:
        path = self.tmp / f"worker-{index}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop_workers(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(sig)
        for proc in self.workers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def projection(self, user_ids: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Rows and badges as the Redis projection store holds them (replay's file layout)."""
        from app.stores.redis_projection import RedisProjectionStore

        store = RedisProjectionStore.from_settings(
            self.settings.redis, self.settings.redis.projection_namespace
        )
        try:
            return await as_replay_files(store, user_ids)
        finally:
            await store.aclose()

    def alive(self, *indexes: int) -> Callable[[], None]:
        """A check that fails with the worker's log tail when one of these workers (all when
        none is named) has exited."""

        def check() -> None:
            for index in indexes or range(len(self.workers)):
                proc = self.workers[index]
                if proc.poll() is not None:
                    raise AssertionError(f"worker {index} exited {proc.returncode}:\n{self.log_tail(index)}")

        return check

    async def wait_for_versions(
        self, expected: dict[int, int], timeout: float, alive: Callable[[], None]
    ) -> None:
        """Until every user's stored version reached the expected one (the replay's)."""
        from app.stores.redis_projection import RedisProjectionStore

        store = RedisProjectionStore.from_settings(
            self.settings.redis, self.settings.redis.projection_namespace
        )
        users = sorted(expected)
        deadline = time.monotonic() + timeout
        try:
            while True:
                versions = await store.versions(users)
                behind = [u for u, v in zip(users, versions, strict=True) if v < expected[u]]
                if not behind:
                    return
                alive()
                if time.monotonic() > deadline:
                    late = {u: (versions[users.index(u)], expected[u]) for u in behind[:5]}
                    tails = "\n".join(
                        f"--- worker {index} (exit {proc.poll()}):\n{self.log_tail(index, 30)}"
                        for index, proc in enumerate(self.workers)
                    )
                    raise AssertionError(
                        f"{len(behind)} users still behind after {timeout}s, (stored, expected) e.g. {late}; "
                        f"logs in {self.tmp}\n{tails}"
                    )
                await asyncio.sleep(0.5)
        finally:
            await store.aclose()

    async def consume(
        self, topic: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float
    ) -> list[dict[str, Any]]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.settings.kafka.kafka_bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )
        await consumer.start()
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        try:
            while not until(out):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topic}: condition not met after {timeout}s ({len(out)} records)")
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    out += [orjson.loads(r.value) for r in records]
        finally:
            await consumer.stop()
        return out

    async def open_producer(self) -> Any:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka.kafka_bootstrap, linger_ms=5)
        await producer.start()
        return producer

    async def produce(self, lines: list[bytes], *, producer: Any = None) -> None:
        """Produce raw mailbox lines as the lanes would: entries keyed by user id, watermark
        markers (and anything without a user) to EVERY partition. One producer keeps each
        partition's order; the markers follow the entries they cover.

        A marker's `count` (docs/contract.md §9) counts what its lane sent to ONE partition; a
        file from `simulate --no-kafka` has no partitions, so its markers count the whole lane,
        and sent as they are to every partition each would report the other partitions' entries
        as missing. Here each partition's copy carries what this stack sent to that partition
        (distinct entries of the lane at or below the marker, every `produce` call so far): the
        lines given are what was sent."""
        from app.kafka.ops import partition_for

        topic = self.settings.topics.topic_mailbox_tail
        count = self.settings.topics.topic_partitions
        own = producer is None
        if own:
            producer = await self.open_producer()
        try:
            pending = []
            for raw in lines:
                try:
                    record = orjson.loads(raw)
                    user = record.get("user_id")
                except (orjson.JSONDecodeError, AttributeError):
                    record, user = None, None
                if isinstance(user, int):
                    key = str(user).encode()
                    partition = partition_for(key, count)
                    lane, seq = record.get("lane"), record.get("mailbox_seq")
                    if isinstance(lane, int) and isinstance(seq, int):
                        self._sent.setdefault((lane, partition), set()).add((user, seq))
                    pending.append(await producer.send(topic, raw, key=key, partition=partition))
                else:
                    for partition in range(count):
                        value = raw
                        if isinstance(record, dict) and isinstance(record.get("count"), int):
                            lane, mark = record.get("lane"), record.get("watermark")
                            if isinstance(lane, int) and isinstance(mark, int):
                                sent = self._sent.get((lane, partition), set())
                                mine = sum(1 for _, seq in sent if seq <= mark)
                                value = orjson.dumps({**record, "count": mine})
                        pending.append(await producer.send(topic, value, partition=partition))
                if len(pending) >= 5000:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
        finally:
            if own:
                await producer.stop()

    async def group_offsets(self) -> dict[int, int]:
        """mailbox-tail offsets committed by the workers' consumer group, per partition."""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka.kafka_bootstrap)
        await admin.start()
        try:
            committed = await admin.list_consumer_group_offsets(self.settings.topics.app_id)
        finally:
            await admin.close()
        topic = self.settings.topics.topic_mailbox_tail
        return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}

    async def end_offsets(self) -> dict[int, int]:
        """mailbox-tail's end offsets, per partition."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        topic = self.settings.topics.topic_mailbox_tail
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka.kafka_bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(self.settings.topics.topic_partitions)]
            return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
        finally:
            await consumer.stop()

    def write_env(self, path: Path) -> None:
        """The stack's PROJECTOR_ settings as shell assignments (`set -a; . stack.env`: its
        topics, keyspace and namespace for a post-mortem with the projector's own commands)."""
        lines = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()) if k.startswith("PROJECTOR_")]
        path.write_text("\n".join(lines) + "\n")

    async def cleanup(self) -> None:
        self.stop_workers(signal.SIGKILL)
        from aiokafka.admin import AIOKafkaAdminClient

        from app.stores.redis_projection import RedisProjectionStore

        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka.kafka_bootstrap)
        await admin.start()
        try:
            present = set(await admin.list_topics())
            prefix = self.settings.topics.app_id.removesuffix("-app")
            doomed = [t for t in present if t.startswith(prefix)]
            if doomed:
                await admin.delete_topics(doomed)
        finally:
            await admin.close()
        store = RedisProjectionStore.from_settings(
            self.settings.redis, self.settings.redis.projection_namespace
        )
        try:
            await store.delete_all()
        finally:
            await store.aclose()
        from app.stores.cassandra_session import open_cluster

        cluster, session = open_cluster(self.settings.cassandra)
        try:
            session.execute(
                f"DROP KEYSPACE IF EXISTS {self.settings.cassandra.cassandra_keyspace}", timeout=120
            )
        finally:
            cluster.shutdown()


def _ephemeral_ports() -> range:
    """The kernel's range for outgoing connections' local ports (Linux default if unreadable)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


_PORTS = random.Random()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server a test starts (worker, API, rebuild).

    Picked below the ephemeral range: a server binds it seconds later, and meanwhile the tests
    open many client connections, whose local ports come from that range (one could take a port
    the kernel handed out as "free" from it)."""
    ephemeral = _ephemeral_ports()
    for _ in range(200):
        port = _PORTS.randrange(20000, 32000)
        if port in ephemeral:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: try another
            return port
    with socket.socket() as sock:  # the range is unusual here: any port the kernel calls free
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found


async def scrape_until(
    url: str,
    ready: Callable[[str], bool],
    timeout: float,
    alive: Callable[[], None],
    *,
    detail: Callable[[str], object] | None = None,
    every: float = 0.5,
) -> str:
    """GET `url` (a /metrics) every `every` s until `ready` holds for its text, failing when
    `alive` does (the server exited) or after `timeout` s; on timeout the message shows
    `detail(last text)`, or the scrape's tail."""
    deadline = time.monotonic() + timeout
    text = ""
    async with aiohttp.ClientSession() as http:
        while True:
            alive()
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        text = await resp.text()
                        if ready(text):
                            return text
            except aiohttp.ClientConnectionError:
                pass  # the server is still starting
            if time.monotonic() > deadline:
                shown = f"\n{text[-3000:]}" if detail is None else f" {detail(text)}"
                raise AssertionError(f"{url}: not met after {timeout}s; last scrape:{shown}")
            await asyncio.sleep(every)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


async def start_api(stack: Stack, port: int, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`projector api` on 127.0.0.1:`port` with the stack's environment plus `env`, its output
    appended to `log`; returned once /openapi.json answers 200 (fails if it exits or takes 120 s)."""
    out = log.open("ab")
    proc = subprocess.Popen(
        [*PROJECTOR, "api", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env={**stack.env, **env},
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
    )
    deadline = time.monotonic() + 120
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"projector api exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                async with http.get(f"http://127.0.0.1:{port}/openapi.json") as resp:
                    if resp.status == 200:
                        return proc
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"projector api did not answer:\n{log.read_text()[-3000:]}")
            await asyncio.sleep(0.3)


def store_messages(settings: Settings, lines: Iterable[bytes]) -> None:
    """Write the stream's messages, recalls and heads to the real MessageStore first, as the
    chat backend (and `projector simulate`) does before the mailbox entries go out: a bounded
    recompute in the worker reads them there."""
    from app.stores.cassandra_messages import CassandraMessageStore, ConversationHead, NewMessage
    from app.stores.cassandra_session import open_cluster

    messages: dict[tuple[str, int], NewMessage] = {}
    recalls: list[tuple[str, int, bool]] = []
    for e in map(orjson.loads, lines):
        if e.get("type") == "message":
            key = (e["conversation_id"], e["conversation_seq"])
            mentions = frozenset({e["user_id"]}) if e["mention"] else frozenset()
            if key in messages:
                mentions |= messages[key].mentions
            messages[key] = NewMessage(
                e["conversation_id"],
                e["conversation_seq"],
                e["message_id"],
                e["activity_id"],
                e["sender_id"],
                e["created_at"],
                e["counts_unread"],
                mentions,
            )
        elif e.get("type") == "recall":
            recalls.append((e["conversation_id"], e["target_conversation_seq"], False))
    heads: dict[str, ConversationHead] = {}
    for m in messages.values():
        if (
            m.conversation_id not in heads
            or m.conversation_seq > heads[m.conversation_id].latest_conversation_seq
        ):
            heads[m.conversation_id] = ConversationHead(
                m.conversation_id, m.conversation_seq, m.message_id, m.activity_id
            )
    cluster, session = open_cluster(settings.cassandra)
    try:
        store = CassandraMessageStore(session, settings.cassandra.cassandra_keyspace)
        store.put_messages(messages.values())
        store.mark_recalled_many(recalls)
        store.update_heads(heads.values())
    finally:
        cluster.shutdown()


def simulated(
    stack: Stack, tmp: Path, messages: int = 300, seed: int = 5, rate: str = "0", *, kafka: bool = True
) -> tuple[Path, dict[str, Any]]:
    """Run `projector simulate` into the stack; replay its --out file for the expected result.
    With `kafka=False` the MessageStore gets every message and the entries only go to the file
    (the test produces them itself, in the parts it needs: `Stack.produce`)."""
    stream = tmp / f"stream-{seed}.jsonl"
    stack.run(
        "simulate",
        "--users",
        "30",
        "--conversations",
        "10",
        "--group-size",
        "20",
        "--messages",
        str(messages),
        "--rate",
        rate,
        "--lanes",
        str(stack.settings.processing.lanes),
        "--seed",
        str(seed),
        "--out",
        str(stream),
        "--progress",
        "never",
        *(() if kafka else ("--no-kafka",)),
    )
    out = tmp / f"replay-{seed}"
    stack.run(
        "replay", "--input", str(stream), "--out", str(out), "--lanes", str(stack.settings.processing.lanes)
    )
    expected = {
        "rows": read_jsonl(out / "projections.jsonl"),
        "badges": read_jsonl(out / "badges.jsonl"),
        "versions": {b["user_id"]: b["projection_mailbox_seq"] for b in read_jsonl(out / "badges.jsonl")},
    }
    return stream, expected


def badge_from_rows(rows: list[dict[str, Any]], include_muted: bool = False) -> Badge:
    unread = mention = muted = 0
    for row in rows:
        active = row["membership"] == "active"
        if active and not row["archived"] and (include_muted or not row["muted"]):
            unread += row["unread_count"]
        if active:
            mention += row["mention_count"]
        if row["muted"]:
            muted += row["unread_count"]
    return Badge(unread, mention, muted)


async def assert_final_equals_replay(stack: Stack, expected: dict[str, Any]) -> None:
    rows, badges = await stack.projection(sorted(expected["versions"]))
    assert badges == expected["badges"]
    assert rows == expected["rows"]
    # J-7: badge and rows never tear: every user's badge is the sum over its rows.
    for badge in badges:
        mine = [row for row in rows if row["user_id"] == badge["user_id"]]
        assert badge_from_rows(mine) == Badge(
            badge["total_unread"], badge["total_mention"], badge["muted_unread"]
        )
