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
