"""What the API instances of one fleet share in the projection store (issue 32): the per-user
request budget, and (app/api/snapshots.py) the walks' frozen orders.

Keys, all under the user's hash tag (so each script call touches one slot of a Redis Cluster,
as app/stores/redis_projection.py's scripts do)::

    {ns}:rate:{<user_id>}   hash  t (tokens left, a float), at (ms of the last refill)
                                  PEXPIRE: the time a drained bucket takes to fill again (an
                                  absent bucket is a full one, so nothing is lost when it goes)

``ns`` is the base namespace (Settings.projection_namespace), not the serving one: a rebuild's
swap does not refill everyone's bucket.

Token bucket (one atomic script per request, `TAKE_SCRIPT`): ``rate`` tokens a second up to
``burst``. The clock is the caller's (``deps.clock_ms``, injectable in tests); the stored ``at``
only ever moves forward, so an instance whose clock is behind gets no refill until its clock
passes it, and an instance whose clock is ahead cannot make the others refill the same interval
twice: a skew between instances never adds tokens.
"""

from __future__ import annotations

from typing import Final

from app.stores.redis_projection import RedisProjectionStore, Script

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


class RedisFleetState:
    """The shared per-user state of the API fleet, in the projection store's Redis."""

    def __init__(self, store: RedisProjectionStore, base: str | None = None) -> None:
        self.store = store
        self.base = base or store.base or store.namespace

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
