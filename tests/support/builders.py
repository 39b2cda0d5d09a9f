"""Small builders for hand-written mailbox streams (unit tests of the core)."""

from __future__ import annotations

from typing import Any

import orjson

CONV_A = "0a0a0a0a-0000-4000-8000-00000000000a"
CONV_B = "0b0b0b0b-0000-4000-8000-00000000000b"


class Stream:
    """Builds one mailbox stream: each call appends an entry with the next mailbox_seq."""

    def __init__(self, lanes: int = 1, ts_step: int = 10) -> None:
        self.lanes = lanes
        self.ts_step = ts_step
        self.seq = 0
        self.ts = 1_000_000
        self.lines: list[bytes] = []

    def entry(self, kind: str, user: int, conv: str = CONV_A, lane: int = 0, **fields: Any) -> int:
        self.seq += 1
        self.ts += self.ts_step
        record = {
            "type": kind,
            "mailbox_seq": self.seq,
            "lane": lane,
            "ts": self.ts,
            "event_id": f"ev-{self.seq}",
            "user_id": user,
            "conversation_id": conv,
            **fields,
        }
        self.lines.append(orjson.dumps(record))
        return self.seq

    def message(
        self,
        user: int,
        seq: int,
        sender: int = 99,
        conv: str = CONV_A,
        counts: bool = True,
        mention: bool = False,
        lane: int = 0,
    ) -> int:
        return self.entry(
            "message",
            user,
            conv,
            lane,
            conversation_seq=seq,
            message_id=f"m-{conv[:4]}-{seq}",
            activity_id=f"{seq:032x}",
            sender_id=sender,
            created_at=self.ts,
            counts_unread=counts,
            mention=mention,
        )

    def recall(self, user: int, seq: int, sender: int = 99, conv: str = CONV_A, kind: str = "recall") -> int:
        return self.entry(
            kind,
            user,
            conv,
            target_conversation_seq=seq,
            target_sender_id=sender,
            target_counts_unread=True,
            target_mention=False,
        )

    def read(self, user: int, seq: int, conv: str = CONV_A) -> int:
        return self.entry("read", user, conv, read_conversation_seq=seq)

    def marker(self, lane: int, watermark: int | None = None) -> None:
        self.ts += self.ts_step
        record = {"type": "watermark", "lane": lane, "watermark": watermark or self.seq, "ts": self.ts}
        self.lines.append(orjson.dumps(record))

    def close(self) -> list[bytes]:
        """Every lane reports the highest seq: everything becomes applicable."""
        for lane in range(self.lanes):
            self.marker(lane, self.seq)
        return self.lines


def rows_by_key(projections: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(row["user_id"], row["conversation_id"]): row for row in projections}
