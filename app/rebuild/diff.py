"""The live namespace against a rebuilt one, field by field (what state cannot know reported apart)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from app.domain.projection_store import StoredProjection
from app.rebuild.from_state import UNKNOWABLE_FROM_STATE

BADGE_FIELDS: Final = ("total_unread", "total_mention", "muted_unread")
EXAMPLES: Final = 20


class StoreReader(Protocol):
    async def load(self, user_id: int) -> StoredProjection: ...


@dataclass(slots=True)
class Diff:
    """Live namespace vs rebuilt namespace, field by field."""

    users: int = 0
    rows_live: int = 0
    rows_rebuilt: int = 0
    rows_added: int = 0  # rebuilt, not live
    rows_removed: int = 0  # live, not rebuilt
    rows_changed: int = 0  # both, some field differs (fields state can know)
    fields_changed: dict[str, int] = field(default_factory=dict)
    unknowable_differing: dict[str, int] = field(default_factory=dict)  # not counted above
    badges_differing: int = 0
    examples: dict[str, list[Any]] = field(
        default_factory=lambda: {"added": [], "removed": [], "changed": [], "badges": []}
    )

    @property
    def identical(self) -> bool:
        return not (self.rows_added or self.rows_removed or self.rows_changed or self.badges_differing)

    def as_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "users": self.users,
            "rows_live": self.rows_live,
            "rows_rebuilt": self.rows_rebuilt,
            "rows_added": self.rows_added,
            "rows_removed": self.rows_removed,
            "rows_changed": self.rows_changed,
            "fields_changed": dict(sorted(self.fields_changed.items())),
            "unknowable_from_state": list(UNKNOWABLE_FROM_STATE),
            "unknowable_differing": dict(sorted(self.unknowable_differing.items())),
            "badges_differing": self.badges_differing,
            "examples": self.examples,
        }

    def _example(self, kind: str, item: Any) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(item)


async def diff_namespaces(
    live: StoreReader,
    rebuilt: StoreReader,
    user_ids: Iterable[int],
    ignore: Sequence[str] = UNKNOWABLE_FROM_STATE,
) -> Diff:
    out = Diff()
    for user_id in user_ids:
        a = await live.load(user_id)
        b = await rebuilt.load(user_id)
        out.users += 1
        out.rows_live += len(a.rows)
        out.rows_rebuilt += len(b.rows)
        for cid in sorted(b.rows.keys() - a.rows.keys()):
            out.rows_added += 1
            out._example("added", {"user_id": user_id, "conversation_id": cid})
        for cid in sorted(a.rows.keys() - b.rows.keys()):
            out.rows_removed += 1
            out._example("removed", {"user_id": user_id, "conversation_id": cid})
        for cid in sorted(a.rows.keys() & b.rows.keys()):
            old, new = a.rows[cid], b.rows[cid]
            changed = {}
            for name in sorted(old.keys() | new.keys()):
                if old.get(name) == new.get(name):
                    continue
                if name in ignore:
                    out.unknowable_differing[name] = out.unknowable_differing.get(name, 0) + 1
                else:
                    changed[name] = [old.get(name), new.get(name)]
                    out.fields_changed[name] = out.fields_changed.get(name, 0) + 1
            if changed:
                out.rows_changed += 1
                out._example("changed", {"user_id": user_id, "conversation_id": cid, "fields": changed})
        badge_a = {name: getattr(a, name) for name in BADGE_FIELDS}
        badge_b = {name: getattr(b, name) for name in BADGE_FIELDS}
        if badge_a != badge_b:
            out.badges_differing += 1
            out._example("badges", {"user_id": user_id, "live": badge_a, "rebuilt": badge_b})
        if a.projection_mailbox_seq != b.projection_mailbox_seq:
            key = "user_version"
            out.unknowable_differing[key] = out.unknowable_differing.get(key, 0) + 1
    return out
