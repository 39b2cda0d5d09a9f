"""`projector simulate` against the real Kafka and Cassandra: what lands in the topic (per
partition: entries, every lane's markers after the entries they cover), what lands in the
MessageStore, and that --out is the same stream and replays clean."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.replay import ReplayOptions, run_replay
from app.settings import Settings
from app.simulate import Mix, SimParams, simulate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def schema(servers: Settings, keyspace: str) -> str:
    from app.cli.bootstrap import ensure_cassandra_schema

    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    return keyspace


async def consume_all(settings: Settings, topic: str) -> dict[int, list[tuple[bytes | None, dict[str, Any]]]]:
    """Every record of every partition, in partition order: {partition: [(key, record)]}."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or await _partitions(consumer, topic))
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        got: dict[int, list[tuple[bytes | None, dict[str, Any]]]] = {p: [] for p in partitions}
        async with asyncio.timeout(60):
            while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, records in batch.items():
                    got[tp.partition].extend((r.key, orjson.loads(r.value)) for r in records)
        return got
    finally:
        await consumer.stop()


async def _partitions(consumer: Any, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    found: set[int] = consumer.partitions_for_topic(topic)
    return found


async def test_simulation_lands_in_kafka_and_cassandra(
    servers: Settings, schema: str, make_topic: Callable[..., Awaitable[str]], tmp_path: Path
) -> None:
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster

    topic = await make_topic("mailbox", partitions=3)
    settings = servers.replace(topic_mailbox_tail=topic, cassandra_keyspace=schema)
    lanes = 2
    params = SimParams(
        users=40, conversations=10, group_size=25, messages=300, lanes=lanes, seed=11,
        mix=Mix(burst=0.1, recall=0.1),
    )  # fmt: skip
    out_path = tmp_path / "sim.jsonl"
    with open(out_path, "wb") as out:
        report = await simulate(settings, params, out=out, rate=0)
    assert report.messages == 300 and not report.stopped_early

    # Every simulated user has a public profile the member directory can show (issue 34).
    from app.simulate.workload import Workload
    from app.stores.cassandra_profiles import CassandraProfileStore
    from app.stores.cassandra_remarks import CassandraRemarkStore

    users = Workload(params).users
    cluster, session = await asyncio.to_thread(open_cluster, settings.cassandra)
    try:
        shown = await CassandraProfileStore(session, schema).profiles(users[:50])
        remarks = CassandraRemarkStore(session, schema)
        # Some viewers keep a private remark on another user; each viewer sees only its own.
        remarks_of = {viewer: await remarks.remarks(viewer, users[:50]) for viewer in users[:4]}
    finally:
        cluster.shutdown()
    assert sorted(shown) == sorted(users[:50])
    assert shown[users[0]].display_name == f"Sim user {users[0]:x}"
    assert remarks_of[users[0]] == {users[1]: f"Sim note {users[1]:x}"}
    assert remarks_of[users[3]] == {users[4]: f"Sim note {users[4]:x}"}
    assert remarks_of[users[1]] == {} and remarks_of[users[2]] == {}

    lines = out_path.read_bytes().splitlines()
    file_records = [orjson.loads(line) for line in lines]
    by_partition = await consume_all(settings, topic)
    topic_records = [record for records in by_partition.values() for _, record in records]

    # The file is the produced stream: the same records (markers once per partition).
    canonical = Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in file_records)
    assert canonical == Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in topic_records)
    entries = [r for r in file_records if r["type"] != "watermark"]
    assert len(entries) == report.entries
    assert sum(1 for r in topic_records if r["type"] == "watermark") == report.markers

    # Stronger: each partition holds exactly its share of the file, in the file's order (the
    # k-th copy of a marker in the file is the one sent to the k-th partition).
    partition_of_user = {
        record["user_id"]: partition
        for partition, records in by_partition.items()
        for _, record in records
        if record["type"] != "watermark"
    }
    # A marker's copies differ only by their `count` (what was sent to that partition).
    copies: Counter[tuple[int, int]] = Counter()
    file_by_partition: dict[int, list[dict[str, Any]]] = {p: [] for p in by_partition}
    for record in file_records:
        if record["type"] == "watermark":
            marker = (record["lane"], record["watermark"])
            partition = sorted(by_partition)[copies[marker]]
            copies[marker] += 1
        else:
            partition = partition_of_user[record["user_id"]]
        file_by_partition[partition].append(record)
    assert file_by_partition == {p: [r for _, r in records] for p, records in by_partition.items()}

    last_seq = max(e["mailbox_seq"] for e in entries)
    user_partition: dict[int, int] = {}
    for partition, records in by_partition.items():
        covered: dict[int, int] = {}  # lane -> last marker seen in this partition
        last_of_user: dict[int, int] = {}
        for key, record in records:
            if record["type"] == "watermark":
                assert record["watermark"] >= covered.get(record["lane"], 0)
                covered[record["lane"]] = record["watermark"]
                continue
            # Keyed by user: a user's entries stay in one partition, in mailbox_seq order.
            assert key == str(record["user_id"]).encode()
            assert user_partition.setdefault(record["user_id"], partition) == partition
            assert record["mailbox_seq"] > last_of_user.get(record["user_id"], 0)
            last_of_user[record["user_id"]] = record["mailbox_seq"]
            # The in-band rule: no entry of a lane behind that lane's marker in this partition.
            assert record["mailbox_seq"] > covered.get(record["lane"], 0), (partition, record)
        # Every lane reported into every partition, finally up to the last seq.
        assert covered == dict.fromkeys(range(lanes), last_seq), partition

    # The MessageStore holds every message the entries name, with the same facts.
    cluster, session = open_cluster(settings.cassandra)
    try:
        store = CassandraMessageStore(session, schema)
        messages = {
            (e["conversation_id"], e["conversation_seq"]): e for e in entries if e["type"] == "message"
        }
        recalled = {
            (e["conversation_id"], e["target_conversation_seq"])
            for e in entries
            if e["type"] in ("recall", "delete_message")
        }
        mentions: dict[tuple[str, int], set[int]] = defaultdict(set)
        for e in entries:
            if e["type"] == "message" and e["mention"]:
                mentions[(e["conversation_id"], e["conversation_seq"])].add(e["user_id"])
        assert len(messages) == 300
        for (conversation, seq), e in messages.items():
            stored = store.get(conversation, seq)
            assert stored is not None, (conversation, seq)
            assert (stored.message_id, stored.activity_id, stored.sender_id, stored.counts_unread) == (
                e["message_id"], e["activity_id"], e["sender_id"], e["counts_unread"],
            )  # fmt: skip
            assert stored.recalled == ((conversation, seq) in recalled)
            assert stored.mentions == frozenset(mentions[(conversation, seq)])
        latest: dict[str, int] = {}
        for conversation, seq in messages:
            latest[conversation] = max(latest.get(conversation, 0), seq)
        heads = store.heads(latest)
        assert {c: h.latest_conversation_seq for c, h in heads.items()} == latest
        for c, h in heads.items():
            assert h.last_message_id == messages[(c, latest[c])]["message_id"]
        # A conversation's range read sees the same messages, ascending.
        some = next(iter(latest))
        assert [m.conversation_seq for m in store.range(some, 0, latest[some])] == sorted(
            s for c, s in messages if c == some
        )
    finally:
        cluster.shutdown()

    # The same stream through `projector replay`'s core: nothing dead, nothing left pending.
    result = run_replay(lines, ReplayOptions(lanes=lanes))
    assert result.stats["dead_letters"] == 0
    assert result.stats["pending"] == 0
    assert result.stats["applied"] == report.entries


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "simulate", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_cli_run_and_replay(
    servers: Settings, schema: str, make_topic: Callable[..., Awaitable[str]], tmp_path: Path
) -> None:
    topic = await make_topic("mailbox", partitions=2)
    env = {"PROJECTOR_TOPIC_MAILBOX_TAIL": topic, "PROJECTOR_CASSANDRA_KEYSPACE": schema}
    out = tmp_path / "cli.jsonl"
    done = await asyncio.to_thread(
        run_cli, "--users", "20", "--conversations", "6", "--messages", "80", "--rate", "0",
        "--lanes", "2", "--out", str(out), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "simulated 80 messages" in done.stderr
    result = run_replay(out.read_bytes().splitlines(), ReplayOptions(lanes=2))
    assert result.stats["dead_letters"] == 0 and result.stats["pending"] == 0


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"PROJECTOR_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, ["--no-cassandra"], "cannot reach 127.0.0.1:1"),
        ({"PROJECTOR_CASSANDRA_PORT": "1"}, [], "cannot reach Cassandra"),
        ({"PROJECTOR_TOPIC_MAILBOX_TAIL": "t-no-such-topic-xyz"}, ["--no-cassandra"], "does not exist"),
        ({"PROJECTOR_CASSANDRA_KEYSPACE": "no_such_keyspace_xyz"}, [], "projector bootstrap"),
    ],
    ids=["kafka-down", "cassandra-down", "no-topic", "no-keyspace"],
)
def test_unreachable_servers_give_a_clear_error(env: dict[str, str], args: list[str], expected: str) -> None:
    done = run_cli("--messages", "5", "--rate", "0", *args, env=env)
    assert done.returncode == 1, done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
