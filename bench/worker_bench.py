"""Worker benchmark on real Kafka: `projector worker` vs a plain aiokafka loop vs a naive faust agent.

Issue #4 (performance): one worker's sustained entries/s and its produce -> SESSION_DELTA latency,
side by side with the transport ceiling (bench/aiokafka_loop.py: consume, decode the JSON,
produce one record per input) and what a typical faust topology does
(bench/naive_faust_agent.py: one event at a time, a RocksDB table read+write and a frame per
entry). Everything runs on the shared local servers in a private namespace (topics, consumer
groups / app ids, Cassandra keyspace, Redis namespace all prefixed `wbench-<id>`), removed at
the end.

Stream (one, fixed, produced once): `projector simulate --no-kafka --rate 0` writes the
MessageStore (the worker's unread recomputes read it) and the mailbox entries to a file — big
groups dominate, as in J-1 — then this script produces them to one input topic, with the lane's
watermark marker after every --marker-every entries (one lane, so W = last seq is exact), a
start probe before and an end probe after (records of an unknown type, one per partition).

Throughput: every contender reads the same pre-produced topic from the beginning under its own
consumer group and writes to its own output topics; startup is excluded: the clock runs from the
contender's reaction to the start probe to its reaction to the end probe, both read as Kafka
record timestamps (the worker dead-letters the probes as soon as the batch holding them is
processed and persisted to its changelog tables; the baselines forward them). entries/s =
entries / that time; CPU is the contender's own (/proc, sampled) over the same interval. For the
worker, frames are checked too: every user's last SESSION_DELTA must reach the user's last
mailbox_seq (the time to that frame, which includes the last compaction window, is reported as
well). Repetitions are interleaved, the order rotating (A B C, B C A, ...); medians and the
median of per-repetition ratios are reported.

Latency: a fresh worker (window --latency-window-ms, default 100) on a fresh topic; once it has
published the set-up (every set-up user's frame is out), the stream's first entries are produced
at a fixed rate (--latency-rate entries/s, ticks of --latency-tick-ms, each tick's entries
followed by the lane's marker). Latency of an entry =
the timestamp of the first SESSION_DELTA of its user whose projection_mailbox_seq >= its
mailbox_seq, minus the entry's produce timestamp (both Kafka CreateTime, same clock).

    .venv/bin/python bench/worker_bench.py [--messages 2000 --reps 3 ...]   (or `make bench`)

Writes bench/out/worker_report.json and prints a table. Exit 1 if a contender failed.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (bench/run.sh): bench.harness is beside it
    sys.path.insert(0, str(ROOT))

from app.domain.fast_lane import FAST_LANE_MAX_MEMBERS  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.harness import percentile  # noqa: E402

# worker-gcoff: the same worker with Python's own GC (issue 14 item 3's effect, side by side);
# worker-base: the worker of another commit (--base-ref: before/after in one run);
# worker-compiled: this checkout's mypyc-compiled build (--compiled-site; what `pip install .`
# deploys where a C compiler is present), the editable install being pure Python.
CONTENDERS = ("worker", "aiokafka", "naive", "worker-gcoff", "worker-base", "worker-compiled", "worker-lw")
WORKERS = ("worker", "worker-gcoff", "worker-base", "worker-compiled", "worker-lw")
# worker-lw: the same worker with the latency phases' window (--latency-window-ms) instead of
# --window-ms, and small fetch batches (--lw-batch-records): its throughput on the backlog is the
# capacity the latency phases run against.
GC_OFF_ENV = {"PROJECTOR_WORKER_GC_THRESHOLD": "0", "PROJECTOR_WORKER_GC_FREEZE": "false"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[worker-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def projector_argv() -> list[str]:
    script = Path(sys.executable).parent / "projector"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


# -- the stream ----------------------------------------------------------------------------------


@dataclass
class Stream:
    records: list[tuple[bytes | None, bytes, int | None]]  # (key, value, partition) in produce order
    entries: int
    markers: int
    last_seq: dict[int, int]  # user -> last mailbox_seq
    entry_values: list[tuple[bytes, bytes, int, int]]  # (key, value, user, seq) of the entries
    setup: int  # entries before the start probe (not timed)
    probes: int  # probe records (start, ticks, end; one per partition each)

    @property
    def timed(self) -> int:
        """Entries between the start and the end probe: what throughput is computed on."""
        return self.entries - self.setup


def probe(kind: str, partition: int, position: int = 0) -> bytes:
    """A record no contender knows (the worker dead-letters it, the baselines forward it).
    `position` = timed entries before it (tick probes)."""
    return orjson.dumps({"type": "bench_probe", "probe": kind, "partition": partition, "position": position})


# Tick probes in the timed part: the worker reacts to a probe when the whole fetch batch holding it
# is processed, so its reaction to the start probe comes after the rest of that batch is done
# too. Ticks that react together with the start probe show how much of the timed part was already
# processed then; it is taken off the timed count (what stays uncounted-for is < TICK_EVERY
# entries, < 0.5% of the default run, in the worker's favour).
TICK_EVERY = 250


def probe_reactions(records: list[Any]) -> dict[tuple[str, int, int], float]:
    """(kind, partition, position) -> timestamp (s) of the first output for that probe."""
    out: dict[tuple[str, int, int], float] = {}
    for record in records:
        value = record.value
        if b"bench_probe" not in value:
            continue
        doc = orjson.loads(value)
        if doc.get("type") != "bench_probe":  # the worker's dead-letter envelope
            doc = orjson.loads(doc["value"])
        key = (doc["probe"], doc["partition"], doc.get("position", 0))
        out.setdefault(key, record.timestamp / 1000)
    return out


def done_at_start(reactions: dict[tuple[str, int, int], float], tolerance_s: float = 0.002) -> int:
    """Timed entries certainly processed when the start probe got its reaction: the position of
    the last tick that reacted with it."""
    starts = [t for (kind, _, _), t in reactions.items() if kind == "start"]
    if not starts:
        return 0
    started = min(starts)
    return max(
        (pos for (kind, _, pos), t in reactions.items() if kind == "tick" and t <= started + tolerance_s),
        default=0,
    )


def marker(seq: int, ts: int) -> bytes:
    return orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": ts})


def load_stream(path: Path, partitions: int, marker_every: int, timed_from: str) -> Stream:
    """The simulator's entries, re-marked: one lane, the marker after every `marker_every`.

    The start probe goes before the first entry (`timed_from="start"`) or after the set-up,
    i.e. before the first `message` entry (`"first-message"`: the simulator opens with every
    membership's `join`, a cold-start burst of new rows; the rest is sustained traffic)."""
    entries: list[tuple[bytes, bytes, int, int]] = []
    setup: int | None = None
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        doc = orjson.loads(line)
        if doc["type"] == "watermark":
            continue
        if doc["lane"] != 0:
            raise SystemExit("worker-bench: the stream must have one lane")
        if setup is None and doc["type"] == "message":
            setup = len(entries)
        entries.append((str(doc["user_id"]).encode(), line, doc["user_id"], doc["mailbox_seq"]))
    setup = (setup or 0) if timed_from == "first-message" else 0
    records: list[tuple[bytes | None, bytes, int | None]] = []
    markers = 0
    last_seq: dict[int, int] = {}
    for index, (key, value, user, seq) in enumerate(entries, start=1):
        if index == setup + 1:
            records += [(None, probe("start", p), p) for p in range(partitions)]
        elif index > setup + 1 and (index - setup - 1) % TICK_EVERY == 0:
            records += [(None, probe("tick", p, index - setup - 1), p) for p in range(partitions)]
        records.append((key, value, None))
        last_seq[user] = max(last_seq.get(user, 0), seq)
        if index % marker_every == 0 or index == len(entries):
            for p in range(partitions):
                records.append((None, marker(seq, 0), p))
                markers += 1
    records += [(None, probe("end", p), p) for p in range(partitions)]
    probes = sum(1 for _, value, _ in records if value.startswith(b'{"type":"bench_probe"'))
    return Stream(records, len(entries), markers, last_seq, entries, setup, probes)


# -- Kafka helpers -------------------------------------------------------------------------------


class Kafka:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin: Any = None
        self.consumer: Any = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self.admin.start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await self.consumer.start()

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.consumer.stop()
        with contextlib.suppress(Exception):
            await self.admin.close()

    async def create(self, names: list[str], partitions: int) -> None:
        from aiokafka.admin import NewTopic

        present = set(await self.admin.list_topics())
        new = [NewTopic(n, partitions, 1) for n in names if n not in present]
        if new:
            await self.admin.create_topics(new)
        for _ in range(100):  # until the metadata knows them
            if all([await self._partitions(n) for n in names]):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"topics not visible: {names}")

    async def _partitions(self, topic: str) -> list[Any]:
        from aiokafka import TopicPartition

        await self.consumer._client.force_metadata_update()
        found = self.consumer._client.cluster.partitions_for_topic(topic) or set()
        return [TopicPartition(topic, p) for p in sorted(found)]

    async def delete_prefixed(self, prefix: str) -> int:
        doomed = [t for t in await self.admin.list_topics() if t.startswith(prefix)]
        if doomed:
            await self.admin.delete_topics(doomed)
        return len(doomed)

    async def end_offsets(self, topic: str, tps: list[Any]) -> int:
        offsets = await self.consumer.end_offsets(tps)
        return sum(offsets.values())

    async def read(self, topic: str, *, keep: bool = True) -> list[Any]:
        """Every record of `topic` as it is now (records; or only first/last per partition)."""
        from aiokafka import AIOKafkaConsumer

        tps = await self._partitions(topic)
        ends = await self.consumer.end_offsets(tps)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            fetch_max_bytes=32 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        await consumer.start()
        out: list[Any] = []
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            for tp in tps:
                if not ends[tp]:
                    continue
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=1000, max_records=50_000)
                    out += batch.get(tp, [])
        finally:
            await consumer.stop()
        return out

    async def produce(self, topic: str, records: list[tuple[bytes | None, bytes, int | None]]) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,  # per partition in send order, markers never overtake
            linger_ms=5,
            max_batch_size=256 * 1024,
        )
        await producer.start()
        try:
            acks = [await producer.send(topic, value=v, key=k, partition=p) for k, v, p in records]
            await asyncio.gather(*acks)
        finally:
            await producer.stop()


# -- contender processes -------------------------------------------------------------------------


class CpuSampler:
    """(wall time, process CPU seconds) every `every` s, read from /proc; interpolated later."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self.peak_rss_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        stat = f"/proc/{self.pid}/stat"
        status = f"/proc/{self.pid}/status"
        while not self._stop.is_set():
            try:
                with open(stat) as fp:
                    fields = fp.read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
                self.samples.append((time.time(), cpu))
                with open(status) as fp:
                    for line in fp:
                        if line.startswith("VmHWM:"):
                            self.peak_rss_kib = int(line.split()[1])
            except (OSError, IndexError, ValueError):
                pass
            self._stop.wait(self.every)

    def cpu_at(self, when: float) -> float:
        samples = self.samples
        if not samples:
            return math.nan
        times = [t for t, _ in samples]
        i = bisect.bisect_left(times, when)
        if i <= 0:
            return samples[0][1]
        if i >= len(samples):
            return samples[-1][1]
        (t0, c0), (t1, c1) = samples[i - 1], samples[i]
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1


@dataclass
class Run:
    contender: str
    rep: int
    ok: bool
    seconds: float = math.nan
    entries_per_s: float = math.nan
    cpu_s: float = math.nan
    entries_per_cpu_s: float = math.nan
    peak_rss_mib: float = math.nan
    startup_s: float = math.nan  # process start -> start probe handled
    outputs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    error: str = ""


class Bench:
    def __init__(self, args: argparse.Namespace, kind: str = "wbench") -> None:
        self.args = args
        self.prefix = f"{kind}-{uuid.uuid4().hex[:8]}"
        self.work = Path(args.work_dir) / self.prefix
        self.work.mkdir(parents=True, exist_ok=True)
        self.input_topic = f"{self.prefix}-mailbox-tail"
        self.keyspace = self.prefix.replace("-", "_")
        self.kafka = Kafka(args.bootstrap)
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.base_dir: Path | None = None
        self.base_sha = ""

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROJECTOR_")}
        env.update(
            {
                "PROJECTOR_KAFKA_BOOTSTRAP": self.args.bootstrap,
                "PROJECTOR_APP_ID": f"{self.prefix}-app",
                **Settings.topic_env(self.prefix),
                "PROJECTOR_TOPIC_MAILBOX_TAIL": self.input_topic,
                "PROJECTOR_TOPIC_PARTITIONS": str(self.args.partitions),
                "PROJECTOR_CASSANDRA_KEYSPACE": self.keyspace,
                "PROJECTOR_PROJECTION_NAMESPACE": self.prefix,
                "PROJECTOR_LANES": "1",
                "PROJECTOR_WORKER_WEB_PORT": "0",
                # INFO is the default; at WARNING faust's spinner sets the root logger to DEBUG
                "PROJECTOR_LOG_LEVEL": "INFO",
            }
        )
        return env

    # -- setup ---------------------------------------------------------------------------------

    async def prepare(self) -> Stream:
        a = self.args
        env = self.base_env()
        log(f"namespace {self.prefix}: bootstrap (keyspace, topics, {a.partitions} partition(s))")
        self.check(subprocess.run([*projector_argv(), "bootstrap"], cwd=ROOT, env=env, capture_output=True))
        path = self.work / "stream.jsonl"
        log(
            f"simulate: {a.users} users, {a.conversations} conversations, groups of {a.group_size}, "
            f"{a.messages} messages (MessageStore written; entries to a file)"
        )
        started = time.monotonic()
        self.check(
            subprocess.run(
                [
                    *projector_argv(),
                    "simulate",
                    "--no-kafka",
                    "--rate",
                    "0",
                    "--users",
                    str(a.users),
                    "--conversations",
                    str(a.conversations),
                    "--group-size",
                    str(a.group_size),
                    "--messages",
                    str(a.messages),
                    "--lanes",
                    "1",
                    "--seed",
                    str(a.seed),
                    "--out",
                    str(path),
                    "--progress",
                    "never",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
            )
        )
        stream = load_stream(path, a.partitions, a.marker_every, a.timed_from)
        log(
            f"stream: {stream.entries:,} entries ({stream.timed:,} timed), {stream.markers:,} markers, "
            f"{len(stream.last_seq):,} users "
            f"({time.monotonic() - started:.1f} s); producing to {self.input_topic}"
        )
        started = time.monotonic()
        await self.kafka.produce(self.input_topic, stream.records)
        log(f"produced {len(stream.records):,} records in {time.monotonic() - started:.1f} s")
        return stream

    @staticmethod
    def check(done: subprocess.CompletedProcess[bytes]) -> None:
        if done.returncode != 0:
            raise SystemExit(
                f"worker-bench: {' '.join(map(str, done.args))[:200]} exited {done.returncode}:\n"
                + done.stderr.decode(errors="replace")[-3000:]
            )

    # -- one run -------------------------------------------------------------------------------

    def spawn(
        self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT
    ) -> subprocess.Popen[bytes]:
        out = log_path.open("ab")
        # Its own process group: a wrapper's child (the real contender) is signalled with it.
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError):  # whatever it left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)

    def worker_env(self, name: str, window_ms: int, input_topic: str) -> dict[str, str]:
        self.namespaces.append(name)
        return {
            **self.base_env(),
            "PROJECTOR_APP_ID": f"{name}-app",
            **Settings.topic_env(name),
            "PROJECTOR_TOPIC_MAILBOX_TAIL": input_topic,
            "PROJECTOR_PROJECTION_NAMESPACE": name,
            "PROJECTOR_PROJECTION_COMPACTION_WINDOW_MS": str(window_ms),
            "PROJECTOR_DATA_DIR": str(self.work / f"{name}-data"),
            **(
                {"PROJECTOR_INTAKE_BATCH_MAX_RECORDS": str(self.args.worker_batch_records)}
                if self.args.worker_batch_records
                else {}
            ),
            **dict(setting.split("=", 1) for setting in self.args.worker_setting),
        }

    def worker_command(self, contender: str, env: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
        """argv, environment and working directory of a worker variant."""
        if contender == "worker-gcoff":
            return [*projector_argv(), "worker"], {**env, **GC_OFF_ENV}, ROOT
        if contender == "worker-base":
            assert self.base_dir is not None
            # The base checkout's packages first on the path (the venv's editable install of this
            # checkout is found after it); its settings never see this checkout's new variables.
            return (
                [sys.executable, "-m", "app", "worker"],
                {**env, "PYTHONPATH": str(self.base_dir)},
                self.base_dir,
            )
        if contender == "worker-compiled":
            assert self.args.compiled_site is not None
            # `python -P -m app`: without -P, `-m` puts the working directory (this checkout, pure)
            # before PYTHONPATH, and the `projector` script runs the editable (pure) package.
            return (
                [sys.executable, "-P", "-m", "app", "worker"],
                {**env, "PYTHONPATH": str(self.args.compiled_site.resolve())},
                ROOT,
            )
        return [*projector_argv(), "worker"], env, ROOT

    def checkout_base(self) -> None:
        """--base-ref: that commit's tree (git archive) under the work dir."""
        ref = self.args.base_ref
        if not ref:
            return
        sha = subprocess.run(
            ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
        )
        if sha.returncode != 0:
            raise SystemExit(f"worker-bench: --base-ref {ref!r} is not a commit: {sha.stderr.strip()}")
        self.base_sha = sha.stdout.strip()
        self.base_dir = self.work / f"base-{self.base_sha[:12]}"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", self.base_sha], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(self.base_dir)], input=archive.stdout, check=True)
        log(f"worker-base: {ref} = {self.base_sha[:12]} in {self.base_dir}")

    async def run_one(
        self, contender: str, rep: int, stream: Stream, input_topic: str = "", tag: str = ""
    ) -> Run:
        """One throughput run of `contender` over `stream`, pre-produced to `input_topic` (default:
        the bench's own); `tag` tells apart the runs of one contender over several streams."""
        a = self.args
        input_topic = input_topic or self.input_topic
        name = f"{self.prefix}-{contender}{tag}{rep}"
        log_path = self.work / f"{name}.log"
        partitions = a.partitions
        cwd = ROOT
        if contender in WORKERS:
            window_ms = a.latency_window_ms if contender == "worker-lw" else a.window_ms
            env = self.worker_env(name, window_ms, input_topic)
            if contender == "worker-lw" and a.lw_batch_records:
                # A batch is applied as a unit and flushes after it: with the product's batches
                # (20,000 records, ~2 s of work) a backlog would be flushed once per batch, not
                # at the window's cadence, and its "capacity" would be ~1.6x what the worker
                # sustains with live traffic (measured). Small batches keep the cadence; never
                # larger than --worker-batch-records (a toy stream needs its small batches).
                limits = [a.lw_batch_records] + ([a.worker_batch_records] if a.worker_batch_records else [])
                env["PROJECTOR_INTAKE_BATCH_MAX_RECORDS"] = str(min(limits))
            progress = env["PROJECTOR_TOPIC_DEAD_LETTER"]
            await self.kafka.create(
                [env["PROJECTOR_TOPIC_SESSION_DELTA"], env["PROJECTOR_TOPIC_BADGE"], progress], partitions
            )
            argv, env, cwd = self.worker_command(contender, env)
            expected = stream.probes  # every probe, dead-lettered
        elif contender == "aiokafka":
            progress = f"{name}-out"
            await self.kafka.create([progress], partitions)
            argv = [
                sys.executable, "bench/aiokafka_loop.py", "--bootstrap", a.bootstrap,
                "--input", input_topic, "--output", progress, "--group", f"{name}-group",
            ]  # fmt: skip
            env = dict(os.environ)
            expected = len(stream.records)
        else:
            progress = f"{name}-out"
            await self.kafka.create([progress], partitions)
            config = {
                "app_id": f"{name}-app",
                "bootstrap": a.bootstrap,
                "input": input_topic,
                "output": progress,
                "partitions": partitions,
                "datadir": str(self.work / f"{name}-data"),
            }
            env = {**os.environ, "NAIVE_FAUST_CONFIG": orjson.dumps(config).decode()}
            argv = [sys.executable, "bench/naive_faust_agent.py", "worker", "-l", "info", "--without-web"]
            expected = stream.entries + stream.probes
        tps = await self.kafka._partitions(progress)
        launched = time.time()
        proc = self.spawn([*shlex.split(a.wrapper), *argv], env, log_path, cwd)
        sampler = CpuSampler(proc.pid)
        sampler.start()
        run = Run(contender, rep, ok=False)
        try:
            deadline = time.monotonic() + a.timeout
            while True:
                done = await self.kafka.end_offsets(progress, tps)
                if done >= expected:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"exited {proc.returncode}: {tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out after {a.timeout:.0f} s ({done:,}/{expected:,} outputs)")
                await asyncio.sleep(0.1)
            outputs_read = await self.kafka.read(progress)
            run.outputs = len(outputs_read)
            # The interval runs from the contender's reaction to the start probe to its reaction
            # to the end probe, for every contender (the baselines' first output is a set-up
            # entry's, long before the start probe).
            reactions = probe_reactions(outputs_read)
            first = min(t for (kind, _, _), t in reactions.items() if kind == "start")
            last = max(t for (kind, _, _), t in reactions.items() if kind == "end")
            run.seconds = last - first
            done_early = done_at_start(reactions)
            timed = stream.timed - done_early
            run.entries_per_s = timed / run.seconds if run.seconds > 0 else math.nan
            run.startup_s = first - launched
            if contender in WORKERS:
                run.extra = await self.worker_frames(env, stream, first, deadline, proc, log_path)
            run.extra["timed_entries_done_at_start"] = done_early
            sampler.stop()
            run.cpu_s = sampler.cpu_at(last) - sampler.cpu_at(first)
            run.entries_per_cpu_s = timed / run.cpu_s if run.cpu_s > 0 else math.nan
            run.peak_rss_mib = sampler.peak_rss_kib / 1024
            run.ok = True
        except RuntimeError as exc:
            run.error = str(exc)
        finally:
            sampler.stop()
            # a profiler wrapper writes its output on SIGINT
            self.stop(proc, signal.SIGINT if a.wrapper else signal.SIGTERM)
        if contender in WORKERS:
            gc_line = gc_summary(log_path)  # logged by the clean stop (app/runtime/gc_tuning.py)
            if gc_line is not None:
                run.extra["gc"] = gc_line
        return run

    async def worker_frames(
        self,
        env: dict[str, str],
        stream: Stream,
        first: float,
        deadline: float,
        proc: subprocess.Popen[bytes],
        log_path: Path,
    ) -> dict[str, Any]:
        """Wait until every user's SESSION_DELTA reached the user's last seq; stats of the frames."""
        topic = env["PROJECTOR_TOPIC_SESSION_DELTA"]
        while True:
            records = await self.kafka.read(topic)
            reached: dict[int, int] = {}  # user -> timestamp of the frame that reached the last seq
            top: dict[int, int] = {}
            for record in records:
                frame = orjson.loads(record.value)
                user, version = frame["user_id"], frame["projection_mailbox_seq"]
                top[user] = max(top.get(user, 0), version)
                if user not in reached and version >= stream.last_seq.get(user, math.inf):
                    reached[user] = record.timestamp
            if len(reached) == len(stream.last_seq):
                last_frame = max(reached.values()) / 1000
                return {
                    "frames": len(records),
                    "all_users_reached_last_seq": True,
                    "seconds_to_last_frame": last_frame - first,
                    "entries_per_s_to_last_frame": stream.timed / (last_frame - first),
                }
            if proc.poll() is not None:
                raise RuntimeError(f"exited {proc.returncode}: {tail(log_path)}")
            if time.monotonic() > deadline:
                behind = [u for u, s in stream.last_seq.items() if top.get(u, 0) < s]
                raise RuntimeError(
                    f"frames: {len(behind)} users never reached their last seq, e.g. {behind[:3]}"
                )
            await asyncio.sleep(max(0.2, self.args.window_ms / 2000))

    # -- latency ---------------------------------------------------------------------------------

    async def latency(
        self, stream: Stream, rate: float, contender: str = "worker", label: str = ""
    ) -> dict[str, Any]:
        a = self.args
        name = f"{self.prefix}-latency-{contender}-{len(self.namespaces)}"
        topic = f"{name}-mailbox-tail"
        env = self.worker_env(name, a.latency_window_ms, topic)
        dead, deltas = env["PROJECTOR_TOPIC_DEAD_LETTER"], env["PROJECTOR_TOPIC_SESSION_DELTA"]
        await self.kafka.create([topic, deltas, env["PROJECTOR_TOPIC_BADGE"], dead], a.partitions)
        tps = await self.kafka._partitions(dead)
        # The set-up (see load_stream) goes in at once, before the paced entries; of these, the
        # first ones (cold caches) warm the worker up and are not measured either.
        setup = stream.entry_values[: stream.setup]
        paced = stream.entry_values[stream.setup :]
        count = min(len(paced), int(rate * (a.latency_warmup_seconds + a.latency_seconds)))
        paced = paced[:count]
        warm = min(count // 2, int(rate * a.latency_warmup_seconds))
        warm_seq = (paced[warm - 1] if warm > 0 else setup[-1] if setup else (b"", b"", 0, 0))[3]
        log(
            f"latency: worker window {a.latency_window_ms} ms; {len(setup):,} set-up entries at once, "
            f"then {count:,} at {rate:,.0f}/s (the first {warm:,} not measured), "
            f"a marker every {a.latency_tick_ms} ms"
        )
        log_path = self.work / f"{name}.log"
        argv, env, cwd = self.worker_command(contender, env)
        proc = self.spawn(argv, env, log_path, cwd)
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=a.bootstrap, acks="all", enable_idempotence=True, linger_ms=0
        )
        await producer.start()
        try:
            deadline = time.monotonic() + a.timeout

            def still_waiting(timed_out: str) -> None:
                """Raises once the worker has exited or the phase's deadline has passed."""
                if proc.poll() is not None:
                    raise RuntimeError(f"latency worker exited {proc.returncode}: {tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(timed_out)

            async def wait_dead(n: int) -> None:
                while await self.kafka.end_offsets(dead, tps) < n:
                    still_waiting("latency worker: timed out")
                    await asyncio.sleep(0.1)

            async def frames_reaching(want: dict[int, int], what: str) -> list[dict[str, Any]]:
                """The SESSION_DELTA topic's frames (with their timestamps, "_ts") once every
                user in `want` has a frame at or past its seq."""
                while True:
                    frames = [
                        orjson.loads(r.value) | {"_ts": r.timestamp} for r in await self.kafka.read(deltas)
                    ]
                    top: dict[int, int] = {}
                    for f in frames:
                        top[f["user_id"]] = max(top.get(f["user_id"], 0), f["projection_mailbox_seq"])
                    if all(top.get(u, 0) >= s for u, s in want.items()):
                        return frames
                    still_waiting(f"latency: {what}")
                    await asyncio.sleep(0.2)

            acks: list[Any] = []
            last_seq: dict[int, int] = {}
            for key, value, user, seq in setup:
                acks.append(await producer.send(topic, value=value, key=key))
                last_seq[user] = seq
            if setup:
                for p in range(a.partitions):
                    acks.append(await producer.send(topic, value=marker(setup[-1][3], 0), partition=p))
            for p in range(a.partitions):
                acks.append(await producer.send(topic, value=probe("start", p), partition=p))
            await asyncio.gather(*acks)
            acks.clear()
            await wait_dead(a.partitions)  # the worker is assigned and past the set-up
            # ... and has published it: the set-up is a burst of every user's first entries (cold
            # caches, a first flush of every user), not traffic at the phase's rate. Pacing before
            # its flush was out started the phase behind a backlog the warm-up did not always
            # drain (a bimodal p50 at one rate: ~0.4 s in some runs, ~2.5 s in others).
            await frames_reaching(dict(last_seq), "the set-up's frames never came out")
            await asyncio.sleep(3 * a.latency_window_ms / 1000)  # its persists and writes settle
            tick_s = a.latency_tick_ms / 1000
            per_tick = rate * tick_s
            sent = 0
            started = time.monotonic()
            tick = 0
            while sent < count:
                tick += 1
                upto = min(count, round(per_tick * tick))
                for key, value, user, seq in paced[sent:upto]:
                    acks.append(await producer.send(topic, value=value, key=key))
                    last_seq[user] = seq
                if upto > sent:
                    seq = paced[upto - 1][3]
                    for p in range(a.partitions):
                        acks.append(await producer.send(topic, value=marker(seq, 0), partition=p))
                sent = upto
                await asyncio.sleep(max(0.0, started + tick * tick_s - time.monotonic()))
            produce_s = time.monotonic() - started
            for p in range(a.partitions):
                acks.append(await producer.send(topic, value=probe("end", p), partition=p))
            await asyncio.gather(*acks)
            await wait_dead(2 * a.partitions)
            # every user's last frame (the last window closes after the last entry)
            frames = await frames_reaching(last_seq, "frames never reached the last seqs")
        finally:
            await producer.stop()
            self.stop(proc)
        inputs = await self.kafka.read(topic)
        by_user: dict[int, list[tuple[int, int]]] = {}
        for f in frames:  # in topic order per partition, i.e. per user in version order
            by_user.setdefault(f["user_id"], []).append((f["projection_mailbox_seq"], f["_ts"]))
        latencies: list[float] = []
        lanes: list[tuple[bool, float]] = []  # (takes the fast lane, latency): issue 33's split
        max_members = int(env.get("PROJECTOR_FAST_LANE_MAX_MEMBERS", FAST_LANE_MAX_MEMBERS))
        in_order: list[float] = []  # by produce time: does the worker keep up (no growing lag)?
        # p50 per second of produce time: where a lag builds up and whether it drains
        by_second: dict[int, list[float]] = {}
        first_ts: int | None = None
        for record in inputs:
            doc = orjson.loads(record.value)
            if doc.get("type") in ("watermark", "bench_probe") or doc["mailbox_seq"] <= warm_seq:
                continue
            user_frames = by_user.get(doc["user_id"], [])
            i = bisect.bisect_left(user_frames, (doc["mailbox_seq"], -1))
            if i == len(user_frames):
                raise RuntimeError(f"latency: no frame for user {doc['user_id']} seq {doc['mailbox_seq']}")
            latencies.append(user_frames[i][1] - record.timestamp)
            lanes.append((takes_fast_lane(doc, max_members), latencies[-1]))
            in_order.append(latencies[-1])
            first_ts = record.timestamp if first_ts is None else first_ts
            by_second.setdefault((record.timestamp - first_ts) // 1000, []).append(latencies[-1])
        latencies.sort()
        quarter = max(1, len(in_order) // 4)
        first_q, last_q = statistics.median(in_order[:quarter]), statistics.median(in_order[-quarter:])

        return {
            "contender": contender,
            "window_ms": a.latency_window_ms,
            "rate_entries_per_s": rate,
            "rate_chosen": label,
            "achieved_rate_entries_per_s": count / produce_s,
            "tick_ms": a.latency_tick_ms,
            "warmup_entries_not_measured": warm,
            # the measured part's length: the stream (--messages) runs out first at high rates
            "measured_seconds": (count - warm) / rate,
            "setup_entries_not_measured": len(setup),
            "entries": len(latencies),
            "frames": len(frames),
            "p50_ms": percentile(latencies, 0.50),
            "p90_ms": percentile(latencies, 0.90),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": latencies[-1],
            "mean_ms": statistics.fmean(latencies),
            "p50_first_quarter_ms": first_q,
            "p50_last_quarter_ms": last_q,
            "p50_by_second_ms": [statistics.median(v) for _, v in sorted(by_second.items())],
            # The fast lane's entries (docs/contract.md §10) and the window's, apart: the lane
            # shows against the window with --latency-window-ms 5000 (the product's).
            "by_lane": lane_split(lanes),
            # a lag that grows through the phase means the rate was above capacity
            "kept_up": last_q <= max(2 * first_q, first_q + 2 * a.latency_window_ms),
        }

    # -- cleanup ---------------------------------------------------------------------------------

    async def cleanup(self) -> None:
        for proc in self.procs:
            self.stop(proc, signal.SIGKILL)
        with contextlib.suppress(Exception):
            n = await self.kafka.delete_prefixed(self.prefix)
            log(f"deleted {n} topics")
        await self.kafka.stop()
        from app.stores.redis_projection import RedisProjectionStore

        settings = Settings.from_env({k: v for k, v in self.base_env().items() if k.startswith("PROJECTOR_")})
        for namespace in self.namespaces:
            store = RedisProjectionStore.from_settings(settings.redis, namespace)
            try:
                await store.delete_all()
            finally:
                await store.aclose()
        from app.stores.cassandra_session import open_cluster

        cluster, session = open_cluster(settings.cassandra)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {self.keyspace}", timeout=120)
        finally:
            cluster.shutdown()
        if not self.args.keep_logs:
            import shutil

            shutil.rmtree(self.work, ignore_errors=True)


GC_LINE = re.compile(
    r"gc \(since the first assignment\): collections gen0/1/2 (\d+)/(\d+)/(\d+), paused ([\d.]+) ms "
    r"\(gen2 ([\d.]+) ms\), max ([\d.]+) ms, (\d+) pauses >= 2 ms, thresholds ([\d/]+), frozen (\d+)"
)


def takes_fast_lane(doc: dict[str, Any], max_members: int) -> bool:
    """docs/contract.md §10's rule (the worker's inline in app/domain/processor.py), for the
    latency phase's split: a mention, an urgent message, a message of a conversation of at most
    `max_members`, a read, a mark_unread. (The per-user rate is not modelled: the split is of
    the entries that ask for the lane.)"""
    kind = doc.get("type")
    if kind == "message":
        members = doc.get("member_count")
        return bool(
            doc.get("mention") is True
            or doc.get("urgent") is True
            or (isinstance(members, int) and members <= max_members)
        )
    return kind in ("read", "mark_unread")


def lane_split(samples: list[tuple[bool, float]]) -> dict[str, dict[str, float]]:
    """p50 / p99 (ms) and counts of the fast lane's entries and the window's, apart."""

    def figures(values: list[float]) -> dict[str, float]:
        values = sorted(values)
        if not values:
            return {"entries": 0}

        def at(q: float) -> float:
            return values[min(len(values) - 1, int(q * len(values)))]

        return {"entries": len(values), "p50_ms": at(0.50), "p99_ms": at(0.99)}

    return {
        "fast_lane": figures([v for fast, v in samples if fast]),
        "window": figures([v for fast, v in samples if not fast]),
    }


def gc_summary(path: Path) -> dict[str, Any] | None:
    """The worker's GC totals from its clean stop's log line (None: a worker without it)."""
    if not path.exists():
        return None
    found = GC_LINE.findall(path.read_text(errors="replace"))
    if not found:
        return None
    g0, g1, g2, paused, paused2, longest, over2, thresholds, frozen = found[-1]
    return {
        "collections": [int(g0), int(g1), int(g2)],
        "paused_ms": float(paused),
        "gen2_paused_ms": float(paused2),
        "max_pause_ms": float(longest),
        "pauses_over_2ms": int(over2),
        "thresholds": thresholds,
        "frozen": int(frozen),
    }


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- report --------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def summarize(runs: list[Run], reps: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in CONTENDERS:
        mine = [r for r in runs if r.contender == name and r.ok]
        if not mine:
            continue
        rates = [r.entries_per_s for r in mine]
        summary[name] = {
            "runs": len(mine),
            "entries_per_s": {"min": min(rates), "median": median(rates), "max": max(rates)},
            "entries_per_cpu_s": median([r.entries_per_cpu_s for r in mine]),
            "cpu_share": median([r.cpu_s / r.seconds if r.seconds > 0 else math.nan for r in mine]),  # cores
            "seconds_median": median([r.seconds for r in mine]),
            "startup_s_median": median([r.startup_s for r in mine]),
            "peak_rss_mib": max(r.peak_rss_mib for r in mine),
        }
        if name in WORKERS:
            summary[name]["entries_per_s_to_last_frame"] = median(
                [r.extra.get("entries_per_s_to_last_frame", math.nan) for r in mine]
            )
            summary[name]["frames_median"] = median([r.extra.get("frames", math.nan) for r in mine])
            gcs = [r.extra["gc"] for r in mine if "gc" in r.extra]
            if gcs:
                summary[name]["gc_paused_ms_median"] = median([g["paused_ms"] for g in gcs])
                summary[name]["gc_gen2_collections_median"] = median([g["collections"][2] for g in gcs])
                summary[name]["gc_max_pause_ms"] = max(g["max_pause_ms"] for g in gcs)
                summary[name]["gc_pauses_over_2ms_median"] = median([g["pauses_over_2ms"] for g in gcs])
    ratios: dict[str, float] = {}
    pairs = [(w, o) for w in WORKERS for o in ("naive", "aiokafka")]
    pairs += [("worker", "worker-base"), ("worker", "worker-gcoff"), ("worker-compiled", "worker")]
    for mine_name, other in pairs:
        for key, attr in (("", "entries_per_s"), ("cpu_", "entries_per_cpu_s")):
            per_rep = []
            for rep in range(reps):
                w = next((r for r in runs if r.ok and r.rep == rep and r.contender == mine_name), None)
                o = next((r for r in runs if r.ok and r.rep == rep and r.contender == other), None)
                if w and o:
                    per_rep.append(getattr(w, attr) / getattr(o, attr))
            if per_rep:
                ratios[f"{key}{mine_name}_over_{other}".replace("-", "_")] = median(per_rep)
    return {"summary": summary, "ratios": ratios}


def issue14_goal(lat: dict[str, Any]) -> bool | None:
    """Issue 14's latency target, for the phase it is stated for (a 100 ms window at 0.5 x the
    worker's own, 5 s window, median throughput): p99 <= 200 ms and p50 <= 120 ms. None for the
    other phases (the worker-lw and fixed-rate ones are reported beside it, without the mark)."""
    if lat["window_ms"] != 100 or not lat["rate_chosen"].startswith("0.5 x worker median"):
        return None
    return bool(lat["p99_ms"] <= 200 and lat["p50_ms"] <= 120)


def summarize_latencies(latencies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per latency phase (contender, rate) over its repetitions, in first-run order:
    the median of the runs' p50, p90 and p99 with their ranges, and how many runs kept up."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for lat in latencies:
        groups.setdefault((lat["contender"], lat["rate_chosen"], lat["rate_entries_per_s"]), []).append(lat)
    summary: list[dict[str, Any]] = []
    for (contender, label, rate), runs in groups.items():
        line: dict[str, Any] = {
            "contender": contender,
            "window_ms": runs[0]["window_ms"],
            "rate_entries_per_s": rate,
            "rate_chosen": label,
            "runs": len(runs),
            "kept_up_runs": sum(1 for r in runs if r["kept_up"]),
        }
        for key in ("p50_ms", "p90_ms", "p99_ms"):
            values = [r[key] for r in runs]
            line[key] = median(values)
            line[f"{key}_range"] = [min(values), max(values)]
        line["goal_met"] = issue14_goal(line)
        summary.append(line)
    return summary


def print_table(report: dict[str, Any]) -> None:
    stream, summary, ratios = report["stream"], report["summary"], report["ratios"]
    print()
    print(
        f"worker bench: {stream['timed_entries']:,} timed entries ({stream['setup_entries_not_timed']:,}"
        f" set-up entries before them, {stream['users']:,} users), "
        f"{report['params']['partitions']} partition(s), worker window {report['params']['window_ms']} ms, "
        f"{report['params']['reps']} interleaved repetitions (medians)"
    )
    if report.get("base"):
        print(f"worker-base = {report['base']}")
    print(
        f"{'contender':12s} {'entries/s':>10s} {'min..max':>17s} {'per cpu s':>10s} {'cores':>6s}"
        f" {'run s':>6s} {'start s':>7s} {'RSS MiB':>8s} {'gc ms':>7s} {'gen2':>5s} {'gc max':>7s}"
    )
    for name, s in summary.items():
        e = s["entries_per_s"]
        gc_cols = (
            f" {s['gc_paused_ms_median']:7.0f} {s['gc_gen2_collections_median']:5.0f}"
            f" {s['gc_max_pause_ms']:7.1f}"
            if "gc_paused_ms_median" in s
            else ""
        )
        print(
            f"{name:12s} {e['median']:10,.0f} {e['min']:8,.0f}..{e['max']:<7,.0f}"
            f" {s['entries_per_cpu_s']:10,.0f} {s['cpu_share']:6.2f} {s['seconds_median']:6.1f}"
            f" {s['startup_s_median']:7.1f} {s['peak_rss_mib']:8.1f}{gc_cols}"
        )
    for name in WORKERS:
        if name in summary:
            print(
                f"{name} to its last SESSION_DELTA (incl. the last window): "
                f"{summary[name]['entries_per_s_to_last_frame']:,.0f} entries/s"
            )
    targets = {"worker_over_naive": 2.0, "worker_over_aiokafka": 0.6}
    for key, value in ratios.items():
        if key.startswith("cpu_"):
            continue  # printed beside the wall ratio
        target = targets.get(key)
        cpu = ratios.get(f"cpu_{key}", math.nan)
        mark = f"  (target >= {target:g}: {'met' if value >= target else 'NOT met'})" if target else ""
        print(f"{key:32s} wall {value:7.3f}  cpu {cpu:7.3f}{mark}")
    asked_seconds = report["params"]["latency_seconds"]
    for lat in report.get("latencies") or []:
        print(
            f"latency {lat['contender']:12s} run {lat['rep'] + 1} (window {lat['window_ms']} ms,"
            f" {lat['rate_entries_per_s']:,.0f} entries/s = {lat['rate_chosen']},"
            f" {lat['entries']:,} entries):"
            f" p50 {lat['p50_ms']:.0f} ms, p90 {lat['p90_ms']:.0f} ms,"
            f" p99 {lat['p99_ms']:.0f} ms, max {lat['max_ms']:.0f} ms"
        )
        print(
            f"  p50 first/last quarter of the phase: {lat['p50_first_quarter_ms']:.0f}/"
            f"{lat['p50_last_quarter_ms']:.0f} ms"
            + ("" if lat["kept_up"] else "  (lag grew: the rate was above capacity, raise nothing from this)")
        )
        if lat["measured_seconds"] < asked_seconds / 2:
            print(
                f"  measured {lat['measured_seconds']:.1f} s of the {asked_seconds:g} s asked:"
                " the stream ran out at this rate (raise --messages), so whether a lag grows is barely seen"
            )
        print("  p50 per second of the phase: " + " ".join(f"{v:.0f}" for v in lat["p50_by_second_ms"]))
        for lane, figures in lat.get("by_lane", {}).items():
            if figures.get("entries"):
                print(
                    f"  {lane:9s} entries {figures['entries']:,.0f}:"
                    f" p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms"
                )
    for line in report.get("latency_summary") or []:
        met = line["goal_met"]
        goal = "" if met is None else f"  (target p99 <= 200, p50 <= 120: {'met' if met else 'NOT met'})"
        p50_lo, p50_hi = line["p50_ms_range"]
        p99_lo, p99_hi = line["p99_ms_range"]
        print(
            f"latency {line['contender']:12s} median of {line['runs']} run(s) (window {line['window_ms']} ms,"
            f" {line['rate_entries_per_s']:,.0f} entries/s = {line['rate_chosen']}):"
            f" p50 {line['p50_ms']:.0f} ms ({p50_lo:.0f}..{p50_hi:.0f}),"
            f" p99 {line['p99_ms']:.0f} ms ({p99_lo:.0f}..{p99_hi:.0f});"
            f" kept up in {line['kept_up_runs']}/{line['runs']}{goal}"
        )
    for note in report["notes"]:
        print(f"note: {note}")


# -- main ----------------------------------------------------------------------------------------


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("PROJECTOR_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--users", type=int, default=env_int("WBENCH_USERS", 2000))
    p.add_argument("--conversations", type=int, default=env_int("WBENCH_CONVERSATIONS", 200))
    p.add_argument("--group-size", type=int, default=env_int("WBENCH_GROUP_SIZE", 500))
    p.add_argument("--messages", type=int, default=env_int("WBENCH_MESSAGES", 400))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--timed-from",
        choices=("first-message", "start"),
        default=os.environ.get("WBENCH_TIMED_FROM", "first-message"),
        help="first-message (default): the set-up joins go before the start probe, untimed; "
        "start: time everything",
    )
    p.add_argument("--marker-every", type=int, default=env_int("WBENCH_MARKER_EVERY", 500))
    p.add_argument("--partitions", type=int, default=env_int("WBENCH_PARTITIONS", 1))
    p.add_argument("--window-ms", type=int, default=env_int("WBENCH_WINDOW_MS", 5000))
    p.add_argument("--reps", type=int, default=env_int("WBENCH_REPS", 3))
    p.add_argument(
        "--contenders",
        default=os.environ.get("WBENCH_CONTENDERS", ",".join(CONTENDERS)),
        help="worker-base only runs with --base-ref",
    )
    p.add_argument("--latency-window-ms", type=int, default=env_int("WBENCH_LATENCY_WINDOW_MS", 100))
    p.add_argument(
        "--latency-rate",
        type=float,
        default=env_float("WBENCH_LATENCY_RATE", 0),
        help="one more fixed rate (entries/s) for the latency phases (compatibility)",
    )
    p.add_argument(
        "--latency-loads",
        default=os.environ.get("WBENCH_LATENCY_LOADS", "0.5"),
        help="comma-separated shares of the worker's median throughput, one latency phase each",
    )
    p.add_argument(
        "--latency-lw-loads",
        default=os.environ.get("WBENCH_LATENCY_LW_LOADS", "0.5"),
        help="comma-separated shares of contender worker-lw's median throughput (the worker with the "
        "latency window), one latency phase each, when worker-lw runs",
    )
    p.add_argument(
        "--lw-batch-records",
        type=int,
        default=env_int("WBENCH_LW_BATCH_RECORDS", 500),
        help="worker-lw's PROJECTOR_INTAKE_BATCH_MAX_RECORDS (0: as the other workers)",
    )
    p.add_argument(
        "--latency-fixed-rates",
        default=os.environ.get("WBENCH_LATENCY_FIXED_RATES", "4000"),
        help="comma-separated fixed entries/s, one latency phase each (runs compare across changes)",
    )
    p.add_argument(
        "--latency-contenders",
        default=os.environ.get("WBENCH_LATENCY_CONTENDERS", "worker,worker-base"),
        help="worker variants measured in the latency phases (those among --contenders)",
    )
    p.add_argument(
        "--latency-reps",
        type=int,
        default=env_int("WBENCH_LATENCY_REPS", 3),
        help="runs of every latency phase (interleaved); the report gives the median p50 / p99 over them",
    )
    p.add_argument("--latency-warmup-seconds", type=float, default=env_float("WBENCH_LATENCY_WARMUP", 5))
    p.add_argument("--latency-seconds", type=float, default=env_float("WBENCH_LATENCY_SECONDS", 15))
    p.add_argument("--latency-tick-ms", type=int, default=env_int("WBENCH_LATENCY_TICK_MS", 10))
    p.add_argument("--no-latency", action="store_true")
    p.add_argument(
        "--base-ref",
        default=os.environ.get("WBENCH_BASE_REF", ""),
        help="a commit whose worker runs as contender worker-base (before/after in one run); "
        "empty: no worker-base",
    )
    p.add_argument(
        "--wrapper",
        default="",
        help="prefix for the throughput runs' commands, e.g. a sampling profiler "
        "(CPU figures are then the wrapper's)",
    )
    p.add_argument(
        "--worker-batch-records",
        type=int,
        default=env_int("WBENCH_WORKER_BATCH_RECORDS", 0),
        help="the worker's PROJECTOR_INTAKE_BATCH_MAX_RECORDS (0: the product's default); a toy stream "
        "needs small batches, or the whole timed part is one batch and cannot be timed",
    )
    p.add_argument(
        "--worker-setting",
        action="append",
        default=[],
        metavar="PROJECTOR_X=V",
        help="a setting for every worker run (repeatable), e.g. PROJECTOR_WORKER_OVERLAP_FLUSHES=true",
    )
    p.add_argument(
        "--compiled-site",
        type=Path,
        default=None,
        help="folder of the compiled build (scripts/test_compiled.sh --build-only): run it as "
        "contender worker-compiled",
    )
    p.add_argument("--timeout", type=float, default=env_float("WBENCH_TIMEOUT", 300), help="per run, s")
    p.add_argument("--report", type=Path, default=ROOT / "bench/out/worker_report.json")
    p.add_argument("--work-dir", default=str(ROOT / "bench/out/worker"))
    p.add_argument("--keep-logs", action="store_true", help="keep the work dir (worker logs, stream)")
    args = p.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if not args.base_ref:
        args.contenders = [c for c in args.contenders if c != "worker-base"]
    if args.compiled_site is None:
        args.contenders = [c for c in args.contenders if c != "worker-compiled"]
    args.latency_contenders = [
        c.strip() for c in args.latency_contenders.split(",") if c.strip() in args.contenders
    ]
    args.latency_loads = [float(x) for x in args.latency_loads.split(",") if x.strip()]
    args.latency_lw_loads = [float(x) for x in args.latency_lw_loads.split(",") if x.strip()]
    args.latency_fixed_rates = [float(x) for x in args.latency_fixed_rates.split(",") if x.strip()]
    if args.latency_rate > 0:
        args.latency_fixed_rates.append(args.latency_rate)
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)} (known: {', '.join(CONTENDERS)})")
    return args


async def amain(args: argparse.Namespace) -> int:
    bench = Bench(args)
    await bench.kafka.start()
    runs: list[Run] = []
    notes: list[str] = []
    latencies: list[dict[str, Any]] = []
    latency_failed = False
    started = time.monotonic()
    try:
        bench.checkout_base()
        stream = await bench.prepare()
        names = list(args.contenders)
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                run = await bench.run_one(name, rep, stream)
                runs.append(run)
                if run.ok:
                    log(
                        f"rep {rep + 1}/{args.reps} {name:8s} {run.entries_per_s:9,.0f} entries/s "
                        f"({run.seconds:.2f} s, cpu {run.cpu_s:.2f} s, started in {run.startup_s:.1f} s)"
                    )
                else:
                    log(f"rep {rep + 1}/{args.reps} {name:8s} FAILED: {run.error[:2000]}")
                    notes.append(f"{name} rep {rep} failed: {run.error[:1000]}")
        if not args.no_latency and args.latency_contenders:
            # Rates: shares of THIS worker's median throughput (below capacity), and fixed ones;
            # every latency contender at each rate, interleaved.
            measured = median([r.entries_per_s for r in runs if r.ok and r.contender == "worker"])
            phases: list[tuple[float, str]] = []
            for load in args.latency_loads:
                rate = max(100.0, load * measured) if not math.isnan(measured) else 500.0
                phases.append((rate, f"{load:g} x worker median entries/s"))
            # Shares of what the worker does with the phases' own window (worker-lw), if it ran.
            at_window = median([r.entries_per_s for r in runs if r.ok and r.contender == "worker-lw"])
            for load in args.latency_lw_loads if not math.isnan(at_window) else []:
                label = f"{load:g} x worker-lw median entries/s (window {args.latency_window_ms} ms)"
                phases.append((max(100.0, load * at_window), label))
            phases += [(rate, "fixed") for rate in args.latency_fixed_rates]
            # Every phase once per repetition, the repetitions one after another (as the
            # throughput runs: what the shared machine does meanwhile spreads over all of them);
            # one phase's p50 moved 2-3x between identical runs here.
            contenders = args.latency_contenders
            for rep in range(args.latency_reps):
                for i, (rate, label) in enumerate(phases):
                    turn = (i + rep) % len(contenders)
                    for contender in contenders[turn:] + contenders[:turn]:
                        try:
                            lat = await bench.latency(stream, rate, contender, label)
                        except RuntimeError as exc:
                            latency_failed = True
                            notes.append(f"latency phase {contender} at {rate:,.0f}/s failed: {exc}")
                            log(f"latency {contender} FAILED: {exc}")
                            continue
                        lat["rep"] = rep
                        latencies.append(lat)
    finally:
        await bench.cleanup()
    report: dict[str, Any] = {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "stream": {
            "entries": stream.entries,
            "timed_entries": stream.timed,
            "setup_entries_not_timed": stream.setup,
            "markers": stream.markers,
            "users": len(stream.last_seq),
            "records": len(stream.records),
        },
        **summarize(runs, args.reps),
        "base": f"{args.base_ref} = {bench.base_sha}" if bench.base_sha else "",
        "latencies": latencies,
        "latency_summary": summarize_latencies(latencies),
        "runs": [vars(r) for r in runs],
        "notes": notes,
        "elapsed_s": time.monotonic() - started,
    }
    report["notes"].append(
        "throughput = entries / (contender's output for the end probe - its output for the start probe), "
        "Kafka timestamps; startup excluded; all contenders share the machine with Kafka, Cassandra, Redis"
    )
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print_table(report)
    print(f"report: {args.report}")
    return 1 if any(not r.ok for r in runs) or latency_failed else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
