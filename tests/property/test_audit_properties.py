"""Properties of the unread audit's pure core, as named invariants (issue 7):

* `sample_is_order_independent`: the rows a round picks do not depend on the scan order.
* `sample_is_the_lowest_draws_below_the_rate`: eligible rows drawn below the rate, at most
  max_rows of them, the lowest draws first (the cap is uniform, never "the first users").
* `correct_rows_recount_to_themselves`: on any stream, every row the audit could pick recounts
  from the MessageStore to exactly its counts (an audit of a correct projection finds nothing).
* `recount_undoes_any_drift`: whatever happened to a row's counts and hand, its recount is the
  definition again.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain import seqs
from app.domain.audit import AuditPolicy, Sampler, copy_row, counts, eligible, keyed_draw, recount
from app.domain.conversation import ConversationState
from app.replay import Replayer, ReplayOptions
from tests.support.strategies import Stream, scenarios, streams

SLOW = settings(
    max_examples=200,
    deadline=None,  # whole streams per example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def replay(stream: Stream) -> Replayer:
    replayer = Replayer(ReplayOptions(lanes=stream.lanes), lambda frame: None)
    replayer.feed_many(line for line in stream.lines() if line.strip())
    replayer.finish()
    return replayer


def auditable(replayer: Replayer) -> list[ConversationState]:
    """Rows one bounded read can recount (unread or not: a zero must recount to zero too)."""
    rows = [row for user in replayer.projector.users.values() for row in user.rows.values()]
    return [row for row in rows if row.unread_exact and row.latest - row.base <= 200]


rows_strategy = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 3), st.integers(0, 5), st.integers(0, 100)),
    max_size=60,
    unique_by=lambda t: (t[0], t[1]),
)


def make_rows(spec: list[tuple[int, int, int, int]]) -> list[ConversationState]:
    rows = []
    for user_id, conv, unread, changed_at in spec:
        row = ConversationState(user_id, f"{conv:08x}-0000-4000-8000-{conv:012x}")
        row.unread_count, row.head_seq, row.changed_at = unread, 5, changed_at
        rows.append(row)
    return rows


@settings(max_examples=300, deadline=None)
@given(
    spec=rows_strategy,
    rate=st.sampled_from((0.0, 0.1, 0.5, 1.0)),
    max_rows=st.integers(1, 20),
    salt=st.integers(0, 2**128 - 1),
    order=st.randoms(use_true_random=False),
)
def test_the_sample(
    spec: list[tuple[int, int, int, int]], rate: float, max_rows: int, salt: int, order: random.Random
) -> None:
    policy = AuditPolicy(sample_rate=rate, idle_ms=40, max_rows=max_rows)
    rows = make_rows(spec)
    draw = keyed_draw(salt)

    def pick(offered: list[ConversationState]) -> list[tuple[int, str]]:
        sampler = Sampler(policy, now_ms=100, draw=draw)
        for row in offered:
            sampler.offer(row)
        return [(r.user_id, r.conversation_id) for r in sampler.chosen()]

    picked = pick(rows)
    shuffled = list(rows)
    order.shuffle(shuffled)
    assert pick(shuffled) == picked, "sample_is_order_independent"
    below = sorted(
        (draw(r.user_id, r.conversation_id), r.user_id, r.conversation_id)
        for r in rows
        if eligible(r, 100, policy) and draw(r.user_id, r.conversation_id) < rate
    )
    want = sorted((user, conv) for _, user, conv in below[:max_rows])
    assert picked == want, "sample_is_the_lowest_draws_below_the_rate"


@SLOW
@given(stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))))
def test_correct_rows_recount_to_themselves(stream: Stream) -> None:
    replayer = replay(stream)
    for row in auditable(replayer):
        copy = copy_row(row)
        recount(copy, replayer.store, 200)
        assert counts(copy) == counts(row), ("correct_rows_recount_to_themselves", row.as_row())


@SLOW
@given(stream=streams(), seed=st.integers(0, 2**32 - 1))
def test_recount_undoes_any_drift(stream: Stream, seed: int) -> None:
    replayer = replay(stream)
    rnd = random.Random(seed)
    for row in auditable(replayer):
        truth = counts(row)
        drifted = copy_row(row)
        # Counts and hand both off, in a way that agrees with itself: nothing left to notice.
        drifted.unread_count = rnd.randint(0, 300)
        drifted.mention_count = rnd.randint(0, 5)
        drifted.mention_first = rnd.choice((None, 1, row.latest))
        for _ in range(rnd.randint(0, 4)):
            seq = rnd.randint(row.base + 1, row.base + 201)
            if rnd.random() < 0.5:
                drifted.counting = seqs.add(drifted.counting, seq)
            else:
                drifted.counting = seqs.discard(drifted.counting, seq)
            if rnd.random() < 0.5:
                drifted.mentioning = seqs.add(drifted.mentioning, seq)
            else:
                drifted.mentioning = seqs.discard(drifted.mentioning, seq)
        recount(drifted, replayer.store, 200)
        assert counts(drifted) == truth, ("recount_undoes_any_drift", row.as_row())
