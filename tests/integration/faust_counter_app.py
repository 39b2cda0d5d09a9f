"""A tiny faust app for the changelog-recovery integration test (run as a worker subprocess).

    python -m tests.integration.faust_counter_app worker -l warning

Configuration comes from one environment variable, ``FAUST_COUNTER_CONFIG`` (a JSON object with
``app_id``, ``bootstrap``, ``topic``, ``partitions``, ``datadir``, ``reports``), because the faust
CLI owns argv. This is test scaffolding, not product code, so it reads the environment directly.

Records on ``topic`` (JSON values, string keys):
  {"op": "add", "n": N}       counts[key] += N   (a RocksDB table with a changelog)
  {"op": "report", "id": ID}  sent once to every partition; when every partition has delivered
                              it, writes ``reports/ID.json`` = {"counts": {...}, "adds_this_run": K}
Because a stream's records are processed in order per partition, a report seen on every
partition means every earlier "add" has been applied. Delivery is at least once (a rebalance
while the worker settles in seeks back to the last commit), so the table also holds, per source
partition, the next offset to apply, written with the count it guards: an "add" re-read is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faust

CONFIG: dict[str, Any] = json.loads(os.environ["FAUST_COUNTER_CONFIG"])

app = faust.App(
    CONFIG["app_id"],
    broker=f"kafka://{CONFIG['bootstrap']}",
    store="rocksdb://",  # faust picks rocksdict when python-rocksdb is absent
    datadir=CONFIG["datadir"],
    topic_partitions=CONFIG["partitions"],
    topic_disable_leader=True,  # one topic less to declare; the assignor leader is not needed
    web_enabled=False,  # tests run in parallel checkouts: never bind 6066
    broker_commit_interval=0.5,
    consumer_auto_offset_reset="earliest",
)

source = app.topic(
    CONFIG["topic"],
    key_type=str,
    value_serializer="json",
    partitions=CONFIG["partitions"],
)
counts = app.Table("counts", default=int, partitions=CONFIG["partitions"])

OFFSET_PREFIX = "@next-offset:"
_adds_this_run = 0
_reported: dict[str, set[int]] = {}


@app.agent(source)
async def process(stream: Any) -> None:
    global _adds_this_run
    async for event in stream.events():
        key, value = event.key, event.value
        if value["op"] == "add":
            # Same table, same partition as the count (faust writes a table's changelog to the
            # event's partition), so the guard comes back from the changelog with the counts.
            guard = f"{OFFSET_PREFIX}{event.message.partition}"
            if event.message.offset < counts[guard]:
                continue  # applied before this rebalance's seek back
            counts[key] += int(value["n"])
            counts[guard] = event.message.offset + 1
            _adds_this_run += 1
        elif value["op"] == "report":
            seen = _reported.setdefault(value["id"], set())
            seen.add(event.message.partition)
            if len(seen) == CONFIG["partitions"]:
                kept = {k: v for k, v in counts.items() if not k.startswith(OFFSET_PREFIX)}
                report = {"counts": kept, "adds_this_run": _adds_this_run}
                target = Path(CONFIG["reports"]) / f"{value['id']}.json"
                tmp = target.with_suffix(".tmp")
                tmp.write_text(json.dumps(report))
                tmp.replace(target)  # the test polls for the file: never let it see half of it


if __name__ == "__main__":
    app.main()
