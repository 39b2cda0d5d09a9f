"""The compact seq sets (app/domain/seqs.py) behave as a plain set of ints through every
representation change: array -> 32-bit roaring -> 64-bit roaring, and through dump/load."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.domain import seqs

SEQ = st.one_of(st.integers(1, 120), st.integers(1, 2**64 - 2), st.integers(2**32 - 3, 2**32 + 3))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), SEQ),
        st.tuples(st.just("discard"), SEQ),
        st.tuples(st.just("add_range"), SEQ, st.integers(0, 70)),
        st.tuples(st.just("remove_range"), SEQ, st.integers(0, 2**33)),
        st.tuples(st.just("roundtrip")),
    ),
    max_size=120,
)


@given(ops=OPS, probes=st.lists(SEQ, max_size=10))
def test_every_representation_behaves_as_a_set(ops: list[tuple[object, ...]], probes: list[int]) -> None:
    model: set[int] = set()
    value: seqs.Seqs = None
    for op in ops:
        name = op[0]
        if name == "add":
            seq = int(op[1])  # type: ignore[call-overload]
            value = seqs.add(value, seq)
            model.add(seq)
        elif name == "discard":
            seq = int(op[1])  # type: ignore[call-overload]
            value = seqs.discard(value, seq)
            model.discard(seq)
        elif name == "add_range":
            low = int(op[1])  # type: ignore[call-overload]
            high = min(low + int(op[2]), 2**64 - 1)  # type: ignore[call-overload]
            value = seqs.add_range(value, low, high)
            model.update(range(low, high))
        elif name == "remove_range":
            low = int(op[1])  # type: ignore[call-overload]
            high = low + int(op[2])  # type: ignore[call-overload]
            value = seqs.remove_range(value, low, high)
            model = {s for s in model if not low <= s < high}
        else:
            value = seqs.load(seqs.dump(value))
        ordered = sorted(model)
        assert seqs.size(value) == len(model)
        assert seqs.highest(value) == (ordered[-1] if ordered else None)
        for probe in [*probes, *ordered[:3]]:
            assert seqs.has(value, probe) == (probe in model)
            assert seqs.rank(value, probe) == sum(1 for s in model if s <= probe)
            assert seqs.count_range(value, probe, probe + 1000) == sum(
                1 for s in model if probe <= s < probe + 1000
            )
            after = [s for s in ordered if probe < s <= probe + 500]
            assert seqs.first_in(value, probe, probe + 500) == (after[0] if after else None)
        for low, width in [(p, w) for p in probes[:3] for w in (1, 2**33)]:
            inside = sum(1 for s in model if low <= s < low + width)
            assert seqs.count_range(value, low, low + width) == inside  # past 2^64 too
        if ordered:
            assert seqs.at(value, len(ordered) - 1) == ordered[-1]  # type: ignore[arg-type]
        copied = seqs.copy(value)
        assert seqs.size(copied) == len(model)


def test_a_full_array_widens_when_the_seq_that_overflows_it_is_past_2_to_the_32() -> None:
    """48 small seqs (SMALL_MAX) then one >= 2^32: the array becomes a roaring set that must hold
    64-bit values (a 32-bit one raised OverflowError: a valid record crashed the processor)."""
    full: seqs.Seqs = None
    for seq in range(1, seqs.SMALL_MAX + 1):
        full = seqs.add(full, seq)
    assert isinstance(full, bytes)
    big = 2**40
    grown = seqs.add(full, big)
    assert seqs.has(grown, big) and seqs.size(grown) == seqs.SMALL_MAX + 1
    grown, new = seqs.added(full, big)
    assert new and seqs.has(grown, big) and seqs.size(grown) == seqs.SMALL_MAX + 1
    assert seqs.added(grown, big)[1] is False


@given(steps=st.lists(st.integers(-3, 40), max_size=130), start=st.integers(1, 2**32 + 5))
def test_added_in_mostly_ascending_order_matches_a_set_and_the_packed_layout(
    steps: list[int], start: int
) -> None:
    """`added` with the seqs a row sees (ascending, some repeats and a few behind): the same
    set and the same 'new' answers as a plain set, and while small the packed bytes are the
    sorted seqs as an array('Q') (the layout dump writes and older records hold)."""
    from array import array

    model: set[int] = set()
    value: seqs.Seqs = None
    seq = start
    seen: list[int] = []
    for step in steps:
        seq = max(1, seq + step)
        seen.append(seq)
        value, new = seqs.added(value, seq)
        assert new == (seq not in model)
        model.add(seq)
        assert seqs.size(value) == len(model)
        if isinstance(value, bytes):
            assert value == array("Q", sorted(model)).tobytes()
        assert seqs.highest(value) == max(model)
    plain: seqs.Seqs = None
    for each in seen:
        plain = seqs.add(plain, each)
    assert seqs.size(plain) == len(model)
