"""`projector simulate --member-notices` (docs/contract.md §9, issue 16 part 2): every join and
leave in a group is followed by a system message of kind 24/27 to the group's members; the
records are valid and the kinds change none of replay's outputs."""

from __future__ import annotations

import dataclasses

import orjson

from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions, run_replay
from app.simulate import SimParams, Workload
from app.stores.memory_messages import InMemoryMessageStore


def test_simulate_follows_joins_and_leaves_with_notices_to_the_members() -> None:
    params = SimParams(users=30, conversations=8, group_size=20, messages=600, lanes=2, seed=3)
    plain = [r for b in Workload(params).batches() for r in (*b.entries, *b.markers)]
    assert not any("notification" in r for r in plain)
    batches = list(Workload(dataclasses.replace(params, member_notices=True)).batches())
    stream = [r for b in batches for r in (*b.entries, *b.markers)]
    entries = sorted((r for r in stream if r["type"] != "watermark"), key=lambda r: r["mailbox_seq"])
    members: dict[str, set[int]] = {}
    last_change: tuple[str, int, int] | None = None  # (conversation, kind it calls for, user)
    recipients: dict[tuple[str, int], set[int]] = {}
    expected: dict[tuple[str, int], set[int]] = {}
    changes = 0
    for entry in entries:
        conv, user = entry["conversation_id"], entry["user_id"]
        if entry["type"] == "join":
            members.setdefault(conv, set()).add(user)
            last_change = (conv, 24, user)
            changes += entry["event_id"].startswith("sim-3-join")
        elif entry["type"] == "leave":
            members[conv].discard(user)
            last_change = (conv, 27, user)
            changes += 1
        elif "notification" in entry:
            # Right after the change, to the members as they are after it, sent by its member.
            assert last_change is not None and last_change[:2] == (conv, entry["notification"])
            assert entry["sender_id"] == last_change[2] and entry["counts_unread"] is False
            key = (conv, entry["conversation_seq"])
            expected.setdefault(key, set(members[conv]))
            recipients.setdefault(key, set()).add(user)
    assert changes == len(recipients) == sum(b.notices for b in batches) > 5
    assert recipients == expected  # every active member, the one who joined included
    # Every record valid; the replay applies all of them, and the kinds change none of its outputs.
    lines = [orjson.dumps(r) for r in stream]
    processor = PartitionProcessor(ProjectorConfig(), InMemoryMessageStore(), lanes=2)
    step = processor.on_records(lines, None)
    assert not step.dead_letters and processor.pending_count == 0
    assert len(step.notices) == sum(len(u) for u in recipients.values())
    assert {n.kind for n in step.notices} == {24, 27}
    stripped = [orjson.dumps({k: v for k, v in r.items() if k != "notification"}) for r in stream]
    a, b = run_replay(lines, ReplayOptions(lanes=2)), run_replay(stripped, ReplayOptions(lanes=2))
    assert orjson.dumps(a.frames) == orjson.dumps(b.frames) and a.stats == b.stats
