"""Outbound records: a batch's dead letters and member notices, owed with the partition until
sent, at least once; the next persist sends them first (docs/decisions/0010-outbound-events-owed.md)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from app.domain.entries import MAX_RECORD_BYTES
from app.domain.notices import MemberNotice
from app.worker.mirror import MirrorPump
from app.worker.ports import Outbox, RawRecord
from app.worker.ratelog import RateLimitedLog
from app.worker.state import PartitionState, WorkerStats

log = logging.getLogger("projector.worker")


class OutboundRecords:
    """Owes, and sends, what applied batches produced for the dead-letter topic and the clients."""

    def __init__(
        self,
        outbox: Outbox,
        stats: WorkerStats,
        mirror: Callable[[], MirrorPump | None],
        dead_letter_log: RateLimitedLog,
    ) -> None:
        self.outbox = outbox
        self.stats = stats
        self._mirror = mirror
        self.dead_letter_log = dead_letter_log

    async def send(
        self,
        state: PartitionState,
        records: Sequence[RawRecord],
        letters: Sequence[tuple[int, Any]],
        notices: Sequence[MemberNotice],
    ) -> None:
        """Owe a batch's events, then try to send all owed (a send that raises: counted, still owed)."""
        if letters:
            state.owed_dead_letters += self._dead_letters(records, letters)
        if notices:
            mirror = self._mirror()
            # Member changes staged before a notice are written first (a failed round: sent anyway).
            if mirror is not None and not await mirror.drain():
                self.stats.notices_ahead_of_roster += len(notices)
            state.owed_notices += [(str(n.user_id).encode(), orjson.dumps(n.frame())) for n in notices]
        try:
            await self.send_owed(state)
        except Exception as exc:
            self.stats.outbound_send_failures += 1
            log.warning(
                "partition %d: sending %d dead letters and %d member notices failed (%s: %s); "
                "sent again before the partition's next persist",
                state.partition,
                len(state.owed_dead_letters),
                len(state.owed_notices),
                type(exc).__name__,
                exc,
            )

    async def send_owed(self, state: PartitionState) -> None:
        """Send what the partition's applied batches owe; raises while it cannot (a crash before
        a persist re-reads the entries and sends again; a duplicate entry sends none)."""
        if state.owed_dead_letters:
            await self.outbox.dead_letters(state.owed_dead_letters)
            state.owed_dead_letters = []
        if state.owed_notices:
            await self.outbox.notices(state.owed_notices)
            self.stats.notices += len(state.owed_notices)
            state.owed_notices = []

    def _dead_letters(
        self, records: Sequence[RawRecord], letters: Sequence[tuple[int, Any]]
    ) -> list[tuple[bytes | None, bytes]]:
        kinds = self.stats.dead_letter_kinds
        out: list[tuple[bytes | None, bytes]] = []
        for index, letter in letters:
            record = records[index]
            kinds[letter.kind] = kinds.get(letter.kind, 0) + 1
            out.append((record.key, dead_letter_envelope(record, letter.reason)))
            # The kind, not the reason (a reason may quote user data); capped per second.
            self.dead_letter_log.log(
                "dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset, letter.kind
            )
        return out


def dead_letter_envelope(record: RawRecord, reason: str) -> bytes:
    """What goes to the dead-letter topic: why, and exactly where the record came from (a value
    over MAX_RECORD_BYTES is cut: topic, partition and offset find the whole record)."""
    raw = record.value or b""
    cut = len(raw) > MAX_RECORD_BYTES
    if cut:
        raw = raw[:MAX_RECORD_BYTES]
    try:
        value: str = raw.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        value = base64.b64encode(raw).decode("ascii")
        encoding = "base64"
    envelope: dict[str, object] = {
        "reason": reason,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key[:1024].decode("utf-8", "replace") if record.key is not None else None,
        "value": value,
        "value_encoding": encoding,
    }
    if cut:
        envelope["value_truncated"] = True
        envelope["value_bytes"] = len(record.value)
    return orjson.dumps(envelope)
