"""Baseline for the worker bench: the naive faust topology (one event at a time).

    NAIVE_FAUST_CONFIG='{"app_id": ..., "bootstrap": ..., "input": ..., "output": ...,
                         "partitions": 1, "datadir": ...}' \
        python bench/naive_faust_agent.py worker -l info --without-web

What a typical faust app for this job looks like: an agent streams mailbox-tail events one by
one, decodes each JSON value, reads and writes the (user, conversation) row (a dict) in a
RocksDB-backed Table (changelogged) on every entry, and emits one frame per entry to --output. Markers are not
gated (skipped); any other record (the bench's probes) is forwarded as it is, so the harness sees
when the first and the last record were processed. The unread rule is the simple one (no
watermark, no disorder handling, no MessageStore): this is a cost baseline, not a product.

Same app settings as the worker (app/main.py: rocksdb store, raw topics, producer linger and
batch size). Configuration comes from the NAIVE_FAUST_CONFIG environment variable (faust's CLI
owns argv).
"""

from __future__ import annotations

import json
import os
from typing import Any

import faust
import orjson

CONFIG: dict[str, Any] = json.loads(os.environ["NAIVE_FAUST_CONFIG"])

app = faust.App(
    CONFIG["app_id"],
    broker=f"kafka://{CONFIG['bootstrap']}",
    store="rocksdb://",
    datadir=CONFIG["datadir"],
    topic_partitions=CONFIG["partitions"],
    topic_disable_leader=True,
    web_enabled=False,
    key_serializer="raw",
    value_serializer="raw",
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=1.0,
    # The worker's producer settings (app/main.py), so the comparison is about the topology.
    producer_linger_ms=10,
    producer_max_batch_size=512 * 1024,
)
source = app.topic(
    CONFIG["input"], key_serializer="raw", value_serializer="raw", partitions=CONFIG["partitions"]
)
output = app.topic(CONFIG["output"], key_serializer="raw", value_serializer="raw")
rows = app.Table("naive-rows", default=None, partitions=CONFIG["partitions"])

ENTRY_TYPES = frozenset(
    {
        "message", "read", "recall", "delete_message", "join", "leave", "pin", "unpin",
        "archive", "unarchive", "mute", "unmute", "clear_history", "delete_conversation",
        "mailbox_dirty",
    }
)  # fmt: skip


def new_row(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "user_id": doc["user_id"],
        "conversation_id": doc["conversation_id"],
        "membership": "active",
        "latest_conversation_seq": None,
        "last_message_id": None,
        "last_activity_id": None,
        "read_conversation_seq": 0,
        "unread_count": 0,
        "mention_count": 0,
        "pinned": False,
        "archived": False,
        "muted": False,
        "projection_mailbox_seq": 0,
    }


def update(row: dict[str, Any], doc: dict[str, Any]) -> None:
    kind = doc["type"]
    if kind == "message":
        seq = doc["conversation_seq"]
        if row["latest_conversation_seq"] is None or seq > row["latest_conversation_seq"]:
            row["latest_conversation_seq"] = seq
            row["last_message_id"] = doc["message_id"]
            row["last_activity_id"] = doc["activity_id"]
        if seq > row["read_conversation_seq"] and doc["counts_unread"] and doc["sender_id"] != doc["user_id"]:
            row["unread_count"] += 1
            row["mention_count"] += 1 if doc["mention"] else 0
    elif kind == "read":
        if doc["read_conversation_seq"] > row["read_conversation_seq"]:
            row["read_conversation_seq"] = doc["read_conversation_seq"]
            if (
                row["latest_conversation_seq"] is None
                or row["read_conversation_seq"] >= row["latest_conversation_seq"]
            ):
                row["unread_count"] = row["mention_count"] = 0
    elif kind in ("recall", "delete_message"):
        if (
            doc["target_counts_unread"]
            and doc["target_sender_id"] != doc["user_id"]
            and doc["target_conversation_seq"] > row["read_conversation_seq"]
        ):
            row["unread_count"] = max(0, row["unread_count"] - 1)
    elif kind == "join":
        row["membership"] = "active"
    elif kind == "leave":
        row["membership"] = doc.get("reason", "left")
    elif kind in ("pin", "unpin"):
        row["pinned"] = kind == "pin"
    elif kind in ("archive", "unarchive"):
        row["archived"] = kind == "archive"
    elif kind in ("mute", "unmute"):
        row["muted"] = kind == "mute"
    row["projection_mailbox_seq"] = doc["mailbox_seq"]


@app.agent(source)
async def project(stream: Any) -> None:
    async for key, value in stream.items():
        doc = orjson.loads(value)
        kind = doc.get("type")
        if kind == "watermark":
            continue
        if kind not in ENTRY_TYPES:
            await output.send(key=key, value=value)  # a probe: forwarded
            continue
        table_key = f"{doc['user_id']}/{doc['conversation_id']}"
        row = rows.get(table_key)
        if row is None:
            row = new_row(doc)
        update(row, doc)
        rows[table_key] = row  # faust's json codec, like any typical table of records
        encoded = orjson.dumps(row)
        frame = b'{"type":"SESSION_DELTA","user_id":%d,"projection_mailbox_seq":%d,"conversations":[%s]}' % (
            doc["user_id"],
            doc["mailbox_seq"],
            encoded,
        )
        await output.send(key=key, value=frame)


if __name__ == "__main__":
    app.main()
