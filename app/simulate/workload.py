"""The traffic model of `projector simulate`: a pure, seeded, deterministic generator.

Users (random u64 ids), 1:1 chats, small groups and big groups; every message is fanned out to
every active member (sender included); reads (often below latest), recalls and deletes, bursts
whose fan-out reaches each recipient in a different order (docs/contract.md §3.6 disorder: a
message after a newer one, a recall before its message), pin/mute/archive toggles,
clear/delete conversation, joins and leaves, the odd ``mailbox_dirty``, and on request the noise
of a real writer (bad records, retried entries). It yields :class:`Batch` es: the messages and
recalls to store, the mailbox entries (docs/contract.md §2) and the lanes' watermark markers.
The I/O that sends them is app/simulate/drive.py.

Watermarks: ``mailbox_seq`` is one global counter, so a lane that has nothing in flight may
claim the current counter; W for a lane is the counter at the end of the batch after which it
reports. Lanes report with some lag (not after every batch), so the gate really holds entries
back; at the end every lane reports the last seq, so nothing is left pending.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.domain.notices import MEMBER_JOINED, MEMBER_LEFT_HISTORY
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
    # docs/contract.md §10 (0 by default: `--markers`, `--badge-conversations`,
    # `--badge-messages`): the share of users who mark conversations unread (one of them marks a
    # known conversation with chance `mark_unread` per tick; a later read clears it), and the
    # shares of users who send a badge_preferences entry choosing each mode (include_muted drawn
    # at random), at their first tick. Drawn from a random generator of their own, so the
    # default traffic of a seed does not change.
    markers: float = 0.0
    mark_unread: float = 0.2
    badge_conversations: float = 0.0
    badge_messages: float = 0.0


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
    # Seed 004's member notifications (docs/contract.md §9): every join or leave in a group is
    # followed by a system message to the group's members carrying `notification` 24 (joined)
    # or 27 (left, history). Off by default: the default traffic stays what it was per seed.
    member_notices: bool = False

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
        if self.mix.badge_conversations + self.mix.badge_messages > 1:
            problems.append("--badge-conversations + --badge-messages must be at most 1 (shares of users)")
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
    notices: int = 0  # of `messages`, the member notifications (SimParams.member_notices)


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
        # §10's users (see Mix): who marks, who chooses which badge mode; a generator of their own.
        mix = params.mix
        self._prefs_rng = random.Random(params.seed * 1_000_003 + 35)
        self.marking_users: list[int] = []
        self.preferences: dict[int, tuple[str, bool]] = {}
        if mix.markers or mix.badge_conversations or mix.badge_messages:
            prefs_rng = self._prefs_rng
            for user in self.users:
                if prefs_rng.random() < mix.markers:
                    self.marking_users.append(user)
                draw = prefs_rng.random()
                if draw < mix.badge_conversations:
                    self.preferences[user] = ("conversations", prefs_rng.random() < 0.5)
                elif draw < mix.badge_conversations + mix.badge_messages:
                    self.preferences[user] = ("messages", prefs_rng.random() < 0.5)
        self._preferences_sent = False

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
        # One draw per kind, in this order (the order is part of a seed's traffic).
        for share, add in (
            (mix.recall, self._recall),
            (mix.read, self._read),
            (mix.toggle, self._toggle),
            (mix.clear, self._clear),
            (mix.churn, self._churn),
            (mix.dirty, self._dirty),
        ):
            if rng.random() < share:
                add(batch)
        if not self._preferences_sent:
            self._badge_preferences(batch)
        if self.marking_users and self._prefs_rng.random() < mix.mark_unread:
            self._mark_unread(batch)
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
            # docs/contract.md §10: the producer knows the fan-out's size (the fast lane takes a
            # direct message's at once)
            member_count=len(conversation.members),
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

    def _badge_preferences(self, batch: Batch) -> None:
        """Every user who chose badge preferences sends them once (docs/contract.md §10). A
        user-level entry: its conversation_id is any valid one, and makes nothing known."""
        self._preferences_sent = True
        conversation = self.conversations[0]
        for user, (mode, include_muted) in self.preferences.items():
            self.mailbox_seq += 1
            batch.entries.append(
                {
                    "type": "badge_preferences",
                    "mailbox_seq": self.mailbox_seq,
                    "lane": user % self.params.lanes,
                    "ts": batch.ts,
                    "event_id": self._event_id("badge_preferences"),
                    "user_id": user,
                    "conversation_id": conversation.id,
                    "badge_mode": mode,
                    "include_muted": include_muted,
                }
            )

    def _mark_unread(self, batch: Batch) -> None:
        """A marking user marks one of their known conversations unread (§10)."""
        rng = self._prefs_rng
        user = rng.choice(self.marking_users)
        known = self.known.get(user)
        if not known:
            return
        conversation = self._by_id[rng.choice(list(known))]
        batch.entries.append(
            self._entry("mark_unread", user, conversation, batch.ts, self._event_id("mark_unread"))
        )

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
                self._member_notice(batch, conversation, MEMBER_JOINED, user)
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
        self._member_notice(batch, conversation, MEMBER_LEFT_HISTORY, user)

    def _member_notice(self, batch: Batch, conversation: _Conversation, kind: int, about: int) -> None:
        """Seed 004's notification of a membership change, when asked for: a system message
        (sent by the member who joined or left; it counts as no one's unread and cannot be
        recalled) to every active member, the one who joined included, carrying the kind."""
        if not self.params.member_notices:
            return
        conversation.latest += 1
        self._activity += 1
        activity = f"{batch.ts:016x}{self._activity:016x}"
        message = NewMessage(
            conversation_id=conversation.id,
            conversation_seq=conversation.latest,
            message_id=f"n{activity}",
            activity_id=activity,
            sender_id=about,
            created_at=batch.ts,
            counts_unread=False,
            mentions=frozenset(),
        )
        batch.messages.append(message)
        batch.notices += 1
        event = self._event_id("notice")
        for user in conversation.members:
            entry = self._message_entry(user, conversation, message, batch.ts, event)
            entry["notification"] = kind
            batch.entries.append(entry)

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
