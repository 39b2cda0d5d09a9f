"""Live push gateway benchmark (issue 16): `projector api` (with its gateway, as deployed) on the
local servers, private topics / keyspace / Redis namespace, everything removed at the end.

Three figures, each next to a baseline measured side by side:

1. **Delivery latency** produce -> SDK event, p50/p99, with the worker's compaction window at
   100 ms: message entries go to mailbox-tail at a steady rate (a lane marker after each), the
   real `projector worker` flushes every 100 ms, the gateway forwards, the SDK's LiveStream
   applies. Each entry's latency ends when the SDK applies the first SESSION_DELTA whose version
   covers it. Baseline, at the same time: a plain Kafka consumer of the session-delta topic
   (the frame as the worker published it). The gateway's own hop is also timed alone: frames
   produced straight onto session-delta -> SDK event, against the same plain consumer.
2. **Idle connections held**: N SSE streams (default 10,000, one user each) opened by a client
   in another process and held for several heartbeats; the gateway process's RSS (VmRSS) is
   read with every stream open, against the same process before the first one (the baseline).
   Every connection must have received heartbeats.
3. **Fan-out frames/s**: frames for `--fanout-users` of those connected users produced onto
   session-delta as fast as possible; frames/s = frames received by the clients / (last
   received - first produced). Baseline: a plain consumer reading and decoding the same frames.
   Repeated `--reps` times, interleaved; the median of per-repetition ratios is reported.

    .venv/bin/python bench/gateway_bench.py [--connections 10000 --fanout-users 1000 ...]

Internal mode (the client process): `--hold URL SECRET FIRST_USER COUNT`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.api.tokens import TokenSigner  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.harness import percentile  # noqa: E402

OUT = ROOT / "bench" / "out"
FIRST_USER = 9_000_000_000_000_000_000  # above 2^53: ids go out as strings
CONV = "0000feed-0000-4000-8000-00000000feed"


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 0.5), 1),
        "p99": round(percentile(values, 0.99), 1),
        "n": len(values),
    }


# -- SDK streams that time what they apply (this bench's latency phase, bench/mix_bench.py) --------


def listening_url(line: str) -> str | None:
    """The URL `projector api` announces on its first line ("... listening on URL ..."), or None."""
    if "listening on " not in line:
        return None
    return line.split("listening on ")[1].split()[0].rstrip(",")


AppliedHook = Callable[[int, int, int], None]  # (user, version, time_ns): a SESSION_DELTA applied


def follow_users(
    url: str, secret: str, users: list[int], on_applied: AppliedHook, stop: asyncio.Event
) -> tuple[list[tuple[Any, Any]], list[asyncio.Task[None]]]:
    """One SDK `LiveStream` per user over the gateway's SSE stream, each running until `stop`;
    `on_applied(user, version, time.time_ns())` right after the SDK applied a SESSION_DELTA (its
    version covers every entry of the user up to it). Returns ([(client, stream)], tasks)."""
    from app.sdk import LiveSessionList, SessionsClient
    from app.sdk.stream import LiveStream

    class Timed(LiveSessionList):
        async def apply(self, frame: Any) -> Any:
            result = await super().apply(frame)
            if frame.get("type") == "SESSION_DELTA" and result.applied:
                on_applied(self.user_id, frame["projection_mailbox_seq"], time.time_ns())
            return result

    signer = TokenSigner(secret)
    clients: list[tuple[Any, Any]] = []
    tasks: list[asyncio.Task[None]] = []
    for user in users:
        api = SessionsClient(url, signer.mint(user, int(time.time()) + 3600))
        follow = LiveStream(Timed(api, user), read_timeout_s=30)
        clients.append((api, follow))
        tasks.append(asyncio.create_task(follow.run(stop)))
    return clients, tasks


async def until_synced(clients: list[tuple[Any, Any]], timeout_s: float) -> None:
    """Every stream has said hello and pulled its list (frames after that are applied on it)."""
    for _, follow in clients:
        await follow.until(lambda f=follow: f.synced, timeout_s)


async def close_followers(clients: list[tuple[Any, Any]], tasks: list[asyncio.Task[None]]) -> None:
    """After `stop` is set: the streams' tasks end, then their HTTP sessions close."""
    await asyncio.gather(*tasks)
    for api, _ in clients:
        await api.close()


# -- the client process: N raw SSE connections ---------------------------------------------------


async def hold(url: str, secret: str, first_user: int, count: int) -> None:
    """Open `count` streams (users first_user..), report on stdout, obey stdin commands."""
    raise_fd_limit()
    host, port = url.removeprefix("http://").split(":")
    signer = TokenSigner(secret)
    expires = int(time.time()) + 3600
    beats = [0] * count
    frames = [0] * count
    state: dict[str, Any] = {"expect": None, "received": 0, "first": 0, "last": 0}
    done = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []
    gate = asyncio.Semaphore(100)
    opened = 0

    async def one(i: int) -> None:
        nonlocal opened
        async with gate:
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
            token = signer.mint(first_user + i, expires)
            writer.write(
                f"GET /v1/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"stream {i}: {status!r}")
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            hello = b""
            while b"event: hello" not in hello:
                hello += await reader.read(65536)
            writers.append(writer)
            opened += 1
        # Chunked transfer framing never splits an event: each event is one write, one chunk.
        while chunk := await reader.read(65536):
            beats[i] += chunk.count(b"event: heartbeat")
            n = chunk.count(b"event: SESSION_DELTA")
            if n:
                now = time.time_ns()
                state["received"] += n
                state["first"] = state["first"] or now
                state["last"] = now
                frames[i] += n
                if state["expect"] is not None and state["received"] >= state["expect"]:
                    done.set()

    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    while opened < count:
        failed = [t for t in tasks if t.done() and t.exception() is not None]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]
        await asyncio.sleep(0.2)
    print(orjson.dumps({"ready": opened}).decode(), flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := (await stdin.readline()).decode().strip():
        command, _, arg = line.partition(" ")
        if command == "expect":  # how many frames (in total, from now) to wait for
            state["expect"] = state["received"] + int(arg)
            done.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=300)
            print(
                orjson.dumps({"received": state["received"], "last_ns": state["last"]}).decode(), flush=True
            )
        elif command == "stats":
            print(
                orjson.dumps(
                    {"beats_min": min(beats), "beats_total": sum(beats), "frames": sum(frames)}
                ).decode(),
                flush=True,
            )
        elif command == "quit":
            break
    for writer in writers:
        writer.close()
    for task in tasks:
        task.cancel()


# -- the main process ------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = uuid.uuid4().hex[:8]
        self.secret = secrets.token_urlsafe(32)
        prefix = f"gbench-{self.run_id}"
        base = Settings.from_env()
        self.env = {
            **os.environ,
            "PROJECTOR_APP_ID": f"{prefix}-app",
            **Settings.topic_env(prefix),
            "PROJECTOR_TOPIC_PARTITIONS": "4",
            "PROJECTOR_CASSANDRA_KEYSPACE": f"gbench_{self.run_id}",
            "PROJECTOR_PROJECTION_NAMESPACE": prefix,
            "PROJECTOR_LANES": "1",
            "PROJECTOR_PROJECTION_COMPACTION_WINDOW_MS": str(args.window_ms),
            "PROJECTOR_WORKER_WEB_PORT": "0",
            "PROJECTOR_DATA_DIR": str(OUT / f"gbench-{self.run_id}-worker"),
            "PROJECTOR_API_SECRET": self.secret,
            "PROJECTOR_API_FILL_FROM_STATE": "never",
            "PROJECTOR_GATEWAY_HEARTBEAT_MS": str(args.heartbeat_ms),
            "PROJECTOR_GATEWAY_MAX_CONNECTIONS": str(args.connections + 1000),
            "PROJECTOR_LOG_LEVEL": "WARNING",
        }
        self.settings = Settings.from_env({k: v for k, v in self.env.items() if k.startswith("PROJECTOR_")})
        self.kafka = base.kafka.kafka_bootstrap
        self.procs: list[subprocess.Popen[bytes]] = []
        self.api_pid = 0
        self.url = ""

    def projector(self, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", *args],
            cwd=ROOT,
            env=self.env,
            preexec_fn=raise_fd_limit,
            **popen,
        )
        self.procs.append(proc)
        return proc

    async def setup(self) -> None:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "app", "bootstrap"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bootstrap failed: {done.stderr.decode()[-2000:]}")
        api = self.projector("api", "--port", "0", stdout=subprocess.PIPE)
        assert api.stdout is not None
        line = (await asyncio.wait_for(asyncio.to_thread(api.stdout.readline), timeout=120)).decode()
        url = listening_url(line)
        if url is None:
            raise RuntimeError(f"projector api did not start: {line!r}")
        self.url = url
        self.api_pid = api.pid

    async def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        from aiokafka.admin import AIOKafkaAdminClient

        from app.stores.cassandra_session import open_cluster
        from app.stores.redis_projection import RedisProjectionStore

        admin = AIOKafkaAdminClient(bootstrap_servers=self.kafka)
        await admin.start()
        try:
            mine = [t for t in await admin.list_topics() if t.startswith(f"gbench-{self.run_id}")]
            if mine:
                await admin.delete_topics(mine)
        finally:
            await admin.close()
        store = RedisProjectionStore.from_settings(
            self.settings.redis, self.settings.redis.projection_namespace
        )
        try:
            await store.delete_all()
        finally:
            await store.aclose()
        cluster, session = await asyncio.to_thread(open_cluster, self.settings.cassandra)
        try:
            await asyncio.to_thread(
                session.execute,
                f"DROP KEYSPACE IF EXISTS {self.settings.cassandra.cassandra_keyspace}",
                timeout=120,
            )
        finally:
            cluster.shutdown()

    @contextlib.asynccontextmanager
    async def producer(self) -> AsyncIterator[Any]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.kafka, linger_ms=2)
        await producer.start()
        try:
            yield producer
        finally:
            await producer.stop()

    @contextlib.asynccontextmanager
    async def plain_consumer(self, topic: str) -> AsyncIterator[Any]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.kafka,
            group_id=None,
            auto_offset_reset="latest",
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        try:
            while not consumer.assignment():
                await asyncio.sleep(0.05)
            for tp in consumer.assignment():
                await consumer.position(tp)
            yield consumer
        finally:
            await consumer.stop()

    # -- 1. latency ------------------------------------------------------------------------

    async def latency(self) -> dict[str, Any]:
        args = self.args
        users = [FIRST_USER + 500_000 + i for i in range(args.latency_users)]
        sent: dict[int, dict[int, int]] = {u: {} for u in users}  # user -> mailbox_seq -> ns
        sdk_ms: list[float] = []
        plain_ms: list[float] = []

        def covered(user: int, version: int, now: int) -> None:
            pending = sent[user]
            for seq in [s for s in pending if s <= version]:
                sdk_ms.append((now - pending.pop(seq)) / 1e6)

        plain_seen: dict[int, int] = dict.fromkeys(users, 0)
        produced_at: dict[tuple[int, int], int] = {}

        async def plain(consumer: Any, stop: asyncio.Event) -> None:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                now = time.time_ns()
                for records in batch.values():
                    for record in records:
                        frame = orjson.loads(record.value)
                        user, version = frame["user_id"], frame["projection_mailbox_seq"]
                        if user not in plain_seen:
                            continue
                        for seq in range(plain_seen[user] + 1, version + 1):
                            if (user, seq) in produced_at:
                                plain_ms.append((now - produced_at.pop((user, seq))) / 1e6)
                        plain_seen[user] = max(plain_seen[user], version)

        worker = self.projector("worker", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = asyncio.Event()
        clients, tasks = follow_users(self.url, self.secret, users, covered, stop)
        try:
            await until_synced(clients, 60)
            async with (
                self.producer() as producer,
                self.plain_consumer(self.settings.topics.topic_session_delta) as pc,
            ):
                watcher = asyncio.create_task(plain(pc, stop))
                # Warm-up: one entry per user until the worker answers (its start-up is not timed).
                seq = await self._entries(producer, users, 1, sent, produced_at, rate=50)
                await self._settle(sent, 120)
                sdk_ms.clear()
                plain_ms.clear()
                count = int(args.latency_rate * args.latency_seconds)
                seq = await self._entries(
                    producer, users, count, sent, produced_at, rate=args.latency_rate, seq=seq
                )
                await self._settle(sent, 120)
                e2e = {"sdk": ms(sdk_ms), "plain_consumer": ms(plain_ms)}
                # The gateway hop alone: frames straight onto session-delta.
                sdk_ms.clear()
                plain_ms.clear()
                worker.terminate()
                worker.wait(timeout=60)
                await asyncio.sleep(1)
                versions = {
                    u: max(f.live.view.version for _, f in clients if f.live.user_id == u) for u in users
                }
                await self._frames(
                    producer, users, count, versions, sent, produced_at, rate=args.latency_rate
                )
                await self._settle(sent, 60)
                hop = {"sdk": ms(sdk_ms), "plain_consumer": ms(plain_ms)}
                stop.set()
                await watcher
        finally:
            stop.set()
            await close_followers(clients, tasks)
        return {
            "window_ms": args.window_ms,
            "rate_per_s": args.latency_rate,
            "users": len(users),
            "entry_to_event_ms": e2e,
            "frame_to_event_ms": hop,
        }

    async def _settle(self, sent: dict[int, dict[int, int]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(sent.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sum(map(len, sent.values()))} entries never reached the SDK")
            await asyncio.sleep(0.1)

    async def _entries(
        self,
        producer: Any,
        users: list[int],
        count: int,
        sent: dict[int, dict[int, int]],
        produced_at: dict[tuple[int, int], int],
        rate: float,
        seq: int = 0,
    ) -> int:
        """`count` message entries round robin over `users` at `rate`/s, each followed by the
        lane's marker on every partition (the watermark gate lets it through at once)."""
        topic = self.settings.topics.topic_mailbox_tail
        partitions = self.settings.topics.topic_partitions
        started = time.monotonic()
        for i in range(count):
            user = users[i % len(users)]
            seq += 1
            entry = {
                "type": "message",
                "mailbox_seq": seq,
                "lane": 0,
                "ts": int(time.time() * 1000),
                "event_id": f"b{seq}",
                "user_id": user,
                "conversation_id": CONV,
                "conversation_seq": seq,
                "message_id": f"m{seq}",
                "activity_id": f"{seq:032x}",
                "sender_id": 1,
                "created_at": int(time.time() * 1000),
                "counts_unread": True,
                "mention": False,
            }
            now = time.time_ns()
            sent[user][seq] = now
            produced_at[(user, seq)] = now
            await producer.send(topic, orjson.dumps(entry), key=str(user).encode())
            marker = orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": entry["ts"]})
            for p in range(partitions):
                await producer.send(topic, marker, partition=p)
            await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
        await producer.flush()
        return seq

    async def _frames(
        self,
        producer: Any,
        users: list[int],
        count: int,
        versions: dict[int, int],
        sent: dict[int, dict[int, int]],
        produced_at: dict[tuple[int, int], int],
        rate: float,
    ) -> None:
        topic = self.settings.topics.topic_session_delta
        started = time.monotonic()
        for i in range(count):
            user = users[i % len(users)]
            prev = versions[user]
            versions[user] = prev + 1
            now = time.time_ns()
            sent[user][prev + 1] = now
            produced_at[(user, prev + 1)] = now
            await producer.send(topic, frame(user, prev + 1, prev), key=str(user).encode())
            await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
        await producer.flush()

    # -- 2 + 3. idle connections and fan-out -------------------------------------------------

    async def connections_and_fanout(self) -> dict[str, Any]:
        args = self.args
        baseline = rss_mib(self.api_pid)
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--hold",
            self.url,
            self.secret,
            str(FIRST_USER),
            str(args.connections),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=raise_fd_limit,
        )
        assert client.stdin is not None and client.stdout is not None

        async def ask(command: str | None = None, timeout: float = 600) -> dict[str, Any]:
            assert client.stdin is not None and client.stdout is not None
            if command is not None:
                client.stdin.write(command.encode() + b"\n")
                await client.stdin.drain()
            line = await asyncio.wait_for(client.stdout.readline(), timeout=timeout)
            if not line:
                raise RuntimeError("the client process ended")
            answer: dict[str, Any] = orjson.loads(line)
            return answer

        try:
            opened_at = time.monotonic()
            ready = await ask()
            open_s = time.monotonic() - opened_at
            # Hold them for three heartbeats: every connection must have been beaten on.
            await asyncio.sleep(3 * args.heartbeat_ms / 1000 + 1)
            held_rss = rss_mib(self.api_pid)
            stats = await ask("stats")
            idle = {
                "connections": ready["ready"],
                "open_seconds": round(open_s, 1),
                "rss_mib_before": round(baseline, 1),
                "rss_mib_held": round(held_rss, 1),
                "kib_per_connection": round((held_rss - baseline) * 1024 / ready["ready"], 1),
                "heartbeat_ms": args.heartbeat_ms,
                "heartbeats_min_per_connection": stats["beats_min"],
            }
            fanout = await self._fanout(ask)
        finally:
            if client.returncode is None:
                client.stdin.write(b"quit\n")
                with contextlib.suppress(Exception):
                    await client.stdin.drain()
                try:
                    await asyncio.wait_for(client.wait(), timeout=30)
                except TimeoutError:
                    client.kill()
        return {"idle": idle, "fanout": fanout}

    async def _fanout(self, ask: Any) -> dict[str, Any]:
        args = self.args
        users = [FIRST_USER + i for i in range(min(args.fanout_users, args.connections))]
        versions = dict.fromkeys(users, 0)
        topic = self.settings.topics.topic_session_delta
        reps = []
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async with self.producer() as producer:
            for _ in range(args.reps):
                total = len(users) * args.frames_per_user
                tps = [TopicPartition(topic, p) for p in range(self.settings.topics.topic_partitions)]
                probe = AIOKafkaConsumer(bootstrap_servers=self.kafka, group_id=None)
                await probe.start()
                start_offsets = await probe.end_offsets(tps)
                await probe.stop()
                # Pre-encode: the producer's own cost is not the gateway's.
                records = []
                for _ in range(args.frames_per_user):
                    for user in users:
                        prev = versions[user]
                        versions[user] = prev + 1
                        records.append((str(user).encode(), frame(user, prev + 1, prev)))
                waiter = asyncio.create_task(ask(f"expect {total}"))
                await asyncio.sleep(0.2)
                cpu_before = cpu_s(self.api_pid)
                first_ns = time.time_ns()
                futures = [await producer.send(topic, value, key=key) for key, value in records]
                await asyncio.gather(*futures)
                got = await waiter
                gateway_s = (got["last_ns"] - first_ns) / 1e9
                gateway_cpu = cpu_s(self.api_pid) - cpu_before
                # Baseline: a plain consumer reading and decoding the same frames.
                plain = AIOKafkaConsumer(
                    bootstrap_servers=self.kafka, group_id=None, enable_auto_commit=False
                )
                await plain.start()
                plain.assign(tps)
                for tp in tps:
                    plain.seek(tp, start_offsets[tp])
                read, began = 0, time.monotonic()
                while read < total:
                    batch = await plain.getmany(timeout_ms=1000, max_records=20_000)
                    for rs in batch.values():
                        for r in rs:
                            orjson.loads(r.value)
                            read += 1
                plain_s = time.monotonic() - began
                await plain.stop()
                reps.append(
                    {
                        "frames": total,
                        "received": got["received"],
                        "gateway_frames_per_s": round(total / gateway_s),
                        # Less sensitive to the client process sharing the cores:
                        "gateway_frames_per_cpu_s": round(total / max(gateway_cpu, 0.01)),
                        "plain_consumer_frames_per_s": round(total / plain_s),
                        "ratio": round(plain_s / gateway_s, 3),  # gateway frames/s over plain
                    }
                )
        return {
            "users": len(users),
            "connections_open": args.connections,
            "reps": reps,
            "gateway_frames_per_s_median": statistics.median(r["gateway_frames_per_s"] for r in reps),
            "gateway_frames_per_cpu_s_median": statistics.median(r["gateway_frames_per_cpu_s"] for r in reps),
            "throughput_ratio_gateway_over_plain_median": statistics.median(r["ratio"] for r in reps),
        }


def frame(user: int, version: int, prev: int) -> bytes:
    return orjson.dumps(
        {
            "type": "SESSION_DELTA",
            "user_id": user,
            "projection_mailbox_seq": version,
            "prev_projection_mailbox_seq": prev,
            "driving_event_id": f"f{version}",
            "driving_mailbox_seq": version,
            "conversations": [
                {
                    "user_id": user,
                    "conversation_id": CONV,
                    "listed": True,
                    "unread_count": version,
                    "last_activity_id": f"{version:032x}",
                    "pin_rank": None,
                    "archived": False,
                    "projection_mailbox_seq": version,
                }
            ],
        }
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()
    bench = Bench(args)
    try:
        await bench.setup()
        report: dict[str, Any] = {"latency": await bench.latency()}
        report.update(await bench.connections_and_fanout())
        return report
    finally:
        await bench.cleanup()


def render(report: dict[str, Any]) -> str:
    lat, idle, fan = report["latency"], report["idle"], report["fanout"]
    e2e, hop = lat["entry_to_event_ms"], lat["frame_to_event_ms"]

    def line(label: str, figures: dict[str, Any], n: bool = True) -> str:
        count = f"  (n={figures['n']})" if n else ""
        return f"  {label:<30}p50 {figures['p50']} ms  p99 {figures['p99']} ms{count}"

    return "\n".join(
        [
            f"gateway bench ({lat['users']} SDK streams, {lat['rate_per_s']} entries/s, "
            f"window {lat['window_ms']} ms)",
            line("entry produced -> SDK event", e2e["sdk"]),
            line("  plain consumer of frames", e2e["plain_consumer"], n=False),
            line("frame produced -> SDK event", hop["sdk"]),
            line("  plain consumer", hop["plain_consumer"], n=False),
            f"  idle SSE connections held     {idle['connections']} in one process: "
            f"RSS {idle['rss_mib_held']} MiB (before: {idle['rss_mib_before']} MiB, "
            f"{idle['kib_per_connection']} KiB each), every one beaten >= "
            f"{idle['heartbeats_min_per_connection']}x at {idle['heartbeat_ms']} ms; "
            f"opened in {idle['open_seconds']} s",
            f"  fan-out                       {fan['gateway_frames_per_s_median']} frames/s "
            f"({fan['gateway_frames_per_cpu_s_median']} per gateway CPU second) to "
            f"{fan['users']} users ({fan['connections_open']} connections open) = "
            f"{fan['throughput_ratio_gateway_over_plain_median']} x a plain consumer's "
            "read+decode rate",
        ]
    )


def cli() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--hold":
        url, secret, first, count = sys.argv[2:6]
        asyncio.run(hold(url, secret, int(first), int(count)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env = os.environ.get
    parser.add_argument("--connections", type=int, default=int(env("GBENCH_CONNECTIONS", "10000")))
    parser.add_argument("--fanout-users", type=int, default=int(env("GBENCH_FANOUT_USERS", "1000")))
    parser.add_argument("--frames-per-user", type=int, default=int(env("GBENCH_FRAMES_PER_USER", "20")))
    parser.add_argument("--reps", type=int, default=int(env("GBENCH_REPS", "3")))
    parser.add_argument("--heartbeat-ms", type=int, default=int(env("GBENCH_HEARTBEAT_MS", "5000")))
    parser.add_argument("--window-ms", type=int, default=int(env("GBENCH_WINDOW_MS", "100")))
    parser.add_argument("--latency-users", type=int, default=int(env("GBENCH_LATENCY_USERS", "20")))
    parser.add_argument("--latency-rate", type=float, default=float(env("GBENCH_LATENCY_RATE", "50")))
    parser.add_argument("--latency-seconds", type=float, default=float(env("GBENCH_LATENCY_SECONDS", "20")))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(main(args))
    (OUT / "gateway_report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
