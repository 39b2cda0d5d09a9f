"""`projector simulate`: realistic mailbox traffic for the running system.

Two halves, kept apart so the first can be unit tested without servers:

* :class:`Workload` — a pure, seeded, deterministic generator. Users (random u64 ids), 1:1 chats,
  small groups and big groups; every message is fanned out to every active member (sender
  included); reads (often below latest), recalls and deletes, bursts whose fan-out reaches each
  recipient in a different order (DESIGN §3.6 disorder: a message after a newer one, a recall
  before its message), pin/mute/archive toggles, clear/delete conversation, joins and leaves,
  the odd ``mailbox_dirty``. It yields :class:`Batch` es: the messages and recalls to store, the
  mailbox entries (DESIGN §2) and the lanes' watermark markers.
* :func:`drive` — the I/O. Per chunk of batches it writes the messages, recall flags and heads
  to the MessageStore FIRST (a worker that reads the store for an entry must find the message),
  then produces the entries (key = ``str(user_id)``) and, for each marker of lane L with
  watermark W, waits until the broker has acknowledged every entry of lane L sent so far (all
  of that lane's entries <= W) and only then sends the marker to EVERY partition of the topic
  (explicit ``partition=``). A lane's markers go out in order; one still waiting for acks is
  superseded by the lane's next (its W covers the same entries), so under load markers thin
  out instead of lagging. ``--out`` gets every produced record in produce order (markers once
  per partition), so ``projector replay`` can run on exactly the stream the workers saw.

Watermarks: ``mailbox_seq`` is one global counter, so a lane that has nothing in flight may
claim the current counter; W for a lane is the counter at the end of the batch after which it
reports. Lanes report with some lag (not after every batch), so the gate really holds entries
back; at the end every lane reports the last seq, so nothing is left pending.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import orjson

from app.cli_args import non_negative_float, non_negative_int, probability
from app.stores.cassandra_exec import StoreError
from app.stores.cassandra_messages import ConversationHead, NewMessage

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the default event-time origin of tests
RECENT = 20  # messages per conversation a recall may target


# -- the workload (pure) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mix:
    """How often the side events happen, per message tick (the tick's main event is a message)."""

    read: float = 0.5
    read_latest: float = 0.5  # share of reads that catch up to latest (the rest stop below it)
    recall: float = 0.03
    delete_share: float = 0.25  # of recalls, the share that are delete_message
    burst: float = 0.05  # 2-3 messages whose fan-out reaches each recipient in its own order
    toggle: float = 0.06  # pin/unpin, mute/unmute, archive/unarchive
    clear: float = 0.005  # clear_history or delete_conversation
    churn: float = 0.02  # a join or a leave in a group
    dirty: float = 0.003  # mailbox_dirty (reconcile)
    mention: float = 0.12  # a message mentions one member
    mention_all: float = 0.01  # a group message is @all
    silent: float = 0.03  # messages that do not count as unread (notices)
    marker: float = 0.8  # chance a lane reports its watermark after a batch
    # Noise a real mailbox writer makes now and then (0 by default: `--bad-records`,
    # `--duplicates`): a record the worker must dead-letter, and a lane's retry of an entry it
    # already wrote (same mailbox_seq: the worker drops it as a duplicate).
    bad: float = 0.0
    retry: float = 0.0


@dataclass(frozen=True, slots=True)
class SimParams:
    users: int = 200
    conversations: int = 50
    group_size: int = 100  # members of a big group (capped at users)
    messages: int | None = 1000  # None: no limit (the driver stops on time or on Ctrl-C)
    lanes: int = 1
    seed: int = 1
    start_ms: int = T0_MS  # event time of the first batch
    step_ms: float = 10.0  # event time between two messages
    mix: Mix = field(default_factory=Mix)

    def __post_init__(self) -> None:
        problems = []
        if self.users < 2:
            problems.append("--users must be at least 2 (a chat needs two people)")
        if self.conversations < 1:
            problems.append("--conversations must be at least 1")
        if self.group_size < 2:
            problems.append("--group-size must be at least 2")
        if self.messages is not None and self.messages < 0:
            problems.append("--messages must be >= 0")
        if self.lanes < 1:
            problems.append("--lanes must be at least 1")
        if self.step_ms <= 0 or self.start_ms < 0:
            problems.append("event time must start at >= 0 and advance")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(slots=True)
class Batch:
    """One tick of traffic, in the order the I/O must honour: store, then entries, then markers."""

    ts: int
    messages: list[NewMessage] = field(default_factory=list)
    recalls: list[tuple[str, int, bool]] = field(default_factory=list)  # (conversation, seq, deleted)
    heads: list[ConversationHead] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    # Records that are not entries the workload tracks (bad records, retries): (key, value),
    # produced after the entries, before the markers.
    noise: list[tuple[bytes, bytes]] = field(default_factory=list)


# Bad records as upstream bugs make them: not JSON, an unknown type, a missing or ill-typed field.
_BAD_RECORDS = (
    b"{not json",
    b'{"type":"teleport","mailbox_seq":1,"lane":0,"ts":1,"event_id":"x","user_id":1}',
    b'{"type":"read","mailbox_seq":"seven","lane":0,"ts":1,"event_id":"x","user_id":1}',
    b'{"type":"read","mailbox_seq":3,"lane":0,"ts":1,"event_id":"x","user_id":1,"conversation_id":"nope",'
    b'"read_conversation_seq":1}',
    b"\xff\xfe not utf-8",
)


@dataclass(slots=True)
class _Sent:
    seq: int
    sender: int
    counts_unread: bool
    mentions: frozenset[int]
    recalled: bool = False


@dataclass(slots=True)
class _Conversation:
    id: str
    kind: str  # direct | group | big
    members: dict[int, str]  # active member -> role (insertion order: deterministic choices)
    former: list[int] = field(default_factory=list)  # left or removed; may rejoin
    latest: int = 0
    recent: list[_Sent] = field(default_factory=list)


_WEIGHT = {"direct": 1, "group": 2, "big": 4}  # how often a kind of conversation talks


class Workload:
    """The seeded traffic model. ``batches()`` yields the whole run; ``closing_batch()`` gives
    the final markers when the driver stops early."""

    def __init__(self, params: SimParams) -> None:
        self.params = params
        self.rng = random.Random(params.seed)
        self.mailbox_seq = 0
        self.messages_made = 0
        self._activity = 0
        self._events = 0
        self.reported = [0] * params.lanes  # each lane's last watermark
        self.users = self._make_users()
        self.conversations = self._make_conversations()
        self._cum_weights: list[int] = []
        total = 0
        for conversation in self.conversations:
            total += _WEIGHT[conversation.kind]
            self._cum_weights.append(total)
        # user -> conversations the user has entries for (a dict as an ordered set)
        self.known: dict[int, dict[str, None]] = {}
        # (user, conversation) -> set flags: "pinned", "muted", "archived"
        self.flags: dict[tuple[int, str], set[str]] = {}
        self._by_id = {c.id: c for c in self.conversations}

    # -- setup -----------------------------------------------------------------------------------

    def _make_users(self) -> list[int]:
        # Random u64 ids: the whole range (ids >= 2^63 included) goes through every adapter.
        users: dict[int, None] = {}
        while len(users) < self.params.users:
            users[self.rng.getrandbits(64)] = None
        return list(users)

    def _make_conversations(self) -> list[_Conversation]:
        p, rng = self.params, self.rng
        out = []
        for i in range(p.conversations):
            if p.users >= 3 and i % 10 == 0:
                kind, size = "big", min(p.group_size, p.users)
            elif p.users >= 3 and i % 2 == 0:
                kind, size = "group", rng.randint(3, min(12, p.users))
            else:
                kind, size = "direct", 2
            members = rng.sample(self.users, size)
            roles = {u: ("owner" if kind != "direct" and n == 0 else "member") for n, u in enumerate(members)}
            cid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            out.append(_Conversation(id=cid, kind=kind, members=roles))
        return out

    # -- the run ---------------------------------------------------------------------------------

    def batches(self) -> Iterator[Batch]:
        yield self._setup_batch()
        limit = self.params.messages
        while limit is None or self.messages_made < limit:
            yield self._tick()
        closing = self.closing_batch()
        if closing is not None:
            yield closing

    def closing_batch(self) -> Batch | None:
        """Every lane reports the last seq (the writers are caught up): nothing stays pending."""
        batch = Batch(ts=self._now())
        batch.markers = self._markers(batch.ts, force=True)
        return batch if batch.markers else None

    def _now(self) -> int:
        return self.params.start_ms + int(self.messages_made * self.params.step_ms)

    def _setup_batch(self) -> Batch:
        batch = Batch(ts=self._now())
        for conversation in self.conversations:
            event = self._event_id("create")
            for user, role in conversation.members.items():
                batch.entries.append(
                    self._entry(
                        "join", user, conversation, batch.ts, event, joined_at_conversation_seq=0, role=role
                    )
                )
        batch.entries = self._interleave(batch.entries)
        batch.markers = self._markers(batch.ts, force=True)
        return batch

    def _tick(self) -> Batch:
        p, mix, rng = self.params, self.params.mix, self.rng
        batch = Batch(ts=self._now())
        conversation = self._pick_conversation()
        left = 3 if p.messages is None else p.messages - self.messages_made
        if left >= 2 and rng.random() < mix.burst:
            self._burst(batch, conversation, min(rng.randint(2, 3), left))
        else:
            self._message(batch, conversation)
        if rng.random() < mix.recall:
            self._recall(batch)
        if rng.random() < mix.read:
            self._read(batch)
        if rng.random() < mix.toggle:
            self._toggle(batch)
        if rng.random() < mix.clear:
            self._clear(batch)
        if rng.random() < mix.churn:
            self._churn(batch)
        if rng.random() < mix.dirty:
            self._dirty(batch)
        # Drawn only when asked for: the default traffic stays what it was for every seed.
        if mix.bad and rng.random() < mix.bad:
            batch.noise.append((str(rng.choice(self.users)).encode(), rng.choice(_BAD_RECORDS)))
        heads: dict[str, ConversationHead] = {}
        for m in batch.messages:
            heads[m.conversation_id] = ConversationHead(
                m.conversation_id, m.conversation_seq, m.message_id, m.activity_id
            )
        batch.heads = list(heads.values())
        batch.entries = self._interleave(batch.entries)
        if mix.retry and batch.entries and rng.random() < mix.retry:
            # A lane writes an entry of this tick again (its acknowledgement was lost).
            again = rng.choice(batch.entries)
            batch.noise.append((str(again["user_id"]).encode(), orjson.dumps(again)))
        done = p.messages is not None and self.messages_made >= p.messages
        batch.markers = self._markers(batch.ts, force=done)
        return batch

    # -- events ----------------------------------------------------------------------------------

    def _pick_conversation(self) -> _Conversation:
        return self.rng.choices(self.conversations, cum_weights=self._cum_weights)[0]

    def _new_message(self, conversation: _Conversation, ts: int) -> NewMessage:
        rng, mix = self.rng, self.params.mix
        sender = rng.choice(list(conversation.members))
        conversation.latest += 1
        self._activity += 1
        self.messages_made += 1
        # Time-sortable: event time first, then a global counter (byte order = time order).
        activity = f"{ts:016x}{self._activity:016x}"
        others = [u for u in conversation.members if u != sender]
        mentions: frozenset[int] = frozenset()
        if conversation.kind != "direct" and rng.random() < mix.mention_all:
            mentions = frozenset(others)  # @all: every member but the sender
        elif others and rng.random() < mix.mention:
            mentions = frozenset({rng.choice(others)})
        counts = rng.random() >= mix.silent
        conversation.recent.append(_Sent(conversation.latest, sender, counts, mentions))
        del conversation.recent[:-RECENT]
        return NewMessage(
            conversation_id=conversation.id,
            conversation_seq=conversation.latest,
            message_id=f"m{activity}",
            activity_id=activity,
            sender_id=sender,
            created_at=ts,
            counts_unread=counts,
            mentions=mentions,
        )

    def _message_entry(
        self, user: int, conversation: _Conversation, m: NewMessage, ts: int, event: str
    ) -> dict[str, Any]:
        return self._entry(
            "message",
            user,
            conversation,
            ts,
            event,
            conversation_seq=m.conversation_seq,
            message_id=m.message_id,
            activity_id=m.activity_id,
            sender_id=m.sender_id,
            created_at=m.created_at,
            counts_unread=m.counts_unread,
            mention=user in m.mentions,
        )

    def _recall_entry(
        self, kind: str, user: int, conversation: _Conversation, target: _Sent, ts: int, event: str
    ) -> dict[str, Any]:
        return self._entry(
            kind,
            user,
            conversation,
            ts,
            event,
            target_conversation_seq=target.seq,
            target_sender_id=target.sender,
            target_counts_unread=target.counts_unread,
            target_mention=user in target.mentions,
        )

    def _message(self, batch: Batch, conversation: _Conversation) -> None:
        m = self._new_message(conversation, batch.ts)
        batch.messages.append(m)
        event = self._event_id("message")
        for user in conversation.members:  # fan-out: every active member, the sender included
            batch.entries.append(self._message_entry(user, conversation, m, batch.ts, event))

    def _burst(self, batch: Batch, conversation: _Conversation, count: int) -> None:
        """Messages sent close together, fanned out by independent writers: each recipient gets
        them (and maybe the recall of the first) in its own order."""
        rng = self.rng
        made = [(self._new_message(conversation, batch.ts), self._event_id("message")) for _ in range(count)]
        batch.messages.extend(m for m, _ in made)
        recall: tuple[str, _Sent, str] | None = None
        if rng.random() < 0.3:
            target = conversation.recent[-count]
            target.recalled = True
            kind = "delete_message" if rng.random() < self.params.mix.delete_share else "recall"
            recall = (kind, target, self._event_id(kind))
            batch.recalls.append((conversation.id, target.seq, kind == "delete_message"))
        steps = len(made) + (recall is not None)
        for user in conversation.members:
            order = list(range(steps))
            rng.shuffle(order)
            for step in order:
                if step < len(made):
                    m, event = made[step]
                    batch.entries.append(self._message_entry(user, conversation, m, batch.ts, event))
                else:
                    assert recall is not None
                    kind, target, event = recall
                    batch.entries.append(
                        self._recall_entry(kind, user, conversation, target, batch.ts, event)
                    )

    def _recall(self, batch: Batch) -> None:
        rng = self.rng
        conversation = self._pick_conversation()
        candidates = [s for s in conversation.recent if not s.recalled]
        if not candidates:
            return
        target = rng.choice(candidates)
        target.recalled = True
        kind = "delete_message" if rng.random() < self.params.mix.delete_share else "recall"
        batch.recalls.append((conversation.id, target.seq, kind == "delete_message"))
        event = self._event_id(kind)
        for user in conversation.members:
            batch.entries.append(self._recall_entry(kind, user, conversation, target, batch.ts, event))

    def _read(self, batch: Batch) -> None:
        rng = self.rng
        conversation = self._pick_conversation()
        if conversation.latest == 0:
            return
        user = rng.choice(list(conversation.members))
        latest = conversation.latest
        if rng.random() < self.params.mix.read_latest:
            seq = latest
        else:  # another device, or a read receipt that raced newer messages
            seq = rng.randint(max(0, latest - 10), latest)
        batch.entries.append(
            self._entry(
                "read", user, conversation, batch.ts, self._event_id("read"), read_conversation_seq=seq
            )
        )

    def _known_pair(self) -> tuple[int, _Conversation] | None:
        user = self.rng.choice(self.users)
        known = self.known.get(user)
        if not known:
            return None
        return user, self._by_id[self.rng.choice(list(known))]

    def _toggle(self, batch: Batch) -> None:
        pair = self._known_pair()
        if pair is None:
            return
        user, conversation = pair
        flags = self.flags.setdefault((user, conversation.id), set())
        flag = self.rng.choice(("pinned", "muted", "archived"))
        on = flag not in flags
        kind = {"pinned": "pin", "muted": "mute", "archived": "archive"}[flag]
        if not on:
            kind = "un" + kind
        extra: dict[str, Any] = {"pin_rank": self.rng.randrange(0, 16)} if kind == "pin" else {}
        if on:
            flags.add(flag)
        else:
            flags.discard(flag)
        batch.entries.append(self._entry(kind, user, conversation, batch.ts, self._event_id(kind), **extra))

    def _clear(self, batch: Batch) -> None:
        pair = self._known_pair()
        if pair is None or pair[1].latest == 0:
            return
        user, conversation = pair
        if self.rng.random() < 0.5:
            kind, extra = "clear_history", {"hidden_before_conversation_seq": conversation.latest}
        else:
            kind, extra = "delete_conversation", {"deleted_before_conversation_seq": conversation.latest}
        batch.entries.append(self._entry(kind, user, conversation, batch.ts, self._event_id(kind), **extra))

    def _churn(self, batch: Batch) -> None:
        rng = self.rng
        groups = [c for c in self.conversations if c.kind != "direct"]
        if not groups:
            return
        conversation = rng.choice(groups)
        if rng.random() < 0.5:
            outsiders = conversation.former or [u for u in self.users if u not in conversation.members]
            if outsiders:
                user = rng.choice(outsiders)
                if user in conversation.former:
                    conversation.former.remove(user)
                conversation.members[user] = "member"
                batch.entries.append(
                    self._entry(
                        "join",
                        user,
                        conversation,
                        batch.ts,
                        self._event_id("join"),
                        joined_at_conversation_seq=conversation.latest,
                        role="member",
                    )
                )
                return
        if len(conversation.members) <= 2:  # a group keeps two members, so it can still talk
            return
        user = rng.choice(list(conversation.members))
        del conversation.members[user]
        conversation.former.append(user)
        reason = "left" if rng.random() < 0.7 else "removed"
        batch.entries.append(
            self._entry(
                "leave",
                user,
                conversation,
                batch.ts,
                self._event_id("leave"),
                left_at_conversation_seq=conversation.latest,
                reason=reason,
            )
        )

    def _dirty(self, batch: Batch) -> None:
        pair = self._known_pair()
        if pair is not None:
            user, conversation = pair
            batch.entries.append(
                self._entry("mailbox_dirty", user, conversation, batch.ts, self._event_id("dirty"))
            )

    # -- records ---------------------------------------------------------------------------------

    def _event_id(self, kind: str) -> str:
        self._events += 1
        return f"sim-{self.params.seed}-{kind}-{self._events}"

    def _entry(
        self, kind: str, user: int, conversation: _Conversation, ts: int, event: str, **fields: Any
    ) -> dict[str, Any]:
        self.mailbox_seq += 1
        self.known.setdefault(user, {})[conversation.id] = None
        return {
            "type": kind,
            "mailbox_seq": self.mailbox_seq,
            "lane": user % self.params.lanes,  # the mailbox write lane that owns the user
            "ts": ts,
            "event_id": event,
            "user_id": user,
            "conversation_id": conversation.id,
            **fields,
        }

    def _interleave(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Lanes are independent writers: keep each lane's entries in mailbox_seq order but mix
        the lanes at random (a uniform interleaving), as the topic would see them."""
        lanes = self.params.lanes
        if lanes == 1 or len(entries) < 2:
            return entries
        queues: list[list[dict[str, Any]]] = [[] for _ in range(lanes)]
        for entry in entries:
            queues[entry["lane"]].append(entry)
        labels = [entry["lane"] for entry in entries]
        self.rng.shuffle(labels)
        positions = [0] * lanes
        out = []
        for lane in labels:
            out.append(queues[lane][positions[lane]])
            positions[lane] += 1
        return out

    def _markers(self, ts: int, *, force: bool) -> list[dict[str, Any]]:
        markers = []
        for lane in range(self.params.lanes):
            if self.reported[lane] >= self.mailbox_seq:
                continue
            if force or self.rng.random() < self.params.mix.marker:
                self.reported[lane] = self.mailbox_seq
                markers.append({"type": "watermark", "lane": lane, "watermark": self.mailbox_seq, "ts": ts})
        return markers


# -- the I/O -----------------------------------------------------------------------------------


class RecordSink(Protocol):
    """Where records go (Kafka in production; fakes in unit tests)."""

    partitions: Sequence[int]  # markers go to each; [] means "no partitions" (file only)

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        """Enqueue one record; the returned awaitable resolves when the broker acknowledged it."""
        ...


class MessageSink(Protocol):
    async def write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None: ...


@dataclass(slots=True)
class Report:
    messages: int = 0
    entries: int = 0
    markers: int = 0  # marker records produced (one per lane report per partition)
    noise: int = 0  # bad records and retried entries (Mix.bad, Mix.retry)
    batches: int = 0
    elapsed_s: float = 0.0
    stopped_early: bool = False


@dataclass(slots=True)
class _Lane:
    """The driver's view of one mailbox write lane."""

    acks: list[Awaitable[Any]] = field(default_factory=list)  # entries since the last marker request
    waiting: list[Awaitable[Any]] = field(default_factory=list)  # what the requested marker waits for
    marker: bytes | None = None  # the newest requested marker not sent yet
    task: asyncio.Task[None] | None = None


# Per chunk: batches taken at once, so the MessageStore write before their entries is one call.
CHUNK_BATCHES = 256
CHUNK_ENTRIES = 20_000


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last = 0.0

    def update(self, report: Report, started: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.5):
            return
        self.last = now
        elapsed = max(now - started, 1e-9)
        sys.stderr.write(
            f"\rsimulate: {report.messages:,} messages ({report.messages / elapsed:,.0f}/s), "
            f"{report.entries:,} entries ({report.entries / elapsed:,.0f}/s), "
            f"{report.markers:,} markers, {elapsed:,.1f}s "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


async def drive(
    workload: Workload,
    sink: RecordSink,
    store: MessageSink | None,
    *,
    out: IO[bytes] | None = None,
    rate: float = 0.0,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    progress: bool = False,
) -> Report:
    """Run the workload: store first, then entries, then each lane's markers once its entries
    are acknowledged. Stops when the workload ends, after ``duration_s``, or when ``stop`` is
    set; in the last two cases the closing markers are still sent."""
    report = Report()
    started = time.monotonic()
    shown = _Progress(progress)
    lanes: dict[int, _Lane] = {}
    marker_acks: list[Awaitable[Any]] = []
    # Markers go to every partition; a file-only sink has none: the marker is written once.
    marker_targets: list[int | None] = [*sink.partitions] or [None]

    def emit(value: bytes) -> None:
        if out is not None:
            out.write(value)
            out.write(b"\n")

    async def report_lane(lane: _Lane) -> None:
        # One task per lane at a time, so a lane's markers go out in order. A marker requested
        # while an older one still waits for its acks supersedes it (its W covers the same
        # entries and more): under load the lane reports less often instead of falling behind.
        while lane.marker is not None:
            value, waiting = lane.marker, lane.waiting
            lane.marker, lane.waiting = None, []
            await asyncio.gather(*waiting)  # every entry of this lane <= W is in the log now
            for partition in marker_targets:
                # Not awaited one by one: per partition the producer keeps send order, so the
                # next marker cannot overtake this one.
                marker_acks.append(await sink.send(value, None, partition))
                emit(value)
                report.markers += 1

    def check_failures() -> None:
        # A failed acknowledgement surfaces in its lane's task or among the marker acks.
        for lane in lanes.values():
            if lane.task is not None and lane.task.done():
                failure = lane.task.exception()
                if failure is not None:
                    raise failure
        remaining = []
        for ack in marker_acks:
            if isinstance(ack, asyncio.Future) and ack.done():
                failure = ack.exception()
                if failure is not None:
                    raise failure
            else:
                remaining.append(ack)
        marker_acks[:] = remaining

    async def produce(batch: Batch) -> None:
        for entry in batch.entries:
            value = orjson.dumps(entry)
            ack = await sink.send(value, str(entry["user_id"]).encode(), None)
            lane = lanes.get(entry["lane"])
            if lane is None:
                lane = lanes[entry["lane"]] = _Lane()
            lane.acks.append(ack)
            emit(value)
        report.entries += len(batch.entries)
        report.messages += len(batch.messages)
        for key, value in batch.noise:
            # Not tracked by any lane: a lane's marker never waits for its retry or a bad record.
            marker_acks.append(await sink.send(value, key, None))
            emit(value)
            report.noise += 1
        for marker in batch.markers:
            lane = lanes.get(marker["lane"])
            if lane is None:
                lane = lanes[marker["lane"]] = _Lane()
            lane.waiting.extend(lane.acks)
            lane.acks = []
            lane.marker = orjson.dumps(marker)
            if lane.task is None or lane.task.done():
                lane.task = asyncio.create_task(report_lane(lane))
        report.batches += 1

    batches = workload.batches()
    taken_messages = 0
    exhausted = False
    try:
        while not exhausted:
            if stop is not None and stop.is_set():
                report.stopped_early = True
                break
            elapsed = time.monotonic() - started
            if duration_s is not None and elapsed >= duration_s:
                report.stopped_early = True
                break
            # (chunk) the batches due now: all of them up to the chunk bounds when unpaced
            due = None if rate <= 0 else rate * elapsed
            chunk: list[Batch] = []
            entries = 0
            while len(chunk) < CHUNK_BATCHES and entries < CHUNK_ENTRIES:
                # Paced: stop at the schedule (message-less batches, like the set-up, go at once).
                if due is not None and taken_messages >= due and (chunk or taken_messages > 0):
                    break
                batch = next(batches, None)
                if batch is None:
                    exhausted = True
                    break
                chunk.append(batch)
                entries += len(batch.entries)
                taken_messages += len(batch.messages)
            if not chunk:
                if not exhausted:
                    next_due = started + taken_messages / rate
                    await asyncio.sleep(min(0.05, max(0.001, next_due - time.monotonic())))
                continue
            if store is not None:
                await store.write(
                    [m for b in chunk for m in b.messages],
                    [r for b in chunk for r in b.recalls],
                    [h for b in chunk for h in b.heads],
                )
            for batch in chunk:
                await produce(batch)
            check_failures()
            shown.update(report, started)
        if not exhausted:
            closing = workload.closing_batch()
            if closing is not None:
                await produce(closing)
        await asyncio.gather(*(lane.task for lane in lanes.values() if lane.task is not None))
        # Everything produced must be acknowledged before the run counts as done.
        await asyncio.gather(*marker_acks, *(ack for lane in lanes.values() for ack in lane.acks))
    finally:
        for lane in lanes.values():
            if lane.task is not None and not lane.task.done():
                lane.task.cancel()
        report.elapsed_s = time.monotonic() - started
        shown.update(report, started, force=True)
        shown.close()
    return report


class KafkaSink:
    """aiokafka producer on one topic."""

    def __init__(self, producer: Any, topic: str, partitions: Sequence[int]) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions: Sequence[int] = sorted(partitions)

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        # `send` returns once the record is in the producer's buffer; the future it returns
        # resolves with the broker's acknowledgement.
        ack: Awaitable[Any] = await self.producer.send(self.topic, value=value, key=key, partition=partition)
        return ack


class FileOnlySink:
    """No broker (--no-kafka): records only go to --out; markers are written once."""

    partitions: Sequence[int] = ()

    async def send(self, value: bytes, key: bytes | None, partition: int | None) -> Awaitable[Any]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class CassandraMessageSink:
    """The Cassandra MessageStore, written from a worker thread (the driver is blocking)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None:
        if messages or recalls or heads:
            await asyncio.to_thread(self._write, messages, recalls, heads)

    def _write(
        self,
        messages: Sequence[NewMessage],
        recalls: Sequence[tuple[str, int, bool]],
        heads: Sequence[ConversationHead],
    ) -> None:
        self.store.put_messages(messages)
        self.store.mark_recalled_many(recalls)
        self.store.update_heads(heads)


class SimulateError(RuntimeError):
    """A server is unreachable or refused: the message says which and what to do."""


async def simulate(
    settings: Any,
    params: SimParams,
    *,
    out: IO[bytes] | None = None,
    rate: float = 0.0,
    duration_s: float | None = None,
    use_kafka: bool = True,
    use_cassandra: bool = True,
    stop: asyncio.Event | None = None,
    progress: bool = False,
    connect_timeout_s: float = 10.0,
) -> Report:
    """Open the servers named by ``settings``, run the workload, close everything."""
    cluster = None
    producer = None
    try:
        store: MessageSink | None = None
        if use_cassandra:
            store, cluster = await asyncio.to_thread(_open_store, settings, connect_timeout_s)
        sink: RecordSink = FileOnlySink()
        if use_kafka:
            producer, sink = await _open_producer(settings, connect_timeout_s)
        return await drive(
            Workload(params),
            sink,
            store,
            out=out,
            rate=rate,
            duration_s=duration_s,
            stop=stop,
            progress=progress,
        )
    except StoreError as exc:  # Cassandra failed mid-run (unreachable, timed out)
        raise SimulateError(f"cassandra: {exc}") from None
    except _kafka_errors() as exc:  # a send or an acknowledgement failed mid-run
        raise SimulateError(f"kafka: {type(exc).__name__}: {exc}") from None
    finally:
        if producer is not None:
            with contextlib.suppress(Exception):  # already failing or done: closing is best effort
                await producer.stop()
        if cluster is not None:
            cluster.shutdown()


def _kafka_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaError

    return (KafkaError,)


def _open_store(settings: Any, connect_timeout_s: float) -> tuple[MessageSink, Any]:
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import CassandraUnavailable, open_cluster

    try:
        cluster, session = open_cluster(settings, connect_timeout=connect_timeout_s)
    except CassandraUnavailable as exc:
        raise SimulateError(f"cassandra: {exc}") from None
    try:
        store = CassandraMessageStore(session, settings.cassandra_keyspace)
    except StoreError as exc:
        cluster.shutdown()
        raise SimulateError(f"cassandra: {exc}") from None
    return CassandraMessageSink(store), cluster


async def _open_producer(settings: Any, connect_timeout_s: float) -> tuple[Any, RecordSink]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        # Idempotence keeps each partition in send order across retries: a marker can never
        # overtake the entries it covers.
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=256 * 1024,
        request_timeout_ms=int(connect_timeout_s * 1000) + 20_000,
    )
    topic = settings.topic_mailbox_tail
    try:
        await asyncio.wait_for(producer.start(), timeout=connect_timeout_s)
        metadata = await producer.client.fetch_all_metadata()
    except (KafkaError, TimeoutError, OSError) as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise SimulateError(
            f"kafka: cannot reach {settings.kafka_bootstrap} ({type(exc).__name__}: {exc}); "
            "start the local servers with `make services-up`"
        ) from None
    partitions = metadata.partitions_for_topic(topic)
    if not partitions:
        await producer.stop()
        raise SimulateError(
            f"kafka: topic {topic!r} does not exist on {settings.kafka_bootstrap}; "
            "create it with `projector bootstrap`"
        )
    return producer, KafkaSink(producer, topic, sorted(partitions))


# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--users", type=non_negative_int, default=200, metavar="N", help="users (default 200)"
    )
    parser.add_argument(
        "--conversations",
        type=non_negative_int,
        default=50,
        metavar="M",
        help="conversations: every 10th a big group, half of the rest 1:1 chats (default 50)",
    )
    parser.add_argument(
        "--group-size",
        type=non_negative_int,
        default=100,
        metavar="N",
        help="members of a big group, capped at --users (default 100)",
    )
    parser.add_argument(
        "--messages",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="messages to send; 0 = no limit (stop with --duration or Ctrl-C) (default 1000)",
    )
    parser.add_argument(
        "--duration",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="stop after S seconds (0 = no limit)",
    )
    parser.add_argument(
        "--rate",
        type=non_negative_float,
        default=100.0,
        metavar="MSG/S",
        help="messages per second; 0 = as fast as possible (default 100)",
    )
    parser.add_argument(
        "--lanes",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="mailbox write lanes (default: PROJECTOR_LANES, i.e. Settings.lanes)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="random seed: same seed, same traffic (default 1)"
    )
    parser.add_argument(
        "--start-ms",
        type=non_negative_int,
        default=None,
        metavar="MS",
        help="event time (ts) of the first batch; default now (fixed + --no-kafka: identical --out per seed)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="also write every produced record (markers too, once per partition) as JSON lines",
    )
    parser.add_argument(
        "--bad-records",
        type=probability,
        default=0.0,
        metavar="P",
        help="chance per message of a bad record the worker must dead-letter (default 0)",
    )
    parser.add_argument(
        "--duplicates",
        type=probability,
        default=0.0,
        metavar="P",
        help="chance per message of a lane writing an entry twice (a retry; default 0)",
    )
    parser.add_argument("--no-cassandra", action="store_true", help="do not write the MessageStore")
    parser.add_argument(
        "--no-kafka", action="store_true", help="do not produce to Kafka (only --out; needs --out)"
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress on stderr (auto: only when stderr is a terminal)",
    )


def run(args: argparse.Namespace) -> int:
    from app.settings import Settings

    prog = "projector simulate"
    settings = Settings.from_env()  # a SettingsError is reported by app.cli.main
    if args.no_kafka and not args.out:
        print(f"{prog}: --no-kafka needs --out (the records have to go somewhere)", file=sys.stderr)
        return 2
    lanes = settings.lanes if args.lanes is None else args.lanes
    rate = float(args.rate)
    start_ms = int(time.time() * 1000) if args.start_ms is None else args.start_ms
    try:
        params = SimParams(
            users=args.users,
            conversations=args.conversations,
            group_size=args.group_size,
            messages=args.messages or None,
            lanes=lanes,
            seed=args.seed,
            start_ms=start_ms,
            # Event time follows the requested rate; unpaced runs still advance 10 ms a message,
            # so flush windows (5 s of ts) close during a replay of the file.
            step_ms=1000.0 / rate if rate > 0 else 10.0,
            mix=Mix(bad=args.bad_records, retry=args.duplicates),
        )
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    _quiet_driver_logs()
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    try:
        out: IO[bytes] | None = open(args.out, "wb") if args.out else None  # noqa: SIM115
    except OSError as exc:
        print(f"{prog}: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        report = asyncio.run(
            _run_with_interrupt(
                lambda stop: simulate(
                    settings,
                    params,
                    out=out,
                    rate=rate,
                    duration_s=args.duration or None,
                    use_kafka=not args.no_kafka,
                    use_cassandra=not args.no_cassandra,
                    stop=stop,
                    progress=show,
                )
            )
        )
    except SimulateError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if out is not None:
            out.close()
    target = "no broker" if args.no_kafka else settings.topic_mailbox_tail
    noise = f", {report.noise} bad or repeated records" if report.noise else ""
    print(
        f"simulated {report.messages} messages: {report.entries} entries{noise} and {report.markers} "
        f"marker records to {target} in {report.elapsed_s:.1f}s"
        + (" (stopped early; closing markers sent)" if report.stopped_early else "")
        + (f"; records in {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


async def _run_with_interrupt(main: Callable[[asyncio.Event], Awaitable[Report]]) -> Report:
    """The first Ctrl-C stops the traffic cleanly (closing markers still go out, so a replay of
    --out leaves nothing pending); a second one interrupts for real."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    # Not the main thread, or a platform without signal handlers: Ctrl-C then interrupts at once.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
    try:
        return await main(stop)
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGINT)


def _quiet_driver_logs() -> None:
    # aiokafka logs every metadata retry as a warning ("Topic ... not found"); the command
    # reports failures itself, once, with what to do.
    import logging

    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    logging.getLogger("cassandra").setLevel(logging.ERROR)
