"""`projector rebuild --by-replay --from-timestamp T` on the real servers (issue 7), and the
rebuild's progress gauges scraped from its own /metrics endpoint while it runs.

A generated stream goes through the worker in two halves; T falls between them. The rebuild
reads the log from T only, starts the users it names from their rows rebuilt from state, and
rebuilds everyone else from state. It must equal `projector replay` of the whole stream on every
field, with each row's projection_mailbox_seq exactly as docs/contract.md §4 says: the row's
last entry when that entry is at or after T and above the user's state version, else state's
updated_mailbox_seq."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.metrics import REBUILD_METRICS, names, sample
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, read_jsonl, store_messages
from tests.support.builders import CONV_A, StreamBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BADGE = ("total_unread", "total_mention", "muted_unread")
QUIET = 424_242


async def tail_entries(stack: Stack, from_ms: int) -> list[dict[str, Any]]:
    """The entries at or after `from_ms` (Kafka record time), as the broker answers it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic = stack.settings.topics.topic_mailbox_tail
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.settings.kafka.kafka_bootstrap, group_id=None)
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(stack.settings.topics.topic_partitions)]
        found = await consumer.offsets_for_times({tp: from_ms for tp in tps})
        end = await consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, end[tp] if found[tp] is None else found[tp].offset)
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [e for e in (orjson.loads(r.value) for r in records) if "mailbox_seq" in e]
    finally:
        await consumer.stop()
    return out


def expected_versions(
    lines: list[bytes], tail: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> tuple[dict[tuple[int, str], int], dict[int, int]]:
    """Row and user versions the contract promises for a rebuild from T (see the module doc)."""
    entries = [e for e in map(orjson.loads, lines) if "mailbox_seq" in e]
    first: dict[tuple[int, str], int] = {}
    last_change: dict[tuple[int, str], int] = {}
    for e in sorted(entries, key=lambda e: e["mailbox_seq"]):
        key = (e["user_id"], e["conversation_id"])
        first.setdefault(key, e["mailbox_seq"])
        if e["type"] != "message":
            last_change[key] = e["mailbox_seq"]
    # What the worker mirrors to UserConversationState: the entry creating the row, then every
    # state-changing entry.
    updated = {key: max(seq, last_change.get(key, 0)) for key, seq in first.items()}
    state_version: dict[int, int] = {}
    for (user, _), seq in updated.items():
        state_version[user] = max(state_version.get(user, 1), seq)
    in_tail = {e["mailbox_seq"] for e in tail}
    tail_top: dict[int, int] = {}
    for e in tail:
        tail_top[e["user_id"]] = max(tail_top.get(e["user_id"], 0), e["mailbox_seq"])
    row_versions = {}
    for row in rows:
        key = (row["user_id"], row["conversation_id"])
        last = row["projection_mailbox_seq"]  # the full replay's: the row's last entry
        exact = last in in_tail and last > state_version[row["user_id"]]
        row_versions[key] = last if exact else updated[key]
    user_versions = {user: max(v, tail_top.get(user, 0)) for user, v in state_version.items()}
    return row_versions, user_versions


async def test_rebuild_by_replay_from_a_timestamp_equals_a_full_replay_on_what_it_can_know(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("rebuild-ts")
    base = stack.settings.redis.projection_namespace
    stream = tmp_path / "stream.jsonl"
    # The MessageStore gets every message first (as the chat backend writes it before the
    # mailbox does); the entries go to Kafka below, in two halves.
    stack.run(
        *("simulate", "--users", "30", "--conversations", "10", "--group-size", "20"),
        *("--messages", "300", "--rate", "0", "--lanes", "2", "--seed", "5"),
        *("--out", str(stream), "--no-kafka", "--progress", "never"),
    )
    generated = stream.read_bytes().splitlines()
    # And one user whose last entry comes before T: the rebuild has them from state alone.
    quiet = StreamBuilder(lanes=2)
    for seq in range(1, 6):
        quiet.message(QUIET, seq, mention=seq == 4)
    quiet.read(QUIET, 2)
    quiet.entry("pin", QUIET, CONV_A, pin_rank=2)
    await asyncio.to_thread(store_messages, stack.settings, quiet.lines)
    half = len(generated) // 2
    first, second = [*generated[:half], *quiet.lines], generated[half:]
    lines = [*first, *second]
    everything = tmp_path / "everything.jsonl"
    everything.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(everything), "--out", str(out), "--lanes", "2", "--progress", "never")
    full_rows = read_jsonl(out / "projections.jsonl")
    full_badges = read_jsonl(out / "badges.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in full_badges}

    stack.start_worker()
    await stack.produce(first)
    await asyncio.sleep(0.05)  # apart from the first half's record times by more than a ms
    from_ms = time.time_ns() // 1_000_000
    await asyncio.sleep(0.05)
    await stack.produce(second)
    await stack.wait_for_versions(versions, timeout=240, alive=stack.alive())
    stack.stop_workers()  # quiescent: the state mirror is complete
    assert await stack.projection(sorted(versions)) == (full_rows, full_badges)

    tail = await tail_entries(stack, from_ms)
    assert 0 < len(tail) < sum(1 for line in lines if b'"mailbox_seq"' in line)
    row_versions, user_versions = expected_versions(lines, tail, full_rows)

    fresh = f"{base}-ts"
    report_path = tmp_path / "ts.json"
    stack.run(
        *("rebuild", "--by-replay", "--from-timestamp", str(from_ms), "--namespace", fresh),
        *("--report", str(report_path), "--progress", "never"),
    )
    report = orjson.loads(report_path.read_bytes())
    assert report["mode"] == "by-replay-from-timestamp"
    replay = report["replay"]
    assert replay["from_timestamp_ms"] == from_ms and replay["pending"] == 0
    assert all(offset > 0 for offset in replay["start_offsets"].values())  # older records unread
    assert replay["users_from_state_base"] == replay["users"] > 0
    assert report["users_from_state_only"] == 1  # QUIET
    assert replay["users"] + report["users_from_state_only"] == len(versions)
    diff = report["diff"]
    assert diff["identical"], diff  # every field state can know

    store = RedisProjectionStore.from_settings(stack.settings.redis, fresh)
    try:
        rebuilt_rows: list[dict[str, Any]] = []
        for user in sorted(versions):
            stored = await store.load(user)
            rebuilt_rows += [stored.rows[cid] for cid in sorted(stored.rows)]
            want = next(b for b in full_badges if b["user_id"] == user)
            assert [getattr(stored, k) for k in BADGE] == [want[k] for k in BADGE], user
            assert stored.projection_mailbox_seq == user_versions[user], user
        # Every field, the versions as promised; and the tail made some of them exact where
        # state alone would not have.
        expected = [
            dict(row, projection_mailbox_seq=row_versions[(row["user_id"], row["conversation_id"])])
            for row in full_rows
        ]
        assert rebuilt_rows == expected
        from_tail = [r for r in full_rows if r["projection_mailbox_seq"] in {e["mailbox_seq"] for e in tail}]
        exact = [
            r
            for r in from_tail
            if row_versions[(r["user_id"], r["conversation_id"])] == r["projection_mailbox_seq"]
        ]
        assert exact
    finally:
        await store.delete_all()
        await store.aclose()


async def test_a_rebuild_serves_its_progress_gauges_and_they_move(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("rebuild-metrics", partitions=2, lanes=1)
    s = StreamBuilder()
    for seq in range(1, 20_001):  # enough records for several fetches of the rebuild
        s.message(1000 + seq % 50, seq)
    await stack.produce(s.close())
    records = 20_000 + 2  # and the closing marker, to both partitions

    port = free_port()
    proc = subprocess.Popen(
        [
            *PROJECTOR,
            *("rebuild", "--by-replay", "--namespace", f"{stack.settings.redis.projection_namespace}-m"),
            *("--metrics-port", str(port), "--metrics-hold", "20", "--progress", "never"),
            *("--report", str(tmp_path / "m.json")),
        ],
        cwd=ROOT,
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[tuple[float, float, float]] = []  # (items, done, ratio) per scrape
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 180
            while not seen or seen[-1][2] < 1.0 or seen[-1][0] == 0:
                assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
                assert time.monotonic() < deadline, seen[-5:]
                try:
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        text = await resp.text()
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.01)
                    continue  # not listening yet
                assert set(REBUILD_METRICS) <= names(text)
                seen.append(
                    (
                        sample(text, "projector_rebuild_work_items"),
                        sample(text, "projector_rebuild_work_done"),
                        sample(text, "projector_rebuild_progress_ratio"),
                    )
                )
                await asyncio.sleep(0.01)
            # Then the diff with the serving namespace (the operator console shows it), held with
            # the final values: the same counts as the report.
            while "projector_rebuild_diff_rows{" not in text:
                assert proc.poll() is None, "the rebuild ended before its diff was scraped"
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
            scraped_diff = {
                **{
                    f"rows_{kind}": sample(text, "projector_rebuild_diff_rows", [("kind", kind)])
                    for kind in ("added", "removed", "changed")
                },
                "badges_differing": sample(text, "projector_rebuild_diff_badges"),
            }
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        target = RedisProjectionStore.from_settings(
            stack.settings.redis, f"{stack.settings.redis.projection_namespace}-m"
        )
        await target.delete_all()
        await target.aclose()

    # The final values, held for the scraper: every record of the log done.
    assert seen[-1] == (records, records, 1.0)
    report = orjson.loads((tmp_path / "m.json").read_bytes())["diff"]
    assert scraped_diff == {name: report[name] for name in scraped_diff}
    assert scraped_diff["rows_added"] > 0  # nothing served before: every rebuilt row is new
    # They moved: work done never goes back, and a scrape saw the rebuild under way.
    counted = [done for items, done, _ in seen if items == records]
    assert counted == sorted(counted)
    assert any(0 <= done < records for done in counted), seen[:20]
