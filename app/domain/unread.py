"""Unread and mention counts: the authority definition kept exact by a per-row hand.

unread(u, c) = |{m : base < m.seq <= latest, m.sender != u, m.counts_unread, not recalled/deleted}|
base = max(read_seq, hidden_before, joined_at, deleted_before)           (docs/contract.md §3.4)

The hand is three compact bitmaps of conversation_seqs: messages that count, those of them that
mention the user, and recalled/deleted targets. Bitmaps make every update idempotent, so a message
delivered twice, a recall before its message, or a recompute that already saw a message can never
count anything twice. The hand is complete for every seq above `floor`; everything at or below the
base is pruned (it can no longer count), so the hand stays bounded by the unread window itself.

When the base moves, the seed's three states apply: (a) the hand covers (old, new] → exact from
the hand; (b) the base reached latest → zero; (c) otherwise one bounded MessageStore range read:
exact when latest - base <= limit, else `unread_count = limit, unread_exact = false`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.domain import seqs
from app.domain.ports import MessageStore, StoredMessage

UNREAD_PRECISE_LIMIT = 200


class UnreadHand(Protocol):
    """What the unread rules read and keep on a row (a `ConversationState`): its base and
    latest, the hand and the counts. A protocol, so this module needs nothing from the row's."""

    user_id: int
    conversation_id: str
    base: int
    floor: int
    received: seqs.Seqs
    counting: seqs.Seqs
    mentioning: seqs.Seqs
    recalled: seqs.Seqs
    unread_count: int
    unread_exact: bool
    mention_count: int
    mention_first: int | None

    @property
    def latest(self) -> int: ...


def derive_from_hand(row: UnreadHand) -> None:
    """Counts over (base, latest] from the hand; valid only when `row.floor <= base`."""
    base = row.base
    latest = row.latest
    if latest <= base:
        row.unread_count = 0
        row.mention_count = 0
        row.mention_first = None
        row.unread_exact = True
    else:
        derive_over(row, base, latest)


def prune_to_base(row: UnreadHand) -> None:
    """Drop hand entries at or below the base: they can no longer count. Recalls are kept: a
    join can move the base back down, and a recalled message must still never count."""
    base = row.base
    if row.floor < base:
        row.counting = seqs.remove_range(row.counting, 0, base + 1)
        row.mentioning = seqs.remove_range(row.mentioning, 0, base + 1)
        row.floor = base


def settle(row: UnreadHand, store: MessageStore, limit: int) -> None:
    """Re-establish the counts after the base or the head moved (the three-state rule)."""
    base = row.base
    if row.floor <= base:  # (a) every seq above the base is in hand
        prune_to_base(row)
        derive_from_hand(row)
    elif row.latest <= base:  # (b) the base reached the head: nothing can count
        row.unread_count = 0
        row.mention_count = 0
        row.mention_first = None
        row.unread_exact = True
    else:  # (c) the hand does not reach down to the base
        recompute(row, store, limit)


def recompute(row: UnreadHand, store: MessageStore, limit: int, *, received_only: bool = True) -> None:
    """Bounded recompute from the MessageStore (one single-partition range read).

    `received_only`: the store fills in what the pruned hand forgot about messages this user
    received (sender, counts, mentions); it does not add messages the user never received — the
    definition is over the user's own entries (docs/contract.md §3.6). Rebuilds from state, which know
    nothing of what was received, take the store as it is (`received_only=False`)."""
    base = row.base
    latest = row.latest
    if latest <= base:
        if row.floor <= base:
            prune_to_base(row)
        derive_from_hand(row)
        return
    if latest - base <= limit:
        merge_stored(row, store.range(row.conversation_id, base, latest), received_only)
        if row.floor <= latest:
            # The read covered (base, latest] and the hand already covered (floor, ∞).
            row.floor = min(row.floor, base)
            prune_to_base(row)
        derive_over(row, base, latest)
        return
    # Too wide to read exactly: the row shows `limit` (the client's 99+) until the base moves.
    merge_stored(row, store.range(row.conversation_id, latest - limit, latest), received_only)
    row.unread_count = limit
    row.unread_exact = False
    low = max(base, latest - limit)
    row.mention_count = seqs.count_range(row.mentioning, low + 1, latest + 1)
    row.mention_first = seqs.first_in(row.mentioning, low, latest) if row.mention_count else None


def derive_over(row: UnreadHand, base: int, latest: int) -> None:
    """Counts over (base, latest] from a hand known to be complete there."""
    row.unread_count = seqs.count_range(row.counting, base + 1, latest + 1)
    row.mention_count = seqs.count_range(row.mentioning, base + 1, latest + 1)
    row.mention_first = seqs.first_in(row.mentioning, base, latest) if row.mention_count else None
    row.unread_exact = True


def merge_stored(row: UnreadHand, messages: Sequence[StoredMessage], received_only: bool = True) -> None:
    """Fold MessageStore facts into the hand (idempotent: bitmaps)."""
    user = row.user_id
    received = row.received
    for message in messages:
        seq = message.conversation_seq
        if received_only and not seqs.has(received, seq):
            continue
        # With received_only, "recalled" is this user's own knowledge too (a recall fanned out to
        # other members only does not change this user's definition).
        if seqs.has(row.recalled, seq) or (message.recalled and not received_only):
            row.recalled = seqs.add(row.recalled, seq)
            row.counting = seqs.discard(row.counting, seq)
            row.mentioning = seqs.discard(row.mentioning, seq)
        elif message.sender_id != user and message.counts_unread:
            row.counting = seqs.add(row.counting, seq)
            if user in message.mentions:
                row.mentioning = seqs.add(row.mentioning, seq)
