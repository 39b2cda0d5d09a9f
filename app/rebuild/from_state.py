"""Rebuild from state (docs/contract.md §6, issue 7): every user's rows from UserConversationState and the
MessageStore heads (:func:`app.domain.rebuild.row_from_state`, bounded recompute), written into a
fresh projection namespace; then a diff against the live namespace.

The rebuilt namespace is never served until ``projector rebuild --swap`` sets ``{base}:serving``
(app/stores/redis_projection.py), one atomic SET.

What state cannot know (README, "Rebuild from state: what state cannot know", each with a test):
a recall that did not reach a former member, and the messages a member received during an
earlier membership (both show as real differences in the diff); and the versions, reported apart
in the diff, never counted as a difference:
  - a row's ``projection_mailbox_seq``: the mailbox_seq of the last entry applied to the row.
    State keeps ``updated_mailbox_seq``, the last *state* change; message entries do not move it,
    so the rebuilt value is <= the live one.
  - the user's version (meta ``version``, the badge's ``projection_mailbox_seq``): the highest
    applied mailbox_seq of the user, for the same reason; the rebuild writes the highest
    ``updated_mailbox_seq`` of the user's rows (at least 1, so the fresh write is accepted), and
    the worker's next flush (a higher version) goes through.
``hidden_before`` (clear history) and ``deleted_before`` (delete conversation) are separate state
columns, so they stay distinguishable; a deleted, not revived conversation is rebuilt with
``listed: false`` (the store keeps it so serving can tell "deleted" from "never known").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from app.domain.badge import full_recompute
from app.domain.conversation import ConversationState
from app.domain.flush import UserFlush
from app.domain.ports import MessageStore
from app.domain.projection_store import ProjectionStore
from app.domain.rebuild import Head, as_replay_base, row_from_state
from app.rebuild.progress import Progress

UNKNOWABLE_FROM_STATE: Final = ("projection_mailbox_seq",)
DRIVING_EVENT_ID: Final = "rebuild-from-state"
USERS_PER_CHUNK: Final = 100


class StateSource(Protocol):
    def load_user(self, user_id: int) -> list[dict[str, Any]]: ...


class HeadLike(Protocol):
    @property
    def latest_conversation_seq(self) -> int: ...
    @property
    def last_message_id(self) -> str: ...
    @property
    def last_activity_id(self) -> str: ...


class HeadSource(Protocol):
    def heads(self, conversation_ids: Iterable[str]) -> Mapping[str, HeadLike]: ...


def rows_from_state(
    user_id: int,
    states: Sequence[Mapping[str, Any]],
    heads: Mapping[str, HeadLike],
    messages: MessageStore,
    limit: int,
) -> list[ConversationState]:
    """Every row (listed or not) of one user from its UserConversationState rows and heads."""
    rows = []
    for state in states:
        cid = str(state["conversation_id"])
        h = heads.get(cid)
        head = Head(h.latest_conversation_seq, h.last_message_id, h.last_activity_id) if h else None
        rows.append(row_from_state(user_id, cid, state, head, messages, limit))
    return rows


def state_version(rows: Iterable[ConversationState]) -> int:
    """The user version a rebuild from state writes: the highest ``updated_mailbox_seq`` (the
    last state-changing entry; at least 1, so the fresh write is accepted)."""
    return max(1, max((row.version for row in rows), default=1))


def rebuild_user(
    user_id: int,
    states: Sequence[Mapping[str, Any]],
    heads: Mapping[str, HeadLike],
    messages: MessageStore,
    *,
    limit: int,
    include_muted: bool,
    badge_mode: str = "messages",
) -> UserFlush | None:
    """One user's batch from state: every row (listed or not), the badge in full, a version."""
    rows = rows_from_state(user_id, states, heads, messages, limit)
    if not rows:
        return None
    version = state_version(rows)
    return UserFlush(
        user_id=user_id,
        rows=[row.as_row() for row in rows],
        # State keeps no badge preferences (README, "what state cannot know"): the defaults.
        badge=full_recompute(rows, include_muted, badge_mode),
        projection_mailbox_seq=version,
        prev_projection_mailbox_seq=0,
        structure_version=1,
        driving_event_id=DRIVING_EVENT_ID,
        driving_mailbox_seq=version,
    )


class StateBase:
    """Users' rows from UserConversationState + MessageStore heads, as the base a rebuild by
    replay from a timestamp applies the retained log on (blocking driver calls: run it in a
    worker thread)."""

    def __init__(self, state: StateSource, heads: HeadSource, messages: MessageStore, limit: int) -> None:
        self.state = state
        self.heads = heads
        self.messages = messages
        self.limit = limit

    def load(self, user_ids: Iterable[int]) -> dict[int, tuple[list[ConversationState], int]]:
        """(rows, version) per user that state knows; users it does not know are left out."""
        out: dict[int, tuple[list[ConversationState], int]] = {}
        for user_id in user_ids:
            states = self.state.load_user(user_id)
            if not states:
                continue
            found = self.heads.heads([str(s["conversation_id"]) for s in states])
            rows = [
                as_replay_base(row)
                for row in rows_from_state(user_id, states, found, self.messages, self.limit)
            ]
            out[user_id] = (rows, state_version(rows))
        return out


@dataclass(slots=True)
class RebuildResult:
    users: int = 0
    rows: int = 0
    listed_rows: int = 0
    seconds: float = 0.0


async def rebuild_from_state(
    user_ids: Sequence[int],
    *,
    state: StateSource,
    heads: HeadSource,
    messages: MessageStore,
    target: ProjectionStore,
    limit: int,
    include_muted: bool,
    badge_mode: str = "messages",
    progress: Progress | None = None,
) -> RebuildResult:
    """Rebuild these users into `target`. The Cassandra reads block: each chunk of users is
    read and recomputed in a worker thread, then written (one atomic batch per user)."""
    result = RebuildResult()
    started = time.monotonic()

    def chunk_flushes(chunk: Sequence[int]) -> list[UserFlush]:
        out = []
        for user_id in chunk:
            states = state.load_user(user_id)
            found = heads.heads([str(s["conversation_id"]) for s in states]) if states else {}
            batch = rebuild_user(
                user_id,
                states,
                found,
                messages,
                limit=limit,
                include_muted=include_muted,
                badge_mode=badge_mode,
            )
            if batch is not None:
                out.append(batch)
        return out

    done = 0
    for start in range(0, len(user_ids), USERS_PER_CHUNK):
        chunk = user_ids[start : start + USERS_PER_CHUNK]
        batches = await asyncio.to_thread(chunk_flushes, chunk)
        if batches:
            await target.write(batches)
        for batch in batches:
            result.users += 1
            result.rows += len(batch.rows)
            result.listed_rows += sum(1 for row in batch.rows if row["listed"])
        done += len(chunk)
        if progress is not None:
            progress.update(done, result.rows)
    if progress is not None:
        progress.update(done, result.rows, final=True)
    result.seconds = time.monotonic() - started
    return result
