"""Garbage at scale through a real worker (issue 18): fuzzed records (tests/support/garbage.py) mixed into
a valid simulated stream on mailbox-tail. Checked: the worker never exits or logs a traceback,
every bad record (and nothing else) reaches the dead-letter topic with a reason, the dead letters
are counted, and the projection equals `projector replay` of the valid records alone.

Used by the integration suite at a CI size and by `make chaos-garbage` at full size.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.domain.entries import DEAD_LETTER_KINDS
from app.metrics import sample
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until
from tests.support.garbage import GarbageMaker

# The mailbox topic takes records up to this size here, so 1 MiB strings (up to 6 MiB once
# escaped) really reach the worker; a deployment's broker default (1 MB) refuses them earlier.
TOPIC_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class GarbagePlan:
    garbage: int = 3000
    huge_share: float = 0.002  # share of records over the size bound (1 MiB strings)
    users: int = 60
    conversations: int = 15
    group_size: int = 30
    messages: int = 300
    seed: int = 18
    catch_up_s: float = 300.0


@dataclass
class GarbageReport:
    valid_records: int = 0
    garbage: int = 0
    dead_letters: int = 0
    by_kind: dict[str, int] | None = None
    by_family: dict[str, int] | None = None
    mismatched_rows: int = 0
    mismatched_badges: int = 0
    elapsed_s: float = 0.0

    def line(self) -> str:
        return (
            f"{self.garbage} garbage records among {self.valid_records} valid ones: "
            f"{self.dead_letters} dead letters, {self.mismatched_rows} rows and "
            f"{self.mismatched_badges} badges differ from replay; {self.elapsed_s:.0f} s; "
            f"by kind {self.by_kind}; by family {self.by_family}"
        )


def stack_overrides() -> dict[str, str]:
    return {"PROJECTOR_WORKER_METRICS_PORT": str(free_port()), "PROJECTOR_LOG_LEVEL": "INFO"}


async def _allow_big_records(stack: Stack) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka.kafka_bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    stack.settings.topics.topic_mailbox_tail,
                    configs={"max.message.bytes": str(TOPIC_MAX_BYTES)},
                )
            ]
        )
    finally:
        await admin.close()


async def run_garbage_scenario(stack: Stack, tmp: Path, plan: GarbagePlan) -> GarbageReport:
    started = time.monotonic()
    report = GarbageReport()
    stream = tmp / "stream.jsonl"
    stack.run(
        "simulate",
        *("--users", str(plan.users), "--conversations", str(plan.conversations)),
        *("--group-size", str(plan.group_size), "--messages", str(plan.messages)),
        *("--rate", "0", "--seed", str(plan.seed), "--lanes", str(stack.settings.processing.lanes)),
        *("--out", str(stream), "--no-kafka", "--progress", "never"),
    )
    valid = [line for line in stream.read_bytes().splitlines() if line.strip()]
    report.valid_records = len(valid)
    out = tmp / "replay"
    lanes = str(stack.settings.processing.lanes)
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", lanes, "--progress", "never")
    expected_rows = read_jsonl(out / "projections.jsonl")
    expected_badges = read_jsonl(out / "badges.jsonl")
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert expected_rows and stats["dead_letters"] == 0 and stats["pending"] == 0, stats

    entries = [orjson.loads(line) for line in valid]
    templates = [e for e in entries if e.get("type") != "watermark"]
    maker = GarbageMaker(plan.seed, stack.settings.processing.lanes, huge_share=plan.huge_share)
    garbage = list(maker.many(plan.garbage, templates))
    report.garbage = len(garbage)
    families: dict[str, int] = {}
    for item in garbage:
        families[item.family] = families.get(item.family, 0) + 1
    report.by_family = families
    rnd = random.Random(plan.seed)
    # Mixed: every garbage record at a random place in the valid stream.
    slots = sorted(rnd.randrange(len(valid) + 1) for _ in garbage)

    await _allow_big_records(stack)
    stack.start_worker()
    alive = stack.alive()
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=stack.settings.kafka.kafka_bootstrap, linger_ms=5, max_request_size=TOPIC_MAX_BYTES
    )
    await producer.start()
    topic = stack.settings.topics.topic_mailbox_tail
    partitions = stack.settings.topics.topic_partitions
    bad_sent: list[asyncio.Future[Any]] = []
    try:
        pending: list[asyncio.Future[Any]] = []
        next_bad = 0
        for index in range(len(valid) + 1):
            while next_bad < len(garbage) and slots[next_bad] == index:
                item = garbage[next_bad]
                # A real user's key (its partition), or none at all (a producer with no key).
                key = str(rnd.choice(templates)["user_id"]).encode() if rnd.random() < 0.7 else None
                partition = None if key is not None else rnd.randrange(partitions)
                bad_sent.append(await producer.send(topic, item.raw, key=key, partition=partition))
                next_bad += 1
            if index == len(valid):
                break
            raw, entry = valid[index], entries[index]
            if entry.get("type") == "watermark":
                for partition in range(partitions):
                    pending.append(await producer.send(topic, raw, partition=partition))
            else:
                pending.append(await producer.send(topic, raw, key=str(entry["user_id"]).encode()))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending = []
            alive()
        await asyncio.gather(*pending)
        placed = {(meta.partition, meta.offset) for meta in await asyncio.gather(*bad_sent)}
    finally:
        await producer.stop()
    assert len(placed) == len(garbage)

    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in expected_badges}
    await stack.wait_for_versions(versions, timeout=plan.catch_up_s, alive=alive)
    rows, badges = await stack.projection(sorted(versions))
    want_rows = {(r["user_id"], r["conversation_id"]): r for r in expected_rows}
    got_rows = {(r["user_id"], r["conversation_id"]): r for r in rows}
    report.mismatched_rows = sum(got_rows.get(k) != v for k, v in want_rows.items()) + len(
        set(got_rows) - set(want_rows)
    )
    want_badges = {b["user_id"]: b for b in expected_badges}
    report.mismatched_badges = sum(want_badges.get(b["user_id"]) != b for b in badges) + abs(
        len(badges) - len(expected_badges)
    )

    # Every bad record, and nothing else, on the dead-letter topic with a reason.
    letters = await stack.consume(
        stack.settings.topics.topic_dead_letter,
        lambda got: len({(d["partition"], d["offset"]) for d in got}) >= len(placed),
        timeout=plan.catch_up_s,
    )
    report.dead_letters = len(letters)
    where = {(d["partition"], d["offset"]) for d in letters}
    assert where == placed, (
        f"{len(placed - where)} bad records not dead-lettered, {len(where - placed)} other records "
        f"dead-lettered, e.g. {sorted(where ^ placed)[:5]}"
    )
    for letter in letters:
        assert isinstance(letter["reason"], str) and letter["reason"].strip(), letter
        assert letter["topic"] == topic
    # Counted, by a kind of the closed set.
    url = f"http://127.0.0.1:{stack.env['PROJECTOR_WORKER_METRICS_PORT']}/metrics"
    text = await scrape_until(
        url, lambda t: (sample(t, "projector_entries_dead_lettered_total") or 0) >= len(placed), 120, alive
    )
    by_kind = {
        kind: int(sample(text, "projector_dead_letters_total", [("reason", kind)]) or 0)
        for kind in DEAD_LETTER_KINDS
    }
    report.by_kind = {k: v for k, v in by_kind.items() if v}
    assert sum(by_kind.values()) == sample(text, "projector_entries_dead_lettered_total")

    alive()
    log = (stack.tmp / "worker-0.log").read_text(errors="replace")
    assert "Traceback" not in log, stack.log_tail(lines=120)
    report.elapsed_s = time.monotonic() - started
    return report
