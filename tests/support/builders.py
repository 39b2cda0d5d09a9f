"""The builder of hand-written mailbox streams for example tests (unit and integration).

One entry per call, mailbox_seq 1, 2, 3, ...; `close()` adds the markers that make everything
applicable. (The property tests draw whole streams from tests/support/strategies.py instead.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

CONV_A = "0a0a0a0a-0000-4000-8000-00000000000a"
CONV_B = "0b0b0b0b-0000-4000-8000-00000000000b"


class StreamBuilder:
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
        notification: int | None = None,
        **optional: Any,
    ) -> int:
        # `notification`: a member notification's kind (docs/contract.md §9); None leaves it out.
        # `optional`: other optional fields as they go on the wire (§10's urgent, member_count).
        kind: dict[str, Any] = {} if notification is None else {"notification": notification}
        kind.update(optional)
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
            **kind,
        )

    def recall(
        self,
        user: int,
        seq: int,
        sender: int = 99,
        conv: str = CONV_A,
        kind: str = "recall",
        mention: bool = False,
    ) -> int:
        return self.entry(
            kind,
            user,
            conv,
            target_conversation_seq=seq,
            target_sender_id=sender,
            target_counts_unread=True,
            target_mention=mention,
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

    def close_part(self) -> list[bytes]:
        """`close()`, then start the next part of the same stream (seqs go on): the parts are
        fed one after the other (a batch, a crash, a restart between them)."""
        part = self.close()
        self.lines = []
        return part


def rows_by_key(projections: Iterable[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(row["user_id"], row["conversation_id"]): row for row in projections}


def member_stats_stream(user: int) -> StreamBuilder:
    """`user`'s mailbox in one conversation (CONV_A) where their member statistics end at 1
    record and 1 mention: they sent 1, 2 and 6 and were mentioned in 3 and (by @all) in 4; 2 and 4
    are recalled and 6 deleted for everyone; the recall of 5 (not theirs, not mentioning them)
    does not concern them."""
    s = StreamBuilder()
    s.message(user, 1, sender=user)  # own message
    s.message(user, 2, sender=user)
    s.message(user, 3, sender=99, mention=True)  # @user
    s.message(user, 4, sender=98, mention=True)  # @all reaches every member as `mention`
    s.message(user, 5, sender=99)  # neither
    s.message(user, 6, sender=user)
    s.recall(user, 2, sender=user)  # their message recalled
    s.recall(user, 4, sender=98, mention=True)  # the @all recalled
    s.recall(user, 6, sender=user, kind="delete_message")  # deleted for everyone
    s.recall(user, 5, sender=99)  # not theirs, not mentioning them: ignored
    return s
