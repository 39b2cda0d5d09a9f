"""MemberDirectory: one member store per (environment, account, group), with the seed's rules.

Seed 004's rules and where they live here:

* Local cache restore and the first server page **start together** (:meth:`MemberDirectory._load`).
  A cache hit is shown first but never sets ``fresh`` and never skips the server; once a
  server page of this generation arrived, a late cache result is dropped whole.
* Pages of 50 **merge by member reference** (``user_id``): the list is never cleared, an
  unchanged member keeps its object (:meth:`Member.with_base`), and a base page never erases
  names, avatars or statistics (they are not base fields).
* Presentation (``/members/by-user-ids`` with statistics and the viewer's own remarks, plus an
  optional profile source for names and avatars) runs in batches of at most 50, **at most two
  in flight**; base paging never waits for it. It only updates members that are still listed:
  it cannot create or revive one. The server's remark replaces a cached one (None clears it).
* A traversal is **not a snapshot**: members it did not return are checked afterwards with
  ``/members/by-user-ids`` and only confirmed removals are applied.
* At most 200 pages per traversal; past that the data read so far stays and the traversal
  fails with :class:`TraversalLimitExceeded` (no removals, no cache write: it is not complete).
* A **generation** number isolates everything asynchronous: request de-duplication keys and
  cache writes carry it, and any result of an older generation is dropped. It moves on access
  denial, invalidation, and deactivation (last subscriber gone).
* 2001/2002 clear the memory and the disk copy and are reported as such; every other failure
  keeps the list (retry with :meth:`refresh`).

:class:`MemberDirectoryRegistry` holds the stores of one environment/account and keeps idle
ones in memory within 20 groups / 20,000 members (oldest idle whole group evicted first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from app.members.cache import CacheKey, SqliteMemberCache
from app.members.model import (
    BY_IDS_MAX,
    PAGE_LIMIT_DEFAULT,
    BaseMember,
    JoinEvent,
    Member,
    PresentationResult,
    Profile,
    merge_join_events,
)
from app.members.source import (
    MemberAccessDenied,
    MemberSource,
    MemberSourceError,
    MemberUnavailable,
    ProfileSource,
    TraversalLimitExceeded,
)

log = logging.getLogger("projector.members")

MAX_PAGES: Final = 200
# Chat notification types that concern the member directory (seed 004).
MEMBER_JOINED: Final = 24
MEMBER_LEFT_HISTORY: Final = 27
PRESENTATION_PARALLEL: Final = 2
IDLE_GROUPS: Final = 20
IDLE_MEMBERS: Final = 20_000

T = TypeVar("T")
Listener = Callable[["MemberDirectory"], None]


class _Stale(Exception):
    """The generation moved while this work was waiting: its result must not land."""


@dataclass(slots=True)
class DirectoryCounters:
    """What happened, for tests and diagnostics."""

    pages: int = 0
    presentation_batches: int = 0
    max_presentation_in_flight: int = 0
    cache_hits: int = 0
    late_cache_dropped: int = 0
    removals_confirmed: int = 0
    cache_writes: int = 0
    traversals_completed: int = 0
    deduplicated_requests: int = 0


@dataclass(slots=True)
class Subscription:
    directory: MemberDirectory
    listener: Listener | None
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.directory._unsubscribe(self)


class MemberDirectory:
    """The member store of one group for one account in one environment."""

    def __init__(
        self,
        key: CacheKey,
        source: MemberSource,
        cache: SqliteMemberCache | None = None,
        *,
        profiles: ProfileSource | None = None,
        page_size: int = PAGE_LIMIT_DEFAULT,
        max_pages: int = MAX_PAGES,
        presentation_batch: int = BY_IDS_MAX,
        presentation_parallel: int = PRESENTATION_PARALLEL,
        on_idle: Callable[[MemberDirectory], None] | None = None,
    ) -> None:
        if not 1 <= presentation_batch <= BY_IDS_MAX:
            raise ValueError(f"presentation_batch must be in 1..{BY_IDS_MAX}")
        self.key = key
        self.source = source
        self.cache = cache
        self.profiles = profiles
        self.page_size = page_size
        self.max_pages = max_pages
        self.presentation_batch = presentation_batch
        self._present_slots = asyncio.Semaphore(presentation_parallel)
        self._on_idle = on_idle
        # Called on a t=27 notification: the host drops its history window for this group.
        self.on_history_invalidated: Callable[[MemberDirectory], None] | None = None
        # -- what subscribers read ------------------------------------------------------------
        self.members: dict[int, Member] = {}
        self.self_role: str | None = None  # from the latest page's access check, never the cache
        # Admin entry: from the latest page (the group's settings and that page's role), never
        # from a cached role; join events of this traversal merged by event and memberRef.
        self.capabilities: dict[str, bool] = {}
        self.join_events: dict[str, JoinEvent] = {}
        self.cached_at_ms: int | None = None  # set by a cache hit (memory or disk)
        self.fresh = False  # a complete server traversal of the current generation landed
        self.error: MemberSourceError | None = None
        self.counters = DirectoryCounters()
        # -- machinery -------------------------------------------------------------------------
        self.generation = 0
        self._remote_seen_gen = -1  # generation in which a server result arrived
        self._subscriptions: list[Subscription] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight: dict[tuple[Any, ...], asyncio.Task[Any]] = {}
        self._traversal: asyncio.Task[None] | None = None
        self._presenting: set[asyncio.Task[None]] = set()
        self._in_flight_presentations = 0
        self._changed = asyncio.Event()

    # -- subscribers -----------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self._subscriptions)

    def subscribe(self, listener: Listener | None = None) -> Subscription:
        """Subscribe; the first subscriber starts loading (cache + server, together)."""
        sub = Subscription(self, listener)
        first = not self._subscriptions
        self._subscriptions.append(sub)
        if first:
            self.refresh()
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        self._subscriptions.remove(sub)
        if not self._subscriptions:
            self.deactivate()
            if self._on_idle is not None:
                self._on_idle(self)

    def deactivate(self) -> None:
        """Stop every outstanding request (last subscriber gone, account switch). The members
        stay in memory, no longer fresh."""
        self._bump()
        self.fresh = False

    def sorted_members(self) -> list[Member]:
        return [self.members[k] for k in sorted(self.members)]

    # -- loading ---------------------------------------------------------------------------

    def refresh(self) -> asyncio.Task[None]:
        """Start a traversal (with a cache restore when nothing is shown yet); an identical
        traversal of this generation already running is reused."""
        running = self._traversal
        if running is not None and not running.done():
            self.counters.deduplicated_requests += 1
            return running
        gen = self.generation
        task = self._spawn(self._load(gen))
        self._traversal = task
        return task

    def invalidate(self) -> asyncio.Task[None]:
        """The roster changed on the server: nothing in flight may be reused (a request sent
        before the change could answer with the old roster), and a new traversal runs."""
        self._bump()
        return self.refresh()

    def on_notification(self, kind: int) -> asyncio.Task[None] | None:
        """A chat notification about this group. t=24 (member joined) only re-reads the public
        roster; t=27 (member-left history) also invalidates the history window
        (``on_history_invalidated``). Neither carries member or read facts to apply directly."""
        if kind not in (MEMBER_JOINED, MEMBER_LEFT_HISTORY):
            return None
        if kind == MEMBER_LEFT_HISTORY and self.on_history_invalidated is not None:
            self.on_history_invalidated(self)
        if not self.active:
            return None  # an idle store re-reads when it is next subscribed
        return self.invalidate()

    async def apply_removal_receipt(self, user_ids: Sequence[int]) -> None:
        """The server confirmed that these members were removed (e.g. the receipt of an admin's
        removal): they leave the list and the disk copy at once, without a traversal."""
        removed = [u for u in user_ids if self.members.pop(u, None) is not None]
        if not removed:
            return
        self.counters.removals_confirmed += len(removed)
        self._notify()
        if self.fresh:
            # Only a roster that was whole stays whole minus these; a partial one is not cached.
            await self._write_cache(self.generation)

    async def clear(self) -> None:
        """The caller left, the group was dissolved, or access is gone: memory and disk copies
        go, and nothing in flight may bring them back."""
        self._bump()
        self.members.clear()
        self.self_role = None
        self.capabilities = {}
        self.join_events = {}
        self.cached_at_ms = None
        self.fresh = False
        self._notify()
        if self.cache is not None:
            await self.cache.delete(self.key)

    async def _load(self, gen: int) -> None:
        restore = None
        if self.cache is not None and not self.members:
            restore = self._spawn(self._restore(gen))  # starts with the first page, not before
        try:
            await self._traverse(gen)
        except _Stale:
            return
        except MemberAccessDenied as exc:
            await self._deny(exc, gen)
        except MemberSourceError as exc:
            # The list (cached or partial) stays; the subscriber may retry.
            if gen == self.generation:
                self.error = exc
                self._notify()
        finally:
            if restore is not None and gen != self.generation:
                restore.cancel()

    async def _restore(self, gen: int) -> None:
        assert self.cache is not None
        roster = await self.cache.load(self.key)
        if roster is None:
            return
        if (
            gen != self.generation
            or self._remote_seen_gen == gen
            or isinstance(self.error, MemberAccessDenied)
        ):
            # A server result (or a denial) came first: the cache may not overwrite it. A mere
            # network failure does not count: then the cached list is exactly what to show.
            self.counters.late_cache_dropped += 1
            return
        self.counters.cache_hits += 1
        for member in roster.members:
            if member.user_id not in self.members:
                self.members[member.user_id] = member
        self.cached_at_ms = roster.cached_at_ms
        self._notify()

    async def _traverse(self, gen: int) -> None:
        seen: set[int] = set()
        after: str | None = None
        pages = 0
        while True:
            if pages >= self.max_pages:
                raise TraversalLimitExceeded(
                    f"group {self.key.group}: more than {self.max_pages} pages; kept what was read"
                )
            page = await self._request(
                gen,
                ("page", after),
                lambda cursor=after: self.source.page(self.key.group, cursor, self.page_size, True),  # type: ignore[misc]
            )
            self._check(gen)
            pages += 1
            self.counters.pages += 1
            self._remote_seen_gen = gen
            self.error = None
            self.self_role = page.self_role
            self.capabilities = dict(page.capabilities)
            self.join_events = merge_join_events(self.join_events, page.join_events)
            self._merge_base(page.items)
            ids = [item.user_id for item in page.items]
            seen.update(ids)
            for start in range(0, len(ids), self.presentation_batch):
                self._schedule_presentation(gen, ids[start : start + self.presentation_batch])
            self._notify()
            if not page.has_more:
                break
            after = page.next_ref
        absent = [user_id for user_id in self.members if user_id not in seen]
        if absent:
            await self._verify_absent(gen, absent)
        # Statistics and names of this traversal go to disk with the roster.
        while self._presenting:
            await asyncio.gather(*list(self._presenting), return_exceptions=True)
        self._check(gen)
        self.fresh = True
        self.counters.traversals_completed += 1
        self._notify()
        await self._write_cache(gen)

    def _merge_base(self, items: Sequence[BaseMember]) -> None:
        members = self.members
        for base in items:
            current = members.get(base.user_id)
            if current is None:
                members[base.user_id] = Member(
                    user_id=base.user_id,
                    role=base.role,
                    state=base.state,
                    joined_at=base.joined_at,
                    left_at=base.left_at,
                )
            else:
                members[base.user_id] = current.with_base(base)

    async def _verify_absent(self, gen: int, absent: list[int]) -> None:
        """Members the traversal did not return: only removals the server confirms apply."""
        for start in range(0, len(absent), BY_IDS_MAX):
            chunk = tuple(absent[start : start + BY_IDS_MAX])
            result: PresentationResult = await self._request(
                gen,
                ("verify", chunk),
                lambda chunk=chunk: self.source.by_user_ids(self.key.group, chunk, False),  # type: ignore[misc]
            )
            self._check(gen)
            for user_id in result.removed_user_ids() & set(chunk):
                if self.members.pop(user_id, None) is not None:
                    self.counters.removals_confirmed += 1
        self._notify()

    # -- presentation ----------------------------------------------------------------------

    def _schedule_presentation(self, gen: int, ids: list[int]) -> None:
        task = self._spawn(self._present(gen, ids))
        self._presenting.add(task)
        task.add_done_callback(self._presenting.discard)

    async def _present(self, gen: int, ids: list[int]) -> None:
        async with self._present_slots:
            if gen != self.generation:
                return
            live = [user_id for user_id in ids if user_id in self.members]
            if not live:
                return
            self._in_flight_presentations += 1
            self.counters.max_presentation_in_flight = max(
                self.counters.max_presentation_in_flight, self._in_flight_presentations
            )
            try:
                self.counters.presentation_batches += 1
                calls: list[Awaitable[Any]] = [self.source.by_user_ids(self.key.group, live, True)]
                if self.profiles is not None:
                    calls.append(self.profiles.profiles(live))
                results = await asyncio.gather(*calls, return_exceptions=True)
            finally:
                self._in_flight_presentations -= 1
        if gen != self.generation:
            return
        presented, profiles = results[0], (results[1] if len(results) > 1 else None)
        if isinstance(presented, MemberAccessDenied):
            await self._deny(presented, gen)
            return
        for outcome in (presented, profiles):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation and friends are not presentation failures
        self._apply_presentation(
            live,
            presented if isinstance(presented, PresentationResult) else None,
            profiles if isinstance(profiles, dict) else None,
        )
        if isinstance(presented, Exception) and not isinstance(presented, MemberUnavailable):
            log.warning("member presentation failed for %s: %s", self.key.group, presented)

    def _apply_presentation(
        self, ids: list[int], result: PresentationResult | None, profiles: dict[int, Profile] | None
    ) -> None:
        by_id = {item.base.user_id: item for item in result.items} if result is not None else {}
        for user_id in ids:
            current = self.members.get(user_id)
            if current is None:
                continue  # removed meanwhile: presentation never creates or revives a member
            fields: dict[str, Any] = {}
            item = by_id.get(user_id)
            if item is not None:
                fields["presented"] = True
                if item.base.state == "active":
                    fields["role"] = item.base.role
                if result is not None and result.stats_included and item.stats_known:
                    fields["record_count"] = item.record_count
                    fields["mention_count"] = item.mention_count
                    fields["stats_known"] = True
                # Statistics late or invalid: keep what we had, never a fake zero.
                if result is not None and result.remarks_included:
                    # The viewer's remark as the server has it now: it replaces a cached one,
                    # and None clears it. Not included (late, failed): the known one stays.
                    fields["remark"] = item.remark
            if self.profiles is not None:
                profile = profiles.get(user_id) if profiles is not None else None
                if profile is None:
                    fields["profile_failed"] = True  # the old avatar (and name) stay
                else:
                    fields.update(
                        display_name=profile.display_name,
                        avatar_url=profile.avatar_url,
                        profile_failed=False,
                        presented=True,
                    )
            if fields:
                self.members[user_id] = current.with_fields(**fields)
        self._notify()

    # -- failures, generations, cache ------------------------------------------------------

    async def _deny(self, exc: MemberAccessDenied, gen: int) -> None:
        """2001/2002: the roster is gone for this account. Memory and disk are cleared, late
        cache restores are cancelled (they would bring the cleared rows back)."""
        if gen != self.generation:
            return
        self.error = exc
        await self.clear()

    async def _write_cache(self, gen: int) -> None:
        if self.cache is None:
            return
        members = list(self.members.values())
        written = await self.cache.store(self.key, members, still_current=lambda: gen == self.generation)
        if written:
            self.counters.cache_writes += 1

    def _bump(self) -> None:
        self.generation += 1
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for request in self._inflight.values():
            request.cancel()  # nobody of the new generation may join it, so nobody needs it
        self._inflight.clear()
        self._traversal = None

    def _check(self, gen: int) -> None:
        if gen != self.generation:
            raise _Stale

    async def _request(
        self, gen: int, what: tuple[Any, ...], call: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        """One server request per (generation, request): an identical request of the same
        generation joins the one in flight; one of a newer generation never does."""
        key = (gen, *what)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(call())
            self._inflight[key] = task
            task.add_done_callback(lambda _t, key=key: self._inflight.pop(key, None))  # type: ignore[misc]
        else:
            self.counters.deduplicated_requests += 1
        result: T = await asyncio.shield(task)
        return result

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        for sub in list(self._subscriptions):
            if sub.listener is not None:
                sub.listener(self)

    async def until(self, predicate: Callable[[MemberDirectory], bool]) -> None:
        """Wait until ``predicate(self)`` holds (checked after every change)."""
        while not predicate(self):
            await self._changed.wait()

    async def settled(self) -> None:
        """Wait for the traversal in flight (and its cache write) to finish, however it ends."""
        task = self._traversal
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def aclose(self) -> None:
        """Cancel everything and wait for it to stop (tests, shutdown)."""
        self._bump()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class MemberDirectoryRegistry:
    """The stores of one environment and account. Idle stores (no subscriber) stay in memory
    within ``idle_groups`` groups and ``idle_members`` members, oldest idle whole group out first.
    An account switch is a new registry: :meth:`aclose` the old one."""

    def __init__(
        self,
        environment: str,
        account: str,
        source: MemberSource,
        cache: SqliteMemberCache | None = None,
        *,
        profiles: ProfileSource | None = None,
        idle_groups: int = IDLE_GROUPS,
        idle_members: int = IDLE_MEMBERS,
        **directory_options: Any,
    ) -> None:
        self.environment = environment
        self.account = account
        self.source = source
        self.cache = cache
        self.profiles = profiles
        self.idle_groups = idle_groups
        self.idle_members = idle_members
        self.directory_options = directory_options
        self._stores: dict[str, MemberDirectory] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # oldest idle first

    def directory(self, group: str) -> MemberDirectory:
        store = self._stores.get(group)
        if store is None:
            store = self._stores[group] = MemberDirectory(
                CacheKey(self.environment, self.account, group),
                self.source,
                self.cache,
                profiles=self.profiles,
                on_idle=self._went_idle,
                **self.directory_options,
            )
        return store

    def subscribe(self, group: str, listener: Listener | None = None) -> Subscription:
        self._idle.pop(group, None)
        return self.directory(group).subscribe(listener)

    def on_notice(self, group: str, kind: int) -> asyncio.Task[None] | None:
        """A member notification for ``group`` (a MEMBER_NOTICE off the live stream): the store
        of that group, if this registry holds one, reacts (:meth:`MemberDirectory.on_notification`).
        A group nobody holds has nothing to refresh: it is read fresh when first subscribed."""
        store = self._stores.get(group)
        return None if store is None else store.on_notification(kind)

    def idle_groups_held(self) -> list[str]:
        return list(self._idle)

    def _went_idle(self, store: MemberDirectory) -> None:
        group = store.key.group
        if not store.members:
            self._stores.pop(group, None)  # nothing worth keeping (e.g. after a denial)
            return
        self._idle[group] = None
        self._idle.move_to_end(group)
        while self._idle and (
            len(self._idle) > self.idle_groups
            or sum(len(self._stores[g].members) for g in self._idle) > self.idle_members
        ):
            oldest, _ = self._idle.popitem(last=False)
            self._stores.pop(oldest, None)

    async def aclose(self) -> None:
        stores = list(self._stores.values())
        self._stores.clear()
        self._idle.clear()
        for store in stores:
            await store.aclose()
