"""Generate the J-1 acceptance stream (seed 000 §9) as mailbox-tail JSON lines.

J-1: a 1,000-member group, 1,000 consecutive messages at 20 msg/s (50 s span, 5 s window):
every member's persistent projection writes for the conversation must stay <= ceil(50/5)+1 = 11
and the compression ratio >= 1000/11 >= 90.

Shape of the stream (defaults; every number is an option so tests can make small versions):

* one conversation, members with user ids 1..members;
* message i (1-based) has ts = t0 + (i-1) * 1000/rate ms, conversation_seq i, a sender picked
  among the members, and is fanned out to every member (the sender included: the sender's own
  entry never counts as unread) as one `message` entry each, so members * messages entries;
* every 100th message is an @all (mention true for every member but the sender), every 10th of
  the others mentions one member (the one after the sender);
* mailbox_seq is globally increasing (1, 2, ...); an entry's lane is user_id % lanes (the mailbox
  write lane that owns the user);
* after each message's fan-out (a batch) every lane writes its in-band watermark marker
  {"type":"watermark","lane":L,"watermark":W,"ts":T} with W = the highest mailbox_seq that lane
  has written so far, so every entry of lane L with mailbox_seq <= W precedes the marker
  (docs/contract.md §2). With lanes > 1 the min over lanes trails the batch's last seq a little, so the
  watermark gate really holds entries back between batches, as in production;
  `--markers-per-batch K` writes markers K times per batch (evenly through the fan-out);
* at the end every lane reports the last mailbox_seq (the writers are caught up), so the whole
  stream is below the watermark and nothing is left pending.

Usage: python bench/gen_j1.py --out bench/out/j1.jsonl [--meta bench/out/j1.meta.json]
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

CONVERSATION_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "session-projector/bench/j1-group"))
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Params:
    members: int = 1000
    messages: int = 1000
    rate: float = 20.0  # messages per second
    lanes: int = 4
    markers_per_batch: int = 1
    t0_ms: int = T0_MS
    all_mention_every: int = 100
    mention_every: int = 10

    @property
    def step_ms(self) -> int:
        return round(1000 / self.rate)


def sender_of(params: Params, message: int) -> int:
    return (message * 7919) % params.members + 1


def mentioned(params: Params, message: int, user_id: int, sender: int) -> bool:
    if user_id == sender:
        return False
    if params.all_mention_every and message % params.all_mention_every == 0:
        return True
    if params.mention_every and message % params.mention_every == 0:
        return user_id == sender % params.members + 1  # the member after the sender
    return False


def generate(params: Params) -> Iterator[dict[str, object]]:
    """The stream, entries and markers, in the order they are written."""
    if params.members < 1 or params.messages < 1 or params.lanes < 1:
        raise ValueError("members, messages and lanes must be >= 1")
    if params.markers_per_batch < 1:
        raise ValueError("markers_per_batch must be >= 1")
    seq = 0
    lane_high = [0] * params.lanes  # highest mailbox_seq each lane has written
    # Positions (number of members written) after which the batch's markers go out.
    marker_at = {
        params.members * (k + 1) // params.markers_per_batch for k in range(params.markers_per_batch)
    }
    for message in range(1, params.messages + 1):
        ts = params.t0_ms + (message - 1) * params.step_ms
        sender = sender_of(params, message)
        message_id = f"msg-{message}"
        event_id = f"send-{message}"
        activity_id = f"{ts:012x}{message:020x}"
        for written, user_id in enumerate(range(1, params.members + 1), start=1):
            seq += 1
            lane = user_id % params.lanes
            lane_high[lane] = seq
            yield {
                "type": "message",
                "mailbox_seq": seq,
                "lane": lane,
                "ts": ts,
                "event_id": event_id,
                "user_id": user_id,
                "conversation_id": CONVERSATION_ID,
                "conversation_seq": message,
                "message_id": message_id,
                "activity_id": activity_id,
                "sender_id": sender,
                "created_at": ts,
                "counts_unread": True,
                "mention": mentioned(params, message, user_id, sender),
            }
            if written in marker_at:
                for lane_id, high in enumerate(lane_high):
                    if high:
                        yield {"type": "watermark", "lane": lane_id, "watermark": high, "ts": ts}
    # The writers are idle and caught up: every lane closes at the last seq, so nothing stays
    # above the watermark at the end of the input (a lane may report any W it will not write
    # below again).
    last_ts = params.t0_ms + (params.messages - 1) * params.step_ms
    for lane_id in range(params.lanes):
        yield {"type": "watermark", "lane": lane_id, "watermark": seq, "ts": last_ts}


@dataclass(frozen=True)
class Written:
    entries: int
    markers: int
    bytes: int


def write(params: Params, out: BinaryIO) -> Written:
    entries = markers = size = 0
    dumps = orjson.dumps
    buffer: list[bytes] = []
    for record in generate(params):
        if record["type"] == "watermark":
            markers += 1
        else:
            entries += 1
        buffer.append(dumps(record))
        if len(buffer) >= 8192:
            chunk = b"\n".join(buffer) + b"\n"
            out.write(chunk)
            size += len(chunk)
            buffer.clear()
    if buffer:
        chunk = b"\n".join(buffer) + b"\n"
        out.write(chunk)
        size += len(chunk)
    return Written(entries=entries, markers=markers, bytes=size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Params()
    parser.add_argument("--members", type=int, default=defaults.members)
    parser.add_argument("--messages", type=int, default=defaults.messages)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="messages per second")
    parser.add_argument("--lanes", type=int, default=defaults.lanes)
    parser.add_argument("--markers-per-batch", type=int, default=defaults.markers_per_batch)
    parser.add_argument("--out", type=Path, help="output file (default: stdout)")
    parser.add_argument("--meta", type=Path, help="also write the parameters and counts here")
    args = parser.parse_args(argv)
    params = Params(
        members=args.members,
        messages=args.messages,
        rate=args.rate,
        lanes=args.lanes,
        markers_per_batch=args.markers_per_batch,
    )
    try:
        if args.out is None:
            written = write(params, sys.stdout.buffer)
        else:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("wb") as fp:
                written = write(params, fp)
    except ValueError as err:
        parser.error(str(err))
    span_ms = (params.messages - 1) * params.step_ms
    meta = {
        "params": asdict(params),
        "conversation_id": CONVERSATION_ID,
        "span_ms": span_ms,
        **asdict(written),
    }
    if args.meta is not None:
        args.meta.parent.mkdir(parents=True, exist_ok=True)
        args.meta.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2) + b"\n")
    print(
        f"gen_j1: {written.entries:,} entries + {written.markers:,} markers, "
        f"{written.bytes / 2**20:.1f} MiB, span {span_ms / 1000:g} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
