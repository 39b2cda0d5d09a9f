"""What the projection repair (app/worker/repair.py) asks of Redis: has the store lost data,
and the restore's own writes. The `RepairTarget` port on a `RedisProjectionStore`.

How a loss shows (README, "Failure behaviours"; what clients see: docs/contract.md §4):

* **Markers.** Per owned partition the worker keeps small marker keys in the store,
  ``{ns}:alive:{<tag>}:<partition>``, whose value says ``done:<token>`` (the projection of the
  partition is whole) or ``restoring:<token>`` (a restore runs, or died). A FLUSHALL, a restart
  without persistence, a failover to an empty replica, or someone deleting the namespace takes
  them along with the projection. On one server one marker per partition does it. On a Redis
  Cluster a master that loses its data loses only its own slots' keys, so a partition has a marker
  in every 128-slot stretch of the slot space (128 hash tags, one per stretch): whatever the slot
  layout, a master that owns any whole stretch holds markers of every partition, and they move
  with their slots on a resharding (a migration moves keys, it does not lose them).
* **Run ids.** ``INFO server``'s ``run_id`` of every master: it changes at every restart and
  failover. A restart WITH persistence keeps the markers but may have lost the last writes (an
  RDB snapshot is older than the last flushes; replication is asynchronous): the set of run ids
  changing makes the worker check every user of its partitions.
* **A write that finds the store behind** (app/worker/core.py `store_behind`): a flush whose user
  the store holds at an older version than the last one written — the user's keys went (an
  eviction, a DEL). Only those users are checked.

Every call retries the failures that pass, as the store's own calls do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from app.stores.redis_projection import SERVING_RECHECK_S, RedisProjectionStore, _text

if TYPE_CHECKING:
    from app.domain.flush import UserFlush

# On a cluster: one marker per partition in each of this many equal stretches of the slot space.
MARKER_STRETCHES = 128

# Set a marker to ARGV[2] only while it holds ARGV[1] (a restore confirms its own marker: one
# that vanished meanwhile means the store lost data again during the restore). One key: any slot.
_CONFIRM_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


def marker_tags(cluster: bool) -> list[str]:
    """The hash tags of a partition's markers: one on a single server; on a cluster the first
    tag ``m<i>`` landing in each stretch of MARKER_STRETCHES (deterministic: every worker and
    every restart names the same keys)."""
    if not cluster:
        return ["m"]
    width = REDIS_CLUSTER_HASH_SLOTS // MARKER_STRETCHES
    found: dict[int, str] = {}
    i = 0
    while len(found) < MARKER_STRETCHES:
        tag = f"m{i}"
        found.setdefault(key_slot(tag.encode()) // width, tag)
        i += 1
    return [found[stretch] for stretch in range(MARKER_STRETCHES)]


class RedisRestoreTarget:
    """The restore's port (app/worker/repair.RepairTarget) on the worker's projection store."""

    def __init__(self, store: RedisProjectionStore) -> None:
        self.store = store
        self.client = store.client
        self.tags = marker_tags(isinstance(store.client, RedisCluster))

    def marker_keys(self, partition: int) -> list[str]:
        namespace = self.store.namespace
        return [f"{namespace}:alive:{{{tag}}}:{partition}" for tag in self.tags]

    async def identity(self) -> frozenset[str]:
        """The run ids of the masters (one server: its own)."""
        client = self.client

        async def read() -> frozenset[str]:
            if isinstance(client, RedisCluster):
                infos: dict[str, Any] = await client.info("server", target_nodes=RedisCluster.PRIMARIES)
                return frozenset(str(info.get("run_id", "")) for info in infos.values())
            info: dict[str, Any] = await client.info("server")
            return frozenset({str(info.get("run_id", ""))})

        return await self.store._guard("identity", read)

    async def read_markers(self, partitions: Sequence[int]) -> dict[int, list[str | None]]:
        """Every marker of each partition (None: absent), in the namespace the worker writes."""
        await self.store.follow_serving(SERVING_RECHECK_S)
        keys = {partition: self.marker_keys(partition) for partition in partitions}

        async def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for names in keys.values():
                for key in names:
                    pipe.get(key)
            return list(await pipe.execute())

        replies = await self.store._guard("markers", read) if keys else []
        out: dict[int, list[str | None]] = {}
        at = 0
        for partition, names in keys.items():
            mine = replies[at : at + len(names)]
            out[partition] = [None if reply is None else _text(reply) for reply in mine]
            at += len(names)
        return out

    async def set_markers(self, partition: int, value: str) -> None:
        keys = self.marker_keys(partition)

        async def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, value)
            await pipe.execute()

        await self.store._guard("markers", write)

    async def confirm_markers(self, partition: int, expected: str, value: str) -> bool:
        """Every marker of the partition set to `value`, each only if it still holds `expected`;
        True when all of them did."""
        keys = self.marker_keys(partition)

        async def confirm() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.execute_command("EVAL", _CONFIRM_SCRIPT, 1, key, expected, value)
            return list(await pipe.execute())

        replies = await self.store._guard("markers", confirm)
        return all(int(reply) == 1 for reply in replies)

    async def inventory(self, user_ids: Sequence[int]) -> list[tuple[int, int]]:
        return await self.store.inventory(user_ids)

    async def restore(self, batches: Sequence[UserFlush]) -> list[int | None]:
        return await self.store.restore(batches)
