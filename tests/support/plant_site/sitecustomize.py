"""Deliberately broken persists, planted into a worker subprocess to measure the crash test's
power (issue 31: a crash test that does not catch a planted loss proves nothing).

Put this directory first on the worker's PYTHONPATH and name the plant in
SESSION_PROJECTOR_PLANT; Python imports this module at start-up, before the worker's code. Each
plant is a realistic durability bug whose effect shows only when a worker stops, is killed or
hands a partition over (never in a run without faults), so a test catches it only by its faults:

- `range-ahead`: every checkpoint names the next offset RANGE_AHEAD entries past what the
  state holds (a commit of the fetch's end instead of the applied entries): a new owner resumes
  a range too far. (One entry too far, measured at 0 of 1: the core heals a single missed
  message by recounting its row from the MessageStore at the next one.)
- `changelog-gaps`: a persist's append leaves out a quarter of its row records while the local
  store takes them all (the store and its changelog disagree): whoever reads the changelog (a
  standby copy promoted, a lost data dir rebuilt) gets stale rows.
- `waiting-dropped`: a persist leaves out the entries waiting above the watermark although its
  input offset covers them: a new owner never sees them.

Test code only: the product never reads this variable.
"""

from __future__ import annotations

import os
import sys

PLANT = os.environ.get("SESSION_PROJECTOR_PLANT", "")
PLANTS = ("range-ahead", "waiting-dropped", "changelog-gaps")
RANGE_AHEAD = 40


def _plant() -> None:
    from tables.durable.tables import CheckpointedTables

    if PLANT == "range-ahead":
        import msgspec

        put_checkpoint_record = CheckpointedTables.put_checkpoint_record

        def put_checkpoint_record_ahead(
            self: CheckpointedTables, partition: int, blob: bytes, next_offset: int | None = None
        ) -> None:
            # The worker's partition record repeats the next offset (app/worker/core.py): both move.
            record = msgspec.msgpack.decode(blob)
            if isinstance(record.get("next_offset"), int):
                record["next_offset"] += RANGE_AHEAD
            ahead = None if next_offset is None else next_offset + RANGE_AHEAD
            put_checkpoint_record(self, partition, msgspec.msgpack.encode(record), ahead)

        CheckpointedTables.put_checkpoint_record = put_checkpoint_record_ahead  # type: ignore[method-assign]
    elif PLANT == "changelog-gaps":
        import zlib
        from collections.abc import Sequence

        from tables.durable.changelog import Appended
        from tables.durable.kafka import KafkaChangelog
        from tables.durable.records import Kind, WireRecord

        append = KafkaChangelog.append
        row = Kind.ROW.value[0]

        async def append_with_gaps(
            self: KafkaChangelog, partition: int, records: Sequence[WireRecord]
        ) -> Appended:
            kept = [
                r for r in records if not (r.key[0] == row and zlib.crc32(r.key + r.headers[-1][1]) % 4 == 0)
            ]
            # The writer applies all of `records` to its store at the position after these.
            return await append(self, partition, kept)

        KafkaChangelog.append = append_with_gaps  # type: ignore[method-assign]
    elif PLANT == "waiting-dropped":

        def put_pending_dropped(
            self: CheckpointedTables, partition: int, user_id: int, mailbox_seq: int, raw: bytes
        ) -> None:
            return None

        CheckpointedTables.put_pending = put_pending_dropped  # type: ignore[method-assign]
    print(f"[plant] {PLANT} planted in pid {os.getpid()}", file=sys.stderr, flush=True)


if PLANT:
    if PLANT not in PLANTS:
        raise SystemExit(f"SESSION_PROJECTOR_PLANT={PLANT!r}: the plants are {', '.join(PLANTS)}")
    if "worker" in sys.argv:
        _plant()
