"""The retention overrun's pure rules (app/domain/retention.py)."""

from __future__ import annotations

import pytest

from app.domain.retention import (
    is_new_overrun,
    overrun_mark,
    partition_users,
    request_chunks,
    slot_reopened,
    slot_value,
)


def test_an_overrun_found_again_at_the_same_checkpoint_is_not_new() -> None:
    assert is_new_overrun(None, 120)  # the partition's first
    assert not is_new_overrun(120, 120)  # a restart before the checkpoint moved past it
    assert is_new_overrun(120, 900)  # a later overrun of the same partition
    assert overrun_mark("mailbox-tail", 3) != overrun_mark("mailbox-tail", 4)


def test_a_slot_of_an_earlier_epoch_is_free() -> None:
    assert slot_reopened(0, 1) and slot_reopened(1, 4)
    assert not slot_reopened(1, 1) and not slot_reopened(2, 1)
    assert slot_value(3, "tok") == "3:tok"


def test_the_partition_users_are_each_once_ascending() -> None:
    assert partition_users([5, 5, 2, 9], [7, 2]) == [2, 5, 7, 9]
    assert partition_users([], []) == []


def test_requests_go_in_bounded_chunks_in_order() -> None:
    users = list(range(1, 12))
    chunks = list(request_chunks(users, 5))
    assert chunks == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11]]
    assert list(request_chunks([], 5)) == []
    with pytest.raises(ValueError):
        list(request_chunks(users, 0))
