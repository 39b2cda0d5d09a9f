"""What the API instances of one fleet share in the projection store (issue 32): the per-user
request budget, and (app/api/snapshots.py) the walks' frozen orders.

Keys, all under the user's hash tag (so each script call touches one slot of a Redis Cluster,
as app/stores/redis_projection.py's scripts do)::

    {ns}:rate:{<user_id>}   hash  t (tokens left, a float), at (ms of the last refill)
                                  PEXPIRE: the time a drained bucket takes to fill again (an
                                  absent bucket is a full one, so nothing is lost when it goes)

    {ns}:reconcile:{<user_id>}  string  "<epoch>:<token>" of the last accepted reconcile request
                                  (the projection epoch it was claimed in, app/stores/redis_epoch.py)
                                  PX: the reconcile interval (absent, or of an earlier epoch: a
                                  reconcile may be asked)

``ns`` is the base namespace (RedisSettings.projection_namespace), not the serving one: a rebuild's
swap does not refill everyone's bucket nor reopen everyone's reconcile slot.

Token bucket (one atomic script per request, `TAKE_SCRIPT`): ``rate`` tokens a second up to
``burst``. The clock is the caller's (``deps.clock_ms``, injectable in tests); the stored ``at``
only ever moves forward, so an instance whose clock is behind gets no refill until its clock
passes it, and an instance whose clock is ahead cannot make the others refill the same interval
twice: a skew between instances never adds tokens.
"""

from __future__ import annotations

from typing import Any, Final

from app.domain.retention import slot_value
from app.stores.redis_epoch import read_epoch
from app.stores.redis_projection import SERVED_FIELDS, RedisProjectionStore, Script

# KEYS: the bucket. ARGV: burst, tokens per ms, now (ms). Returns 0 (take one token: go) or the
# whole ms until the next token (nothing taken). Lua numbers are doubles: ms since the epoch
# (~1.8e12) and the token counts are exact enough (2^53).
TAKE_SCRIPT: Final = Script("""
local burst = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * per_ms)
  at = now
end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / per_ms)
  if wait < 1 then wait = 1 end
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'at', string.format('%.17g', at))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / per_ms) + 1000)
return wait
""")


# KEYS: the user's reconcile slot. ARGV: "<epoch>:<token>", interval ms, epoch. Returns 0 (claimed:
# SET NX PX), -1 (claimed: the slot was held since an earlier projection epoch, which frees it:
# app.domain.retention.slot_reopened) or the ms until the slot is free (PTTL; at least 1). A value
# without an epoch (from before epochs) is epoch 0's.
CLAIM_SCRIPT: Final = Script("""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
local held = redis.call('GET', KEYS[1])
local held_epoch = 0
if held then held_epoch = tonumber(string.match(held, '^(%d+):')) or 0 end
if held_epoch < tonumber(ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return -1
end
local left = redis.call('PTTL', KEYS[1])
if left < 1 then left = 1 end
return left
""")

# KEYS: the slot. ARGV: "<epoch>:<token>". Deletes it only while that claim holds it.
RELEASE_SCRIPT: Final = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""")


class RedisFleetState:
    """The shared per-user state of the API fleet, in the projection store's Redis."""

    def __init__(self, store: RedisProjectionStore, base: str | None = None) -> None:
        self.store = store
        self.base = base or store.base or store.namespace
        self.snapshots = RedisSnapshots(store)

    def rate_key(self, user_id: int) -> str:
        return f"{self.base}:rate:{{{user_id}}}"

    async def take_token(self, user_id: int, burst: float, per_s: float, now_ms: int) -> int:
        """0 when the request may go (a token was taken); else the ms until the next token."""
        reply = await self.store.run_script(
            "rate limit",
            TAKE_SCRIPT,
            [self.rate_key(user_id)],
            [repr(float(burst)), repr(per_s / 1000), str(int(now_ms))],
        )
        return int(reply)

    def reconcile_key(self, user_id: int) -> str:
        return f"{self.base}:reconcile:{{{user_id}}}"

    async def claim_reconcile(
        self, user_id: int, token: str, interval_ms: int, now_ms: int, epoch: int = 0
    ) -> int:
        """0 when the slot was free (now taken for `interval_ms`), -1 when it was held since an
        earlier projection epoch (taken too); else the ms until it is free. `now_ms` is not
        needed: the slot expires on the store's clock (one clock for the fleet)."""
        reply = await self.store.run_script(
            "reconcile claim",
            CLAIM_SCRIPT,
            [self.reconcile_key(user_id)],
            [slot_value(epoch, token), str(int(interval_ms)), str(int(epoch))],
        )
        return int(reply)

    async def release_reconcile(self, user_id: int, token: str, epoch: int = 0) -> None:
        await self.store.run_script(
            "reconcile release", RELEASE_SCRIPT, [self.reconcile_key(user_id)], [slot_value(epoch, token)]
        )

    async def projection_epoch(self) -> int:
        return await read_epoch(self.store)


# -- snapshots (app/api/snapshots.py) ------------------------------------------------------------
#
#     {ns}:snap:{<user_id>}          hash    rev      the user's revision counter (HINCRBY)
#                                            live     "<rev>:<header>" of the newest snapshot
#                                            live_id  its id; prev: the id of the one before it
#                                            PEXPIRE: the snapshot TTL, from the last publish
#     {ns}:snap:{<user_id>}:r<id>    string  that snapshot's frozen record (the order of its
#                                            walk), PX: the snapshot TTL
#
# ``ns`` is the serving namespace (a rebuild's swap starts every walk again: the rows changed).
# At most two records per user are kept (the live one and the one before it, as each process
# holds two): publishing a third deletes the oldest. The record's key is not a declared key of
# the script; it is the header's key plus a suffix, so it shares the user's hash tag and slot.

# KEYS: meta, snap header. Returns {the meta's SERVED_FIELDS, the live header or nil}.
LIVE_SCRIPT: Final = Script(
    """
return {redis.call('HMGET', KEYS[1], FIELDS), redis.call('HGET', KEYS[2], 'live')}
""".replace("FIELDS", ", ".join(f"'{name}'" for name in SERVED_FIELDS))
)

# KEYS: snap header, the new record. ARGV: header (without the revision), record, ttl ms, id.
# Returns the new revision.
PUBLISH_SCRIPT: Final = Script("""
local rev = redis.call('HINCRBY', KEYS[1], 'rev', 1)
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
local oldest = redis.call('HGET', KEYS[1], 'prev')
local live = redis.call('HGET', KEYS[1], 'live_id')
if oldest and oldest ~= ARGV[4] and oldest ~= live then
  redis.call('DEL', KEYS[1] .. ':r' .. oldest)
end
if live and live ~= ARGV[4] then
  redis.call('HSET', KEYS[1], 'prev', live)
end
redis.call('HSET', KEYS[1], 'live', rev .. ':' .. ARGV[1], 'live_id', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return rev
""")


def _snap_key(namespace: str, user_id: int) -> str:
    return f"{namespace}:snap:{{{user_id}}}"


async def live_meta(store: RedisProjectionStore, user_id: int) -> tuple[list[Any], Any]:
    """The user's meta (SERVED_FIELDS) and the fleet's live snapshot header, one round trip."""
    keys = [store.meta_key(user_id), _snap_key(store.namespace, user_id)]
    meta, live = await store.run_script("meta", LIVE_SCRIPT, keys, [])
    return list(meta), live


class RedisSnapshots:
    """The snapshot records of the fleet (see above)."""

    def __init__(self, store: RedisProjectionStore) -> None:
        self.store = store

    async def publish(self, user_id: int, snapshot_id: int, header: str, record: bytes, ttl_ms: int) -> int:
        snap = _snap_key(self.store.namespace, user_id)
        reply = await self.store.run_script(
            "snapshot publish",
            PUBLISH_SCRIPT,
            [snap, f"{snap}:r{snapshot_id}"],
            [header, record, str(ttl_ms), str(snapshot_id)],
        )
        return int(reply)

    async def record(self, user_id: int, snapshot_id: int) -> bytes | None:
        key = f"{_snap_key(self.store.namespace, user_id)}:r{snapshot_id}"
        raw = await self.store.run_script("snapshot read", GET_SCRIPT, [key], [])
        return None if raw is None else bytes(raw)


# KEYS: a record. (A script rather than GET: the one guarded, NOSCRIPT-proof call path.)
GET_SCRIPT: Final = Script("return redis.call('GET', KEYS[1])")
