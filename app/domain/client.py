"""The client rule for SESSION_DELTA and BADGE_UPDATE frames (docs/contract.md §4, seed §5, acceptance J-2).

This is the small library a client (or a test standing in for one) uses to keep its copy of a
user's conversation list in step with the frames the projector emits. Stdlib only; time comes in
as an argument.

The rule, and why it is shaped this way:

* Frames carry **absolute** rows. The push channel is at-least-once and may drop frames, so a
  delta ("+1 unread") would double-count on a redelivery and drift forever after a loss. A row is
  therefore applied by *overwriting* the client's copy, and only if the frame's
  ``projection_mailbox_seq`` is greater than the version the client holds for that conversation.
  A duplicate or older frame applies zero times. Nothing in this module adds to or subtracts
  from a count (a test walks this file's syntax tree for ``+=`` / ``-=``).
* Each frame names the version of the user's previous frame (``prev_projection_mailbox_seq``).
  If that is not the last version this client saw, frames were lost in between: the client
  must not patch (the missing frames may have changed conversations this one does not
  mention); it re-pulls the list and loads it with :meth:`SessionView.reset`.
* A badge is a set of totals, so the newest one is complete on its own: BADGE_UPDATE frames are
  applied by version only, with no gap check.
* An **audit correction** (``"correction": true``; docs/contract.md §3.4, "Unread audit")
  restates version V with the values V should have had: the projection store's copy had drifted,
  and a pull may have handed the drifted rows out at V. It carries no newer version (none exists), so
  the version rule above would drop it; instead it overwrites every named row the client holds
  at a version <= V (rows held at a newer version came from later frames or pulls, which are
  right) and the badge if held at <= V, and leaves the chain position alone: it is no step in
  the chain (``prev_projection_mailbox_seq == projection_mailbox_seq``), so it never signals a
  gap and never hides one.
* Frames received within ``session_delta_merge_window`` (100-200 ms) may be merged
  (:class:`DeltaMerger`), but only by letting a newer row of a conversation replace an older
  row of the same conversation, and only across frames that are contiguous in the version
  chain, so a merged frame never hides a gap.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from app.domain.listing import is_listed

SESSION_DELTA: Final = "SESSION_DELTA"
BADGE_UPDATE: Final = "BADGE_UPDATE"

MERGE_WINDOW_MIN_MS: Final = 100
MERGE_WINDOW_MAX_MS: Final = 200
MERGE_WINDOW_DEFAULT_MS: Final = 150

# A frame or a row as it comes off the wire (decoded JSON object).
Frame = Mapping[str, object]
Row = Mapping[str, object]


class FrameError(ValueError):
    """A frame that is not a well-formed SESSION_DELTA / BADGE_UPDATE (the client drops it)."""


class ApplyStatus(enum.Enum):
    APPLIED = "applied"
    """The frame was the next one in the user's chain; its rows (and badge) were applied."""
    STALE = "stale"
    """Duplicate or older frame: applied zero times."""
    GAP = "gap"
    """Frames were missed: nothing was patched; the caller re-pulls and calls ``reset``."""
    FOREIGN = "foreign"
    """A frame for another user: ignored."""
    CORRECTED = "corrected"
    """An audit correction: the rows (or badge) held at or below its version were overwritten;
    the chain position is unchanged."""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    status: ApplyStatus
    version: int = 0
    """The frame's ``projection_mailbox_seq``."""
    conversations: tuple[str, ...] = ()
    """The conversations whose row this frame overwrote (empty unless ``status`` is APPLIED)."""

    @property
    def rows_applied(self) -> int:
        return len(self.conversations)

    @property
    def applied(self) -> bool:
        """The frame changed the view (a chain step, or an audit correction)."""
        return self.status is ApplyStatus.APPLIED or self.status is ApplyStatus.CORRECTED

    @property
    def needs_repull(self) -> bool:
        return self.status is ApplyStatus.GAP


@dataclass(frozen=True, slots=True)
class Badge:
    total_unread: int
    total_mention: int
    muted_unread: int
    version: int
    # docs/contract.md §10: the archived folder's totals and the preferences the badge is in
    # (absent from an older server: these defaults).
    archived_unread: int = 0
    archived_mention: int = 0
    badge_mode: str = "messages"
    include_muted: bool = False


def badge_of(obj: Mapping[str, object], version: int | None = None) -> Badge:
    """A Badge from a BADGE_UPDATE frame, a hello's badge or a /v1/badge body, every field's type
    checked (FrameError); `version` overrides `projection_mailbox_seq` (a correction's)."""
    mode = obj.get("badge_mode", "messages")
    if mode not in ("messages", "conversations"):
        raise FrameError(f"'badge_mode' must be 'messages' or 'conversations', got {mode!r}")
    include_muted = obj.get("include_muted", False)
    if not isinstance(include_muted, bool):
        raise FrameError(f"'include_muted' must be a boolean, got {include_muted!r}")
    return Badge(
        total_unread=_int(obj, "total_unread"),
        total_mention=_int(obj, "total_mention"),
        muted_unread=_int(obj, "muted_unread"),
        version=_int(obj, "projection_mailbox_seq") if version is None else version,
        archived_unread=_int(obj, "archived_unread") if "archived_unread" in obj else 0,
        archived_mention=_int(obj, "archived_mention") if "archived_mention" in obj else 0,
        badge_mode=str(mode),
        include_muted=include_muted,
    )


def display_count(count: int, exact: bool = True) -> str:
    """How a count is shown (seed 000 §3.3): above 99, or inexact, "99+"."""
    return "99+" if not exact or count > 99 else str(count)


def shows_unread(row: Mapping[str, object]) -> bool:
    """Whether a row shows as unread: unread messages, or marked unread (docs/contract.md §10)."""
    unread = row.get("unread_count")
    return (isinstance(unread, int) and unread > 0) or row.get("marked_unread") is True


# --------------------------------------------------------------------------------------------
# Field access with types checked (a malformed frame is a FrameError, never a half-applied frame)


def _int(obj: Mapping[str, object], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(f"{key!r} must be an integer, got {value!r}")
    if value < 0:
        raise FrameError(f"{key!r} must be >= 0, got {value!r}")
    return value


def _str(obj: Mapping[str, object], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise FrameError(f"{key!r} must be a string, got {value!r}")
    return value


def _rows(frame: Frame) -> list[Row]:
    rows = frame.get("conversations")
    if not isinstance(rows, list):
        raise FrameError(f"'conversations' must be a list, got {type(rows).__name__}")
    checked: list[Row] = []
    for row in rows:
        if not isinstance(row, Mapping):
            raise FrameError(f"a row must be an object, got {type(row).__name__}")
        _str(row, "conversation_id")
        checked.append(row)
    return checked


def _versions(frame: Frame) -> tuple[int, int]:
    version = _int(frame, "projection_mailbox_seq")
    prev = _int(frame, "prev_projection_mailbox_seq")
    if prev >= version:
        raise FrameError(f"prev_projection_mailbox_seq {prev} must be below projection_mailbox_seq {version}")
    return version, prev


def is_correction(frame: Frame) -> bool:
    """Whether ``frame`` is an audit correction (see the module docstring)."""
    value = frame.get("correction", False)
    if not isinstance(value, bool):
        raise FrameError(f"'correction' must be a boolean, got {value!r}")
    return value


def _correction_version(frame: Frame) -> int:
    version = _int(frame, "projection_mailbox_seq")
    if _int(frame, "prev_projection_mailbox_seq") != version:
        raise FrameError("a correction restates its version: prev_projection_mailbox_seq must equal it")
    return version


def _order_key_activity(row: Row) -> tuple[bool, str]:
    # Sorted in reverse (DESC): rows with an activity come first, a null activity sorts last.
    activity = row.get("last_activity_id")
    return (isinstance(activity, str), activity if isinstance(activity, str) else "")


def _order_key_zone(row: Row) -> tuple[int, int]:
    # Pinned zone (by pin_rank ASC) before the normal zone.
    rank = row.get("pin_rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return (0, rank)
    return (1, 0)


def sort_rows(rows: Iterable[Row]) -> list[Row]:
    """Rows in list order (docs/contract.md §5): pinned zone by ``pin_rank ASC, last_activity_id DESC,
    conversation_id ASC``, then the normal zone by ``last_activity_id DESC, conversation_id ASC``.
    """
    # Stable sorts from the least significant key up (a reverse sort keeps ties in order).
    ordered = sorted(rows, key=lambda r: _str(r, "conversation_id"))
    ordered.sort(key=_order_key_activity, reverse=True)
    ordered.sort(key=_order_key_zone)
    return ordered


# --------------------------------------------------------------------------------------------


class SessionView:
    """One user's conversation list as the client holds it, patched by frames.

    Per conversation it keeps the last applied row and its version (the ``projection_mailbox_seq``
    of the frame that carried it); for the user, the version of the last frame applied (the chain
    position used for gap detection) and the badge.
    """

    def __init__(self, user_id: int, *, version: int = 0) -> None:
        self.user_id: Final = user_id
        self._version = version
        self._rows: dict[str, dict[str, object]] = {}
        self._row_versions: dict[str, int] = {}
        self._badge: Badge | None = None

    # -- reading

    @property
    def version(self) -> int:
        """The version of the last frame (or pull) applied: the next frame must name it as prev."""
        return self._version

    @property
    def badge(self) -> Badge | None:
        return self._badge

    def row(self, conversation_id: str) -> Mapping[str, object] | None:
        return self._rows.get(conversation_id)

    def row_version(self, conversation_id: str) -> int | None:
        return self._row_versions.get(conversation_id)

    def known(self) -> dict[str, Mapping[str, object]]:
        """Every conversation the client knows, listed or not, by conversation_id."""
        return dict(self._rows)

    def listed(self) -> list[Mapping[str, object]]:
        """The conversations in the list (``listed`` true), in list order (docs/contract.md §5).

        Archived conversations are included (they carry ``archived``; the caller shows them
        under the archived folder).
        """
        return sort_rows(row for row in self._rows.values() if is_listed(row))

    # -- changing

    def reset(self, rows: Iterable[Row], version: int, *, badge: Badge | None = None) -> None:
        """Load a fresh pull: the whole list as of ``version`` (replaces everything held)."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        fresh: dict[str, dict[str, object]] = {}
        for row in rows:
            fresh[_str(row, "conversation_id")] = dict(row)
        self._rows = fresh
        self._row_versions = dict.fromkeys(fresh, version)
        self._version = version
        if badge is not None:
            self._badge = badge

    def offer_badge(self, badge: Badge) -> bool:
        """A badge from a pull or the live stream's hello (absolute totals as of
        ``badge.version``): taken only when newer than the one held, as a BADGE_UPDATE is."""
        held = self._badge
        if held is not None and badge.version <= held.version:
            return False
        self._badge = badge
        return True

    def apply(self, frame: Frame) -> ApplyResult:
        """Apply one frame by the client rule; see the module docstring."""
        kind = frame.get("type")
        if kind == SESSION_DELTA:
            return self._apply_delta(frame)
        if kind == BADGE_UPDATE:
            return self._apply_badge(frame)
        raise FrameError(f"not a client frame: type {kind!r}")

    def _apply_delta(self, frame: Frame) -> ApplyResult:
        if is_correction(frame):
            return self._apply_delta_correction(frame)
        version, prev = _versions(frame)
        rows = _rows(frame)  # validate the whole frame before touching anything
        if _int(frame, "user_id") != self.user_id:
            return ApplyResult(ApplyStatus.FOREIGN, version=version)
        if version <= self._version:
            return ApplyResult(ApplyStatus.STALE, version=version)
        if prev != self._version:
            return ApplyResult(ApplyStatus.GAP, version=version)
        applied: list[str] = []
        for row in rows:
            conversation_id = _str(row, "conversation_id")
            held = self._row_versions.get(conversation_id)
            if held is not None and version <= held:
                continue
            self._rows[conversation_id] = dict(row)  # overwrite, never add
            self._row_versions[conversation_id] = version
            applied.append(conversation_id)
        self._version = version
        return ApplyResult(ApplyStatus.APPLIED, conversations=tuple(applied), version=version)

    def _apply_delta_correction(self, frame: Frame) -> ApplyResult:
        version = _correction_version(frame)
        rows = _rows(frame)
        if _int(frame, "user_id") != self.user_id:
            return ApplyResult(ApplyStatus.FOREIGN, version=version)
        corrected: list[str] = []
        for row in rows:
            conversation_id = _str(row, "conversation_id")
            held = self._row_versions.get(conversation_id)
            if held is not None and held > version:
                continue  # a later frame or pull carried this row: newer than the correction
            self._rows[conversation_id] = dict(row)  # overwrite, never add
            self._row_versions[conversation_id] = version
            corrected.append(conversation_id)
        if not corrected:
            return ApplyResult(ApplyStatus.STALE, version=version)
        return ApplyResult(ApplyStatus.CORRECTED, conversations=tuple(corrected), version=version)

    def _apply_badge(self, frame: Frame) -> ApplyResult:
        correction = is_correction(frame)
        version = _correction_version(frame) if correction else _int(frame, "projection_mailbox_seq")
        badge = badge_of(frame, version)
        if _int(frame, "user_id") != self.user_id:
            return ApplyResult(ApplyStatus.FOREIGN, version=version)
        held = self._badge
        if held is not None and (version < held.version or (version == held.version and not correction)):
            return ApplyResult(ApplyStatus.STALE, version=version)
        self._badge = badge  # absolute totals: the newest is complete, no gap check needed
        return ApplyResult(ApplyStatus.CORRECTED if correction else ApplyStatus.APPLIED, version=version)


# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Segment:
    """Contiguous SESSION_DELTA frames of one user merged into one: versions (prev, version]."""

    prev: int
    version: int
    head: Frame  # the newest frame in the segment (its driving fields are the merged frame's)
    rows: dict[str, tuple[int, Row]]  # conversation_id -> (frame version, row)

    @classmethod
    def of(cls, frame: Frame) -> _Segment:
        version, prev = _versions(frame)
        rows = {_str(row, "conversation_id"): (version, row) for row in _rows(frame)}
        return cls(prev=prev, version=version, head=frame, rows=rows)

    def covers(self, other: _Segment) -> bool:
        return self.prev <= other.prev and other.version <= self.version

    def absorb(self, other: _Segment) -> bool:
        """Merge ``other`` if it is adjacent in the chain; False (and no change) otherwise."""
        if other.prev == self.version:
            self.version = other.version
            self.head = other.head
        elif other.version == self.prev:
            self.prev = other.prev
        else:
            return False
        for conversation_id, (version, row) in other.rows.items():
            held = self.rows.get(conversation_id)
            if held is None or held[0] < version:
                self.rows[conversation_id] = (version, row)  # the newer row replaces, whole
        return True

    def frame(self) -> dict[str, object]:
        return {
            "type": SESSION_DELTA,
            "user_id": self.head.get("user_id"),
            "projection_mailbox_seq": self.version,
            "prev_projection_mailbox_seq": self.prev,
            "driving_event_id": self.head.get("driving_event_id"),
            "driving_mailbox_seq": self.head.get("driving_mailbox_seq"),
            "conversations": [self.rows[key][1] for key in sorted(self.rows)],
        }


@dataclass(slots=True)
class _Pending:
    opened_at_ms: int
    segments: list[_Segment] = field(default_factory=list)
    badge: Frame | None = None


class DeltaMerger:
    """Holds frames for ``window_ms`` and merges them before they are applied.

    Frames of one user received within the window (it opens at that user's first held frame)
    are merged: per conversation only the row from the newest frame is kept, the older row of
    the same conversation is dropped whole. Counts are never combined. Only frames adjacent in
    the user's version chain are merged, so a merged frame is exactly what applying its parts in
    order would give, and a gap stays visible to :class:`SessionView`. Of BADGE_UPDATE frames
    only the newest is kept. Frames a held segment already covers (duplicates) are dropped.

    The clock is injected: pass the current time in ms to ``offer`` / ``poll``.
    """

    def __init__(self, window_ms: int = MERGE_WINDOW_DEFAULT_MS) -> None:
        if not MERGE_WINDOW_MIN_MS <= window_ms <= MERGE_WINDOW_MAX_MS:
            raise ValueError(
                f"session_delta_merge_window must be {MERGE_WINDOW_MIN_MS}-{MERGE_WINDOW_MAX_MS}"
                f" ms, got {window_ms}"
            )
        self.window_ms: Final = window_ms
        self._pending: dict[int, _Pending] = {}

    def __len__(self) -> int:
        """How many users have frames held."""
        return len(self._pending)

    def offer(self, frame: Frame, now_ms: int) -> list[dict[str, object]]:
        """Hold ``frame``; return the frames now due (whose window has elapsed), in order."""
        kind = frame.get("type")
        user_id = _int(frame, "user_id")
        if kind in (SESSION_DELTA, BADGE_UPDATE) and is_correction(frame):
            # Never merged: it is no step in the chain. What is held for the user goes first, so
            # the client sees the user's frames in the order they were produced.
            _correction_version(frame)
            due = self.poll(now_ms)
            earlier = self._release([user_id]) if user_id in self._pending else []
            return [*due, *earlier, dict(frame)]
        if kind == SESSION_DELTA:
            segment = _Segment.of(frame)
        elif kind == BADGE_UPDATE:
            _versions(frame)
            segment = None
        else:
            raise FrameError(f"not a client frame: type {kind!r}")
        pending = self._pending.get(user_id)
        if pending is None:
            pending = self._pending[user_id] = _Pending(opened_at_ms=now_ms)
        if segment is None:
            held = pending.badge
            if held is None or _int(held, "projection_mailbox_seq") < _int(frame, "projection_mailbox_seq"):
                pending.badge = frame
        else:
            self._hold(pending, segment)
        return self.poll(now_ms)

    @staticmethod
    def _hold(pending: _Pending, segment: _Segment) -> None:
        if any(held.covers(segment) for held in pending.segments):
            return  # a duplicate of what is held
        merged = next((held for held in pending.segments if held.absorb(segment)), None)
        if merged is None:
            pending.segments.append(segment)
            pending.segments.sort(key=lambda s: s.version)
            return
        # The merged segment may now touch a neighbour: coalesce until nothing is adjacent.
        pending.segments.remove(merged)
        DeltaMerger._hold(pending, merged)

    def poll(self, now_ms: int) -> list[dict[str, object]]:
        """Return (and stop holding) the frames of every user whose window has elapsed."""
        due = [
            user_id
            for user_id, pending in self._pending.items()
            if now_ms - pending.opened_at_ms >= self.window_ms
        ]
        return self._release(sorted(due))

    def flush(self) -> list[dict[str, object]]:
        """Return every held frame now (e.g. when the connection closes)."""
        return self._release(sorted(self._pending))

    def _release(self, user_ids: list[int]) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for user_id in user_ids:
            pending = self._pending.pop(user_id)
            out.extend(segment.frame() for segment in pending.segments)
            if pending.badge is not None:
                out.append(dict(pending.badge))
        return out
