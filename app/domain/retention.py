"""Retention overrun (docs/contract.md §3.9, §10; docs/durability.md "The input's identity and
retention"): entries of mailbox-tail deleted before the worker applied them. The pure rules.

  overrun of partition p (log start past the checkpoint's next offset)
  → the projection epoch goes up by one, once per overrun: the overrun is named by its
    partition and the checkpoint's next offset it found (`overrun_mark`), so a worker that
    restarts over the same overrun (its checkpoint not yet past it) does not bump again
  → the API's reconcile slot is per epoch (`slot_reopened`): the slot holds the epoch it was
    claimed in, and a slot of an earlier epoch is free, so a user reconciled within the interval
    before the bump is reconciled again at the next login after it (counted as trigger "epoch")
  → the worker asks a reconcile of every user of p it knows (`partition_users`, sent in
    `request_chunks`), so users with an open stream are corrected without a login.

Known gap (seed 000 §1): a conversation that first appeared in the deleted entries and had no
message afterwards is in no state the reconcile reads: it stays missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

# Reconcile requests the worker sends per chunk after an overrun; the next chunk waits until this
# one is acknowledged and the reconcile runner's backlog is under a chunk (app/worker/retention.py),
# so a request is handled well within the age at which the runner drops it as stale (a minute at
# least: 200 reconciles of ~100 ms each is 20 s).
REQUEST_CHUNK: Final = 200


def overrun_mark(topic: str, partition: int) -> str:
    """The field under which the last overrun of a partition is remembered."""
    return f"{topic}/{partition}"


def is_new_overrun(remembered: int | None, checkpoint_next: int) -> bool:
    """An overrun bumps the epoch unless it is the one remembered for its partition: the same
    checkpoint's next offset means the same deleted range found again (a restart before the
    checkpoint moved past the log start); a log start that moved further meanwhile is still it."""
    return remembered != checkpoint_next


def slot_reopened(held_epoch: int, epoch: int) -> bool:
    """A reconcile slot held since an earlier epoch is free in `epoch` (a slot from before epochs
    is epoch 0's)."""
    return held_epoch < epoch


def slot_value(epoch: int, token: str) -> str:
    """What a reconcile slot holds: the epoch it was claimed in and the claimer's token."""
    return f"{epoch}:{token}"


def partition_users(row_users: Iterable[int], resident_users: Iterable[int]) -> list[int]:
    """The users of a partition the worker knows: those with a row in its state tables and those
    resident in memory (rows not persisted yet), each once, in ascending order."""
    return sorted({*row_users, *resident_users})


def request_chunks(users: list[int], size: int = REQUEST_CHUNK) -> Iterator[list[int]]:
    if size < 1:
        raise ValueError(f"chunk size must be positive, got {size}")
    for start in range(0, len(users), size):
        yield users[start : start + size]
