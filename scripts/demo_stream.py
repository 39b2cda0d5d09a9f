#!/usr/bin/env python3
"""Write a small, valid mailbox-tail stream (JSON lines) for `make run`'s demo.

    demo_stream.py OUT.jsonl [--users 6] [--messages 60] [--lanes 1] [--seed 7]

Six users share one group chat and a few direct chats; messages fan out to every member (sender
included), with some mentions, reads, a recall, a pin, a mute and an archive. mailbox_seq is
globally increasing; after each fan-out batch every lane writes its in-band watermark marker
(docs/contract.md §2), so nothing is left pending. Standard library only; deterministic per --seed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import uuid
from typing import Any

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def conv_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"session-projector/demo/{name}"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--messages", type=int, default=60)
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    users = list(range(1001, 1001 + args.users))
    group = conv_id("group")
    dms = {conv_id(f"dm-{a}-{b}"): [a, b] for a, b in itertools.pairwise(users)}
    members = {group: users, **dms}
    conv_seq = dict.fromkeys(members, 0)
    lines: list[dict[str, Any]] = []
    mailbox_seq = 0
    lane_high = [0] * args.lanes
    ts = T0_MS

    def entry(kind: str, user: int, conv: str, **fields: Any) -> None:
        nonlocal mailbox_seq
        mailbox_seq += 1
        lane = user % args.lanes
        lane_high[lane] = mailbox_seq
        lines.append(
            {
                "type": kind,
                "mailbox_seq": mailbox_seq,
                "lane": lane,
                "ts": ts,
                "event_id": f"evt-{mailbox_seq}",
                "user_id": user,
                "conversation_id": conv,
                **fields,
            }
        )

    def markers() -> None:
        for lane, high in enumerate(lane_high):
            lines.append({"type": "watermark", "lane": lane, "watermark": high, "ts": ts})

    for conv, who in members.items():
        for user in who:
            entry(
                "join", user, conv, joined_at_conversation_seq=0, role="owner" if user == who[0] else "member"
            )
    markers()

    for i in range(args.messages):
        ts += rng.randint(200, 1500)
        conv = group if i % 3 else rng.choice(list(dms))
        conv_seq[conv] += 1
        seq = conv_seq[conv]
        sender = rng.choice(members[conv])
        mentioned = rng.choice(members[conv]) if i % 7 == 0 else None
        activity = f"{ts:016x}{rng.getrandbits(64):016x}"
        for user in members[conv]:
            entry(
                "message",
                user,
                conv,
                conversation_seq=seq,
                message_id=f"m-{conv[:8]}-{seq}",
                activity_id=activity,
                sender_id=sender,
                created_at=ts,
                counts_unread=True,
                mention=user == mentioned and user != sender,
            )
        if i % 5 == 4:  # somebody catches up
            reader = rng.choice(members[conv])
            entry("read", reader, conv, read_conversation_seq=seq)
        if i == args.messages // 2:  # the sender takes the message back
            for user in members[conv]:
                entry(
                    "recall",
                    user,
                    conv,
                    target_conversation_seq=seq,
                    target_sender_id=sender,
                    target_counts_unread=True,
                    target_mention=user == mentioned,
                )
        markers()

    ts += 1000
    entry("pin", users[0], group, pin_rank=1)
    entry("mute", users[1], group)
    entry("archive", users[2], next(iter(dms)))
    markers()

    with open(args.out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(f"{args.out}: {len(lines)} lines, {args.users} users, {len(members)} conversations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
