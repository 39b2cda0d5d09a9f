"""MemberDirectory against a fake server that answers after 2 s of virtual time (seed 004)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.members.cache import CacheKey, CacheLimits, SqliteMemberCache
from app.members.directory import MemberDirectory, MemberDirectoryRegistry
from app.members.model import Profile
from app.members.source import MemberAccessDenied, MemberUnavailable, TraversalLimitExceeded
from app.members.testing import FakeClock, FakeMemberServer, FakeProfiles

GROUP = "6f1c2a5e-0000-4000-8000-000000000001"
KEY = CacheKey("test-env", "42", GROUP)
SIGNING_KEY = b"runtime-key-0123456789"
CALLER = 42


def make_server(clock: FakeClock, n: int = 500) -> FakeMemberServer:
    server = FakeMemberServer(clock=clock, caller=CALLER)
    for i in range(n):
        server.add(1000 + i * 7)
    server.add(CALLER, role="admin")
    return server


def make_cache(tmp_path: Path, clock: FakeClock, **limits: int) -> SqliteMemberCache:
    return SqliteMemberCache(
        tmp_path / "members.sqlite", SIGNING_KEY, clock_ms=clock.now_ms, limits=CacheLimits(**limits)
    )


async def wait(directory: MemberDirectory, predicate: object, timeout: float = 5.0) -> None:
    """Real-time wait (for cache threads); virtual time does not move meanwhile."""
    await asyncio.wait_for(directory.until(predicate), timeout)  # type: ignore[arg-type]


async def run_to_completion(clock: FakeClock, directory: MemberDirectory, max_s: float = 200.0) -> None:
    waited = 0.0
    while directory.counters.traversals_completed == 0 and directory.error is None and waited < max_s:
        await clock.advance(1.0)
        await asyncio.sleep(0.01)  # real time for the cache thread
        waited += 1
    task = directory._traversal
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 5)


async def test_first_50_members_visible_after_one_round_trip() -> None:
    clock = FakeClock()
    server = make_server(clock, 499)  # 499 + the caller = 500
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    await clock.advance(1.9)
    assert directory.members == {}
    await clock.advance(0.1)
    assert len(directory.members) == 50
    assert directory.self_role == "admin"
    assert not directory.fresh  # a traversal is not finished by one page
    await run_to_completion(clock, directory)
    assert len(directory.members) == 500
    assert directory.fresh
    assert directory.counters.pages == 10  # 10 pages, the last one says has_more = false
    # Presentation ran in batches of <= 50, never more than two at once.
    assert all(len(ids) <= 50 for ids, _ in server.by_ids_calls)
    assert server.max_in_flight_by_ids <= 2
    assert directory.counters.max_presentation_in_flight <= 2
    await directory.aclose()


async def test_pages_merge_without_replacing_unchanged_members() -> None:
    clock = FakeClock()
    server = make_server(clock, 120)
    server.record_counts = {u: 3 for u in server.members}
    profiles = FakeProfiles(clock, {u: Profile(f"n{u}", f"a{u}") for u in server.members})
    directory = MemberDirectory(KEY, server, profiles=profiles)
    directory.subscribe()
    await run_to_completion(clock, directory)
    before = dict(directory.members)
    changed_id = sorted(server.members)[5]
    server.add(changed_id, role="admin")
    directory.refresh()
    await clock.advance(2.0)  # first page of the second traversal
    # The list was never cleared: every member is still there mid-traversal.
    assert len(directory.members) == len(before)
    await run_to_completion_again(clock, directory)
    for user_id, member in directory.members.items():
        if user_id == changed_id:
            assert member is not before[user_id] and member.role == "admin"
            # A base page never erases the presentation: name, avatar, statistics stay.
            old = before[user_id]
            assert (member.display_name, member.avatar_url, member.record_count, member.stats_known) == (
                old.display_name,
                old.avatar_url,
                3,
                True,
            )
        else:
            assert member is before[user_id]  # unchanged: the very same object
    await directory.aclose()


async def run_to_completion_again(clock: FakeClock, directory: MemberDirectory) -> None:
    done = directory.counters.traversals_completed
    for _ in range(200):
        if directory.counters.traversals_completed > done:
            return
        await clock.advance(1.0)
    raise AssertionError("second traversal did not finish")


async def test_restart_shows_cached_members_before_the_server_answers(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 499)
    first = MemberDirectory(KEY, server, make_cache(tmp_path, clock))
    first.subscribe()
    await run_to_completion(clock, first)
    assert first.counters.cache_writes == 1
    await first.aclose()
    await first.cache.close()  # type: ignore[union-attr]

    # Restart: the server now has one member fewer and one role change, and answers after 2 s.
    leaver, promoted = sorted(server.members)[10], sorted(server.members)[20]
    server.add(leaver, state="left")
    server.add(promoted, role="admin")
    server.page_calls.clear()
    cache = make_cache(tmp_path, clock)
    second = MemberDirectory(KEY, server, cache)
    second.subscribe()
    await wait(second, lambda d: len(d.members) == 500)  # real time only: the server has not answered
    assert server.page_calls == [(None, 50)]  # the first page went out together with the restore
    assert second.counters.cache_hits == 1 and second.cached_at_ms is not None
    assert not second.fresh and second.self_role is None  # a cache hit is never fresh nor a role source
    assert second.members[promoted].role == "member"
    await run_to_completion(clock, second)
    assert len(second.members) == 499 and leaver not in second.members
    assert second.members[promoted].role == "admin"
    assert second.counters.removals_confirmed == 1
    # The disk converged too.
    roster = await cache.load(KEY)
    assert roster is not None and len(roster.members) == 499
    await second.aclose()
    await cache.close()


class SlowCache(SqliteMemberCache):
    """A cache whose restore finishes after `delay_s` of virtual time."""

    def __init__(self, *args: object, clock: FakeClock, delay_s: float, **kwargs: object) -> None:
        super().__init__(*args, clock_ms=clock.now_ms, **kwargs)  # type: ignore[arg-type]
        self.clock = clock
        self.delay_s = delay_s
        self.read = asyncio.Event()

    async def load(self, key: CacheKey):  # type: ignore[no-untyped-def]
        roster = await super().load(key)
        self.read.set()  # the virtual delay is registered before the waiting test resumes
        await self.clock.sleep(self.delay_s)
        return roster

    async def wait_read(self) -> None:
        """Real time for the cache thread; virtual time does not move meanwhile."""
        await asyncio.wait_for(self.read.wait(), 10)


async def test_a_late_cache_result_cannot_overwrite_the_server(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 60)
    seeded = MemberDirectory(KEY, server, make_cache(tmp_path, clock))
    seeded.subscribe()
    await run_to_completion(clock, seeded)
    await seeded.aclose()
    ghost = sorted(server.members)[3]
    server.members.pop(ghost)  # the server no longer knows this member; the cache still does
    cache = SlowCache(tmp_path / "members.sqlite", SIGNING_KEY, clock=clock, delay_s=5.0)
    late = MemberDirectory(KEY, server, cache)
    late.subscribe()
    await cache.wait_read()  # the cache thread has read; its result waits 5 virtual seconds
    await clock.advance(2.0)  # the first page lands first
    assert len(late.members) == 50
    await clock.advance(3.5)
    assert late.counters.late_cache_dropped == 1 and late.counters.cache_hits == 0
    await run_to_completion(clock, late)
    assert ghost not in late.members
    await late.aclose()
    await cache.close()


@pytest.mark.parametrize("code", [2001, 2002])
async def test_access_denial_clears_memory_and_disk(tmp_path: Path, code: int) -> None:
    clock = FakeClock()
    server = make_server(clock, 80)
    cache = make_cache(tmp_path, clock)
    directory = MemberDirectory(KEY, server, cache)
    directory.subscribe()
    await run_to_completion(clock, directory)
    assert await cache.load(KEY) is not None
    if code == 2001:
        server.add(CALLER, state="removed")
    else:
        server.disabled = True
    directory.invalidate()
    await clock.advance(2.0)
    await asyncio.wait_for(directory.settled(), 10)  # the denial's disk delete runs in a thread
    assert isinstance(directory.error, MemberAccessDenied) and directory.error.code == code
    assert directory.members == {} and directory.self_role is None
    assert await cache.load(KEY) is None
    await directory.aclose()
    await cache.close()


async def test_a_general_failure_keeps_the_list() -> None:
    clock = FakeClock()
    server = make_server(clock, 80)
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    await run_to_completion(clock, directory)
    server.fail_next.append(MemberUnavailable("boom"))
    directory.refresh()
    await clock.advance(2.0)
    assert isinstance(directory.error, MemberUnavailable)
    assert len(directory.members) == 81


async def test_denial_cancels_a_late_cache_restore(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 30)
    seeded = MemberDirectory(KEY, server, make_cache(tmp_path, clock))
    seeded.subscribe()
    await run_to_completion(clock, seeded)
    await seeded.aclose()
    server.add(CALLER, state="left")
    cache = SlowCache(tmp_path / "members.sqlite", SIGNING_KEY, clock=clock, delay_s=5.0)
    directory = MemberDirectory(KEY, server, cache)
    directory.subscribe()
    await cache.wait_read()
    await clock.advance(2.0)  # 2001 arrives before the cache result
    await clock.advance(5.0)
    assert directory.members == {}
    assert isinstance(directory.error, MemberAccessDenied)
    await directory.aclose()


async def test_traversal_stops_at_the_page_limit_and_keeps_the_data(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 499)
    cache = make_cache(tmp_path, clock)
    directory = MemberDirectory(KEY, server, cache, max_pages=3)
    directory.subscribe()
    for _ in range(20):
        await clock.advance(1.0)
    assert isinstance(directory.error, TraversalLimitExceeded)
    assert len(directory.members) == 150
    assert len(server.page_calls) == 3
    assert directory.counters.cache_writes == 0 and not directory.fresh
    assert await cache.load(KEY) is None  # never cached as if it were the whole roster
    await directory.aclose()
    await cache.close()


async def test_generation_isolates_deduplication() -> None:
    clock = FakeClock()
    server = make_server(clock, 10)
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    await clock.settle()
    again = directory.refresh()  # same generation: joins the traversal in flight
    await clock.settle()
    assert directory.counters.deduplicated_requests == 1
    assert len(server.page_calls) == 1
    directory.invalidate()  # a membership notification: the old request may not be reused
    await clock.settle()
    assert again.cancelled() or again.done()
    assert len(server.page_calls) == 2
    await run_to_completion(clock, directory)
    assert len(directory.members) == 11


async def test_generation_isolates_cache_writes(tmp_path: Path) -> None:
    clock = FakeClock()
    cache = make_cache(tmp_path, clock)
    directory = MemberDirectory(KEY, make_server(clock, 5), cache)
    directory.members = {}  # empty
    generation = directory.generation
    still_current = lambda: directory.generation == generation  # noqa: E731
    directory.generation += 1  # e.g. a denial happened while the write was queued
    from app.members.model import Member

    assert not await cache.store(KEY, [Member(1)], still_current=still_current)
    assert await cache.load(KEY) is None
    await cache.close()


async def test_presentation_sets_stats_and_a_2s_timeout_drops_them_but_keeps_identities() -> None:
    clock = FakeClock()
    server = make_server(clock, 10)
    members = sorted(server.members)
    server.record_counts = {members[0]: 7}
    server.mention_counts = {members[0]: 2}
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    await run_to_completion(clock, directory)
    first = directory.members[members[0]]
    assert (first.record_count, first.mention_count, first.stats_known) == (7, 2, True)
    assert directory.members[members[1]].record_count == 0  # a real zero is known

    slow = make_server(clock, 10)
    slow.stats_latency_s = 3.0  # statistics late: the server drops both fields
    fresh = MemberDirectory(CacheKey("e", "42", "other"), slow)
    fresh.subscribe()
    await run_to_completion(clock, fresh)
    assert len(fresh.members) == 11
    for member in fresh.members.values():
        assert member.presented and not member.stats_known
        assert member.record_count is None and member.mention_count is None  # never a fake zero


async def test_presentation_never_creates_or_revives_and_profile_failure_keeps_old_avatar() -> None:
    clock = FakeClock()
    server = make_server(clock, 3)
    ids = sorted(server.members)
    profiles = FakeProfiles(clock, {u: Profile(f"name{u}", f"avatar{u}") for u in ids})
    directory = MemberDirectory(KEY, server, profiles=profiles)
    directory.subscribe()
    await run_to_completion(clock, directory)
    assert directory.members[ids[0]].avatar_url == f"avatar{ids[0]}"
    # A presentation result for an id that is not listed creates nothing.
    directory._apply_presentation([999_999], None, {999_999: Profile("ghost")})
    assert 999_999 not in directory.members
    # Profile failure: marked, old avatar and name kept; statistics still update.
    profiles.fail = MemberUnavailable("profiles down")
    server.record_counts[ids[0]] = 5
    directory.refresh()
    await run_to_completion_again(clock, directory)
    member = directory.members[ids[0]]
    assert member.profile_failed and member.avatar_url == f"avatar{ids[0]}"
    assert member.display_name == f"name{ids[0]}" and member.record_count == 5


async def test_absent_members_are_removed_only_when_confirmed(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 60)
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    await run_to_completion(clock, directory)
    # The member vanished from the pages (e.g. paged past concurrently) but is still active:
    hidden = sorted(server.members)[7]
    real = server.page

    async def page_without_hidden(group, after, limit, active_only):  # type: ignore[no-untyped-def]
        page = await real(group, after, limit, active_only)
        import dataclasses

        return dataclasses.replace(page, items=tuple(i for i in page.items if i.user_id != hidden))

    server.page = page_without_hidden  # type: ignore[method-assign]
    directory.refresh()
    await run_to_completion_again(clock, directory)
    assert hidden in directory.members  # verified active: kept
    assert directory.counters.removals_confirmed == 0


async def test_unsubscribe_cancels_outstanding_work() -> None:
    clock = FakeClock()
    server = make_server(clock, 200)
    directory = MemberDirectory(KEY, server)
    sub = directory.subscribe()
    await clock.advance(2.0)
    assert len(directory.members) == 50
    sub.close()
    await clock.settle()
    await clock.advance(30.0)
    assert len(directory.members) == 50  # nothing landed after the last subscriber left
    assert not directory._tasks


async def test_registry_keeps_idle_groups_within_bounds() -> None:
    clock = FakeClock()
    server = make_server(clock, 10)
    by_groups = MemberDirectoryRegistry("e", "42", server, idle_groups=2, idle_members=1000)
    by_members = MemberDirectoryRegistry("e", "42", server, idle_groups=20, idle_members=15)
    for registry in (by_groups, by_members):
        for group in ("g1", "g2", "g3"):
            sub = registry.subscribe(group)
            await run_to_completion(clock, registry.directory(group))
            sub.close()
    # 3 idle groups of 11 members: the oldest whole groups go first, never part of one.
    assert by_groups.idle_groups_held() == ["g2", "g3"]
    assert by_members.idle_groups_held() == ["g3"]
    registry = by_members
    # Re-subscribing an idle group shows its members at once, not fresh until the server answers.
    sub = registry.subscribe("g3")
    store = registry.directory("g3")
    assert len(store.members) == 11 and not store.fresh
    sub.close()
    await registry.aclose()
    await by_groups.aclose()


async def test_a_network_failure_still_shows_the_cached_list(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 40)
    seeded = MemberDirectory(KEY, server, make_cache(tmp_path, clock))
    seeded.subscribe()
    await run_to_completion(clock, seeded)
    await seeded.aclose()
    server.fail_next.append(MemberUnavailable("network down"))
    server.latency_s = 0.0
    cache = SlowCache(tmp_path / "members.sqlite", SIGNING_KEY, clock=clock, delay_s=1.0)
    directory = MemberDirectory(KEY, server, cache)
    directory.subscribe()
    await cache.wait_read()
    await clock.advance(0.1)
    assert isinstance(directory.error, MemberUnavailable)
    await clock.advance(1.0)
    assert len(directory.members) == 41 and not directory.fresh  # shown, and still not fresh
    await directory.aclose()
    await cache.close()


async def test_account_switch_closes_the_registry_and_stops_its_work() -> None:
    clock = FakeClock()
    server = make_server(clock, 300)
    registry = MemberDirectoryRegistry("e", "42", server)
    registry.subscribe(GROUP)
    store = registry.directory(GROUP)
    await clock.advance(2.0)
    assert len(store.members) == 50
    await registry.aclose()  # the runtime activated another account
    calls = len(server.page_calls)
    await clock.advance(30.0)
    assert len(server.page_calls) == calls and not store._tasks


async def test_notifications_reread_the_roster_and_t27_invalidates_history() -> None:
    clock = FakeClock()
    server = make_server(clock, 20)
    directory = MemberDirectory(KEY, server)
    history: list[str] = []
    directory.on_history_invalidated = lambda d: history.append(d.key.group)
    directory.subscribe()
    await run_to_completion(clock, directory)
    calls = len(server.page_calls)
    server.add(5000)  # somebody joined
    assert directory.on_notification(24) is not None
    assert history == []
    await run_to_completion_again(clock, directory)
    assert 5000 in directory.members and len(server.page_calls) == calls + 1
    directory.on_notification(27)
    assert history == [GROUP]
    assert directory.on_notification(99) is None  # not a member notification
    await directory.aclose()


async def test_a_removal_receipt_updates_memory_and_disk_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    server = make_server(clock, 20)
    cache = make_cache(tmp_path, clock)
    directory = MemberDirectory(KEY, server, cache)
    directory.subscribe()
    await run_to_completion(clock, directory)
    await directory.settled()
    gone = sorted(server.members)[3]
    await directory.apply_removal_receipt([gone])
    assert gone not in directory.members
    roster = await cache.load(KEY)
    assert roster is not None and gone not in {m.user_id for m in roster.members}
    await directory.clear()  # e.g. the caller left the group
    assert directory.members == {} and await cache.load(KEY) is None
    await directory.aclose()
    await cache.close()


async def test_admin_entry_and_join_events_come_from_the_pages_not_the_cache() -> None:
    from app.members.model import BaseMember

    clock = FakeClock()
    server = make_server(clock, 120)
    # One join event (seq 40) whose invitees straddle the first two pages of 50.
    invited = sorted(server.members)[45:55]
    for user_id in invited:
        server.members[user_id] = BaseMember(user_id, "member", "active", 40, None)
    directory = MemberDirectory(KEY, server)
    directory.subscribe()
    assert directory.capabilities == {}  # nothing granted before a page's access check
    await clock.advance(2.0)
    assert directory.capabilities["remove_members"] and not directory.capabilities["manage_admins"]
    assert directory.join_events["join:40"].invitees == tuple(invited[:5])
    await run_to_completion(clock, directory)
    assert directory.join_events["join:40"].invitees == tuple(invited)  # merged by memberRef
    assert sum(len(e.invitees) for e in directory.join_events.values()) == 121
    await directory.clear()
    assert directory.capabilities == {} and directory.join_events == {}
    await directory.aclose()


async def test_the_viewers_remark_comes_from_the_presentation_and_the_server_wins_over_the_cache(
    tmp_path: Path,
) -> None:
    """Remarks (备注) are the viewer's: they come with the presentation, never with the public
    profile. A cached remark is shown first after a restart, then the server's presentation
    replaces it (a changed one) or clears it (a removed one), in memory and on disk; a cache
    that answers after the server is dropped whole."""
    clock = FakeClock()
    server = make_server(clock, 60)
    changed, cleared, kept = sorted(server.members)[1:4]
    server.remarks = {changed: "old note", cleared: "to be cleared", kept: "same"}
    profiles = FakeProfiles(clock, {u: Profile(f"n{u}", f"a{u}") for u in server.members})
    first = MemberDirectory(KEY, server, make_cache(tmp_path, clock), profiles=profiles)
    first.subscribe()
    await run_to_completion(clock, first)
    assert {u: m.remark for u, m in first.members.items() if m.remark} == server.remarks
    assert first.members[changed].display_name == f"n{changed}"  # the public name stays apart
    await first.aclose()
    await first.cache.close()  # type: ignore[union-attr]

    # On the server: one remark changed, one cleared.
    server.remarks = {changed: "new note", kept: "same"}
    cache = make_cache(tmp_path, clock)
    second = MemberDirectory(KEY, server, cache, profiles=profiles)
    second.subscribe()
    await wait(second, lambda d: len(d.members) == 61)  # the cached roster, the server not answered
    assert second.members[changed].remark == "old note" and second.members[cleared].remark == "to be cleared"
    await run_to_completion(clock, second)
    assert second.members[changed].remark == "new note"
    assert second.members[cleared].remark is None
    assert second.members[kept].remark == "same"
    roster = await cache.load(KEY)
    assert roster is not None
    on_disk = {m.user_id: m.remark for m in roster.members if m.remark is not None}
    assert on_disk == {changed: "new note", kept: "same"}
    await second.aclose()
    await cache.close()

    # A late cache (it answers after the server's first page) never brings the old remark back.
    server.remarks = {changed: "newest note"}
    slow = SlowCache(tmp_path / "members.sqlite", SIGNING_KEY, clock=clock, delay_s=5.0)
    late = MemberDirectory(KEY, server, slow, profiles=profiles)
    late.subscribe()
    await slow.wait_read()
    await run_to_completion(clock, late)
    assert late.counters.late_cache_dropped == 1 and late.counters.cache_hits == 0
    assert late.members[changed].remark == "newest note" and late.members[kept].remark is None
    await late.aclose()
    await slow.close()


async def test_remarks_not_included_keep_the_known_one_and_a_failed_profile_does_not_stop_them() -> None:
    clock = FakeClock()
    server = make_server(clock, 5)
    target = sorted(server.members)[0]
    server.remarks = {target: "note"}
    profiles = FakeProfiles(clock, {u: Profile(f"n{u}", f"a{u}") for u in server.members})
    directory = MemberDirectory(KEY, server, profiles=profiles)
    directory.subscribe()
    await run_to_completion(clock, directory)
    assert directory.members[target].remark == "note"
    # The server could not read remarks this time: the known remark stays (never cleared by a failure).
    server.remarks_fail = True
    server.remarks = {}
    directory.refresh()
    await run_to_completion_again(clock, directory)
    assert directory.members[target].remark == "note"
    # Public profiles fail, the presentation carries a new remark: the remark still updates
    # (seed 004: a failed profile keeps the old avatar only; names, remarks, stats update).
    server.remarks_fail = False
    server.remarks = {target: "renamed note"}
    profiles.fail = MemberUnavailable("profiles down")
    directory.refresh()
    await run_to_completion_again(clock, directory)
    member = directory.members[target]
    assert member.profile_failed and member.remark == "renamed note" and member.avatar_url == f"a{target}"
    await directory.aclose()
