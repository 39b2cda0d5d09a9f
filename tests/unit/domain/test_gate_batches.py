"""The batch paths of the gate and the arrival ledger (issue 14) against their one-at-a-time
forms: `WatermarkGate.offer_run` takes a segment whole only when offering it entry by entry
would put every entry at the run's end, and `ArrivalLedger.received_all` counts like
`received`; the releases, waiting entries and counts stay the same whatever the arrival order."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.arrivals import ArrivalLedger
from app.domain.entries import Entry, ReadEntry, WatermarkMarker
from app.domain.watermark import Offer, WatermarkGate

LANES = 3
CID = "00000000-0000-0000-0000-000000000001"


def entry(user_id: int, seq: int) -> Entry:
    return ReadEntry(
        mailbox_seq=seq,
        lane=user_id % LANES,
        ts=seq,
        event_id=f"e{seq}",
        user_id=user_id,
        conversation_id=CID,
        read_conversation_seq=0,
    )


# A stream: segments of (user, seq) entries (mostly ascending, with repeats and disorder), each
# followed by markers (lane, watermark).
SEGMENT = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 60)), min_size=1, max_size=12)
ASCENDING = st.lists(st.integers(1, 6), min_size=1, max_size=12).flatmap(
    lambda users: st.integers(1, 40).map(lambda start: [(u, start + i) for i, u in enumerate(users)])
)
MARKERS = st.lists(st.tuples(st.integers(0, LANES - 1), st.integers(0, 70)), max_size=3)
STREAM = st.lists(st.tuples(st.one_of(SEGMENT, ASCENDING), MARKERS), min_size=1, max_size=10)


def run(stream: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]], batched: bool) -> list[object]:
    gate = WatermarkGate(LANES)
    ledger = ArrivalLedger(LANES)
    log: list[object] = []
    for segment, markers in stream:
        entries = [entry(user, seq) for user, seq in segment]
        seqs = [e.mailbox_seq for e in entries]
        increasing = all(a < b for a, b in pairwise(seqs))
        if batched and increasing and gate.offer_run(entries, seqs[0], seqs[-1]):
            ledger.received_all(entries)
            log.append(("run", len(entries)))
        else:
            for e in entries:
                offer = gate.offer(e)
                if offer is Offer.PENDING:
                    ledger.received(e.lane, e.mailbox_seq)
                pending = offer is Offer.PENDING
                log.append(("run", 1) if pending else (offer.value, e.user_id, e.mailbox_seq))
        for lane, watermark in markers:
            released = gate.mark(WatermarkMarker(lane=lane, watermark=watermark, ts=1))
            ledger.marked(lane, watermark, None)
            log.append([(e.user_id, e.mailbox_seq) for e in released])
    log.append([(e.user_id, e.mailbox_seq) for e in gate.waiting()])
    log.append((gate.pending_count, ledger.counted, ledger.above))
    return log


def merged(log: list[object]) -> list[object]:
    """Consecutive ("run", n) items summed: a segment taken whole logs one item for n entries."""
    out: list[object] = []
    for item in log:
        if isinstance(item, tuple) and item[0] == "run" and out:
            last = out[-1]
            if isinstance(last, tuple) and last[0] == "run":
                out[-1] = ("run", last[1] + item[1])
                continue
        out.append(item)
    return out


@settings(max_examples=300, deadline=None)
@given(stream=STREAM)
def test_batched_offers_release_and_count_like_single_ones(
    stream: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]],
) -> None:
    assert merged(run(stream, batched=True)) == merged(run(stream, batched=False))


def test_a_segment_below_the_run_end_is_refused_whole() -> None:
    gate = WatermarkGate(1)
    first = [entry(1, 5), entry(2, 6)]
    assert gate.offer_run(first, 5, 6)
    later = [entry(3, 6), entry(4, 7)]  # starts at the run's end: entry by entry
    assert not gate.offer_run(later, 6, 7)
    assert gate.pending_count == 2


def test_the_ledger_keeps_seqs_arriving_out_of_order_sorted() -> None:
    ledger = ArrivalLedger(1)
    for seq in (10, 12, 11, 15, 13):
        ledger.received(0, seq)
    assert ledger.above[0] == [10, 11, 12, 13, 15]
    ledger.marked(0, 12, None)
    assert ledger.counted[0] == 3 and ledger.above[0] == [13, 15]
