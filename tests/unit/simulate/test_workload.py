"""The simulator's workload generator, without servers: the stream it makes is a valid mailbox
stream (docs/contract.md §2) whose markers are right per lane, whose messages reach every member, and that
`projector replay` digests with no dead letter and nothing pending."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from app.domain.entries import DeadLetter, decode_record
from app.replay import Replayer, ReplayOptions
from app.simulate import Batch, Mix, SimParams, Workload


def records(batches: list[Batch]) -> Iterator[dict[str, Any]]:
    """The stream in produce order as the driver emits it with one partition."""
    for batch in batches:
        yield from batch.entries
        yield from batch.markers


def run(params: SimParams) -> list[Batch]:
    return list(Workload(params).batches())


SMALL = SimParams(users=40, conversations=12, group_size=30, messages=400, lanes=3, seed=5)


@pytest.fixture(scope="module")
def small() -> list[Batch]:
    return run(SMALL)


def test_deterministic_per_seed() -> None:
    a = list(records(run(SMALL)))
    assert a == list(records(run(SMALL)))
    other = SimParams(users=40, conversations=12, group_size=30, messages=400, lanes=3, seed=6)
    assert a != list(records(run(other)))


def test_exactly_the_requested_messages(small: list[Batch]) -> None:
    assert sum(len(b.messages) for b in small) == 400
    entries = [r for r in records(small) if r["type"] == "message"]
    assert len({(e["conversation_id"], e["conversation_seq"]) for e in entries}) == 400


def test_every_record_decodes(small: list[Batch]) -> None:
    for record in records(small):
        decoded = decode_record(orjson.dumps(record), SMALL.lanes)
        assert not isinstance(decoded, DeadLetter), (decoded.reason, record)


def test_mailbox_seq_is_one_increasing_counter(small: list[Batch]) -> None:
    entries = [r for r in records(small) if r["type"] != "watermark"]
    seqs = [e["mailbox_seq"] for e in entries]
    assert sorted(seqs) == list(range(1, len(entries) + 1))  # unique, no gaps
    per_lane: dict[int, list[int]] = defaultdict(list)
    per_user: dict[int, list[int]] = defaultdict(list)
    for e in entries:
        per_lane[e["lane"]].append(e["mailbox_seq"])
        per_user[e["user_id"]].append(e["mailbox_seq"])
        assert e["lane"] == e["user_id"] % SMALL.lanes  # a user's entries stay in one lane
    for seq_list in [*per_lane.values(), *per_user.values()]:
        assert seq_list == sorted(seq_list)


def test_lanes_interleave(small: list[Batch]) -> None:
    """Several lanes are independent writers: the topic does not see one global order."""
    seqs = [r["mailbox_seq"] for r in records(small) if r["type"] != "watermark"]
    assert seqs != sorted(seqs)


def test_markers_are_right_per_lane(small: list[Batch]) -> None:
    """A marker (L, W) comes after every entry of lane L with mailbox_seq <= W."""
    seen_max = 0
    last_marker: dict[int, int] = {}
    markers = 0
    for record in records(small):
        if record["type"] == "watermark":
            lane, w = record["lane"], record["watermark"]
            assert w >= last_marker.get(lane, 0)
            last_marker[lane] = w
            markers += 1
            continue
        seen_max = max(seen_max, record["mailbox_seq"])
        covered = last_marker.get(record["lane"], 0)
        assert record["mailbox_seq"] > covered, f"entry {record['mailbox_seq']} after marker {covered}"
    # At the end every lane has reported the last seq: nothing can stay pending.
    assert last_marker == dict.fromkeys(range(SMALL.lanes), seen_max)
    # Lanes lag sometimes (the gate really holds entries back) but report often.
    batches_with_messages = sum(1 for b in small if b.messages)
    assert batches_with_messages < markers < batches_with_messages * SMALL.lanes


def test_fan_out_reaches_every_active_member(small: list[Batch]) -> None:
    entries = sorted((r for r in records(small) if r["type"] != "watermark"), key=lambda r: r["mailbox_seq"])
    members: dict[str, set[int]] = defaultdict(set)
    recipients: dict[tuple[str, int], set[int]] = defaultdict(set)
    members_then: dict[tuple[str, int], set[int]] = {}
    stored = {(m.conversation_id, m.conversation_seq): m for b in small for m in b.messages}
    for e in entries:
        conversation = e["conversation_id"]
        if e["type"] == "join":
            members[conversation].add(e["user_id"])
        elif e["type"] == "leave":
            members[conversation].discard(e["user_id"])
        elif e["type"] == "message":
            key = (conversation, e["conversation_seq"])
            recipients[key].add(e["user_id"])
            members_then.setdefault(key, set(members[conversation]))
            message = stored[key]
            assert e["sender_id"] == message.sender_id and e["message_id"] == message.message_id
            assert e["mention"] == (e["user_id"] in message.mentions)
            assert e["counts_unread"] == message.counts_unread
    assert set(recipients) == set(stored)
    for key, users in recipients.items():
        assert users == members_then[key], key
        assert stored[key].sender_id in users  # the sender's own list gets it too
        assert stored[key].mentions <= users - {stored[key].sender_id}


def test_conversation_kinds_and_big_groups() -> None:
    workload = Workload(SimParams(users=300, conversations=20, group_size=250, messages=0))
    kinds = [c.kind for c in workload.conversations]
    assert kinds.count("big") == 2 and "direct" in kinds and "group" in kinds
    assert all(len(c.members) == 250 for c in workload.conversations if c.kind == "big")
    assert all(len(c.members) == 2 for c in workload.conversations if c.kind == "direct")
    assert any(u >= 2**63 for u in workload.users)  # u64 ids, all of the range


def test_workload_covers_every_entry_type() -> None:
    busy = Mix(recall=0.3, toggle=0.5, clear=0.1, churn=0.2, dirty=0.1, mention_all=0.05)
    batches = run(SimParams(users=30, conversations=10, group_size=20, messages=600, seed=3, mix=busy))
    kinds = {r["type"] for r in records(batches)}
    assert kinds >= {
        "message", "read", "recall", "delete_message", "join", "leave", "pin", "unpin", "archive",
        "unarchive", "mute", "unmute", "clear_history", "delete_conversation", "mailbox_dirty",
        "watermark",
    }  # fmt: skip
    reads = [r for r in records(batches) if r["type"] == "read"]
    latest: dict[str, int] = {}
    below = 0
    for r in sorted(records(batches), key=lambda r: r.get("mailbox_seq", 0)):
        if r["type"] == "message":
            latest[r["conversation_id"]] = max(latest.get(r["conversation_id"], 0), r["conversation_seq"])
        elif r["type"] == "read":
            below += r["read_conversation_seq"] < latest.get(r["conversation_id"], 0)
    assert 0 < below < len(reads)  # reads are often, not always, below latest


def test_bursts_deliver_out_of_order() -> None:
    """docs/contract.md §3.6: a message after a newer one, and a recall before its message, both occur."""
    batches = run(
        SimParams(users=12, conversations=3, group_size=8, messages=300, seed=9, mix=Mix(burst=1.0))
    )
    message_after_newer = recall_first = False
    got: dict[tuple[int, str], set[int]] = defaultdict(set)
    for r in sorted(records(batches), key=lambda r: r.get("mailbox_seq", 0)):
        key = (r.get("user_id", 0), r.get("conversation_id", ""))
        if r["type"] == "message":
            message_after_newer |= any(s > r["conversation_seq"] for s in got[key])
            got[key].add(r["conversation_seq"])
        elif r["type"] in ("recall", "delete_message"):
            recall_first |= r["target_conversation_seq"] not in got[key]
    assert message_after_newer and recall_first


def test_store_writes_precede_the_entries_that_need_them(small: list[Batch]) -> None:
    stored: set[tuple[str, int]] = set()
    recalled: set[tuple[str, int]] = set()
    for batch in small:
        stored |= {(m.conversation_id, m.conversation_seq) for m in batch.messages}
        recalled |= {(c, s) for c, s, _ in batch.recalls}
        for e in batch.entries:
            if e["type"] == "message":
                assert (e["conversation_id"], e["conversation_seq"]) in stored
            elif e["type"] in ("recall", "delete_message"):
                assert (e["conversation_id"], e["target_conversation_seq"]) in recalled
        heads = {h.conversation_id: h.latest_conversation_seq for h in batch.heads}
        expected: dict[str, int] = {}
        for m in batch.messages:
            expected[m.conversation_id] = max(expected.get(m.conversation_id, 0), m.conversation_seq)
        assert heads == expected


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_replay_of_the_stream_is_clean(lanes: int) -> None:
    params = SimParams(users=50, conversations=15, group_size=40, messages=500, lanes=lanes, seed=lanes)
    batches = run(params)
    replayer = Replayer(ReplayOptions(lanes=lanes), lambda frame: None)
    replayer.feed_many(orjson.dumps(r) for r in records(batches))
    stats = replayer.finish().stats
    entries = sum(len(b.entries) for b in batches)
    assert stats["dead_letters"] == 0
    assert stats["pending"] == 0
    assert stats["duplicates"] == 0
    assert stats["entries"] == stats["applied"] == entries
    # What the simulator writes to the MessageStore agrees with what its entries tell replay.
    for batch in batches:
        for m in batch.messages:
            known = replayer.store.get(m.conversation_id, m.conversation_seq)
            assert known is not None
            assert (known.message_id, known.sender_id, known.counts_unread, known.mentions) == (
                m.message_id,
                m.sender_id,
                m.counts_unread,
                m.mentions,
            )
    recalls = {(c, s) for b in batches for c, s, _ in b.recalls}
    for batch in batches:
        for m in batch.messages:
            known = replayer.store.get(m.conversation_id, m.conversation_seq)
            assert known is not None and known.recalled == (
                (m.conversation_id, m.conversation_seq) in recalls
            )


def test_noise_is_dead_lettered_or_dropped_as_duplicates_and_changes_nothing_else() -> None:
    """--bad-records / --duplicates: every bad record is a dead letter, every retried entry a
    duplicate, and the projection is the same stream's without them."""
    noisy = SimParams(
        users=30, conversations=10, group_size=20, messages=400, lanes=2, seed=9, mix=Mix(bad=0.1, retry=0.1)
    )
    noisy_batches = run(noisy)
    bad = sum(
        1 for b in noisy_batches for _, value in b.noise if decode_record(value, 2).__class__ is DeadLetter
    )
    retried = sum(len(b.noise) for b in noisy_batches) - bad
    assert bad > 10 and retried > 10

    def replay(batches: list[Batch], noise: bool) -> Any:
        replayer = Replayer(ReplayOptions(lanes=2), lambda frame: None)
        lines = []
        for batch in batches:
            lines += [orjson.dumps(e) for e in batch.entries] + [v for _, v in batch.noise if noise]
            lines += [orjson.dumps(m) for m in batch.markers]
        replayer.feed_many(lines)
        return replayer.finish()

    got, want = replay(noisy_batches, noise=True), replay(noisy_batches, noise=False)
    assert got.stats["dead_letters"] == bad
    assert got.stats["duplicates"] == retried
    assert got.projections == want.projections
    assert got.badges == want.badges


def test_unbounded_workload_closes_on_demand() -> None:
    workload = Workload(SimParams(users=10, conversations=4, group_size=5, messages=None, lanes=2))
    batches = workload.batches()
    taken = [next(batches) for _ in range(50)]
    closing = workload.closing_batch()
    last = workload.mailbox_seq
    if closing is not None:
        assert all(m["watermark"] == last for m in closing.markers)
        taken.append(closing)
    final = {}
    for r in records(taken):
        if r["type"] == "watermark":
            final[r["lane"]] = r["watermark"]
    assert final == {0: last, 1: last}
    assert workload.closing_batch() is None  # nothing new since: no more markers


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="--users"):
        SimParams(users=1)
    with pytest.raises(ValueError, match="--lanes"):
        SimParams(lanes=0)
