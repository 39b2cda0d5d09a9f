"""Reconcile (seed §3.4, issue 7) in the pure core: the triggers recompute the row (never zero it)
and the user's badge in full, so drift accumulated by the deltas is cancelled.

Drift cannot arise from correct entries, so these tests plant it in the projector's state, as a
bug or a bit flip would, and check that each trigger takes it out."""

from __future__ import annotations

from app.domain.badge import Badge, full_recompute
from app.domain.entries import DeadLetter, Entry, WatermarkMarker, decode_record
from app.domain.projector import Projector, ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore
from tests.support.builders import CONV_A, CONV_B, StreamBuilder

ME = 7
DRIFTED = Badge(999, 77, 5)


def entries(stream: StreamBuilder) -> list[Entry]:
    out = []
    for raw in stream.lines:
        decoded = decode_record(raw, stream.lanes)
        assert not isinstance(decoded, DeadLetter | WatermarkMarker), decoded
        out.append(decoded)
    return out


def applied(stream: StreamBuilder, projector: Projector | None = None) -> Projector:
    projector = projector or Projector(ProjectorConfig(), InMemoryMessageStore())
    for entry in entries(stream):
        projector.apply(entry, entry.ts)
    stream.lines = []
    return projector


def backlog() -> tuple[StreamBuilder, Projector]:
    """Ten messages in A (two mention me), three in B; all flushed."""
    s = StreamBuilder()
    for seq in range(1, 11):
        s.message(ME, seq, mention=seq in (3, 8))
    for seq in range(1, 4):
        s.message(ME, seq, conv=CONV_B)
    projector = applied(s)
    projector.flush()
    return s, projector


def test_a_read_below_the_head_recomputes_the_row_and_the_badge_in_full() -> None:
    s, projector = backlog()
    user = projector.users[ME]
    user.badge = DRIFTED
    s.read(ME, 4)  # another device read up to 4 of 10: recompute, never zero
    applied(s, projector)
    (batch,) = projector.flush()
    (row,) = batch.rows
    assert (row["unread_count"], row["unread_exact"], row["mention_count"]) == (6, True, 1)
    assert row["mention_first_conversation_seq"] == 8
    assert batch.badge == Badge(6 + 3, 1, 0) == full_recompute(user.rows.values(), False)
    assert batch.badge_update()["total_unread"] == 9  # the frame carries the absolute value


def test_a_read_below_the_head_corrects_a_drifted_row_from_the_hand() -> None:
    s, projector = backlog()
    row = projector.users[ME].rows[CONV_A]
    row.unread_count, row.mention_count = 0, 0  # planted: a zeroed row, the bug the seed names
    s.read(ME, 2)
    applied(s, projector)
    (batch,) = projector.flush()
    assert (batch.rows[0]["unread_count"], batch.rows[0]["mention_count"]) == (8, 2)
    assert batch.badge == Badge(8 + 3, 2, 0)


def test_a_read_up_to_the_head_zeroes_without_a_reconcile() -> None:
    """Base reaching the head is the seed's case (b): zero is the definition's value there, and
    the badge follows by delta (no full recompute is needed for it)."""
    s, projector = backlog()
    s.read(ME, 10)
    applied(s, projector)
    assert projector.users[ME].badge_reconcile is False
    (batch,) = projector.flush()
    assert batch.rows[0]["unread_count"] == 0
    assert batch.badge == Badge(3, 0, 0)


def test_a_read_that_does_not_move_the_base_is_no_reconcile() -> None:
    s, projector = backlog()
    s.read(ME, 5)
    applied(s, projector)
    projector.flush()
    s.read(ME, 4)  # a lagging device: read_seq = max(...), nothing moves
    applied(s, projector)
    assert projector.users[ME].badge_reconcile is False
    (batch,) = projector.flush()
    assert batch.rows[0]["unread_count"] == 5


def test_mailbox_dirty_recomputes_the_row_and_the_badge_in_full() -> None:
    s, projector = backlog()
    user = projector.users[ME]
    user.badge = DRIFTED
    user.rows[CONV_B].unread_count = 40  # planted drift in the row the entry names
    s.entry("mailbox_dirty", ME, CONV_B)
    applied(s, projector)
    (batch,) = projector.flush()
    assert batch.rows[0]["conversation_id"] == CONV_B and batch.rows[0]["unread_count"] == 3
    assert batch.badge == Badge(10 + 3, 2, 0)
    assert batch.projection_mailbox_seq == s.seq  # a new version: clients take the frame


def test_the_badge_is_recomputed_once_per_flush_and_deltas_go_on_after_it() -> None:
    s, projector = backlog()
    s.read(ME, 4)
    applied(s, projector)
    projector.flush()
    user = projector.users[ME]
    assert user.badge_reconcile is False
    s.message(ME, 11)
    applied(s, projector)
    (batch,) = projector.flush()
    assert batch.badge == Badge(7 + 3, 1, 0)


def test_a_restart_recomputes_every_badge_in_full() -> None:
    """A restore replays from an older checkpoint (seed §3.4): badges come back as the sum of
    their rows, whatever the checkpoint held."""
    _, projector = backlog()
    state = projector.dump()
    for user_state in state["users"]:
        user_state["badge"] = list(DRIFTED.counts)
    restored = Projector.restore(projector.config, projector.store, state)
    assert restored.badge_of(ME) == Badge(10 + 3, 2, 0)
    assert restored.dirty.row_count == 0  # everything was flushed: nothing to write again
