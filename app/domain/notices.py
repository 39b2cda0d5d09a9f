"""Member notifications (seed 004; docs/contract.md §9): which `message` entries make a MEMBER_NOTICE.

A `message` entry may carry `notification`, an integer kind. Two kinds mean something to a
client's member directory, and only those are forwarded to the member's live stream:

* 24 — a member joined: re-read the public roster;
* 27 — a member left, with history: re-read it and also drop the history window.

Neither carries a fact a client could apply by itself (seed 004: "两者都不携带可直接落地的成员或
已读事实"): a notice only says "read again". Any other kind is a plain message. The message itself
is processed like every other one whatever its kind (its `counts_unread` decides whether it
counts): a notice is produced *beside* the message's effect, never instead of it.

Pure: the processor reports notices (`Step.notices`); the worker publishes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from app.domain.entries import MessageEntry

MEMBER_NOTICE: Final = "MEMBER_NOTICE"
MEMBER_JOINED: Final = 24
MEMBER_LEFT_HISTORY: Final = 27
NOTICE_KINDS: Final = frozenset({MEMBER_JOINED, MEMBER_LEFT_HISTORY})


@dataclass(frozen=True, slots=True)
class MemberNotice:
    """A notice for `user_id`'s stream, made by the `message` entry of `mailbox_seq`."""

    user_id: int
    conversation_id: str
    kind: int
    conversation_seq: int
    mailbox_seq: int

    def frame(self) -> dict[str, Any]:
        """The frame on the session-delta topic (keyed by user; ids stay numbers there, the
        gateway writes them as strings towards clients: docs/contract.md §9).

        `projection_mailbox_seq` is the entry's mailbox_seq: where in the user's sequence the
        notice was made, which is what the gateway's resume log orders it by (docs/gateway.md). A
        notice has no `prev_projection_mailbox_seq`: it is not a step of the list's version chain,
        and (conversation_id, kind, conversation_seq) names it for clients that see it twice."""
        return {
            "type": MEMBER_NOTICE,
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "kind": self.kind,
            "conversation_seq": self.conversation_seq,
            "projection_mailbox_seq": self.mailbox_seq,
        }


def notice_of(entry: MessageEntry) -> MemberNotice | None:
    """The notice an applied `message` entry makes, if its kind is one clients react to."""
    kind = entry.notification
    if isinstance(kind, int) and kind in NOTICE_KINDS:
        return MemberNotice(
            entry.user_id, entry.conversation_id, kind, entry.conversation_seq, entry.mailbox_seq
        )
    return None
