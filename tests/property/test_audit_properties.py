"""Properties of the unread audit's pure core, as named invariants (issue 7):

* `sample_is_order_independent`: the rows a round picks do not depend on the scan order.
* `sample_is_the_lowest_draws_below_the_rate`: eligible rows drawn below the rate, at most
  max_rows of them, the lowest draws first (the cap is uniform, never "the first users").
* `correct_rows_recount_to_themselves`: on any stream, every row the audit could pick recounts
  from the MessageStore to exactly its counts (an audit of a correct projection finds nothing).
* `recount_undoes_any_drift`: whatever happened to a row's counts and hand, its recount is the
  definition again.
* `sweep_covers_the_key_space`: the key-range sampler, from any start key, over any keys
  (clustered or spread user ids, any UUIDs), any slice, share and cap: no tick reads more than
  its slice, no row is read twice in a round, every row is read within ceil(rows / rows a round
  reads) rounds, and (rate = share) every auditable row is drawn by then; rows at half the share
  are all drawn within 40 sweeps.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain import seqs
from app.domain.audit import (
    START_KEY_BITS,
    AuditPolicy,
    KeyRangeSampler,
    Sampler,
    copy_row,
    counts,
    eligible,
    keyed_draw,
    number_key,
    recount,
    round_budget,
    start_key,
)
from app.domain.conversation import ConversationState
from app.replay import Replayer, ReplayOptions
from tests.support.row_range import ListRange, key_of
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


# -- the key-range sampler ------------------------------------------------------------------------

_user_ids = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1))
row_keys_strategy = st.lists(
    st.tuples(_user_ids, st.integers(0, 2**128 - 1)), min_size=1, max_size=300, unique=True
)


def sweep_rows(keys: list[tuple[int, int]], unread_every: int) -> list[ConversationState]:
    rows = []
    for n, (user_id, low) in enumerate(keys):
        row = ConversationState(*number_key(user_id * 2**128 + low))
        if unread_every and n % unread_every == 0:
            row.unread_count, row.head_seq = 1, 1
        rows.append(row)
    return rows


def audit_round(
    sweep: KeyRangeSampler, store: ListRange, policy: AuditPolicy, slice_rows: int, salt: int
) -> list[tuple[int, str]]:
    """One round as app/worker/audit.sweep_round drives it: the round's budget in ticks of at most
    `slice_rows`, up to `max_rows` drawn; the keys read, in order."""
    budget = round_budget(store.estimated_rows(), policy)
    draw = keyed_draw(salt)
    sweep.begin_round()
    drawn = 0
    read: list[tuple[int, str]] = []
    while budget > 0 and drawn < policy.max_rows:
        mark = len(store.reads)
        tick = sweep.tick(store, min(slice_rows, budget), 0, policy, draw, policy.max_rows - drawn)
        # Bounded work per tick: no store read returns more than the slice, and the tick counts
        # what it read (a read past where the round began is read but not counted).
        assert tick.read <= slice_rows and max(store.reads[mark:], default=0) <= slice_rows
        assert sum(store.reads[mark:]) >= tick.read
        budget -= tick.read
        drawn += len(tick.chosen)
        read += [key_of(row) for row in tick.chosen]
        if tick.swept or tick.read == 0:
            break
    return read


@settings(max_examples=300, deadline=None)
@given(
    keys=row_keys_strategy,
    unread_every=st.integers(0, 3),  # 0: every row at 0 unread
    share=st.sampled_from((0.003, 0.1, 0.37, 1.0)),
    slice_rows=st.integers(1, 40),
    max_rows=st.integers(1, 400),
    pick=st.integers(0, 2**START_KEY_BITS - 1),
    overestimate=st.integers(1, 3),
)
def test_sweep_covers_the_key_space(
    keys: list[tuple[int, int]],
    unread_every: int,
    share: float,
    slice_rows: int,
    max_rows: int,
    pick: int,
    overestimate: int,
) -> None:
    rows = sweep_rows(keys, unread_every)
    store = ListRange(rows, overestimate)
    bounds = store.key_bounds()
    assert bounds is not None
    # Rate = share for both kinds: every row read is drawn, so drawn = read.
    policy = AuditPolicy(sample_rate=share, idle_ms=0, max_rows=max_rows, zero_sample_rate=share)
    sweep = KeyRangeSampler(start_key(bounds, pick))
    # A round reads its budget (of the estimate), up to the cap, never more than every row once.
    per_round = min(round_budget(store.estimated_rows(), policy), max_rows, len(rows))
    rounds = -(-len(rows) // per_round)
    seen: set[tuple[int, str]] = set()
    for n in range(rounds):
        read = audit_round(sweep, store, policy, slice_rows, salt=n)
        assert len(read) == len(set(read)), "sweep_covers_the_key_space: a row read twice in a round"
        assert len(read) == per_round
        seen.update(read)
    assert seen == set(store.keys), "sweep_covers_the_key_space"


@settings(max_examples=100, deadline=None)
@given(
    keys=row_keys_strategy,
    share=st.sampled_from((0.1, 0.5, 1.0)),
    slice_rows=st.integers(1, 40),
    pick=st.integers(0, 2**START_KEY_BITS - 1),
    salt=st.integers(0, 2**64),
)
def test_at_half_the_share_every_row_is_drawn_within_40_sweeps(
    keys: list[tuple[int, int]], share: float, slice_rows: int, pick: int, salt: int
) -> None:
    """Rows with unread at the share (drawn whenever read), rows at 0 at half of it: drawn with
    probability 1/2 each time read (a fresh salt each round), missed by 40 sweeps with
    probability 2^-40."""
    rows = sweep_rows(keys, unread_every=2)
    store = ListRange(rows)
    bounds = store.key_bounds()
    assert bounds is not None
    policy = AuditPolicy(sample_rate=share, idle_ms=0, max_rows=10**6, zero_sample_rate=share / 2)
    sweep = KeyRangeSampler(start_key(bounds, pick))
    rounds = 40 * -(-len(rows) // round_budget(len(rows), policy))
    drawn: set[tuple[int, str]] = set()
    for n in range(rounds):
        drawn.update(audit_round(sweep, store, policy, slice_rows, salt=salt + n))
    assert drawn == set(store.keys), "sweep_covers_the_key_space"
