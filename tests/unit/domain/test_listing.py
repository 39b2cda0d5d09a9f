"""The list order of app/domain/listing.py: zones, folders, keyset positions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

import app.domain.listing as listing_module
from app.domain.client import sort_rows
from app.domain.listing import (
    Folder,
    Position,
    RowError,
    RowFields,
    Zone,
    arrange,
    build_folders,
    order,
    position_of,
)
from tests.support.rows import cid, expected_order, make_row, mixed_rows

# --------------------------------------------------------------------------------------------


def test_order_matches_the_client_library_sort() -> None:
    rows = mixed_rows(7, 800)
    folders, dropped, bad = build_folders(rows)
    assert dropped == 0 and bad == []
    for folder in Folder:
        got = [str(r["conversation_id"]) for r in folders[folder].rows]
        assert got == expected_order(rows, folder)


def test_zones_ranks_activity_and_ties() -> None:
    rows = [
        make_row(1, 1, act=5),
        make_row(1, 2, act=9),
        make_row(1, 3, act=None),
        make_row(1, 4, act=9),  # same activity as 2: conversation_id ASC breaks the tie
        make_row(1, 5, act=1, pin_rank=2),
        make_row(1, 6, act=7, pin_rank=0),
        make_row(1, 7, act=None, pin_rank=0),  # null activity sorts last within its zone
        make_row(1, 8, act=8, pin_rank=0),
    ]
    got = [r["conversation_id"] for r in order(rows).rows]
    assert got == [cid(8), cid(6), cid(7), cid(5), cid(2), cid(4), cid(1), cid(3)]


def test_unlisted_rows_are_absent_and_archived_rows_have_their_own_folder() -> None:
    rows = [make_row(1, 1, act=1), make_row(1, 2, act=2, listed=False), make_row(1, 3, act=3, archived=True)]
    folders, _, _ = build_folders(rows)
    assert [r["conversation_id"] for r in folders[Folder.MAIN].rows] == [cid(1)]
    assert [r["conversation_id"] for r in folders[Folder.ARCHIVED].rows] == [cid(3)]


def test_max_rows_keeps_the_head_of_the_order_main_first() -> None:
    rows = [make_row(1, n, act=n) for n in range(1, 11)] + [make_row(1, 100, act=1, archived=True)]
    folders, dropped, _ = build_folders(rows, max_rows=4)
    assert [r["conversation_id"] for r in folders[Folder.MAIN].rows] == [cid(10), cid(9), cid(8), cid(7)]
    assert len(folders[Folder.ARCHIVED]) == 0 and dropped == 7


def test_a_malformed_row_is_left_out_not_fatal() -> None:
    rows = [make_row(1, 1, act=1), {**make_row(1, 2, act=2), "pin_rank": "high"}, {"conversation_id": "x"}]
    folders, _, bad = build_folders(rows)
    assert [r["conversation_id"] for r in folders[Folder.MAIN].rows] == [cid(1)]
    assert len(bad) == 2 and "pin_rank 'high'" in bad[0]


def test_position_rejects_what_is_not_a_position() -> None:
    for broken in ({**make_row(1, 1), "last_activity_id": "zz"}, {**make_row(1, 1), "pin_rank": -1}):
        try:
            position_of(broken)
        except RowError:
            continue
        raise AssertionError(f"accepted {broken}")
    try:
        Position.checked(Zone.NORMAL, 3, None, bytes(16))
    except ValueError:
        pass
    else:
        raise AssertionError("a normal-zone position with a pin_rank")


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 3)),  # pin_rank
            st.one_of(st.none(), st.integers(0, 6)),  # activity
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 7),
)
def test_walking_by_keyset_gives_every_row_once_in_order(
    spec: list[tuple[int | None, int | None]], limit: int
) -> None:
    rows = [make_row(1, n + 1, act=a, pin_rank=p) for n, (p, a) in enumerate(spec)]
    ordered = order(rows)
    walked: list[object] = []
    position = None
    while True:
        start = ordered.after(position)
        page = ordered.rows[start : start + limit]
        if not page:
            break
        walked += [r["conversation_id"] for r in page]
        position = position_of(page[-1])
    assert walked == [r["conversation_id"] for r in sort_rows(rows)]
    for row, key in zip(ordered.rows, ordered.keys, strict=True):
        position = position_of(row)
        assert Position.of_key(key) == position and position.key == key
        assert all(type(part) in (int, bytes) for part in key)  # untracked by the GC


def listable_rows() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda n, p, a, archived, listed: make_row(1, n, act=a, pin_rank=p, archived=archived, listed=listed),
        st.integers(1, 60),
        st.one_of(st.none(), st.integers(0, 3)),
        st.one_of(st.none(), st.integers(0, 6)),
        st.booleans(),
        st.sampled_from([True, True, True, False]),
    )


@settings(max_examples=200)
@given(st.data())
def test_a_rearrangement_with_earlier_rows_equals_a_fresh_one(data: st.DataObject) -> None:
    """A reload keeps the rows an earlier arrangement placed that are unchanged since (the same
    objects) in their order; with any rows changed, added, removed, unlisted or archived since,
    and the earlier arrangement truncated or not, the result is the arrangement from scratch."""
    before = data.draw(
        st.lists(listable_rows(), min_size=0, max_size=40, unique_by=lambda r: r["conversation_id"])
    )
    first, _, _ = build_folders(before, data.draw(st.none() | st.integers(0, 50)))
    after = [r for r in before if data.draw(st.booleans())]  # some removed
    changed = data.draw(st.lists(listable_rows(), max_size=80, unique_by=lambda r: r["conversation_id"]))
    by_id = {r["conversation_id"]: r for r in after}
    by_id.update({r["conversation_id"]: r for r in changed})  # changed or added
    rows = data.draw(st.permutations(list(by_id.values())))
    present = Identities(rows)
    earlier = {folder: listing.kept(present) for folder, listing in first.items()}
    unchanged = Identities(row for listing in earlier.values() for row in listing.rows)
    max_rows = data.draw(st.none() | st.integers(0, 50))
    items = [(RowFields.of(row), row) for row in rows if row not in unchanged]
    # New rows inserted one by one into the earlier order, or (many of them) sorted in with it.
    with patch.object(listing_module, "_INSERTED_ONE_BY_ONE", data.draw(st.sampled_from([0, 64]))):
        again, dropped, bad = arrange(items, max_rows, earlier)
    fresh, fresh_dropped, fresh_bad = build_folders(rows, max_rows)
    assert {f: (o.rows, o.keys) for f, o in again.items()} == {f: (o.rows, o.keys) for f, o in fresh.items()}
    assert (dropped, bad) == (fresh_dropped, fresh_bad)
    if max_rows is None:  # nothing dropped: every unchanged row is kept as the same object
        kept = {id(row) for listing in again.values() for row in listing.rows}
        assert all(id(row) in kept for listing in earlier.values() for row in listing.rows)


class Identities:
    """Rows by identity (dicts are not hashable; the API matches its rows by their bytes)."""

    def __init__(self, rows: Iterable[object]) -> None:
        self.ids = {id(row) for row in rows}

    def __contains__(self, row: object) -> bool:
        return id(row) in self.ids
