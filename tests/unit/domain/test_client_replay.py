"""The client library against real frames: `projector replay`'s deltas reproduce its rows.

A client that applies a user's SESSION_DELTA / BADGE_UPDATE frames by the client rule must end
with exactly the rows and badge the projector holds (frames_reproduce_rows) — in order, with
every frame redelivered and reordered (re-pulling on gaps), and through the merge window.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from app.cli import main as projector
from app.domain.client import DeltaMerger, SessionView

USERS = [1, 2, 3, 4]
CONVERSATIONS = [f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 3)]
T0 = 1_767_225_600_000


def mailbox(seed: int, count: int = 400) -> Iterator[dict[str, object]]:
    """A valid mailbox stream of mixed entry types, one lane, markers every few entries."""
    rng = random.Random(seed)
    conversation_seq = dict.fromkeys(CONVERSATIONS, 0)
    sent: dict[str, list[dict[str, object]]] = {c: [] for c in CONVERSATIONS}
    seq = 0
    for i in range(count):
        ts = T0 + 40 * i
        conversation = rng.choice(CONVERSATIONS)
        roll = rng.random()
        base: dict[str, object] = {"lane": 0, "ts": ts, "event_id": f"e{i}"}
        if roll < 0.55 or not sent[conversation]:
            conversation_seq[conversation] += 1
            n = conversation_seq[conversation]
            facts: dict[str, object] = {
                "conversation_seq": n,
                "sender_id": rng.choice(USERS),
                "counts_unread": rng.random() < 0.9,
            }
            sent[conversation].append(facts)
            recipients = rng.sample(USERS, rng.randint(1, len(USERS)))
            for user in sorted(recipients):
                seq += 1
                yield {
                    **base,
                    "type": "message",
                    "mailbox_seq": seq,
                    "user_id": user,
                    "conversation_id": conversation,
                    "message_id": f"m-{conversation[-1]}-{n}",
                    "activity_id": f"{ts:016x}{n:016x}",
                    "created_at": ts,
                    "mention": rng.random() < 0.2,
                    **facts,
                }
        else:
            seq += 1
            entry: dict[str, object] = {
                **base,
                "mailbox_seq": seq,
                "user_id": rng.choice(USERS),
                "conversation_id": conversation,
            }
            latest = conversation_seq[conversation]
            kind = rng.choice(["read", "read", "recall", "delete", "pin", "unpin", "mute"])
            if kind == "read":
                entry |= {"type": "read", "read_conversation_seq": rng.randint(0, latest)}
            elif kind == "recall":
                target = rng.choice(sent[conversation])
                entry |= {
                    "type": "recall",
                    "target_conversation_seq": target["conversation_seq"],
                    "target_sender_id": target["sender_id"],
                    "target_counts_unread": target["counts_unread"],
                    "target_mention": False,
                }
            elif kind == "delete":
                entry |= {"type": "delete_conversation", "deleted_before_conversation_seq": latest}
            elif kind == "pin":
                entry |= {"type": "pin", "pin_rank": rng.randint(0, 3)}
            else:
                entry |= {"type": kind}
            yield entry
        if i % 7 == 6:
            yield {"type": "watermark", "lane": 0, "watermark": seq, "ts": ts}
    # Leave one conversation deleted at the end: a known row with listed = false.
    seq += 1
    yield {
        "type": "delete_conversation",
        "mailbox_seq": seq,
        "lane": 0,
        "ts": T0 + 40 * count,
        "event_id": "last",
        "user_id": USERS[0],
        "conversation_id": CONVERSATIONS[0],
        "deleted_before_conversation_seq": max(1, conversation_seq[CONVERSATIONS[0]]),
    }
    yield {"type": "watermark", "lane": 0, "watermark": seq, "ts": T0 + 40 * count}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="module", params=[3, 11])
def replayed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    """(frames in emission order, final rows by user and conversation, final badge by user)."""
    folder = tmp_path_factory.mktemp(f"replay{request.param}")
    source = folder / "in.jsonl"
    source.write_bytes(b"\n".join(orjson.dumps(e) for e in mailbox(request.param)) + b"\n")
    out = folder / "out"
    code = projector(["replay", "--input", str(source), "--out", str(out), "--window-ms", "200"])
    assert code == 0
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["dead_letters"] == 0 and stats["pending"] == 0
    assert stats["flushes"] > 10  # enough frames per user to make ordering matter
    frames = read_jsonl(out / "deltas.jsonl")
    rows: dict[int, dict[str, dict[str, object]]] = {}
    for r in read_jsonl(out / "projections.jsonl"):
        rows.setdefault(r["user_id"], {})[r["conversation_id"]] = r
    badges: dict[int, object] = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
    assert any(not r["listed"] for per_user in rows.values() for r in per_user.values())
    return frames, rows, badges


Replayed = tuple[list[dict[str, Any]], dict[int, dict[str, dict[str, object]]], dict[int, object]]


def frames_of(frames: list[dict[str, Any]], user: int) -> list[dict[str, Any]]:
    return [f for f in frames if f["user_id"] == user]


def assert_matches(view: SessionView, rows: dict[str, dict[str, object]], badge: object) -> None:
    assert view.known() == rows
    assert isinstance(badge, dict)
    assert view.badge is not None
    assert (view.badge.total_unread, view.badge.total_mention, view.badge.muted_unread) == (
        badge["total_unread"],
        badge["total_mention"],
        badge["muted_unread"],
    )
    assert view.badge.version == badge["projection_mailbox_seq"]
    assert {r["conversation_id"] for r in view.listed()} == {c for c, r in rows.items() if r["listed"]}


def test_frames_in_order_reproduce_rows_and_badges(replayed: Replayed) -> None:
    frames, rows, badges = replayed
    for user in rows:
        view = SessionView(user)
        for frame in frames_of(frames, user):
            assert view.apply(frame).applied
        assert_matches(view, rows[user], badges[user])


def test_redelivered_and_reordered_frames_converge_with_repulls(replayed: Replayed) -> None:
    frames, rows, badges = replayed
    rng = random.Random(5)
    repulls = 0
    for user in rows:
        mine = frames_of(frames, user)
        deltas = [f for f in mine if f["type"] == "SESSION_DELTA"]
        delivery = mine + rng.choices(mine, k=2 * len(mine))
        # Reorder locally (a connection replacement replays a recent stretch), not globally.
        for i in range(0, len(delivery) - 3, 3):
            window = delivery[i : i + 4]
            rng.shuffle(window)
            delivery[i : i + 4] = window
        delivery.append(mine[-1] if mine[-1]["type"] == "SESSION_DELTA" else mine[-2])
        delivery.append(next(f for f in reversed(mine) if f["type"] == "BADGE_UPDATE"))
        view = SessionView(user)
        newest = 0
        for frame in delivery:
            if frame["type"] == "SESSION_DELTA":
                newest = max(newest, frame["projection_mailbox_seq"])
            if view.apply(frame).needs_repull:
                repulls = repulls + 1
                # Re-pull: the server's rows as of the newest version it has pushed.
                server: dict[str, dict[str, object]] = {}
                for d in deltas:
                    if d["projection_mailbox_seq"] <= newest:
                        for r in d["conversations"]:
                            server[r["conversation_id"]] = r
                view.reset(server.values(), newest)
        assert_matches(view, rows[user], badges[user])
    assert repulls > 0  # the reordering did open gaps


def test_frames_through_the_merge_window_reproduce_rows(replayed: Replayed) -> None:
    frames, rows, badges = replayed
    merger = DeltaMerger(150)
    views = {user: SessionView(user) for user in rows}
    now = 0
    merged_count = 0
    for frame in frames:
        now = now + 5  # a flush's frames arrive together; flushes ~40 ms apart
        for out in merger.offer(frame, now):
            merged_count = merged_count + 1
            assert views[cast(int, out["user_id"])].apply(out).applied
    for out in merger.flush():
        merged_count = merged_count + 1
        assert views[cast(int, out["user_id"])].apply(out).applied
    assert merged_count < len(frames)  # the window did merge
    for user, view in views.items():
        assert_matches(view, rows[user], badges[user])
