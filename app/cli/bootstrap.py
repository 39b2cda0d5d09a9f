"""`projector bootstrap`: create the Cassandra schema and the Kafka topics, idempotently.

Run it before the worker (``make run`` / the compose ``bootstrap`` job do). Safe to run any number
of times: what exists is left alone. Two things are reported, not "fixed":

* an existing topic whose partition count differs from ``PROJECTOR_TOPIC_PARTITIONS`` (changing a
  live topic's partitions reshuffles keys and breaks co-partitioning with changelogs), exit 1;
* nothing else: missing tables are created, missing columns are added (see app/stores/schema.py).

Topics are always created explicitly here: the broker runs with auto-creation off, because an
auto-created topic would get the broker's default partition count.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.connections import kafka_client_options, kafka_security_options, keyspace_replication, quiet_logger
from app.kafka.refusal import kafka_unreachable
from app.settings import CassandraSettings, KafkaSettings, Settings, TopicSettings
from app.stores.cassandra_session import CassandraUnavailable, open_cluster
from app.stores.schema import TABLES, create_keyspace_cql

TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code


class KafkaUnavailable(RuntimeError):
    """Kafka could not be reached, or refused an admin request."""


@dataclass
class SchemaReport:
    keyspace: str
    created_keyspace: bool = False
    created_tables: list[str] = field(default_factory=list)
    existing_tables: list[str] = field(default_factory=list)
    added_columns: list[str] = field(default_factory=list)  # "table.column"

    def summary(self) -> str:
        parts = [f"keyspace {self.keyspace}: {'created' if self.created_keyspace else 'exists'}"]
        if self.created_tables:
            parts.append("created tables " + ", ".join(self.created_tables))
        if self.existing_tables:
            parts.append("existing tables " + ", ".join(self.existing_tables))
        if self.added_columns:
            parts.append("added columns " + ", ".join(self.added_columns))
        return "; ".join(parts)


@dataclass
class TopicReport:
    partitions: int
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    # (topic, actual partitions, wanted partitions)
    mismatched: list[tuple[str, int, int]] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        if self.created:
            parts.append(f"created {', '.join(self.created)} ({self.partitions} partitions)")
        if self.existing:
            parts.append("already there: " + ", ".join(self.existing))
        return "; ".join(parts) or "no topics"

    def mismatch_message(self) -> str:
        lines = [
            f"topic {name!r} has {actual} partitions, settings want {wanted}"
            for name, actual, wanted in self.mismatched
        ]
        return (
            "\n".join(lines) + "\nExisting topics are left alone: delete and recreate them (losing "
            "their data), or set PROJECTOR_TOPIC_PARTITIONS to the existing count."
        )


def ensure_cassandra_schema(
    cassandra: CassandraSettings, *, keyspace: str | None = None, connect_timeout: float = 10.0
) -> SchemaReport:
    """Create the keyspace and every table of app/stores/schema.py that is missing."""
    ks = keyspace or cassandra.cassandra_keyspace
    report = SchemaReport(keyspace=ks)
    cluster, session = open_cluster(cassandra, connect_timeout=connect_timeout)
    try:
        report.created_keyspace = ks not in cluster.metadata.keyspaces
        # DDL through the driver waits for schema agreement before returning.
        session.execute(
            create_keyspace_cql(ks, cassandra.cassandra_replication_factor, keyspace_replication(cassandra))
        )
        for table in TABLES:
            existing = _table_columns(session, ks, table.name)
            if existing is None:
                session.execute(table.create_cql(ks))
                report.created_tables.append(table.name)
                continue
            report.existing_tables.append(table.name)
            for column, _ in table.columns:
                if column not in existing:
                    session.execute(table.add_column_cql(ks, column))
                    report.added_columns.append(f"{table.name}.{column}")
    finally:
        cluster.shutdown()
    return report


def _table_columns(session: Any, keyspace: str, table: str) -> set[str] | None:
    """Column names of an existing table, or None when the table does not exist."""
    rows = session.execute(
        "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s",
        (keyspace, table),
    )
    names = {row.column_name for row in rows}
    return names or None


async def ensure_topics(
    kafka: KafkaSettings,
    product: TopicSettings,
    topics: Sequence[str] | None = None,
    *,
    partitions: int | None = None,
    timeout_s: float = 30.0,
) -> TopicReport:
    """Create each topic that does not exist, with the configured partition count.

    ``topics`` defaults to every topic of the product (``product.names``); tests pass their own
    unique names. Existing topics are never altered; a partition count that differs is reported
    in ``mismatched``.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    wanted = partitions or product.topic_partitions
    names = list(product.names if topics is None else topics)
    report = TopicReport(partitions=wanted)
    admin = AIOKafkaAdminClient(**kafka_client_options(kafka), request_timeout_ms=int(timeout_s * 1000))
    try:
        try:
            with quiet_logger("aiokafka"):  # its line per failed connect: ours says it once
                await asyncio.wait_for(admin.start(), timeout=timeout_s)
        except (KafkaError, TimeoutError, OSError) as exc:
            raise KafkaUnavailable(
                await kafka_unreachable(kafka.kafka_bootstrap, kafka_security_options(kafka), exc)
            ) from None
        present = set(await admin.list_topics())
        missing = [n for n in names if n not in present]
        if missing:
            response = await admin.create_topics(
                [NewTopic(n, wanted, product.topic_replication_factor) for n in missing],
                timeout_ms=int(timeout_s * 1000),
            )
            for item in response.to_object()["topic_errors"]:
                code = item["error_code"]
                if code == 0:
                    report.created.append(item["topic"])
                elif code == TOPIC_ALREADY_EXISTS:  # another bootstrap won the race: fine
                    present.add(item["topic"])
                else:
                    message = item.get("error_message") or f"error code {code}"
                    raise KafkaUnavailable(f"creating topic {item['topic']!r} failed: {message}")
        existing = [n for n in names if n in present]
        if existing:
            for meta in await admin.describe_topics(existing):
                actual = len(meta["partitions"])
                report.existing.append(meta["topic"])
                if actual != wanted:
                    report.mismatched.append((meta["topic"], actual, wanted))
    finally:
        await admin.close()
    report.created.sort(key=names.index)
    report.existing.sort(key=names.index)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skip-cassandra", action="store_true", help="do not touch the Cassandra schema")
    parser.add_argument("--skip-kafka", action="store_true", help="do not touch the Kafka topics")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="connect/request timeout per server in seconds (default 30)",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    status = 0
    if not args.skip_cassandra:
        try:
            schema = ensure_cassandra_schema(settings.cassandra, connect_timeout=args.timeout)
            print(f"cassandra: {schema.summary()}")
        except CassandraUnavailable as exc:
            print(f"cassandra: {exc}", file=sys.stderr)
            status = 1
    if not args.skip_kafka:
        try:
            topics = asyncio.run(ensure_topics(settings.kafka, settings.topics, timeout_s=args.timeout))
            print(f"kafka: {topics.summary()}")
            if topics.mismatched:
                print(f"kafka: {topics.mismatch_message()}", file=sys.stderr)
                status = 1
        except KafkaUnavailable as exc:
            print(f"kafka: {exc}", file=sys.stderr)
            status = 1
    return status
