"""Baseline for projection writes: a projector without compaction.

It is what "keep the list as a materialized view" costs when every entry writes its row at once:
decode each line with the stdlib json module, update the (user, conversation) state, then
"write" the row — serialize it with orjson into an in-memory store, one write per applied entry.
The write count is what the compactor's `projection_writes` is compared against.

What it models, deliberately minimal:
* `message` (unread, mention, head), `read` (read_seq, recount-free: zero when caught up,
  otherwise unchanged — it is a baseline for write volume, not for unread correctness); any other
  type just marks the row and writes it.
* exactly once per user mailbox_seq (a seq at or below the user's highest applied is dropped);
* watermark markers are skipped: it applies entries in file order. The bench stream is written in
  mailbox_seq order and every marker eventually covers everything, so gating would change when
  entries apply, not which ones or how many writes happen.

Prints a JSON object of counts on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import orjson


def run(path: Path) -> dict[str, object]:
    store: dict[tuple[int, str], bytes] = {}
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    writes_per_row: dict[tuple[int, str], int] = {}
    user_seq: dict[int, int] = {}
    entries = applied = duplicates = markers = writes = 0
    with path.open("rb") as fp:
        for line in fp:
            if not line.strip():
                continue
            entry = json.loads(line)
            kind = entry["type"]
            if kind == "watermark":
                markers += 1
                continue
            entries += 1
            user_id = entry["user_id"]
            seq = entry["mailbox_seq"]
            if seq <= user_seq.get(user_id, 0):
                duplicates += 1
                continue
            user_seq[user_id] = seq
            applied += 1
            key = (user_id, entry["conversation_id"])
            row = rows.get(key)
            if row is None:
                row = rows[key] = {
                    "user_id": user_id,
                    "conversation_id": entry["conversation_id"],
                    "unread_count": 0,
                    "mention_count": 0,
                    "read_conversation_seq": 0,
                    "latest_conversation_seq": None,
                    "last_message_id": None,
                    "last_activity_id": None,
                }
            if kind == "message":
                conversation_seq = entry["conversation_seq"]
                if (
                    entry["sender_id"] != user_id
                    and entry["counts_unread"]
                    and conversation_seq > row["read_conversation_seq"]
                ):
                    row["unread_count"] += 1
                    if entry["mention"]:
                        row["mention_count"] += 1
                latest = row["latest_conversation_seq"]
                if latest is None or conversation_seq > latest:
                    row["latest_conversation_seq"] = conversation_seq
                    row["last_message_id"] = entry["message_id"]
                    row["last_activity_id"] = entry["activity_id"]
            elif kind == "read":
                read = max(row["read_conversation_seq"], entry["read_conversation_seq"])
                row["read_conversation_seq"] = read
                if row["latest_conversation_seq"] is not None and read >= row["latest_conversation_seq"]:
                    row["unread_count"] = 0
                    row["mention_count"] = 0
            row["projection_mailbox_seq"] = seq
            # The write: the whole row, serialized, replacing the stored one.
            store[key] = orjson.dumps(row)
            writes += 1
            writes_per_row[key] = writes_per_row.get(key, 0) + 1
    return {
        "entries": entries,
        "markers": markers,
        "applied": applied,
        "duplicates": duplicates,
        "rows": len(store),
        "projection_writes": writes,
        "max_writes_per_user_conversation": max(writes_per_row.values(), default=0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.input)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
