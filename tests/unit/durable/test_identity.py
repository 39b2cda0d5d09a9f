from __future__ import annotations

import pytest

from tables.durable.identity import InputMismatch, check_identity, retention_overrun
from tables.durable.records import Checkpoint, InputIdentity, PersistId

TAKEN = InputIdentity("cluster-a", "topic-1", 4)
CHECKPOINT = Checkpoint(PersistId(2, 5), PersistId(2, 4), 1000, TAKEN)


def test_the_same_input_passes_and_no_checkpoint_checks_nothing() -> None:
    check_identity(CHECKPOINT, TAKEN, 3)
    check_identity(None, InputIdentity("other", "other", 1), 3)


@pytest.mark.parametrize(
    ("live", "named"),
    [
        (
            InputIdentity("cluster-b", "topic-1", 4),
            "cluster id 'cluster-a' (checkpoint) != 'cluster-b' (live)",
        ),
        (InputIdentity("cluster-a", "topic-2", 4), "mailbox-tail topic id"),
        (InputIdentity("cluster-a", "topic-1", 8), "mailbox-tail partition count 4 (checkpoint) != 8 (live)"),
    ],
)
def test_another_input_is_refused_in_one_line(live: InputIdentity, named: str) -> None:
    with pytest.raises(InputMismatch) as refused:
        check_identity(CHECKPOINT, live, 3)
    line = str(refused.value)
    assert "\n" not in line and named in line
    assert line.startswith("partition 3: checkpoint 2.5") and "projector rebuild" in line


def test_retention_overrun_is_a_log_start_past_the_checkpoint() -> None:
    assert retention_overrun(CHECKPOINT, 1000, 3) is None
    assert retention_overrun(CHECKPOINT, 0, 3) is None
    assert retention_overrun(None, 5000, 3) is None
    overrun = retention_overrun(CHECKPOINT, 1250, 3)
    assert overrun is not None and overrun.lost == 250
    assert str(overrun) == (
        "partition 3: mailbox-tail starts at 1250, the checkpoint needs 1000: 250 offsets deleted unread"
    )
