"""Is this checkpoint about the input we are about to read? Pure checks; the lookups they need
(cluster id, topic id, partition count, log start offset) are in `tables.durable.kafka`."""

from __future__ import annotations

from dataclasses import dataclass

from tables.durable.records import Checkpoint, InputIdentity


class InputMismatch(Exception):
    """The checkpoint names another input than the live one: its offsets mean nothing there.
    The worker says so in one line (str of this) and exits non-zero; `projector rebuild` is the
    way on. Applying the new input from the checkpoint's offset would skip its entries as
    "already applied"."""


def check_identity(checkpoint: Checkpoint | None, live: InputIdentity, partition: int) -> None:
    """Raise `InputMismatch` when the checkpoint was taken on another cluster, another
    incarnation of the mailbox-tail topic, or another partition count. No checkpoint: nothing
    to check (a partition's first start)."""
    if checkpoint is None:
        return
    taken = checkpoint.identity
    differences = [
        f"{name} {was!r} (checkpoint) != {now!r} (live)"
        for name, was, now in (
            ("cluster id", taken.cluster_id, live.cluster_id),
            ("mailbox-tail topic id", taken.topic_id, live.topic_id),
            ("mailbox-tail partition count", taken.partition_count, live.partition_count),
        )
        if was != now
    ]
    if differences:
        raise InputMismatch(
            f"partition {partition}: checkpoint {checkpoint.persist} is of another input: "
            + "; ".join(differences)
            + "; run `projector rebuild` to start this state over"
        )


@dataclass(frozen=True, slots=True)
class RetentionOverrun:
    """Entries the state never applied were deleted from mailbox-tail (retention, or records
    deleted by hand): offsets [input_next_offset, log_start) are gone."""

    partition: int
    input_next_offset: int
    log_start: int

    @property
    def lost(self) -> int:
        return self.log_start - self.input_next_offset

    def __str__(self) -> str:
        return (
            f"partition {self.partition}: mailbox-tail starts at {self.log_start}, the checkpoint "
            f"needs {self.input_next_offset}: {self.lost} offsets deleted unread"
        )


def retention_overrun(
    checkpoint: Checkpoint | None, log_start: int, partition: int
) -> RetentionOverrun | None:
    """The overrun, when the input's log start is past the checkpoint's next offset."""
    if checkpoint is None or log_start <= checkpoint.input_next_offset:
        return None
    return RetentionOverrun(partition, checkpoint.input_next_offset, log_start)
