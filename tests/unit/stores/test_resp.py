"""The packed EVALSHA trip (app/stores/resp.py) is byte for byte what redis-py would send for the
batched script's single call."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from app.stores.resp import pack_evalsha_batch

texts = st.text(min_size=0, max_size=30)
calls = st.lists(
    st.tuples(
        st.lists(texts, min_size=1, max_size=3),
        st.lists(st.one_of(texts, st.binary(max_size=40)), max_size=8),
    ),
    min_size=1,
    max_size=6,
)


def _redis_py_packs(sha: str, calls: list[tuple[list[str], list[str | bytes]]]) -> bytes:
    """The batched script's single EVALSHA as redis-py packs it."""
    keys = [key for call_keys, _ in calls for key in call_keys]
    counts = [str(len(calls))]
    for call_keys, call_args in calls:
        counts += [str(len(call_keys)), str(len(call_args))]
    args = [arg for _, call_args in calls for arg in call_args]
    return b"".join(Connection().pack_command("EVALSHA", sha, len(keys), *keys, *counts, *args))


@given(calls=calls)
def test_the_packed_trip_is_what_redis_py_packs(calls: list[tuple[list[str], list[str | bytes]]]) -> None:
    sha = "a" * 40
    assert pack_evalsha_batch(sha, calls) == _redis_py_packs(sha, calls)


def test_counts_past_the_table_of_small_ones_are_packed_too() -> None:
    # A heavy user's flush: hundreds of rows, two args each (the small-count table stops at 255).
    sha = "b" * 40
    calls: list[tuple[list[str], list[str | bytes]]] = [
        (["rows", "meta"], [str(n) for n in range(600)]),
        (["k"], []),
        ([f"key{n}" for n in range(256)], [b"x"] * 255),
    ]
    assert pack_evalsha_batch(sha, calls) == _redis_py_packs(sha, calls)
