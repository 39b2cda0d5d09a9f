"""The fleet's reconcile slot (docs/contract.md §10; app/api/fleet.py's `claim_reconcile` /
`release_reconcile`): one suite over the in-memory fleet and the Redis one (single server and
cluster). At most one claim per user per interval; the refusal says how long is left; a release
frees only the holder's slot; users do not share slots; the key lives under the user's hash tag
and goes with the namespace."""

from __future__ import annotations

import asyncio

from app.api.fleet import FleetState, MemoryFleetState
from app.stores.redis_fleet import RedisFleetState
from app.stores.redis_projection import RedisProjectionStore, own_key
from tests.contract.conftest import MakeRedisStore, MakeStore

INTERVAL_MS = 60_000
T0 = 1_800_000_000_000


def fleet_of(store: object) -> FleetState:
    if isinstance(store, RedisProjectionStore):
        return RedisFleetState(store)
    return MemoryFleetState()


async def test_one_claim_per_user_per_interval_and_the_refusal_says_how_long(make_store: MakeStore) -> None:
    fleet = fleet_of(make_store())
    assert await fleet.claim_reconcile(7, "a", INTERVAL_MS, T0) == 0
    left = await fleet.claim_reconcile(7, "b", INTERVAL_MS, T0 + 1000)
    assert 0 < left <= INTERVAL_MS
    assert await fleet.claim_reconcile(8, "c", INTERVAL_MS, T0 + 1000) == 0  # another user: its own slot
    # Many instances asking at once: exactly one wins.
    answers = await asyncio.gather(*(fleet.claim_reconcile(9, f"t{i}", INTERVAL_MS, T0) for i in range(20)))
    assert sorted(answers)[0] == 0 and sum(1 for a in answers if a == 0) == 1


async def test_a_release_frees_only_the_holders_slot(make_store: MakeStore) -> None:
    fleet = fleet_of(make_store())
    assert await fleet.claim_reconcile(7, "mine", INTERVAL_MS, T0) == 0
    await fleet.release_reconcile(7, "someone-else")
    assert await fleet.claim_reconcile(7, "x", INTERVAL_MS, T0 + 1) > 0
    await fleet.release_reconcile(7, "mine")
    assert await fleet.claim_reconcile(7, "again", INTERVAL_MS, T0 + 2) == 0


async def test_the_redis_slot_expires_with_its_interval_on_the_store_clock(
    make_redis_store: MakeRedisStore,
) -> None:
    store = make_redis_store()
    fleet = RedisFleetState(store)
    assert await fleet.claim_reconcile(7, "a", 200, T0) == 0
    assert await fleet.claim_reconcile(7, "b", 200, T0) > 0
    while await fleet.claim_reconcile(7, "c", 200, T0) != 0:
        await asyncio.sleep(0.05)
    key = fleet.reconcile_key(7)
    assert key.endswith(":reconcile:{7}")  # one slot, the user's hash tag
    assert own_key(store.namespace).fullmatch(key)  # deleted with the namespace


async def test_the_memory_slot_expires_on_the_callers_clock() -> None:
    fleet = MemoryFleetState()
    assert await fleet.claim_reconcile(7, "a", INTERVAL_MS, T0) == 0
    assert await fleet.claim_reconcile(7, "b", INTERVAL_MS, T0 + INTERVAL_MS - 1) == 1
    assert await fleet.claim_reconcile(7, "b", INTERVAL_MS, T0 + INTERVAL_MS) == 0


async def test_a_slot_of_an_earlier_projection_epoch_is_free_once_per_epoch(make_store: MakeStore) -> None:
    fleet = fleet_of(make_store())
    assert await fleet.claim_reconcile(7, "a", INTERVAL_MS, T0, epoch=0) == 0
    assert await fleet.claim_reconcile(7, "b", INTERVAL_MS, T0 + 1, epoch=0) > 0
    # The epoch moved (a retention overrun): the slot held since epoch 0 is free, and says so.
    assert await fleet.claim_reconcile(7, "c", INTERVAL_MS, T0 + 2, epoch=1) == -1
    assert await fleet.claim_reconcile(7, "d", INTERVAL_MS, T0 + 3, epoch=1) > 0
    # An instance still on the old epoch does not take it back.
    assert await fleet.claim_reconcile(7, "e", INTERVAL_MS, T0 + 4, epoch=0) > 0
    # A release names the epoch it claimed in: the old claim's release frees nothing.
    await fleet.release_reconcile(7, "a", epoch=0)
    assert await fleet.claim_reconcile(7, "f", INTERVAL_MS, T0 + 5, epoch=1) > 0
    await fleet.release_reconcile(7, "c", epoch=1)
    assert await fleet.claim_reconcile(7, "g", INTERVAL_MS, T0 + 6, epoch=1) == 0
    # An epoch that jumped by several frees the slot too.
    assert await fleet.claim_reconcile(7, "h", INTERVAL_MS, T0 + 7, epoch=4) == -1


async def test_the_redis_projection_epoch_bumps_once_per_overrun(make_redis_store: MakeRedisStore) -> None:
    from app.stores.redis_epoch import bump_epoch, read_epoch

    store = make_redis_store()
    fleet = RedisFleetState(store)
    assert await read_epoch(store) == 0 and await fleet.projection_epoch() == 0
    assert await bump_epoch(store, "mailbox-tail/3", 120) == (True, 1)
    # The same overrun found again (a restart before the checkpoint moved past it): no bump.
    assert await bump_epoch(store, "mailbox-tail/3", 120) == (False, 1)
    # Another partition's overrun, and a later one of the same partition: one bump each.
    assert await bump_epoch(store, "mailbox-tail/4", 120) == (True, 2)
    assert await bump_epoch(store, "mailbox-tail/3", 900) == (True, 3)
    assert await fleet.projection_epoch() == 3
