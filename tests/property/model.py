"""Reference model of the processing core: the definitions of docs/contract.md §2-§4/§7, evaluated directly.

Deliberately naive and written without looking at `app/`: it validates every line, runs the
watermark gate literally (one partition), keeps the list of entries applied per user, and then
evaluates the definitions for each (user, conversation) from those entries, with no incremental
state at all. It follows docs/contract.md, the project choices included.

The fast lane (docs/contract.md §10) is in `flush_schedule`: which applied entries matter to their
user now, and the per-user rate over a sliding second, kept as the full list of each user's fast
flush times (never forgotten, unlike the core's limiter).

What it does NOT model: frame contents (only which rows each flush writes: `flush_schedule`),
and unread_exact (the model is always exact; the tests check the core's inexact rows against the
200 rule instead).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

U64 = 1 << 64
U32 = 1 << 32
UNREAD_PRECISE_LIMIT = 200
# docs/contract.md §2 bounds: record size, nesting.
MAX_RECORD_BYTES = 64 * 1024
MAX_NESTING = 32

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_ACTIVITY = re.compile(r"[0-9a-f]{32}")

Check = Callable[[Any], bool]


def _int(lo: int, hi: int | None = None) -> Check:
    # JSON integers only: bool is a subclass of int in Python and floats are not ints.
    return lambda v: type(v) is int and v >= lo and (hi is None or v < hi)


def _str(v: Any) -> bool:
    return type(v) is str


def _bool(v: Any) -> bool:
    return type(v) is bool


def _one_of(*values: str) -> Check:
    return lambda v: type(v) is str and v in values


# docs/contract.md §2: every int <= 2^64-1 (u64); conversation seqs (`*conversation_seq`) <= 2^64-2.
SEQ1, SEQ0, U64_ID = _int(1, U64), _int(0, U64), _int(0, U64)
CSEQ1, CSEQ0 = _int(1, U64 - 1), _int(0, U64 - 1)

COMMON: dict[str, Check] = {
    "mailbox_seq": SEQ1,
    "lane": SEQ0,  # range against --lanes checked separately
    "ts": SEQ0,
    "event_id": _str,
    "user_id": U64_ID,
    "conversation_id": lambda v: type(v) is str and _UUID.fullmatch(v) is not None,
}
_TARGET: dict[str, Check] = {
    "target_conversation_seq": CSEQ1,
    "target_sender_id": U64_ID,
    "target_counts_unread": _bool,
    "target_mention": _bool,
}
TYPES: dict[str, dict[str, Check]] = {
    "message": {
        "conversation_seq": CSEQ1,
        "message_id": _str,
        "activity_id": lambda v: type(v) is str and _ACTIVITY.fullmatch(v) is not None,
        "sender_id": U64_ID,
        "created_at": SEQ0,
        "counts_unread": _bool,
        "mention": _bool,
    },
    "read": {"read_conversation_seq": CSEQ0},
    "recall": _TARGET,
    "delete_message": _TARGET,
    "join": {"joined_at_conversation_seq": CSEQ0},
    "leave": {"left_at_conversation_seq": CSEQ0, "reason": _one_of("left", "removed")},
    "pin": {"pin_rank": _int(0, U32)},
    "unpin": {},
    "archive": {},
    "unarchive": {},
    "mute": {},
    "unmute": {},
    "clear_history": {"hidden_before_conversation_seq": CSEQ0},
    "delete_conversation": {"deleted_before_conversation_seq": CSEQ0},
    "mailbox_dirty": {},
    # docs/contract.md §10
    "mark_unread": {},
    "badge_preferences": {"badge_mode": _one_of("messages", "conversations"), "include_muted": _bool},
}
OPTIONAL: dict[str, dict[str, Check]] = {
    "join": {"role": _one_of("owner", "admin", "member")},
    "watermark": {"count": SEQ0},  # docs/contract.md §9: a u64 when present (null is no count)
    # §9: any u32 kind; 24 and 27 notify. §10 (the fast lane): urgent, a JSON bool; member_count,
    # a u32 (the conversation's members as the producer fanned the message out).
    "message": {"notification": _int(0, U32), "urgent": _bool, "member_count": _int(0, U32)},
}
MARKER: dict[str, Check] = {"lane": SEQ0, "watermark": SEQ0, "ts": SEQ0}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")  # NaN / Infinity are not JSON


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("a key is repeated")
    return dict(pairs)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _model_int(text: str) -> int | float:
    # Python refuses to convert ints of more than 4,300 digits (a CPython limit, not JSON's): far
    # past u64 anyway, such a value is no int to the schema (inf is no JSON integer either).
    return int(text) if len(text) <= 100 else float("inf")


def parse_line(line: bytes, lanes: int) -> tuple[str, Any]:
    """-> ("blank", None) | ("bad", reason) | ("marker", (lane, W)) | ("entry", dict)."""
    if not line.strip():
        return "blank", None
    if len(line) > MAX_RECORD_BYTES:
        return "bad", "too large"
    try:
        obj = json.loads(line.decode("utf-8"), parse_constant=_reject_constant, parse_int=_model_int)
        # a lone surrogate escape ("\ud800") parses in Python but is not Unicode text
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError, ValueError, RecursionError):
        return "bad", "malformed"
    if not isinstance(obj, dict):
        return "bad", "not an object"
    try:  # a repeated key makes the record ambiguous (only the top level's keys are fields)
        _no_repeated_keys(json.loads(line, object_pairs_hook=list, parse_int=len))
    except ValueError:
        return "bad", "repeated key"
    try:
        too_deep = _depth(obj) > MAX_NESTING
    except RecursionError:
        too_deep = True
    if too_deep:
        return "bad", "nested too deep"
    kind = obj.get("type")
    if kind == "watermark":
        for name, ok in MARKER.items():
            if name not in obj or not ok(obj[name]):
                return "bad", f"marker field {name}"
        for name, ok in OPTIONAL["watermark"].items():
            if name in obj and not ok(obj[name]):
                return "bad", f"marker field {name}"
        if obj["lane"] >= lanes:
            return "bad", "lane out of range"
        return "marker", (obj["lane"], obj["watermark"])
    if type(kind) is not str or kind not in TYPES:
        return "bad", "unknown type"
    for name, ok in {**COMMON, **TYPES[kind]}.items():
        if name not in obj or not ok(obj[name]):
            return "bad", f"field {name}"
    for name, ok in OPTIONAL.get(kind, {}).items():
        if name in obj and not ok(obj[name]):
            return "bad", f"field {name}"
    if obj["lane"] >= lanes:
        return "bad", "lane out of range"
    entry = dict(obj)
    entry["conversation_id"] = obj["conversation_id"].lower()
    return "entry", entry


@dataclass
class ModelResult:
    rows: dict[tuple[int, str], dict[str, Any]]  # (user, conversation) -> row
    badges: dict[int, dict[str, Any]]
    stats: dict[str, int]
    applied: list[dict[str, Any]]  # every applied entry, in apply order
    pending: list[dict[str, Any]]  # entries still waiting at the end
    received: dict[tuple[int, str], set[int]] = field(default_factory=dict)

    def pending_pairs(self) -> set[tuple[int, str]]:
        return {(e["user_id"], e["conversation_id"]) for e in self.pending}


def run_model(
    lines: Iterable[bytes], lanes: int = 1, include_muted: bool = False, badge_mode: str = "messages"
) -> ModelResult:
    stats = dict.fromkeys(("entries", "applied", "duplicates", "dead_letters", "pending"), 0)
    marks: dict[int, int] = {}  # lane -> highest marker seen
    waiting: list[tuple[int, int, dict[str, Any]]] = []  # (mailbox_seq, arrival, entry)
    waiting_keys: set[tuple[int, int]] = set()  # (user, mailbox_seq) waiting
    version: dict[int, int] = defaultdict(int)  # user -> projection_mailbox_seq
    applied: list[dict[str, Any]] = []

    def hi() -> int:
        return min(marks.values()) if len(marks) == lanes else 0

    def apply(e: dict[str, Any]) -> None:
        if e["mailbox_seq"] <= version[e["user_id"]]:
            stats["duplicates"] += 1
            return
        version[e["user_id"]] = e["mailbox_seq"]
        applied.append(e)

    for arrival, line in enumerate(lines):
        kind, value = parse_line(line, lanes)
        if kind == "blank":
            continue
        if kind == "marker":
            lane, w = value
            marks[lane] = max(marks.get(lane, w), w)
            h = hi()
            ready = sorted((x for x in waiting if x[0] <= h), key=lambda x: (x[0], x[1]))
            waiting = [x for x in waiting if x[0] > h]
            for _, _, e in ready:
                waiting_keys.discard((e["user_id"], e["mailbox_seq"]))
                apply(e)
            continue
        stats["entries"] += 1
        if kind == "bad":
            stats["dead_letters"] += 1
            continue
        e, seq = value, value["mailbox_seq"]
        if (e["user_id"], seq) in waiting_keys:
            stats["duplicates"] += 1
        elif seq <= hi():
            apply(e)
        else:
            waiting.append((seq, arrival, e))
            waiting_keys.add((e["user_id"], seq))

    stats["applied"] = len(applied)
    stats["pending"] = len(waiting)

    per_pair: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    # docs/contract.md §10: the last badge_preferences entry applied per user (a user-level
    # entry: it makes no conversation known); None = the deployment's defaults.
    preferences: dict[int, tuple[str, bool]] = {}
    for e in applied:
        if e["type"] == "badge_preferences":
            preferences[e["user_id"]] = (e["badge_mode"], e["include_muted"])
            continue
        per_pair[(e["user_id"], e["conversation_id"])].append(e)
    rows = {pair: evaluate_row(pair, es) for pair, es in per_pair.items()}
    received = {
        pair: {e["conversation_seq"] for e in es if e["type"] == "message"} for pair, es in per_pair.items()
    }
    users = sorted({u for u, _ in per_pair} | set(preferences))
    badges = {
        u: badge_of(
            u,
            [r for (ru, _), r in rows.items() if ru == u],
            version[u],
            preferences.get(u, (badge_mode, include_muted))[1],
            preferences.get(u, (badge_mode, include_muted))[0],
        )
        for u in users
    }
    return ModelResult(rows, badges, stats, applied, [x[2] for x in waiting], received)


def evaluate_row(pair: tuple[int, str], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The definitions (docs/contract.md §3.4, §3.7, §4), evaluated over one row's applied entries."""
    user, conversation = pair
    membership, joined_at, left_at = "active", 0, None
    read = hidden = deleted = 0
    pin_rank, archived, muted = None, False, False
    marked = False  # §10: set by mark_unread, cleared by any read or delete_conversation
    received: dict[int, dict[str, Any]] = {}  # conversation_seq -> first message entry
    mentioned: set[int] = set()
    recalled: set[int] = set()
    for e in entries:
        t = e["type"]
        if t == "message":
            received.setdefault(e["conversation_seq"], e)
            if e["mention"]:
                mentioned.add(e["conversation_seq"])
        elif t in ("recall", "delete_message"):
            recalled.add(e["target_conversation_seq"])
        elif t == "read":
            read = max(read, e["read_conversation_seq"])
            marked = False
        elif t == "clear_history":
            hidden = max(hidden, e["hidden_before_conversation_seq"])
        elif t == "delete_conversation":
            deleted = max(deleted, e["deleted_before_conversation_seq"])
            marked = False
        elif t == "mark_unread":
            marked = True
        elif t == "join":
            membership, joined_at, left_at = "active", e["joined_at_conversation_seq"], None
        elif t == "leave":
            membership, left_at = e["reason"], e["left_at_conversation_seq"]
        elif t == "pin":
            pin_rank = e["pin_rank"]
        elif t == "unpin":
            pin_rank = None
        elif t in ("archive", "unarchive"):
            archived = t == "archive"
        elif t in ("mute", "unmute"):
            muted = t == "mute"

    # Not active: a leave set left_at (membership and left_at change together above).
    visible = [s for s in received if membership == "active" or (left_at is not None and s <= left_at)]
    latest = max(visible, default=None)
    head = received[latest] if latest is not None else None
    base = max(read, hidden, joined_at, deleted)
    counted = sorted(
        s
        for s, m in received.items()
        if base < s <= (latest or 0) and m["sender_id"] != user and m["counts_unread"] and s not in recalled
    )
    mentions = [s for s in counted if s in mentioned]
    return {
        "user_id": user,
        "conversation_id": conversation,
        "listed": not (deleted > 0 and deleted >= (latest or 0)),
        "membership": membership,
        "pinned": pin_rank is not None,
        "pin_rank": pin_rank,
        "archived": archived,
        "muted": muted,
        "marked_unread": marked,
        "last_activity_id": head["activity_id"] if head else None,
        "latest_conversation_seq": latest,
        "last_message_id": head["message_id"] if head else None,
        "unread_count": len(counted),
        "unread_exact": True,
        "mention_count": len(mentions),
        "mention_first_conversation_seq": mentions[0] if mentions else None,
        "read_conversation_seq": read,
        "hidden_before_conversation_seq": hidden,
        "deleted_before_conversation_seq": deleted,
        "joined_at_conversation_seq": joined_at,
        "left_at_conversation_seq": left_at,
        # docs/contract.md §4: a row's version is the mailbox_seq of the last entry applied to it
        "projection_mailbox_seq": entries[-1]["mailbox_seq"],
    }


def base_of(row: dict[str, Any]) -> int:
    base: int = max(
        row["read_conversation_seq"],
        row["hidden_before_conversation_seq"],
        row["joined_at_conversation_seq"],
        row["deleted_before_conversation_seq"],
    )
    return base


def badge_of(
    user: int,
    rows: Iterable[dict[str, Any]],
    version: int,
    include_muted: bool,
    badge_mode: str = "messages",
) -> dict[str, Any]:
    """docs/contract.md §3.8 and §10 over a user's rows (whatever their unread_count is: model's
    or core's), written out as the definitions read: filter the rows, then sum (messages) or
    count the rows above zero (conversations)."""
    rows = list(rows)

    def unread(r: dict[str, Any]) -> int:
        # §10: a marked row counts as max(unread_count, 1) wherever an unread sum counts it
        value: int = max(r["unread_count"], 1) if r.get("marked_unread") else r["unread_count"]
        return value

    def total(values: list[int]) -> int:
        return sum(values) if badge_mode == "messages" else sum(1 for v in values if v > 0)

    active = [r for r in rows if r["membership"] == "active"]
    counted = [r for r in active if not r["muted"] or include_muted]
    return {
        "user_id": user,
        "total_unread": total([unread(r) for r in counted if not r["archived"]]),
        "total_mention": total([r["mention_count"] for r in active]),
        "muted_unread": total([unread(r) for r in rows if r["muted"]]),
        "archived_unread": total([unread(r) for r in counted if r["archived"]]),
        "archived_mention": total([r["mention_count"] for r in active if r["archived"]]),
        "badge_mode": badge_mode,
        "include_muted": include_muted,
        "projection_mailbox_seq": version,
    }


# docs/contract.md §10: the fast lane's defaults (the replay command's and the worker's)
FAST_LANE_MAX_MEMBERS = 2
FAST_LANE_PER_USER_PER_S = 5


def matters_now(e: dict[str, Any], max_members: int) -> bool:
    """§10: a message with mention, urgent, or a member_count <= max_members; a read; a mark_unread."""
    if e["type"] == "message":
        return bool(
            e["mention"]
            or e.get("urgent") is True
            or ("member_count" in e and e["member_count"] <= max_members)
        )
    return e["type"] in ("read", "mark_unread")


@dataclass
class Flush:
    """One flush of the schedule: (user, version, driving_event_id, sorted conversation ids) by
    user; `fast` when the fast lane made it (one user)."""

    users: list[tuple[int, int, str, list[str]]]
    fast: bool = False


def flush_schedule(
    applied: list[dict[str, Any]],
    window_ms: int,
    max_dirty_rows: int,
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS,
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S,
) -> list[Flush]:
    """The flush policy of docs/contract.md §3.9 and §10, replayed over the applied entries (in
    apply order)."""
    flushes: list[Flush] = []
    dirty: set[tuple[int, str]] = set()
    last: dict[int, dict[str, Any]] = {}  # user -> last applied entry
    window_start: int | None = None

    dirty_users: set[int] = set()  # users to flush whatever their rows (badge_preferences)
    fast_times: dict[int, list[int]] = defaultdict(list)  # user -> every fast flush's clock
    fast_clock: int | None = None  # the highest ts that asked for the fast lane

    def batch(u: int) -> tuple[int, int, str, list[str]]:
        return (u, last[u]["mailbox_seq"], last[u]["event_id"], sorted(c for v, c in dirty if v == u))

    def flush() -> None:
        users = sorted({u for u, _ in dirty} | dirty_users)
        if users:  # a fast flush may have left nothing for the window
            flushes.append(Flush([batch(u) for u in users]))
        dirty.clear()
        dirty_users.clear()

    for e in applied:
        if window_start is not None and e["ts"] - window_start >= window_ms:
            flush()  # the window is over before this entry: it opens the next one
            window_start = None
        if window_start is None:
            window_start = e["ts"]
        u = e["user_id"]
        if e["type"] == "badge_preferences":
            dirty_users.add(u)  # §10: the badge alone changed, no row
        else:
            dirty.add((u, e["conversation_id"]))
        last[u] = e
        if fast_lane_per_user_per_s > 0 and matters_now(e, fast_lane_max_members):
            fast_clock = e["ts"] if fast_clock is None else max(fast_clock, e["ts"])
            in_last_second = [t for t in fast_times[u] if t > fast_clock - 1000]
            if len(in_last_second) < fast_lane_per_user_per_s:
                fast_times[u].append(fast_clock)
                flushes.append(Flush([batch(u)], fast=True))  # this user only; the window goes on
                dirty.difference_update({(v, c) for v, c in dirty if v == u})
                dirty_users.discard(u)
        if len(dirty) > max_dirty_rows:  # memory bound, after applying
            flush()
            window_start = None
    if dirty or dirty_users:
        flush()
    return flushes


def fast_writes(schedule: list[Flush]) -> dict[tuple[int, str], int]:
    """(user, conversation) -> how many fast flushes wrote the row."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    for flush in schedule:
        if flush.fast:
            for u, _, _, convs in flush.users:
                for c in convs:
                    counts[(u, c)] += 1
    return counts
