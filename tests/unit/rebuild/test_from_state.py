"""`projector rebuild --from-state` without servers: users rebuilt from state (fakes of
UserConversationState and the MessageStore heads) into a fresh in-memory namespace equal the
live (replayed) projection on every field state can know; the diff finds what differs."""

from __future__ import annotations

import io
import os
from typing import Any, cast

import pytest

from app.cli.rebuild import _user_list
from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.metrics import exposition, sample
from app.rebuild.diff import diff_namespaces
from app.rebuild.from_state import UNKNOWABLE_FROM_STATE, rebuild_from_state
from app.rebuild.progress import Progress
from app.replay import Replayer, ReplayOptions
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.rebuild import FakeHeads, state_of

ME, OTHER = 7, 8


class FakeState:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def load_user(self, user_id: int) -> list[dict[str, Any]]:
        return [
            {"conversation_id": r["conversation_id"], **state_of(r), "updated_mailbox_seq": 1}
            for r in self.rows
            if r["user_id"] == user_id
        ]


def scenario() -> tuple[Replayer, Any]:
    s = StreamBuilder()
    for seq in range(1, 8):
        for user in (ME, OTHER):
            s.message(user, seq, conv=CONV_A, mention=seq == 6)
            s.message(user, seq, conv=CONV_B, sender=user if seq == 3 else 99)
    s.read(ME, 4, conv=CONV_A)
    for user in (ME, OTHER):  # a recall reaches every member (the MessageStore marks it for all)
        s.recall(user, 5, conv=CONV_A)
    s.entry("pin", ME, CONV_A, pin_rank=3)
    s.entry("clear_history", ME, CONV_B, hidden_before_conversation_seq=6)
    s.entry("delete_conversation", OTHER, CONV_B, deleted_before_conversation_seq=7)
    replayer = Replayer(ReplayOptions(), lambda frame: None)
    replayer.feed_many(s.close())
    return replayer, replayer.finish()


async def live_store(result: Any) -> InMemoryProjectionStore:
    store = InMemoryProjectionStore()
    for badge in result.badges:
        rows = [r for r in result.projections if r["user_id"] == badge["user_id"]]
        b = Badge(badge["total_unread"], badge["total_mention"], badge["muted_unread"])
        v = badge["projection_mailbox_seq"]
        await store.write([UserFlush(badge["user_id"], rows, b, v, 0, 1, "live", v)])
    return store


async def rebuilt(
    replayer: Replayer, result: Any, progress: Progress | None = None
) -> InMemoryProjectionStore:
    target = InMemoryProjectionStore()
    await rebuild_from_state(
        [ME, OTHER],
        state=FakeState(result.projections),
        heads=FakeHeads(replayer, {CONV_A: 7, CONV_B: 7}),
        messages=replayer.store,
        target=target,
        limit=200,
        include_muted=False,
        progress=progress,
    )
    return target


async def test_rebuild_from_state_equals_the_live_projection_on_every_knowable_field() -> None:
    replayer, result = scenario()
    live = await live_store(result)
    fresh = await rebuilt(replayer, result)
    diff = await diff_namespaces(live, fresh, [ME, OTHER])
    assert diff.identical, diff.as_dict()
    assert diff.rows_live == diff.rows_rebuilt == 4
    # The row versions state cannot know are reported apart, never as a difference.
    assert set(diff.unknowable_differing) <= {*UNKNOWABLE_FROM_STATE, "user_version"}
    mine = (await fresh.load(ME)).rows[CONV_B]
    theirs = (await fresh.load(OTHER)).rows[CONV_B]
    # Cleared and deleted stay distinguishable: cleared is listed, deleted is not.
    assert mine["hidden_before_conversation_seq"] == 6 and mine["deleted_before_conversation_seq"] == 0
    assert mine["listed"] is True
    assert theirs["deleted_before_conversation_seq"] == 7 and theirs["listed"] is False


async def test_the_diff_reports_rows_added_removed_changed_per_field_and_badges() -> None:
    replayer, result = scenario()
    live = await live_store(result)
    fresh = await rebuilt(replayer, result)
    stored = await live.load(ME)
    rows = dict(stored.rows)
    wrong = dict(rows[CONV_A], unread_count=cast(int, rows[CONV_A]["unread_count"]) + 5)  # drift
    del rows[CONV_B]  # the live namespace lost a row
    extra = dict(wrong, conversation_id="0c0c0c0c-0000-4000-8000-00000000000c")  # and holds a stray one
    badge = Badge(stored.total_unread + 5, stored.total_mention, stored.muted_unread)
    v = stored.projection_mailbox_seq + 1
    live = InMemoryProjectionStore()
    await live.write([UserFlush(ME, [wrong, extra], badge, v, 0, 1, "live", v)])
    diff = (await diff_namespaces(live, fresh, [ME])).as_dict()
    assert diff["identical"] is False
    assert (diff["rows_added"], diff["rows_removed"], diff["rows_changed"]) == (1, 1, 1)
    assert diff["fields_changed"] == {"unread_count": 1}
    assert diff["badges_differing"] == 1
    assert diff["examples"]["changed"][0]["fields"]["unread_count"] == [
        wrong["unread_count"],
        cast(int, wrong["unread_count"]) - 5,
    ]
    assert diff["examples"]["added"] == [{"user_id": ME, "conversation_id": CONV_B}]


async def test_progress_line_and_rebuild_gauges_move() -> None:
    replayer, result = scenario()
    out = io.StringIO()
    progress = Progress(2, out=out, mode="always")
    assert sample(exposition(progress.metrics.registry).decode(), "projector_rebuild_progress_ratio") == 0
    await rebuilt(replayer, result, progress)
    assert "rebuild: 2/2 users (100%), 4 rows" in out.getvalue()
    text = exposition(progress.metrics.registry).decode()
    assert sample(text, "projector_rebuild_progress_ratio") == 1.0
    assert sample(text, "projector_rebuild_work_done") == 2


def test_user_list_argument() -> None:
    import argparse

    assert _user_list("3, 1,3") == [1, 3]
    for bad in ("", "a,b", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _user_list(bad)


def test_no_state_means_no_batch() -> None:
    from app.rebuild.from_state import rebuild_user

    replayer, _ = scenario()
    assert rebuild_user(1, [], {}, replayer.store, limit=200, include_muted=False) is None


def test_the_replay_rebuilds_tables_give_the_replayed_projection() -> None:
    """rebuild --by-replay's in-memory tables and silent outbox under the worker core."""
    import asyncio

    from app.domain.projector import ProjectorConfig
    from app.rebuild.by_replay import SilentOutbox
    from app.replay import run_replay
    from app.stores.memory_tables import MemoryTables
    from app.worker.core import WorkerConfig, WorkerCore
    from tests.support.projection_files import as_replay_files
    from tests.support.worker import message_store_for, records

    s = StreamBuilder(lanes=2)
    for seq in range(1, 6):
        s.message(ME, seq, lane=seq % 2)
        s.message(OTHER, seq, conv=CONV_B, lane=seq % 2, mention=seq == 2)
    s.read(ME, 3)
    lines = s.close()
    expected = run_replay(lines, ReplayOptions(lanes=2))
    outbox = SilentOutbox()
    target = InMemoryProjectionStore()
    core = WorkerCore(
        WorkerConfig(
            lanes=2,
            projector=ProjectorConfig(window_ms=1000, max_dirty_rows=100_000, unread_precise_limit=200),
        ),
        message_store=message_store_for(lines, 2),
        projection_store=target,
        tables=MemoryTables(),
        outbox=outbox,
    )

    async def run() -> tuple[list[Any], list[Any]]:
        await core.on_records(records([b"{oops", *lines]))
        await core.flush_all()
        return await as_replay_files(target, [ME, OTHER])

    rows, badges = asyncio.run(run())
    assert rows == expected.projections and badges == expected.badges
    # Counted, never produced: the end's flush (OTHER: 2 frames), and the fast lane's
    # (docs/contract.md §10) for OTHER's mention and ME's read (2 frames each; ME's rows all
    # went with its read).
    assert outbox.dead_letters_seen == 1 and outbox.frames_seen == 6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rebuild", "--from-state", "--namespace", "x"], "needs --users"),  # whose?
        (["rebuild", "--by-replay", "--namespace", "x", "--users", "1"], "every user"),
        (["rebuild", "--from-state", "--all-known", "--namespace", "x", "--state-dir", "d"], "--by-replay"),
        (["rebuild", "--by-replay", "--namespace", "x", "--hot-rows", "5"], "goes with --state-dir"),
        # --state-dir is scratch space: a file, or a folder holding anything, is refused.
        (["rebuild", "--by-replay", "--namespace", "x", "--state-dir", __file__], "not a folder"),
        (["rebuild", "--by-replay", "--namespace", "x", "--state-dir", os.path.dirname(__file__)], "empty"),
    ],
)
def test_rebuild_arguments_are_checked_before_any_connection(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err
