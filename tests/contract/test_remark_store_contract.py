"""One contract for every RemarkStore (app/members/remarks.py): the in-memory one the unit tests
use and the Cassandra one (``member_remarks``) the API serves must answer the same.

Per viewer: a remark is the viewer's, never another viewer's; a batch read of 1 to 50 targets
returns exactly the targets the viewer has a remark on; a write replaces, a clear removes (and
clearing nothing is fine); ids across all of u64 round-trip exactly; bad input is refused before
anything is stored. The Cassandra parameter is an integration test (the real server; it fails,
never skips, when Cassandra is down); ``-m "not integration"`` runs the in-memory half alone.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.members.remarks import REMARK_MAX_CHARS, InMemoryRemarkStore, InvalidRemark, RemarkStore
from app.settings import Settings

U64_MAX = 2**64 - 1
T0 = 1_800_000_000_000


@pytest.fixture(scope="module")
def cassandra_keyspace(settings: Settings) -> Iterator[tuple[Any, str]]:
    """One keyspace with the project schema (``projector bootstrap``'s) for the module; tests
    keep apart by using fresh viewer ids. Created lazily: only the Cassandra parameter asks."""
    from app.cli.bootstrap import ensure_cassandra_schema
    from app.stores.cassandra_session import open_cluster

    host, port = settings.cassandra.cassandra_contact_points[0], settings.cassandra.cassandra_port
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        pytest.fail(f"Cassandra not reachable at {host}:{port}; run `make services-up`", pytrace=False)
    keyspace = f"t_remarks_{uuid.uuid4().hex[:10]}"
    ensure_cassandra_schema(settings.cassandra, keyspace=keyspace)
    cluster, session = open_cluster(settings.cassandra)
    try:
        yield session, keyspace
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("cassandra", marks=[pytest.mark.integration, pytest.mark.timeout(120)]),
    ]
)
def store(request: pytest.FixtureRequest) -> RemarkStore:
    if request.param == "memory":
        return InMemoryRemarkStore()
    from app.stores.cassandra_remarks import CassandraRemarkStore

    session, keyspace = request.getfixturevalue("cassandra_keyspace")
    return CassandraRemarkStore(session, keyspace)


@pytest.fixture
def viewer() -> Iterator[int]:
    """A fresh viewer id per test (the Cassandra keyspace is shared by the module's tests)."""
    yield random.randrange(1, 2**63)


async def test_a_remark_is_the_viewers_own(store: RemarkStore, viewer: int) -> None:
    other_viewer = viewer + 1
    await store.set_remark(viewer, 10, "my note on 10", T0)
    await store.set_remark(other_viewer, 10, "their note on 10", T0)
    assert await store.remarks(viewer, [10]) == {10: "my note on 10"}
    assert await store.remarks(other_viewer, [10]) == {10: "their note on 10"}
    # The target's own view of itself knows nothing of what others wrote about it.
    assert await store.remarks(10, [viewer, other_viewer, 10]) == {}


async def test_a_batch_returns_exactly_the_targets_with_a_remark(store: RemarkStore, viewer: int) -> None:
    targets = list(range(1000, 1050))  # 50: the batch bound
    with_remark = targets[::3]
    for t in with_remark:
        await store.set_remark(viewer, t, f"note {t}", T0)
    await store.set_remark(viewer, 5000, "not asked", T0)
    assert await store.remarks(viewer, targets) == {t: f"note {t}" for t in with_remark}
    assert await store.remarks(viewer, [targets[0], targets[0]]) == {targets[0]: f"note {targets[0]}"}
    assert await store.remarks(viewer, [1001]) == {}
    assert await store.remarks(viewer, []) == {}


async def test_a_write_replaces_and_a_clear_removes(store: RemarkStore, viewer: int) -> None:
    await store.set_remark(viewer, 7, "first", T0)
    await store.set_remark(viewer, 7, "second", T0 + 1)
    assert await store.remarks(viewer, [7]) == {7: "second"}
    await store.clear_remark(viewer, 7)
    assert await store.remarks(viewer, [7]) == {}
    await store.clear_remark(viewer, 7)  # nothing to clear: not an error
    await store.clear_remark(viewer, 8)
    await store.set_remark(viewer, 7, "again", T0 + 2)  # a cleared remark can be set again
    assert await store.remarks(viewer, [7, 8]) == {7: "again"}


async def test_u64_ids_and_unicode_round_trip_exactly(store: RemarkStore, viewer: int) -> None:
    note = "备" * REMARK_MAX_CHARS
    await store.set_remark(U64_MAX, 0, "zero", T0)
    await store.set_remark(viewer, U64_MAX, note, T0)
    await store.set_remark(viewer, 2**53 + 1, "👩‍💻 2^53+1", T0)  # a JS number would round it
    assert await store.remarks(U64_MAX, [0]) == {0: "zero"}
    assert await store.remarks(viewer, [U64_MAX, 2**53 + 1, 2**53]) == {
        U64_MAX: note,
        2**53 + 1: "👩‍💻 2^53+1",
    }


async def test_bad_input_is_refused_before_anything_is_stored(store: RemarkStore, viewer: int) -> None:
    with pytest.raises(ValueError, match="at most 50"):
        await store.remarks(viewer, list(range(51)))
    for bad_id in (-1, U64_MAX + 1):
        with pytest.raises(ValueError, match="user id"):
            await store.remarks(bad_id, [1])
        with pytest.raises(ValueError, match="user id"):
            await store.set_remark(viewer, bad_id, "x", T0)
        with pytest.raises(ValueError, match="user id"):
            await store.clear_remark(viewer, bad_id)
    for bad_remark in ("", "  padded  ", "two\nlines", "x" * (REMARK_MAX_CHARS + 1)):
        with pytest.raises(InvalidRemark):
            await store.set_remark(viewer, 3, bad_remark, T0)
    assert await store.remarks(viewer, [3]) == {}
