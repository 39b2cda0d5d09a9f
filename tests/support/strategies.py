"""Hypothesis strategies for mailbox-tail streams, and a small builder for hand-written streams.

A stream is made in two stages, so that tests can vary one while keeping the other:

1. `scenarios()` simulates a few conversations (members, messages with conversation_seq 1..n,
   reads, recalls, joins/leaves, pins, ...) and *materializes* the per-user mailbox entries
   in a disordered way: fan-out of a message reaches each member at a different time, so a
   user's mailbox is not in conversation_seq order (a message can come after a newer one, after
   a read covering it, after its own recall). Every materialized entry gets the next mailbox_seq
   (one global space, or one space per user), a random lane and an increasing-ish `ts`.
   Membership/flag entries of one (user, conversation) keep their relative order.
2. `deliver()` turns a scenario into input lines: a delivery order that interleaves lanes and lets
   some entries arrive late, correct in-band watermark markers (a lane's marker W is emitted only
   once every entry of that lane with mailbox_seq <= W is out), final markers covering everything
   (or not, leaving entries pending), repeated lines, bad lines and blank lines.

Noise (lanes, ts steps, seq gaps, delivery jitter, bad-line shapes) comes from a seeded
`random.Random`; the structure (who does what) is drawn from hypothesis so that it shrinks.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from tests.property.model import COMMON, OPTIONAL, TYPES, U32, U64

BASE_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms

ORDERED_TYPES = frozenset(
    {
        "join",
        "leave",
        "pin",
        "unpin",
        "archive",
        "unarchive",
        "mute",
        "unmute",
        "clear_history",
        "delete_conversation",
    }
)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def activity_id(created_at: int, conv_index: int, seq: int) -> str:
    # 16 bytes, time-sortable: 6 bytes of ms, 2 of conversation, 8 of conversation_seq.
    return f"{created_at % (1 << 48):012x}{conv_index % (1 << 16):04x}{seq:016x}"


# --------------------------------------------------------------------------- hand-made streams


class Builder:
    """Hand-written streams in the drawn streams' shape: one lane, mailbox_seq 1, 2, 3, ... in
    call order, BASE_TS timestamps, time-sortable activity ids, the entries kept as dicts (the
    model reads them). For the property tests' examples and tests that sit beside drawn streams;
    other example tests use tests/support/builders.StreamBuilder."""

    def __init__(self, lanes: int = 1) -> None:
        self.lanes = lanes
        self.seq = 0
        self.ts = BASE_TS
        self.lines: list[bytes] = []
        self.entries: list[dict[str, Any]] = []

    def add(self, type_: str, user: int, conv: str, *, lane: int = 0, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        self.ts += 10
        e = {
            "type": type_,
            "mailbox_seq": self.seq,
            "lane": lane,
            "ts": self.ts,
            "event_id": f"ev-{self.seq}",
            "user_id": user,
            "conversation_id": conv,
            **fields,
        }
        self.entries.append(e)
        self.lines.append(dumps(e))
        return e

    def message(
        self,
        user: int,
        conv: str,
        seq: int,
        sender: int,
        *,
        counts_unread: bool = True,
        mention: bool = False,
        **kw: Any,
    ) -> dict[str, Any]:
        return self.add(
            "message",
            user,
            conv,
            conversation_seq=seq,
            message_id=f"m{seq}",
            activity_id=activity_id(self.ts, 0, seq),
            sender_id=sender,
            created_at=self.ts,
            counts_unread=counts_unread,
            mention=mention,
            **kw,
        )

    def recall(
        self,
        user: int,
        conv: str,
        seq: int,
        sender: int,
        *,
        counts_unread: bool = True,
        mention: bool = False,
        type_: str = "recall",
    ) -> dict[str, Any]:
        return self.add(
            type_,
            user,
            conv,
            target_conversation_seq=seq,
            target_sender_id=sender,
            target_counts_unread=counts_unread,
            target_mention=mention,
        )

    def read(self, user: int, conv: str, seq: int) -> dict[str, Any]:
        return self.add("read", user, conv, read_conversation_seq=seq)

    def marker(self, lane: int, w: int) -> None:
        self.lines.append(dumps({"type": "watermark", "lane": lane, "watermark": w, "ts": self.ts}))

    def finish(self) -> list[bytes]:
        """The lines, with a final marker per lane covering everything."""
        return [
            *self.lines,
            *(
                dumps({"type": "watermark", "lane": lane, "watermark": self.seq, "ts": self.ts})
                for lane in range(self.lanes)
            ),
        ]


# --------------------------------------------------------------------------- scenarios

user_ids = st.one_of(
    st.integers(0, 40),
    st.integers(0, 5).map(lambda k: U64 - 1 - k),  # near 2^64-1: must survive every layer
)


def _uuid(n: int) -> str:
    h = f"{n:032x}"
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


uuids = st.integers(0, (1 << 128) - 1).map(_uuid)


@dataclass
class Message:
    seq: int
    sender: int
    counts_unread: bool
    message_id: str
    activity_id: str
    created_at: int
    mentions: dict[int, bool]  # recipient -> mention flag of that recipient's entry
    # docs/contract.md §10's optional fields, the same on every recipient's entry: `urgent`,
    # `member_count` (the fast lane)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Conversation:
    cid: str
    index: int
    members: dict[int, int] = field(default_factory=dict)  # user -> joined_at
    seq: int = 0
    messages: dict[int, Message] = field(default_factory=dict)


@dataclass
class Scenario:
    lanes: int
    entries: list[dict[str, Any]]  # materialized valid entries, in mailbox (materialization) order
    rendered: list[bytes]  # the line of each entry (same index)
    per_user_seq: bool

    @property
    def max_seq(self) -> int:
        return max((e["mailbox_seq"] for e in self.entries), default=0)


ACTIONS = (
    ["send"] * 7
    + ["read"] * 2
    + ["recall", "join", "leave", "clear", "delete", "pin", "unpin", "mute", "unmute"]
    + ["archive", "unarchive", "dirty", "dirty", "redeliver", "churn", "churn"]
    # docs/contract.md §10: mark as unread, badge preferences
    + ["mark_unread", "mark_unread", "badge_preferences"]
)


class _World:
    def __init__(
        self,
        users: list[int],
        convs: list[str],
        lanes: int,
        rnd: random.Random,
        per_user_seq: bool,
        ts_step: tuple[int, int],
    ) -> None:
        self.users, self.lanes, self.rnd = users, lanes, rnd
        self.convs = [Conversation(cid, i) for i, cid in enumerate(convs)]
        self.per_user_seq, self.ts_step = per_user_seq, ts_step
        self.pool: list[tuple[int, str, dict[str, Any]]] = []  # (user, conv, payload)
        self.entries: list[dict[str, Any]] = []
        self.seen: dict[tuple[int, str], int] = {}  # highest materialized message seq
        self.seqs: dict[int, int] = {}
        self.clock = BASE_TS
        self.free_order = False  # True: membership/flag entries may overtake each other too

    def queue(self, user: int, conv: Conversation, payload: dict[str, Any]) -> None:
        self.pool.append((user, conv.cid, payload))

    def eligible(self) -> list[int]:
        # Free kinds may overtake anything; ordered kinds keep their order per (user, conv).
        # free_order: membership and flag entries may overtake each other too, so a stale join
        # can move joined_at down below messages this user never received.
        if self.free_order:
            return list(range(len(self.pool)))
        first_ordered: set[tuple[int, str]] = set()
        out = []
        for i, (u, c, p) in enumerate(self.pool):
            if p["type"] in ORDERED_TYPES:
                if (u, c) in first_ordered:
                    continue
                first_ordered.add((u, c))
            out.append(i)
        return out

    def materialize(self, i: int) -> None:
        u, c, payload = self.pool.pop(i)
        rnd = self.rnd
        key = u if self.per_user_seq else -1
        self.seqs[key] = self.seqs.get(key, 0) + rnd.choice((1, 1, 1, 2, 5))
        self.clock += rnd.randint(*self.ts_step)
        e = {
            "type": payload["type"],
            "mailbox_seq": self.seqs[key],
            "lane": rnd.randrange(self.lanes),
            "ts": self.clock,
            "event_id": f"ev-{len(self.entries)}",
            "user_id": u,
            "conversation_id": c,
        }
        e.update(payload)
        self.entries.append(e)
        if e["type"] == "message":
            self.seen[(u, c)] = max(self.seen.get((u, c), 0), e["conversation_seq"])

    def send(
        self,
        conv: Conversation,
        sender: int,
        counts_unread: bool,
        mentioned: Callable[[int], bool],
        extra: dict[str, Any] | None = None,
    ) -> None:
        conv.seq += 1
        created = self.clock + 1
        m = Message(
            conv.seq,
            sender,
            counts_unread,
            f"m-{conv.index}-{conv.seq}" + ("-é😀" if conv.index == 1 else ""),
            activity_id(created, conv.index, conv.seq),
            created,
            {u: mentioned(u) for u in sorted(conv.members)},
            dict(extra or {}),
        )
        conv.messages[m.seq] = m
        for u, mention in m.mentions.items():
            self.queue(u, conv, message_payload(m, mention))


def message_payload(m: Message, mention: bool) -> dict[str, Any]:
    return {
        "type": "message",
        "conversation_seq": m.seq,
        "message_id": m.message_id,
        "activity_id": m.activity_id,
        "sender_id": m.sender,
        "created_at": m.created_at,
        "counts_unread": m.counts_unread,
        "mention": mention,
        **m.extra,
    }


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    min_steps: int = 2,
    max_steps: int = 40,
    lanes: int | None = None,
    per_user_seq: bool | None = None,
    ts_step: tuple[int, int] = (0, 40),
    big: bool = False,
) -> Scenario:
    """A simulated history, materialized into mailbox entries (see the module doc).

    `ts_step`: bounds of the ts increment between consecutive materialized entries (use a lower
    bound >= 1 for strictly increasing ts). `big`: add at least one burst of > 200 messages.
    """
    lanes = draw(st.integers(1, 3)) if lanes is None else lanes
    per_user = draw(st.booleans()) if per_user_seq is None else per_user_seq
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    users = draw(st.lists(user_ids, min_size=1, max_size=4, unique=True))
    convs = draw(st.lists(uuids, min_size=1, max_size=3, unique=True))
    w = _World(users, convs, lanes, rnd, per_user, ts_step)
    w.free_order = draw(st.integers(0, 4)) == 4

    for conv in w.convs:
        members = draw(st.lists(st.sampled_from(users), min_size=1, max_size=len(users), unique=True))
        with_joins = draw(st.booleans())
        for k, u in enumerate(members):
            conv.members[u] = 0
            if with_joins:
                role = {} if k else {"role": "owner"}
                w.queue(u, conv, {"type": "join", "joined_at_conversation_seq": 0, **role})

    def pick_conv() -> Conversation:
        return w.convs[draw(st.integers(0, len(w.convs) - 1))]

    def pick(options: list[int]) -> int:
        return options[draw(st.integers(0, len(options) - 1))]

    def materialize_some(n: int) -> None:
        for _ in range(n):
            if not w.pool:
                return
            el = w.eligible()
            w.materialize(el[draw(st.integers(0, len(el) - 1))])

    steps = draw(st.integers(min_steps, max_steps))
    burst_at = draw(st.integers(0, steps)) if big else -1
    for step in range(steps + 1):
        if step == burst_at:
            _burst(w, draw(st.integers(201, 320)))
        if step == steps:
            break
        action = draw(st.sampled_from(ACTIONS))
        conv = pick_conv()
        members = sorted(conv.members)
        u = pick(users)
        key = (u, conv.cid)
        seen = w.seen.get(key, 0)
        if action == "send" and members:
            sender = pick(members)
            counts = draw(st.integers(0, 7)) < 7  # mostly true
            how = draw(st.sampled_from(("none", "none", "some", "all")))
            some = set(draw(st.lists(st.sampled_from(members), max_size=len(members))))
            chosen = set(members) if how == "all" else some if how == "some" else set()
            # The fast lane's fields (docs/contract.md §10): the conversation's size as the
            # producer fanned out (a DM's 2 included), an urgent flag either way, or neither.
            lane = draw(st.sampled_from(("plain", "plain", "members", "urgent", "both")))
            extra: dict[str, Any] = {}
            if lane in ("members", "both"):
                extra["member_count"] = len(conv.members)
            if lane in ("urgent", "both"):
                extra["urgent"] = draw(st.booleans())
            w.send(conv, sender, counts, chosen.__contains__, extra)
        elif action == "read":
            how = draw(st.sampled_from(("below", "seen", "above", "conv")))
            value = {
                "seen": seen,
                "below": draw(st.integers(0, seen)) if seen else 0,
                "above": seen + draw(st.integers(1, 3)),
                "conv": conv.seq,
            }[how]
            w.queue(u, conv, {"type": "read", "read_conversation_seq": value})
        elif action == "recall" and conv.messages:
            target = conv.messages[pick(sorted(conv.messages))]
            kind = draw(st.sampled_from(("recall", "delete_message")))
            # to everyone who got the message, or only to those who are still members (a former
            # member keeps counting it: the core must not take the recall from the MessageStore)
            everyone = draw(st.booleans())
            for r, mention in target.mentions.items():
                if everyone or r in conv.members:
                    w.queue(r, conv, recall_payload(kind, target, mention))
        elif action == "join" and u not in conv.members:
            role = draw(st.sampled_from((None, "member", "admin", "owner")))
            conv.members[u] = conv.seq
            w.queue(
                u,
                conv,
                {
                    "type": "join",
                    "joined_at_conversation_seq": conv.seq,
                    **({"role": role} if role else {}),
                },
            )
        elif action == "leave" and u in conv.members:
            del conv.members[u]
            reason = draw(st.sampled_from(("left", "removed")))
            w.queue(u, conv, {"type": "leave", "left_at_conversation_seq": conv.seq, "reason": reason})
        elif action in ("clear", "delete"):
            value = conv.seq if draw(st.integers(0, 4)) == 4 else seen
            if action == "clear":
                w.queue(u, conv, {"type": "clear_history", "hidden_before_conversation_seq": value})
            else:
                w.queue(
                    u,
                    conv,
                    {"type": "delete_conversation", "deleted_before_conversation_seq": value},
                )
        elif action == "pin":
            rank = draw(st.sampled_from((0, 1, 2, 3, U32 - 1)))
            w.queue(u, conv, {"type": "pin", "pin_rank": rank})
        elif action in ("unpin", "mute", "unmute", "archive", "unarchive"):
            w.queue(u, conv, {"type": action})
        elif action == "dirty":
            w.queue(u, conv, {"type": "mailbox_dirty"})
        elif action == "mark_unread":
            w.queue(u, conv, {"type": "mark_unread"})
        elif action == "badge_preferences":
            mode = draw(st.sampled_from(("messages", "conversations")))
            w.queue(
                u,
                conv,
                {"type": "badge_preferences", "badge_mode": mode, "include_muted": draw(st.booleans())},
            )
        elif action == "churn" and u in conv.members and len(conv.members) > 1:
            # leave, miss a message, rejoin, get one: all queued at once, so the later message
            # can overtake the leave in u's mailbox (the leave then moves the head down)
            others = [m for m in members if m != u]
            del conv.members[u]
            w.queue(u, conv, {"type": "leave", "left_at_conversation_seq": conv.seq, "reason": "left"})
            w.send(conv, pick(others), True, lambda r: False)
            conv.members[u] = conv.seq
            w.queue(u, conv, {"type": "join", "joined_at_conversation_seq": conv.seq})
            w.send(conv, pick(others), True, lambda r: False)
        elif action == "redeliver" and conv.messages:
            # the same message again under a new mailbox_seq (a retried fan-out), not a duplicate
            m = conv.messages[pick(sorted(conv.messages))]
            r = pick(sorted(m.mentions))
            w.queue(r, conv, message_payload(m, m.mentions[r]))
        materialize_some(draw(st.integers(0, 3)))
    while w.pool:
        materialize_some(len(w.pool))
    return Scenario(lanes, w.entries, [render(e, rnd) for e in w.entries], per_user)


def _burst(w: _World, n: int) -> None:
    """More than 200 messages in conversation 0 from one sender, with light noise: reads, clears
    and mailbox_dirty into the middle of what a member has seen, recalls, and disorder."""
    rnd, conv = w.rnd, w.convs[0]
    if not conv.members:
        u = w.users[0]
        conv.members[u] = conv.seq
        w.queue(u, conv, {"type": "join", "joined_at_conversation_seq": conv.seq})
    sender = rnd.choice(sorted(conv.members))
    # Sometimes a member's joined_at jumps ahead (messages at or below it leave the unread hand)
    # and a late join moves it back down: only a MessageStore read can count them again (> 200).
    jumper = rnd.choice(sorted(conv.members)) if rnd.random() < 0.5 else None
    if jumper is not None:
        low = rnd.randint(0, conv.seq)  # may be below its real join: messages it never got
        w.queue(jumper, conv, {"type": "join", "joined_at_conversation_seq": conv.seq + n - 20})
    for _ in range(n):
        size = {"member_count": len(conv.members)} if rnd.random() < 0.2 else {}
        w.send(conv, sender, rnd.random() < 0.9, lambda u: rnd.random() < 0.03, size)
        u = rnd.choice(sorted(conv.members))
        seen = w.seen.get((u, conv.cid), 0)
        x = rnd.random()
        if x < 0.01 and u != jumper:
            w.queue(u, conv, {"type": "read", "read_conversation_seq": rnd.randint(0, seen)})
        elif x < 0.015:
            w.queue(
                u, conv, {"type": "clear_history", "hidden_before_conversation_seq": rnd.randint(0, seen)}
            )
        elif x < 0.035:
            w.queue(u, conv, {"type": "mailbox_dirty"})
        elif x < 0.055:
            target = conv.messages[rnd.randint(1, conv.seq)]
            for r, mention in target.mentions.items():
                w.queue(r, conv, recall_payload("recall", target, mention))
        if rnd.random() < 0.5:
            for _ in range(rnd.randint(1, 3)):
                if w.pool:
                    el = w.eligible()
                    w.materialize(rnd.choice(el) if rnd.random() < 0.3 else el[0])
    if jumper is not None:
        w.queue(jumper, conv, {"type": "join", "joined_at_conversation_seq": low})
    for u in sorted(conv.members):  # a reconcile after the burst
        if rnd.random() < 0.5:
            w.queue(u, conv, {"type": "mailbox_dirty"})


def recall_payload(kind: str, m: Message, mention: bool) -> dict[str, Any]:
    return {
        "type": kind,
        "target_conversation_seq": m.seq,
        "target_sender_id": m.sender,
        "target_counts_unread": m.counts_unread,
        "target_mention": mention,
    }


def render(e: dict[str, Any], rnd: random.Random) -> bytes:
    """The JSON line of a valid entry; sometimes an upper-case UUID or an unknown extra field."""
    obj = dict(e)
    if rnd.random() < 0.1:
        obj["conversation_id"] = obj["conversation_id"].upper()
    if rnd.random() < 0.05:
        obj["x_trace"] = {"hop": rnd.randint(0, 9)}
    if rnd.random() < 0.05:
        obj["event_id"] += "-é😀\u2028"
    if rnd.random() < 0.2:
        keys = list(obj)
        rnd.shuffle(keys)
        obj = {k: obj[k] for k in keys}
    line = dumps(obj) if rnd.random() < 0.9 else json.dumps(obj, ensure_ascii=False).encode()
    if rnd.random() < 0.05:
        line = b" \t" + line + b" \r"  # JSON whitespace around, CRLF once lines() adds "\n"
    return line


# --------------------------------------------------------------------------- delivery


@dataclass
class Stream:
    scenario: Scenario
    # ("entry", i) | ("dup", i) | ("marker", lane, w) | ("bad", bytes) | ("blank", bytes)
    items: list[tuple[Any, ...]]

    def lines(self, *, bad: bool = True, dups: bool = True) -> list[bytes]:
        out = []
        for item in self.items:
            kind = item[0]
            if kind in ("entry", "dup"):
                if kind == "dup" and not dups:
                    continue
                out.append(self.scenario.rendered[item[1]] + b"\n")
            elif kind == "marker":
                out.append(marker_line(item[1], item[2]))
            elif bad:
                out.append(item[1] + b"\n")
        return out

    @property
    def lanes(self) -> int:
        return self.scenario.lanes


def marker_line(lane: int, w: int, ts: int = BASE_TS) -> bytes:
    return dumps({"type": "watermark", "lane": lane, "watermark": w, "ts": ts}) + b"\n"


def deliver(
    sc: Scenario,
    seed: int,
    *,
    full: bool = True,
    dup_rate: float = 0.0,
    bad_rate: float = 0.0,
    blank_rate: float = 0.0,
) -> Stream:
    """A delivery of a scenario: jittered order, correct markers, final markers (all if `full`)."""
    rnd = random.Random(seed)
    n = len(sc.entries)
    spread = rnd.choice((0, 1, 3, 8))
    keys = [i + rnd.uniform(0, spread) + (rnd.uniform(0, n) if rnd.random() < 0.03 else 0) for i in range(n)]
    order = sorted(range(n), key=lambda i: (keys[i], i))

    # Per lane, the undelivered seqs (lazy min-heap): a marker may not pass the lowest of them.
    heaps: list[list[tuple[int, int]]] = [[] for _ in range(sc.lanes)]
    for i, e in enumerate(sc.entries):
        heapq.heappush(heaps[e["lane"]], (e["mailbox_seq"], i))
    delivered: set[int] = set()

    def bound(lane: int) -> int:
        h = heaps[lane]
        while h and h[0][1] in delivered:
            heapq.heappop(h)
        return h[0][0] - 1 if h else sc.max_seq

    marker_rate = rnd.choice((0.0, 0.05, 0.2, 0.5))
    items: list[tuple[Any, ...]] = []
    for i in order:
        items.append(("entry", i))
        delivered.add(i)
        while rnd.random() < marker_rate:
            lane = rnd.randrange(sc.lanes)
            b = bound(lane)
            items.append(("marker", lane, b if rnd.random() < 0.8 else max(0, b - rnd.randint(1, 5))))
    lanes = list(range(sc.lanes))
    rnd.shuffle(lanes)
    short = set() if full else set(rnd.sample(lanes, rnd.randint(1, len(lanes))))
    for lane in lanes:
        if lane not in short:
            items.append(("marker", lane, sc.max_seq))
        elif rnd.random() < 0.5:
            items.append(("marker", lane, max(0, sc.max_seq - rnd.randint(1, 12))))

    for _ in range(_count(rnd, dup_rate, n) if n else 0):
        i = rnd.randrange(n)
        at = items.index(("entry", i))
        items.insert(rnd.randint(at + 1, len(items)), ("dup", i))
    for _ in range(_count(rnd, bad_rate, n)):
        items.insert(rnd.randint(0, len(items)), ("bad", bad_line(sc, rnd)))
    for _ in range(_count(rnd, blank_rate, n)):
        items.insert(rnd.randint(0, len(items)), ("blank", rnd.choice((b"", b"   ", b"\t "))))
    return Stream(sc, items)


def _count(rnd: random.Random, rate: float, n: int) -> int:
    if rate <= 0:
        return 0
    return sum(rnd.random() < rate for _ in range(max(n, 4)))


@st.composite
def streams(
    draw: st.DrawFn,
    scenario: st.SearchStrategy[Scenario] | None = None,
    *,
    full: bool | None = None,
    dups: bool = True,
    bad: bool = True,
    blanks: bool = True,
) -> Stream:
    sc = draw(scenario if scenario is not None else scenarios())
    seed = draw(st.integers(0, 2**32 - 1))
    full_ = draw(st.integers(0, 5)) < 5 if full is None else full  # mostly full
    return deliver(
        sc,
        seed,
        full=full_,
        dup_rate=draw(st.sampled_from((0.0, 0.05, 0.2))) if dups else 0.0,
        bad_rate=draw(st.sampled_from((0.0, 0.05, 0.2))) if bad else 0.0,
        blank_rate=0.03 if blanks else 0.0,
    )


# --------------------------------------------------------------------------- bad lines


def _invalid_values(check: Callable[[Any], bool]) -> list[Any]:
    candidates = [True, False, "5", 5.0, None, -1, 0, U64, [], {}, "not-a-uuid", "X" * 32, 1]
    return [v for v in candidates if not check(v)]


def bad_line(sc: Scenario, rnd: random.Random) -> bytes:
    """An invalid line, often a corruption of a real entry (same user and mailbox_seq)."""
    e = dict(rnd.choice(sc.entries)) if sc.entries else None
    kind = rnd.choice(
        (
            "malformed",
            "non_object",
            "unknown_type",
            "missing",
            "ill_typed",
            "lane",
            "uuid",
            "activity",
            "bad_marker",
        )
    )
    if e is None or kind == "non_object":
        return rnd.choice((b"[]", b"5", b'"x"', b"null", b"true", b"[{}]"))
    if kind == "malformed":
        line = dumps(e)
        return rnd.choice(
            (
                line.replace(b'"event_id":"', b'"event_id":"\\udc00', 1),  # lone surrogate
                line[: rnd.randint(1, len(line) - 1)],
                b"{not json",
                b"\xff\xfe{}",
                b'{"type":"read","mailbox_seq":NaN}',
                line + b"}",
                b"{,}",
            )
        )
    if kind == "unknown_type":
        e["type"] = rnd.choice(("reaction", "Message", "", 5, None))
        if rnd.random() < 0.3:
            del e["type"]
        return dumps(e)
    fields = {**COMMON, **TYPES[e["type"]]}
    if kind == "missing":
        del e[rnd.choice(sorted(fields))]
        return dumps(e)
    if kind == "ill_typed":
        if e["type"] == "join" and rnd.random() < 0.3:
            e["role"] = rnd.choice(("root", "", 1, True, "Owner"))
            assert not OPTIONAL["join"]["role"](e["role"])
            return dumps(e)
        if e["type"] == "message" and rnd.random() < 0.3:
            # docs/contract.md §10's optional fields, ill-typed or out of range
            name = rnd.choice(("urgent", "member_count"))
            e[name] = rnd.choice([*_invalid_values(OPTIONAL["message"][name]), U32])
            assert not OPTIONAL["message"][name](e[name])
            return dumps(e)
        name = rnd.choice(sorted(fields))
        e[name] = rnd.choice(_invalid_values(fields[name]))
        return dumps(e)
    if kind == "lane":
        e["lane"] = rnd.choice((sc.lanes, sc.lanes + 2, -1))
        return dumps(e)
    if kind == "uuid":
        hexes = e["conversation_id"].replace("-", "")
        e["conversation_id"] = rnd.choice(
            (
                hexes,
                "{" + e["conversation_id"] + "}",
                "urn:uuid:" + e["conversation_id"],
                e["conversation_id"][:-1],
                e["conversation_id"][:-1] + "g",
                hexes[:8] + "-" + hexes[8:],
                e["conversation_id"] + "\n",
                " " + e["conversation_id"],
            )
        )
        return dumps(e)
    if kind == "activity" and e["type"] == "message":
        a = e["activity_id"]
        e["activity_id"] = rnd.choice(
            (
                a.upper() if a.upper() != a else "A" + a[1:],
                a[:-1],
                a + "0",
                "g" + a[1:],
                "0x" + a[2:],
            )
        )
        return dumps(e)
    marker = {"type": "watermark", "lane": 0, "watermark": sc.max_seq, "ts": BASE_TS}
    broken = rnd.choice(("lane", "lane_bool", "watermark", "ts", "missing"))
    if broken == "lane":
        marker["lane"] = sc.lanes
    elif broken == "lane_bool":
        marker["lane"] = False
    elif broken == "watermark":
        marker["watermark"] = rnd.choice((-1, "7", 7.0, None))
    elif broken == "ts":
        marker["ts"] = -5
    else:
        del marker[rnd.choice(("lane", "watermark", "ts"))]
    return dumps(marker)
