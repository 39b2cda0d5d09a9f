"""The packed EVALSHA trip (app/stores/resp.py) is byte for byte what redis-py would send."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from app.stores.resp import pack_evalsha

texts = st.text(min_size=0, max_size=30)
calls = st.lists(
    st.tuples(
        st.lists(texts, min_size=1, max_size=3),
        st.lists(st.one_of(texts, st.binary(max_size=40)), max_size=8),
    ),
    min_size=1,
    max_size=6,
)


@given(calls=calls)
def test_the_packed_trip_is_what_redis_py_packs(calls: list[tuple[list[str], list[str | bytes]]]) -> None:
    sha = "a" * 40
    connection = Connection()
    expected = b"".join(
        connection.pack_commands([("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls])
    )
    assert pack_evalsha(sha, calls) == expected
