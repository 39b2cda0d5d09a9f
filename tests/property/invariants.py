"""Named invariants between the core's replay result and the reference model.

Each predicate raises AssertionError with a readable message on the first violation, so that a
hypothesis failure names the invariant that broke.

Every row must equal the definition evaluated over the entries applied for that user (docs/contract.md
§3.6), pending entries or not: docs/contract.md §3.4 says a MessageStore recompute adds no message
and no recall that never reached this user's mailbox. Only the counts of an inexact row are
exempt (inexact_only_beyond_200 checks them).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from tests.property.model import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_PER_USER_PER_S,
    UNREAD_PRECISE_LIMIT,
    ModelResult,
    badge_of,
    base_of,
    fast_writes,
    flush_schedule,
)

ROW_FIELDS = [
    "user_id",
    "conversation_id",
    "listed",
    "membership",
    "pinned",
    "pin_rank",
    "archived",
    "muted",
    "marked_unread",
    "last_activity_id",
    "latest_conversation_seq",
    "last_message_id",
    "unread_count",
    "unread_exact",
    "mention_count",
    "mention_first_conversation_seq",
    "read_conversation_seq",
    "hidden_before_conversation_seq",
    "deleted_before_conversation_seq",
    "joined_at_conversation_seq",
    "left_at_conversation_seq",
    "projection_mailbox_seq",
]
COUNT_FIELDS = ("unread_count", "unread_exact", "mention_count", "mention_first_conversation_seq")
BADGE_FIELDS = (
    "user_id",
    "total_unread",
    "total_mention",
    "muted_unread",
    "archived_unread",
    "archived_mention",
    "badge_mode",
    "include_muted",
    "projection_mailbox_seq",
)
# The sums over rows (docs/contract.md §3.8, §10 folder totals): "badge = sum over rows" holds for each.
BADGE_COUNTS = ("total_unread", "total_mention", "muted_unread", "archived_unread", "archived_mention")
STAT_FIELDS = ("entries", "applied", "duplicates", "dead_letters", "pending")

Row = dict[str, Any]


def key(row: Row) -> tuple[int, str]:
    return row["user_id"], row["conversation_id"]


def _diff(a: Row, b: Row, fields: Any) -> dict[str, tuple[Any, Any]]:
    return {f: (a.get(f), b.get(f)) for f in fields if a.get(f) != b.get(f)}


def rows_equal_model(res: Any, model: ModelResult) -> None:
    """Every known row, field by field, equals the definition (counts of inexact rows aside)."""
    got = {key(r): r for r in res.projections}
    assert len(got) == len(res.projections), "projections: a (user, conversation) twice"
    assert [key(r) for r in res.projections] == sorted(got), "projections not sorted"
    assert set(got) == set(model.rows), (
        f"known rows differ: core-only {sorted(set(got) - set(model.rows))}, "
        f"model-only {sorted(set(model.rows) - set(got))}"
    )
    for k, want in model.rows.items():
        row = got[k]
        assert set(row) == set(ROW_FIELDS), f"row {k} fields: {sorted(set(row) ^ set(ROW_FIELDS))}"
        if row["unread_exact"] is False:  # checked by inexact_only_beyond_200
            fields = [f for f in ROW_FIELDS if f not in COUNT_FIELDS]
        else:
            fields = ROW_FIELDS
        diff = _diff(row, want, fields)
        assert not diff, f"row {k} differs from the definition (core, model): {diff}"


def inexact_only_beyond_200(rows: list[Row]) -> None:
    """unread_exact = false only when latest - base > 200, and then unread_count == 200."""
    for row in rows:
        gap = (row["latest_conversation_seq"] or 0) - base_of(row)
        if row["unread_exact"] is False:
            assert gap > UNREAD_PRECISE_LIMIT, f"inexact row with latest - base = {gap}: {row}"
            assert row["unread_count"] == UNREAD_PRECISE_LIMIT, f"inexact row not 200: {row}"
        else:
            assert row["unread_exact"] is True, row
        assert 0 <= row["mention_count"] <= row["unread_count"], f"mention > unread: {row}"
        assert (row["mention_count"] == 0) == (row["mention_first_conversation_seq"] is None), row


def no_double_count(res: Any, model: ModelResult) -> None:
    """An exact count never exceeds the distinct received messages in (base, latest]."""
    for row in res.projections:
        k = key(row)
        if not row["unread_exact"]:
            continue
        lo, hi = base_of(row), row["latest_conversation_seq"] or 0
        distinct = {s for s in model.received.get(k, ()) if lo < s <= hi}
        assert row["unread_count"] <= len(distinct), f"{k} counts {row['unread_count']} > {distinct}"


def badge_is_sum_of_rows(res: Any, include_muted: bool) -> None:
    """The final badge and every BADGE_UPDATE equal §3.8 over the user's rows at that version."""
    rows_by_user: dict[int, list[Row]] = defaultdict(list)
    for row in res.projections:
        rows_by_user[row["user_id"]].append(row)
    for badge in res.badges:
        # In the preferences the badge says it is in (badges_equal_model checks those against
        # the model: the deployment's defaults, or the user's last badge_preferences entry).
        want = badge_of(
            badge["user_id"], rows_by_user[badge["user_id"]], 0, badge["include_muted"], badge["badge_mode"]
        )
        diff = _diff(badge, want, BADGE_COUNTS)
        assert not diff, f"badge of {badge['user_id']} is not the sum of its rows: {diff}"
    # J-7: replaying frames, the rows the client holds after a SESSION_DELTA sum to the badge that
    # comes with it (rows and badge of one flush are one batch: they never tear).
    client: dict[tuple[int, str], Row] = {}
    for f in res.frames:
        if f["type"] == "SESSION_DELTA":
            for row in f["conversations"]:
                client[key(row)] = row
        else:
            user = f["user_id"]
            rows = [r for k, r in client.items() if k[0] == user]
            want = badge_of(user, rows, 0, f["include_muted"], f["badge_mode"])
            diff = _diff(f, want, BADGE_COUNTS)
            assert not diff, f"BADGE_UPDATE v{f['projection_mailbox_seq']} of {user} torn: {diff}"


def badges_equal_model(res: Any, model: ModelResult) -> None:
    """Badges equal the model's (counts only where every row of the user is comparable)."""
    got = {b["user_id"]: b for b in res.badges}
    assert [b["user_id"] for b in res.badges] == sorted(got), "badges not sorted / not unique"
    assert set(got) == set(model.badges), f"badge users {sorted(got)} != {sorted(model.badges)}"
    inexact_users = {r["user_id"] for r in res.projections if not r["unread_exact"]}
    for user, want in model.badges.items():
        assert set(got[user]) == set(BADGE_FIELDS), f"badge fields: {got[user]}"
        fields = ["projection_mailbox_seq", "badge_mode", "include_muted"]
        if user not in inexact_users:
            fields = list(BADGE_FIELDS)
        diff = _diff(got[user], want, fields)
        assert not diff, f"badge of {user} differs (core, model): {diff}"


def stats_equal_model(res: Any, model: ModelResult) -> None:
    s = res.stats
    diff = {f: (s.get(f), model.stats[f]) for f in STAT_FIELDS if s.get(f) != model.stats[f]}
    assert not diff, f"stats differ (core, model): {diff}"
    assert s["entries"] == s["applied"] + s["duplicates"] + s["dead_letters"] + s["pending"]
    writes = Counter(
        (f["user_id"], r["conversation_id"])
        for f in res.frames
        if f["type"] == "SESSION_DELTA"
        for r in f["conversations"]
    )
    deltas = sum(f["type"] == "SESSION_DELTA" for f in res.frames)
    assert s["projection_writes"] == sum(writes.values()), (s, sum(writes.values()))
    assert s["max_writes_per_user_conversation"] == max(writes.values(), default=0)
    assert (s["flushes"] > 0) == (deltas > 0) and s["flushes"] <= deltas, (s, deltas)
    messages = sum(e["type"] == "message" for e in model.applied)
    want_ratio = messages / s["projection_writes"] if s["projection_writes"] else 0
    # the core rounds the ratio for display (6 decimals, docs/contract.md §7): compare with a tolerance
    assert math.isclose(s["compression_ratio"], want_ratio, rel_tol=1e-6, abs_tol=1e-6), (
        s["compression_ratio"],
        want_ratio,
    )


def frames_reproduce_rows(res: Any) -> None:
    """The client rule (version per conversation = the frame's projection_mailbox_seq; apply only
    if newer; overwrite) over all frames gives projections.jsonl exactly; a row's own version is
    at most its frame's."""
    client: dict[tuple[int, str], Row] = {}
    version: dict[tuple[int, str], int] = {}
    for f in res.frames:
        if f["type"] != "SESSION_DELTA":
            continue
        convs = [r["conversation_id"] for r in f["conversations"]]
        assert convs == sorted(set(convs)), f"frame rows not unique/sorted: {convs}"
        for row in f["conversations"]:
            assert row["user_id"] == f["user_id"], f
            assert row["projection_mailbox_seq"] <= f["projection_mailbox_seq"], (row, f)
            k = key(row)
            if f["projection_mailbox_seq"] > version.get(k, 0):
                client[k], version[k] = row, f["projection_mailbox_seq"]
    want = {key(r): r for r in res.projections}
    assert set(client) == set(want), f"rows never sent: {sorted(set(want) - set(client))}"
    for k, row in want.items():
        diff = _diff(client[k], row, ROW_FIELDS)
        assert not diff, f"client row {k} != projections.jsonl: {diff}"


def frame_versions_chain(res: Any, model: ModelResult) -> None:
    """Per user and frame type: prev == previous version (0 first), versions strictly increase,
    each version is an applied mailbox_seq of that user; each SESSION_DELTA is followed by the
    user's BADGE_UPDATE of the same version; the last BADGE_UPDATE is badges.jsonl."""
    applied_seqs: dict[int, set[int]] = defaultdict(set)
    for e in model.applied:
        applied_seqs[e["user_id"]].add(e["mailbox_seq"])
    last: dict[tuple[int, str], int] = defaultdict(int)
    last_badge: dict[int, dict[str, Any]] = {}
    for i, f in enumerate(res.frames):
        user, v, t = f["user_id"], f["projection_mailbox_seq"], f["type"]
        assert t in ("SESSION_DELTA", "BADGE_UPDATE"), f
        assert f["prev_projection_mailbox_seq"] == last[(user, t)], f"gap/rewind in {t}: {f}"
        assert v > last[(user, t)], f"version not increasing: {f}"
        assert v in applied_seqs[user], f"version {v} is not an applied mailbox_seq of {user}"
        last[(user, t)] = v
        if t == "SESSION_DELTA":
            assert f["driving_mailbox_seq"] == v, f
            assert isinstance(f["driving_event_id"], str), f
            nxt = res.frames[i + 1] if i + 1 < len(res.frames) else {}
            assert (nxt.get("type"), nxt.get("user_id"), nxt.get("projection_mailbox_seq")) == (
                "BADGE_UPDATE",
                user,
                v,
            ), f"SESSION_DELTA not followed by its BADGE_UPDATE: {f} / {nxt}"
        else:
            last_badge[user] = f
    for badge in res.badges:
        f = last_badge.get(badge["user_id"])
        assert f is not None, f"no BADGE_UPDATE for {badge['user_id']}"
        diff = _diff(f, badge, BADGE_FIELDS)
        assert not diff, f"last BADGE_UPDATE != badges.jsonl: {diff}"


def writes_bounded_by_window(
    res: Any,
    model: ModelResult,
    window_ms: int,
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS,
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S,
) -> None:
    """Writes per (user, conversation) <= ceil(span / window) + 1 + the fast flushes of that row
    (docs/contract.md §3.9 and §10, seed §8); the fast ones counted by the model's schedule
    (flushes_follow_policy checks that the core's flushes are the schedule's)."""
    schedule = flush_schedule(
        model.applied, window_ms, 100_000, fast_lane_max_members, fast_lane_per_user_per_s
    )
    fast = fast_writes(schedule)
    ts: dict[tuple[int, str], list[int]] = defaultdict(list)
    for e in model.applied:
        ts[(e["user_id"], e["conversation_id"])].append(e["ts"])
    writes = Counter(
        (f["user_id"], r["conversation_id"])
        for f in res.frames
        if f["type"] == "SESSION_DELTA"
        for r in f["conversations"]
    )
    for k, n in writes.items():
        span = max(ts[k]) - min(ts[k])
        bound = math.ceil(span / window_ms) + 1 + fast.get(k, 0)
        assert n <= bound, f"{k}: {n} writes > ceil({span}/{window_ms})+1+{fast.get(k, 0)} = {bound}"


def flushes_follow_policy(
    res: Any,
    model: ModelResult,
    window_ms: int,
    max_dirty_rows: int,
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS,
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S,
) -> None:
    """Which rows each flush writes, and in which frames (docs/contract.md §3.9, §10): after each
    applied entry, flush when dirty rows > max_dirty_rows or ts - window_start >= window; an
    entry that matters now flushes its user alone (within the per-user rate); end of input
    flushes the rest; users ascending, SESSION_DELTA (rows by conversation_id) then
    BADGE_UPDATE; driving ids are the user's last applied entry's."""
    schedule = flush_schedule(
        model.applied, window_ms, max_dirty_rows, fast_lane_max_members, fast_lane_per_user_per_s
    )
    want: list[tuple[Any, ...]] = []
    for flush in schedule:
        for user, version, event_id, convs in flush.users:
            want.append(("SESSION_DELTA", user, version, event_id, convs))
            want.append(("BADGE_UPDATE", user, version))
    got: list[tuple[Any, ...]] = []
    for f in res.frames:
        if f["type"] == "SESSION_DELTA":
            convs = [r["conversation_id"] for r in f["conversations"]]
            got.append((f["type"], f["user_id"], f["projection_mailbox_seq"], f["driving_event_id"], convs))
        else:
            got.append((f["type"], f["user_id"], f["projection_mailbox_seq"]))
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        assert g == w, f"frame {i} (core, policy): {g} != {w}"
    assert len(got) == len(want), f"{len(got)} frames, the policy gives {len(want)}"
    assert res.stats["flushes"] == len(schedule), (res.stats["flushes"], len(schedule))
    fast = [flush for flush in schedule if flush.fast]
    assert res.stats["fast_flushes"] == len(fast), (res.stats["fast_flushes"], len(fast))
    assert res.stats["fast_writes"] == sum(len(f.users[0][3]) for f in fast), res.stats
    writes = Counter(
        (f["user_id"], r["conversation_id"])
        for f in res.frames
        if f["type"] == "SESSION_DELTA"
        for r in f["conversations"]
    )
    fast_by_row = fast_writes(schedule)
    window_writes = max((n - fast_by_row.get(k, 0) for k, n in writes.items()), default=0)
    assert res.stats["max_window_writes_per_user_conversation"] == window_writes, res.stats


def check_all(
    res: Any,
    model: ModelResult,
    include_muted: bool,
    window_ms: int | None = None,
    max_dirty_rows: int | None = None,
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS,
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S,
) -> None:
    rows_equal_model(res, model)
    inexact_only_beyond_200(res.projections)
    inexact_only_beyond_200(
        [r for f in res.frames if f["type"] == "SESSION_DELTA" for r in f["conversations"]]
    )
    no_double_count(res, model)
    badge_is_sum_of_rows(res, include_muted)
    badges_equal_model(res, model)
    stats_equal_model(res, model)
    frames_reproduce_rows(res)
    frame_versions_chain(res, model)
    if window_ms is not None and max_dirty_rows is not None:
        flushes_follow_policy(
            res, model, window_ms, max_dirty_rows, fast_lane_max_members, fast_lane_per_user_per_s
        )
