"""The I/O of `projector simulate`: a workload's batches to the MessageStore and Kafka.

Per chunk of batches it writes the messages, recall flags and heads to the MessageStore FIRST (a
worker that reads the store for an entry must find the message), then produces the entries
(key = ``str(user_id)``) and, for each marker of lane L with watermark W, waits until the broker
has acknowledged every entry of lane L sent so far (all of that lane's entries <= W) and only
then sends the marker to EVERY partition of the topic (explicit ``partition=``). A lane's
markers go out in order; one still waiting for acks is superseded by the lane's next (its W
covers the same entries), so under load markers thin out instead of lagging. ``--out`` gets
every produced record in produce order (markers once per partition), so ``projector replay``
can run on exactly the stream the workers saw.

Marker counts (docs/contract.md §9): each entry goes to the partition Kafka's default partitioner
picks for its key (computed here and named explicitly, so the count cannot disagree with where
it went), and each marker carries, per partition, how many entries of its lane the driver had
sent there when the marker was requested (all of them <= W, each once: the workload's retries
are noise the lanes do not count). ``drop_entries`` leaves entries out on purpose (every
``DROP_SPACING``-th entry, counted by its lane but never sent nor written to --out): a loss the
workers must report.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

import orjson

from app.simulate.workload import Batch, SimParams, Workload
from app.stores.cassandra_exec import StoreError
from app.stores.cassandra_messages import ConversationHead, NewMessage

if TYPE_CHECKING:
    from app.settings import CassandraSettings, KafkaSettings, Settings

# -- the I/O -----------------------------------------------------------------------------------


class RecordSink(Protocol):
    """Where records go (Kafka in production; fakes in unit tests)."""

    partitions: Sequence[int]  # markers go to each; [] means "no partitions" (file only)

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        """Enqueue one record; the returned awaitable resolves when the broker acknowledged it."""
        ...


class MessageSink(Protocol):
    async def write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None: ...


@dataclass(slots=True)
class Report:
    messages: int = 0
    notices: int = 0  # of the messages, member notifications (--member-notices)
    entries: int = 0
    markers: int = 0  # marker records produced (one per lane report per partition)
    dropped: int = 0  # entries left out on purpose (counted by their markers, never sent)
    noise: int = 0  # bad records and retried entries (Mix.bad, Mix.retry)
    batches: int = 0
    elapsed_s: float = 0.0
    stopped_early: bool = False


@dataclass(slots=True)
class _Lane:
    """The driver's view of one mailbox write lane."""

    acks: list[Awaitable[Any]] = field(default_factory=list)  # entries since the last marker request
    waiting: list[Awaitable[Any]] = field(default_factory=list)  # what the requested marker waits for
    # The newest requested marker not sent yet, and the lane's count per partition at the request.
    marker: tuple[dict[str, Any], dict[int | None, int]] | None = None
    sent: dict[int | None, int] = field(default_factory=dict)  # entries per partition, cumulative
    task: asyncio.Task[None] | None = None


# Per chunk: batches taken at once, so the MessageStore write before their entries is one call.
CHUNK_BATCHES = 256
CHUNK_ENTRIES = 20_000
# With lane_lag_s: this lane's markers go out that much later than its entries (as behind a
# slow mailbox writer), so the other lanes' entries wait above the watermark meanwhile.
LAGGING_LANE = 0
# With drop_entries: entries number DROP_SPACING, 2 * DROP_SPACING, ... are left out.
DROP_SPACING = 97


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last = 0.0

    def update(self, report: Report, started: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.5):
            return
        self.last = now
        elapsed = max(now - started, 1e-9)
        sys.stderr.write(
            f"\rsimulate: {report.messages:,} messages ({report.messages / elapsed:,.0f}/s), "
            f"{report.entries:,} entries ({report.entries / elapsed:,.0f}/s), "
            f"{report.markers:,} markers, {elapsed:,.1f}s "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


async def drive(
    workload: Workload,
    sink: RecordSink,
    store: MessageSink | None,
    *,
    out: IO[bytes] | None = None,
    rate: float = 0.0,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    progress: bool = False,
    drop_entries: int = 0,
    lane_lag_s: float = 0.0,
) -> Report:
    """Run the workload: store first, then entries, then each lane's markers once its entries
    are acknowledged. Stops when the workload ends, after ``duration_s``, or when ``stop`` is
    set; in the last two cases the closing markers are still sent. ``drop_entries``: leave that
    many entries out on purpose (see the module docstring). ``lane_lag_s``: lane
    ``LAGGING_LANE``'s markers are held back that long (crash tests: entries wait above the
    watermark at every moment)."""
    report = Report()
    started = time.monotonic()
    shown = _Progress(progress)
    lanes: dict[int, _Lane] = {}
    marker_acks: list[Awaitable[Any]] = []
    # Markers go to every partition; a file-only sink has none: the marker is written once.
    marker_targets: list[int | None] = [*sink.partitions] or [None]
    partition_of = _partitioner(sink.partitions)
    entries_seen = 0

    def emit(value: bytes) -> None:
        if out is not None:
            out.write(value)
            out.write(b"\n")

    async def report_lane(lane: _Lane) -> None:
        # One task per lane at a time, so a lane's markers go out in order. A marker requested
        # while an older one still waits for its acks supersedes it (its W covers the same
        # entries and more): under load the lane reports less often instead of falling behind.
        while lane.marker is not None:
            (marker, counts), waiting = lane.marker, lane.waiting
            lane.marker, lane.waiting = None, []
            if lane_lag_s > 0 and marker["lane"] == LAGGING_LANE:
                await asyncio.sleep(lane_lag_s)  # a slow writer: the lane's watermark trails
            await asyncio.gather(*waiting)  # every entry of this lane <= W is in the log now
            for partition in marker_targets:
                value = orjson.dumps({**marker, "count": counts.get(partition, 0)})
                # Not awaited one by one: per partition the producer keeps send order, so the
                # next marker cannot overtake this one.
                marker_acks.append(await sink.send(value, None, partition))
                emit(value)
                report.markers += 1

    def check_failures() -> None:
        # A failed acknowledgement surfaces in its lane's task or among the marker acks.
        for lane in lanes.values():
            if lane.task is not None and lane.task.done():
                failure = lane.task.exception()
                if failure is not None:
                    raise failure
        remaining = []
        for ack in marker_acks:
            if isinstance(ack, asyncio.Future) and ack.done():
                failure = ack.exception()
                if failure is not None:
                    raise failure
            else:
                remaining.append(ack)
        marker_acks[:] = remaining

    async def produce(batch: Batch) -> None:
        nonlocal entries_seen
        for entry in batch.entries:
            lane = lanes.get(entry["lane"])
            if lane is None:
                lane = lanes[entry["lane"]] = _Lane()
            key = str(entry["user_id"]).encode()
            partition = partition_of(key)
            lane.sent[partition] = lane.sent.get(partition, 0) + 1
            entries_seen += 1
            if report.dropped < drop_entries and entries_seen % DROP_SPACING == 0:
                report.dropped += 1  # counted by its lane's markers, never sent: lost on the way
                continue
            value = orjson.dumps(entry)
            ack = await sink.send(value, key, partition)
            lane.acks.append(ack)
            emit(value)
            report.entries += 1
        report.messages += len(batch.messages)
        report.notices += batch.notices
        for key, value in batch.noise:
            # Not tracked by any lane: a lane's marker never waits for its retry or a bad record.
            marker_acks.append(await sink.send(value, key, None))
            emit(value)
            report.noise += 1
        for marker in batch.markers:
            lane = lanes.get(marker["lane"])
            if lane is None:
                lane = lanes[marker["lane"]] = _Lane()
            lane.waiting.extend(lane.acks)
            lane.acks = []
            # Every entry of the lane so far is <= W: the counts as of now go with the marker.
            lane.marker = (marker, dict(lane.sent))
            if lane.task is None or lane.task.done():
                lane.task = asyncio.create_task(report_lane(lane))
        report.batches += 1

    batches = workload.batches()
    taken_messages = 0
    exhausted = False
    try:
        while not exhausted:
            if stop is not None and stop.is_set():
                report.stopped_early = True
                break
            elapsed = time.monotonic() - started
            if duration_s is not None and elapsed >= duration_s:
                report.stopped_early = True
                break
            # (chunk) the batches due now: all of them up to the chunk bounds when unpaced
            due = None if rate <= 0 else rate * elapsed
            chunk: list[Batch] = []
            entries = 0
            while len(chunk) < CHUNK_BATCHES and entries < CHUNK_ENTRIES:
                # Paced: stop at the schedule (message-less batches, like the set-up, go at once).
                if due is not None and taken_messages >= due and (chunk or taken_messages > 0):
                    break
                batch = next(batches, None)
                if batch is None:
                    exhausted = True
                    break
                chunk.append(batch)
                entries += len(batch.entries)
                taken_messages += len(batch.messages)
            if not chunk:
                if not exhausted:
                    next_due = started + taken_messages / rate
                    await asyncio.sleep(min(0.05, max(0.001, next_due - time.monotonic())))
                continue
            if store is not None:
                await store.write(
                    [m for b in chunk for m in b.messages],
                    [r for b in chunk for r in b.recalls],
                    [h for b in chunk for h in b.heads],
                )
            for batch in chunk:
                await produce(batch)
            check_failures()
            shown.update(report, started)
        if not exhausted:
            closing = workload.closing_batch()
            if closing is not None:
                await produce(closing)
        await asyncio.gather(*(lane.task for lane in lanes.values() if lane.task is not None))
        # Everything produced must be acknowledged before the run counts as done.
        await asyncio.gather(*marker_acks, *(ack for lane in lanes.values() for ack in lane.acks))
    finally:
        for lane in lanes.values():
            if lane.task is not None and not lane.task.done():
                lane.task.cancel()
        report.elapsed_s = time.monotonic() - started
        shown.update(report, started, force=True)
        shown.close()
    return report


def _partitioner(partitions: Sequence[int]) -> Callable[[bytes], int | None]:
    """The partition Kafka's default partitioner picks for a key among `partitions` (None for a
    sink without partitions)."""
    if not partitions:
        return lambda key: None
    from app.kafka.ops import partition_for

    ordered = sorted(partitions)
    return lambda key: ordered[partition_for(key, len(ordered))]


class KafkaSink:
    """aiokafka producer on one topic."""

    def __init__(self, producer: Any, topic: str, partitions: Sequence[int]) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions: Sequence[int] = sorted(partitions)

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        # `send` returns once the record is in the producer's buffer; the future it returns
        # resolves with the broker's acknowledgement.
        ack: Awaitable[Any] = await self.producer.send(self.topic, value=value, key=key, partition=partition)
        return ack


class FileOnlySink:
    """No broker (--no-kafka): records only go to --out; markers are written once."""

    partitions: Sequence[int] = ()

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class CassandraMessageSink:
    """The Cassandra MessageStore, written from a worker thread (the driver is blocking), the
    public profiles of the simulated users (``member_profiles``: names, avatars) and some of
    their private remarks on each other (``member_remarks``)."""

    def __init__(self, store: Any, profiles: Any = None, remarks: Any = None) -> None:
        self.store = store
        self.profiles = profiles
        self.remarks = remarks

    async def write_profiles(self, users: Sequence[int]) -> int:
        """One synthetic public profile per simulated user (the member directory shows names)."""
        if self.profiles is None:
            return 0
        from app.stores.cassandra_profiles import ProfileRow

        rows = [ProfileRow(u, f"Sim user {u:x}", f"https://avatars.invalid/{u}.png") for u in users]
        written: int = await self.profiles.put(rows, 0)
        return written

    async def write_remarks(self, users: Sequence[int]) -> int:
        """Every third simulated user keeps a remark on the next one (``Sim note <hex id>``), so
        a member directory shows remarks for some viewers and none for the rest."""
        if self.remarks is None:
            return 0
        pairs = simulated_remarks(users)
        slots = asyncio.Semaphore(32)

        async def one(viewer: int, target: int, remark: str) -> None:
            async with slots:
                await self.remarks.set_remark(viewer, target, remark, 0)

        await asyncio.gather(*(one(*pair) for pair in pairs))
        return len(pairs)

    async def write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None:
        if messages or recalls or heads:
            await asyncio.to_thread(self._write, messages, recalls, heads)

    def _write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None:
        self.store.put_messages(messages)
        self.store.mark_recalled_many(recalls)
        self.store.update_heads(heads)


def simulated_remarks(users: Sequence[int]) -> list[tuple[int, int, str]]:
    """``(viewer, target, remark)``: every third user (by position) on the next one."""
    ordered = list(users)
    if len(ordered) < 2:
        return []
    return [
        (viewer, ordered[(i + 1) % len(ordered)], f"Sim note {ordered[(i + 1) % len(ordered)]:x}")
        for i, viewer in enumerate(ordered)
        if i % 3 == 0
    ]


class SimulateError(RuntimeError):
    """A server is unreachable or refused: the message says which and what to do."""


async def simulate(
    settings: Settings,
    params: SimParams,
    *,
    out: IO[bytes] | None = None,
    rate: float = 0.0,
    duration_s: float | None = None,
    use_kafka: bool = True,
    use_cassandra: bool = True,
    stop: asyncio.Event | None = None,
    progress: bool = False,
    connect_timeout_s: float = 10.0,
    drop_entries: int = 0,
    lane_lag_s: float = 0.0,
) -> Report:
    """Open the servers named by ``settings``, run the workload, close everything."""
    cluster = None
    producer = None
    try:
        store: MessageSink | None = None
        if use_cassandra:
            store, cluster = await asyncio.to_thread(_open_store, settings.cassandra, connect_timeout_s)
        sink: RecordSink = FileOnlySink()
        if use_kafka:
            topic = settings.topics.topic_mailbox_tail
            producer, sink = await _open_producer(settings.kafka, topic, connect_timeout_s)
        workload = Workload(params)
        if isinstance(store, CassandraMessageSink):
            await store.write_profiles(workload.users)
            await store.write_remarks(workload.users)
        return await drive(
            workload,
            sink,
            store,
            out=out,
            rate=rate,
            duration_s=duration_s,
            stop=stop,
            progress=progress,
            drop_entries=drop_entries,
            lane_lag_s=lane_lag_s,
        )
    except StoreError as exc:  # Cassandra failed mid-run (unreachable, timed out)
        raise SimulateError(f"cassandra: {exc}") from None
    except _kafka_errors() as exc:  # a send or an acknowledgement failed mid-run
        raise SimulateError(f"kafka: {type(exc).__name__}: {exc}") from None
    finally:
        if producer is not None:
            with contextlib.suppress(Exception):  # already failing or done: closing is best effort
                await producer.stop()
        if cluster is not None:
            cluster.shutdown()


def _kafka_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaError

    return (KafkaError,)


def _open_store(cassandra: CassandraSettings, connect_timeout_s: float) -> tuple[MessageSink, Any]:
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_profiles import CassandraProfileStore
    from app.stores.cassandra_remarks import CassandraRemarkStore
    from app.stores.cassandra_session import CassandraUnavailable, open_cluster

    try:
        cluster, session = open_cluster(cassandra, connect_timeout=connect_timeout_s)
    except CassandraUnavailable as exc:
        raise SimulateError(f"cassandra: {exc}") from None
    try:
        store = CassandraMessageStore(session, cassandra.cassandra_keyspace)
        profiles = CassandraProfileStore(session, cassandra.cassandra_keyspace)
        remarks = CassandraRemarkStore(session, cassandra.cassandra_keyspace)
    except StoreError as exc:
        cluster.shutdown()
        raise SimulateError(f"cassandra: {exc}") from None
    return CassandraMessageSink(store, profiles, remarks), cluster


async def _open_producer(
    kafka: KafkaSettings, topic: str, connect_timeout_s: float
) -> tuple[Any, RecordSink]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from app.connections import (
        kafka_client_options,
        kafka_error_text,
        kafka_hosts,
        kafka_security_options,
        quiet_logger,
        unreachable_hint,
    )
    from app.kafka.refusal import kafka_refusal

    producer = AIOKafkaProducer(
        **kafka_client_options(kafka),
        acks="all",
        # Idempotence keeps each partition in send order across retries: a marker can never
        # overtake the entries it covers.
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=256 * 1024,
        request_timeout_ms=int(connect_timeout_s * 1000) + 20_000,
    )
    try:
        with quiet_logger("aiokafka"):  # its line per failed connect: the error below says it once
            await asyncio.wait_for(producer.start(), timeout=connect_timeout_s)
        metadata = await producer.client.fetch_all_metadata()
    except (KafkaError, TimeoutError, OSError) as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        reason = await kafka_refusal(kafka.kafka_bootstrap, kafka_security_options(kafka)) or (
            f"cannot reach {kafka.kafka_bootstrap} ({kafka_error_text(exc)})"
            + unreachable_hint(kafka_hosts(kafka.kafka_bootstrap))
        )
        raise SimulateError(f"kafka: {reason}") from None
    partitions = metadata.partitions_for_topic(topic)
    if not partitions:
        await producer.stop()
        raise SimulateError(
            f"kafka: topic {topic!r} does not exist on {kafka.kafka_bootstrap}; "
            "create it with `projector bootstrap`"
        )
    return producer, KafkaSink(producer, topic, sorted(partitions))
