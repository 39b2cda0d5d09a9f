"""The projector: applies gated entries per user, keeps badges, and produces flush batches.

Replay and the worker drive this same object; it does no I/O of its own (the MessageStore port
is the only thing it reads, for bounded recomputes) and takes time as an argument.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from app.domain.badge import BADGE_MODES, MESSAGES, ZERO, Badge, badge_of, full_recompute, moved, row_key
from app.domain.conversation import STRUCTURAL_ENTRIES, ConversationState
from app.domain.entries import (
    BadgePreferencesEntry,
    Entry,
    MailboxDirtyEntry,
    MessageEntry,
    ReadEntry,
)
from app.domain.fast_lane import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_MAX_MEMBERS_MAX,
    FAST_LANE_MAX_MEMBERS_MIN,
    FAST_LANE_PER_USER_PER_S,
    FAST_LANE_PER_USER_PER_S_MAX,
    FAST_LANE_PER_USER_PER_S_MIN,
)
from app.domain.flush import DirtySet, FlushPolicy, UserFlush
from app.domain.ports import MessageStore
from app.domain.record_fields import bool_field, int_field, list_field, str_field
from app.domain.unread import UNREAD_PRECISE_LIMIT

# The bounds of the processing configuration, declared once (the settings and the replay
# command's options use these same constants). A window of 0 flushes before every entry after the
# first; a bound of 0 dirty rows flushes after every entry.
WINDOW_MS_MIN = 0
MAX_DIRTY_ROWS_MIN = 0
UNREAD_PRECISE_LIMIT_MIN = 1


@dataclass(frozen=True, slots=True)
class ProjectorConfig:
    window_ms: int = 5000  # >= WINDOW_MS_MIN
    max_dirty_rows: int = 100_000  # >= MAX_DIRTY_ROWS_MIN
    include_muted: bool = False
    unread_precise_limit: int = UNREAD_PRECISE_LIMIT  # >= UNREAD_PRECISE_LIMIT_MIN
    # docs/contract.md §10: the badge mode of a user who sent no badge_preferences entry.
    badge_mode: str = MESSAGES
    # docs/contract.md §10, the fast lane (app/domain/fast_lane.py): a message in a conversation
    # of at most this many members flushes its user at once; at most `fast_lane_per_user_per_s`
    # fast flushes per user and second (0: the fast lane is off).
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S

    def __post_init__(self) -> None:
        if self.badge_mode not in BADGE_MODES:
            raise ValueError(f"badge_mode must be one of {BADGE_MODES}, got {self.badge_mode!r}")
        if self.window_ms < WINDOW_MS_MIN:
            raise ValueError(f"window_ms must be >= {WINDOW_MS_MIN}, got {self.window_ms}")
        if self.max_dirty_rows < MAX_DIRTY_ROWS_MIN:
            raise ValueError(f"max_dirty_rows must be >= {MAX_DIRTY_ROWS_MIN}, got {self.max_dirty_rows}")
        if self.unread_precise_limit < UNREAD_PRECISE_LIMIT_MIN:
            raise ValueError(
                f"unread_precise_limit must be >= {UNREAD_PRECISE_LIMIT_MIN}, got {self.unread_precise_limit}"
            )
        if not FAST_LANE_MAX_MEMBERS_MIN <= self.fast_lane_max_members <= FAST_LANE_MAX_MEMBERS_MAX:
            raise ValueError(
                f"fast_lane_max_members must be in [{FAST_LANE_MAX_MEMBERS_MIN},"
                f" {FAST_LANE_MAX_MEMBERS_MAX}], got {self.fast_lane_max_members}"
            )
        if not FAST_LANE_PER_USER_PER_S_MIN <= self.fast_lane_per_user_per_s <= FAST_LANE_PER_USER_PER_S_MAX:
            raise ValueError(
                f"fast_lane_per_user_per_s must be in [{FAST_LANE_PER_USER_PER_S_MIN},"
                f" {FAST_LANE_PER_USER_PER_S_MAX}], got {self.fast_lane_per_user_per_s}"
            )


class Applied(Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"


class UserState:
    """Per-user state: rows, version, badge.

    `rows` holds the user's rows that are in memory; `complete` says whether that is all of them
    (a new user, or one whose rows were all read). With state kept on disk (app/domain/residency.py)
    a user's rows are read one by one as entries touch them, and all of them before anything
    needs them all (a full badge recompute)."""

    __slots__ = (
        "archived_mention",
        "archived_unread",
        "badge_mode",
        "badge_reconcile",
        "complete",
        "driving_event_id",
        "flushed_seq",
        "include_muted",
        "muted_unread",
        "preferences_seq",
        "projection_mailbox_seq",
        "rows",
        "structure_version",
        "total_mention",
        "total_unread",
        "user_id",
    )

    def __init__(self, user_id: int) -> None:
        self.user_id = user_id
        self.rows: dict[str, ConversationState] = {}
        self.complete = True
        self.projection_mailbox_seq = 0  # highest applied mailbox_seq: the version source
        self.flushed_seq = 0  # version of the last flushed batch (prev_projection_mailbox_seq)
        self.driving_event_id = ""
        # The badge as three counters moved in place by every applied entry (`badge` is the
        # value): no Badge tuple is made per message.
        self.total_unread = 0
        self.total_mention = 0
        self.muted_unread = 0
        self.archived_unread = 0  # docs/contract.md §10: the archived folder's totals
        self.archived_mention = 0
        # The badge preferences in force (§10): the deployment's defaults (set by the projector)
        # until the user's badge_preferences entry, whose mailbox_seq is preferences_seq (0: none).
        self.badge_mode = MESSAGES
        self.include_muted = False
        self.preferences_seq = 0
        self.structure_version = 0  # bumped by pin/unpin/archive/unarchive/leave/delete
        # A reconcile happened since the last flush: the flush recomputes the badge in full
        # (seed §4). Not persisted: a restart recomputes every badge in full anyway (`restarted`).
        self.badge_reconcile = False

    @property
    def badge(self) -> Badge:
        return badge_of(self)

    @badge.setter
    def badge(self, badge: Badge) -> None:
        """The counts only: the preferences are the user's (`badge_mode`, `include_muted`)."""
        self.total_unread = badge.total_unread
        self.total_mention = badge.total_mention
        self.muted_unread = badge.muted_unread
        self.archived_unread = badge.archived_unread
        self.archived_mention = badge.archived_mention

    def recompute_badge(self) -> None:
        """The badge in full from the rows in memory, in the user's preferences."""
        self.badge = full_recompute(self.rows.values(), self.include_muted, self.badge_mode)

    def dump(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "projection_mailbox_seq": self.projection_mailbox_seq,
            "flushed_seq": self.flushed_seq,
            "driving_event_id": self.driving_event_id,
            "badge": list(self.badge.counts),
            "structure_version": self.structure_version,
            # Only a user's own choice is kept: the defaults follow the deployment's settings.
            "preferences": (
                [self.badge_mode, self.include_muted, self.preferences_seq] if self.preferences_seq else None
            ),
        }

    @classmethod
    def load(cls, state: dict[str, Any], rows: Iterable[ConversationState]) -> UserState:
        """A user from its record; `rows` are the ones read with it (`complete` is the caller's
        to say)."""
        user = cls(int_field(state["user_id"], "user_id"))
        user.projection_mailbox_seq = int_field(state["projection_mailbox_seq"], "projection_mailbox_seq")
        user.flushed_seq = int_field(state["flushed_seq"], "flushed_seq")
        user.driving_event_id = str_field(state["driving_event_id"], "driving_event_id")
        badge = list_field(state["badge"], "badge")
        if len(badge) not in (3, 5):  # 3: written before the folder totals (§10)
            raise ValueError(f"badge: expected 3 or 5 counts, got {len(badge)}")
        counts = [int_field(n, "badge") for n in badge]
        user.total_unread, user.total_mention, user.muted_unread = counts[0], counts[1], counts[2]
        if len(counts) == 5:
            user.archived_unread, user.archived_mention = counts[3], counts[4]
        preferences = state.get("preferences")
        if preferences is not None:
            preferences = list_field(preferences, "preferences")
            if len(preferences) != 3:
                raise ValueError(f"preferences: expected 3 values, got {len(preferences)}")
            mode = str_field(preferences[0], "preferences")
            if mode not in BADGE_MODES:
                raise ValueError(f"preferences: unknown badge_mode {mode!r}")
            user.badge_mode = mode
            user.include_muted = bool_field(preferences[1], "preferences")
            user.preferences_seq = int_field(preferences[2], "preferences")
        user.structure_version = int_field(state["structure_version"], "structure_version")
        user.rows = {row.conversation_id: row for row in rows}
        return user


class StateLoader(Protocol):
    """Where users and rows not in memory come from (app/domain/residency.py); the projector
    asks only on a miss."""

    def load_user(self, user_id: int) -> UserState | None: ...

    def load_row(self, user: UserState, conversation_id: str) -> ConversationState | None: ...

    def complete(self, user: UserState) -> None:
        """Read every row of the user that is not in memory yet."""
        ...

    def created(self, user: UserState, row: ConversationState | None) -> None:
        """A new user (row None) or a new row was created in memory."""
        ...


class Projector:
    """All users of one or more partitions."""

    def __init__(self, config: ProjectorConfig, store: MessageStore) -> None:
        self.config = config
        self.store = store
        # Read on every entry: the config's values, one attribute away.
        self._limit = config.unread_precise_limit
        self.users: dict[int, UserState] = {}
        self.policy = FlushPolicy(config.window_ms, config.max_dirty_rows)  # validated by the config
        self.dirty = DirtySet()
        # None: everything is in memory (replay, tests). Otherwise misses are read through it.
        self.loader: StateLoader | None = None

    # -- applying -------------------------------------------------------------------------------

    def user(self, user_id: int) -> UserState | None:
        """The user's state, read from the loader when it is not in memory."""
        user = self.users.get(user_id)
        if user is None and self.loader is not None:
            user = self.loader.load_user(user_id)
        return user

    def defaults(self, user: UserState) -> None:
        """A user who chose no badge preferences gets the deployment's (a new or loaded user)."""
        if not user.preferences_seq:
            user.badge_mode = self.config.badge_mode
            user.include_muted = self.config.include_muted

    def row(self, user: UserState, conversation_id: str) -> ConversationState | None:
        row = user.rows.get(conversation_id)
        if row is None and not user.complete and self.loader is not None:
            row = self.loader.load_row(user, conversation_id)
        return row

    def complete(self, user: UserState) -> None:
        """Every row of the user in memory (a full badge recompute needs them all)."""
        if not user.complete and self.loader is not None:
            self.loader.complete(user)

    def is_duplicate(self, entry: Entry) -> bool:
        user = self.user(entry.user_id)
        return user is not None and entry.mailbox_seq <= user.projection_mailbox_seq

    def apply(self, entry: Entry, now_ms: int) -> Applied:
        """Apply one entry released by the watermark gate (in mailbox_seq order per user)."""
        if type(entry) is MessageEntry:
            applied = self.apply_message(entry, now_ms)
            return Applied.APPLIED if applied else Applied.DUPLICATE
        if type(entry) is BadgePreferencesEntry:
            return self._apply_preferences(entry, now_ms)
        user, found = self._user_and_row(entry)
        if found is None:
            return Applied.DUPLICATE
        row = found
        kind = type(entry)
        before = row_key(row)
        base_before = row.base
        row.apply(entry, self.store, self._limit)
        if before != row_key(row):
            user.badge = moved(user.badge, row, before)
        if kind is MailboxDirtyEntry or (
            kind is ReadEntry and row.base != base_before and row.base < row.latest
        ):
            # Reconcile triggers (seed §3.4): MAILBOX_DIRTY, and a read (from any device)
            # that moved the base to below the head: the row was recomputed (never zeroed)
            # by the three-state rule, and the badge is then recomputed in full, cancelling
            # any drift the deltas accumulated. Once per flush rather than per read: a user
            # reading through a busy list sends many reads in one window, and the badge only
            # leaves the projector with a flush.
            user.badge_reconcile = True
        if kind in STRUCTURAL_ENTRIES:
            user.structure_version += 1
        user.projection_mailbox_seq = entry.mailbox_seq
        user.driving_event_id = entry.event_id
        if not row.dirty:
            row.dirty = True
            self.dirty.mark(user.user_id, row.conversation_id)
        if self.policy.window_start is None:
            self.policy.window_start = now_ms
        return Applied.APPLIED

    def _apply_preferences(self, entry: BadgePreferencesEntry, now_ms: int) -> Applied:
        """A user-level entry (§10): no row is made known or touched. The badge is recomputed in
        full (every row read) and goes out with the user's next flush, rows or none."""
        user_id = entry.user_id
        user = self.user(user_id)
        if user is None:
            user = self.users[user_id] = UserState(user_id)
            if self.loader is not None:
                self.loader.created(user, None)
        elif entry.mailbox_seq <= user.projection_mailbox_seq:
            return Applied.DUPLICATE
        user.badge_mode = entry.badge_mode
        user.include_muted = entry.include_muted
        user.preferences_seq = entry.mailbox_seq
        self.complete(user)
        user.recompute_badge()
        user.badge_reconcile = False
        user.projection_mailbox_seq = entry.mailbox_seq
        user.driving_event_id = entry.event_id
        self.dirty.mark_user(user_id)
        if self.policy.window_start is None:
            self.policy.window_start = now_ms
        return Applied.APPLIED

    def apply_message(self, entry: MessageEntry, now_ms: int) -> bool:
        """`apply` of a message (the hot path: what most entries are); False for a duplicate.

        A message moves the counts only (never the zone: membership, folder, mute), so the badge
        moves by the counts' deltas, as `moved` does in that case."""
        user_id = entry.user_id
        mailbox_seq = entry.mailbox_seq
        user = self.users.get(user_id)
        row = user.rows.get(entry.conversation_id) if user is not None else None
        if row is None or user is None:  # a user or a row not in memory: read or created
            user, row = self._user_and_row(entry)
            if row is None:
                return False
        elif mailbox_seq <= user.projection_mailbox_seq:
            return False
        unread = row.unread_count
        mention = row.mention_count
        row.apply_message(entry, self.store, self._limit)
        d_unread = row.unread_count - unread
        d_mention = row.mention_count - mention
        if d_unread or d_mention:
            if row.marked_unread or user.badge_mode != "messages":
                # A marked row's floor of 1, or counts of rows: the general rule (§10).
                before = (unread, mention, row.membership, row.archived, row.muted, row.marked_unread)
                user.badge = moved(user.badge, row, before)
            else:
                if row.membership == "active":
                    if row.archived:
                        if user.include_muted or not row.muted:
                            user.archived_unread += d_unread
                        user.archived_mention += d_mention
                    elif user.include_muted or not row.muted:
                        user.total_unread += d_unread
                    user.total_mention += d_mention
                if row.muted:
                    user.muted_unread += d_unread
        user.projection_mailbox_seq = mailbox_seq
        user.driving_event_id = entry.event_id
        if not row.dirty:
            row.dirty = True
            self.dirty.mark(user_id, row.conversation_id)
        policy = self.policy
        if policy.window_start is None:
            policy.window_start = now_ms
        return True

    def _user_and_row(self, entry: Entry) -> tuple[UserState, ConversationState | None]:
        """`apply`'s lookups when the user or the row is not in memory: read through the loader
        or created; the row is None when the entry is a duplicate (the user's version is past it)."""
        user_id = entry.user_id
        user = self.users.get(user_id)
        if user is None and self.loader is not None:
            user = self.loader.load_user(user_id)
        if user is None:
            user = self.users[user_id] = UserState(user_id)
            self.defaults(user)
            if self.loader is not None:
                self.loader.created(user, None)
        elif entry.mailbox_seq <= user.projection_mailbox_seq:
            return user, None
        conversation_id = entry.conversation_id
        row = user.rows.get(conversation_id)
        if row is None and not user.complete and self.loader is not None:
            row = self.loader.load_row(user, conversation_id)
        if row is None:
            # Interned: every member's row of a conversation shares one id string.
            conversation_id = sys.intern(conversation_id)
            row = user.rows[conversation_id] = ConversationState(user.user_id, conversation_id)
            if self.loader is not None:
                self.loader.created(user, row)
        return user, row

    def adopt(self, user_id: int, rows: Iterable[ConversationState], version: int, event_id: str) -> None:
        """Take a user's state from elsewhere (a rebuild's base, rows from durable state), as of
        `version`: entries at or below it are duplicates from now on. Every row is dirty, so the
        user's next flush writes the user whole; the badge is recomputed in full from the rows."""
        if user_id in self.users:
            raise ValueError(f"user {user_id} already has state here")
        user = self.users[user_id] = UserState(user_id)
        user.rows = {row.conversation_id: row for row in rows}
        user.projection_mailbox_seq = version
        user.driving_event_id = event_id
        user.structure_version = 1
        self.defaults(user)
        user.recompute_badge()
        for conversation_id in user.rows:
            self.dirty.mark(user_id, conversation_id)

    # -- flushing -------------------------------------------------------------------------------

    def flush_due(self, now_ms: int) -> bool:
        dirty = self.dirty
        if not dirty.row_count:
            # Users dirty with no row (a badge_preferences entry, §10) flush at the window's end.
            return bool(dirty.rows) and self.policy.window_elapsed(now_ms)
        return self.policy.due(now_ms, dirty.row_count)

    def mark_dirty(self, user_id: int, conversation_ids: Iterable[str], now_ms: int) -> None:
        """Have these rows written again by the user's next flush (an audit's repair through the
        flush path); opens a window if none is open, so that flush comes within one window."""
        for conversation_id in conversation_ids:
            self.dirty.mark(user_id, conversation_id)
        if self.policy.window_start is None and self.dirty.row_count:
            self.policy.window_start = now_ms

    def flush(self) -> list[UserFlush]:
        """One batch per dirty user (ascending user_id), rows sorted by conversation_id."""
        batches = list(self._batches())
        self.dirty.clear()
        self.policy.flushed()
        return batches

    def flush_user(self, user_id: int) -> UserFlush | None:
        """The fast lane's flush (docs/contract.md §10): this user's dirty rows at once, in one
        batch like the window's; None when the user has nothing dirty. The window is left as it
        is: the other users' rows still wait for its end."""
        conversation_ids = self.dirty.take(user_id)
        if conversation_ids is None:
            return None
        return self._batch(self.users[user_id], sorted(conversation_ids), fast=True)

    def _batches(self) -> Iterator[UserFlush]:
        for user_id in self.dirty.users:
            user = self.users[user_id]
            yield self._batch(user, sorted(self.dirty.rows.get(user_id, ())))

    def _batch(self, user: UserState, conversation_ids: list[str], fast: bool = False) -> UserFlush:
        version = user.projection_mailbox_seq
        if user.badge_reconcile:
            self.complete(user)
            user.recompute_badge()
            user.badge_reconcile = False
        rows = []
        for cid in conversation_ids:
            row = user.rows[cid]
            row.writes += 1
            if fast:
                row.fast_writes += 1
            row.dirty = False
            rows.append(row.as_row())
        batch = UserFlush(
            user_id=user.user_id,
            rows=rows,
            badge=user.badge,
            projection_mailbox_seq=version,
            prev_projection_mailbox_seq=user.flushed_seq,
            structure_version=user.structure_version,
            driving_event_id=user.driving_event_id,
            driving_mailbox_seq=version,
            fast=fast,
        )
        user.flushed_seq = version
        return batch

    # -- reads ----------------------------------------------------------------------------------

    def badge_of(self, user_id: int) -> Badge:
        user = self.users.get(user_id)
        return user.badge if user else ZERO

    # -- persistence ----------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """What the changelog tables hold: rows and per-user state (never the dirty set)."""
        return {
            "users": [user.dump() for user in self.users.values()],
            "rows": [
                [user.user_id, cid, row.dump()]
                for user in self.users.values()
                for cid, row in user.rows.items()
            ],
        }

    @classmethod
    def restore(cls, config: ProjectorConfig, store: MessageStore, state: dict[str, Any]) -> Projector:
        projector = cls(config, store)
        rows_by_user: dict[int, list[ConversationState]] = {}
        for user_id, conversation_id, row_state in state["rows"]:
            row = ConversationState.load(row_state, user_id, conversation_id)
            rows_by_user.setdefault(row.user_id, []).append(row)
        for user_state in state["users"]:
            user_id = int(user_state["user_id"])
            projector.users[user_id] = UserState.load(user_state, rows_by_user.get(user_id, []))
        projector.restarted()
        return projector

    def restarted(self) -> None:
        """What a restart does, once the rows and users are back from the changelog.

        The dirty set is gone (`lose_dirty_set`). And a restart replays the input from the last
        committed offset, an older checkpoint than the state: a reconcile trigger (seed §3.4),
        so every badge is recomputed in full from its rows. It leaves the projector with the
        user's next flush (a badge is only ever written with a new version)."""
        self.lose_dirty_set()
        for user in self.users.values():
            self.defaults(user)
            user.recompute_badge()

    def lose_dirty_set(self) -> None:
        """What a restart does to the dirty set: it is gone, so every row of every user with
        anything not yet flushed is dirty again.

        Re-flushing unchanged rows is harmless: rows are absolute and the store refuses versions
        that are not newer. A user whose version was flushed is complete in the store and in the
        frames already; a frame for it could only repeat its version, which breaks the chain.
        """
        self.dirty = DirtySet()
        for user_id, user in self.users.items():
            unflushed = user.projection_mailbox_seq > user.flushed_seq
            if unflushed:
                self.dirty.mark_user(user_id)  # a user whose last entry touched no row (§10)
            for conversation_id, row in user.rows.items():
                row.dirty = unflushed  # the flags follow the new set
                if unflushed:
                    self.dirty.mark(user_id, conversation_id)
