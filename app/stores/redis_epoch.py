"""The projection epoch in the projection store (docs/contract.md §3.9; app/domain/retention.py)::

    {ns}:projection-epoch:{pe}           string  the epoch (absent: 0); INCR on a retention overrun
    {ns}:projection-epoch-overruns:{pe}  hash    <topic>/<partition> -> the checkpoint's next
                                                 offset of the last overrun that bumped it

``ns`` is the base namespace (as the reconcile slots, app/stores/redis_fleet.py: a rebuild's swap
does not move the epoch). Both keys share the hash tag ``{pe}``: one slot of a Redis Cluster, so
the bump is one atomic script.
"""

from __future__ import annotations

from typing import Final

from app.stores.redis_projection import RedisProjectionStore, Script

# KEYS: epoch, overruns. ARGV: mark, the checkpoint's next offset. Returns {1 bumped | 0 the same
# overrun again, the epoch now}.
BUMP_SCRIPT: Final = Script("""
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if seen == ARGV[2] then
  return {0, tonumber(redis.call('GET', KEYS[1]) or '0')}
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {1, redis.call('INCR', KEYS[1])}
""")

READ_SCRIPT: Final = Script("return redis.call('GET', KEYS[1])")


def epoch_key(base: str) -> str:
    return f"{base}:projection-epoch:{{pe}}"


def overruns_key(base: str) -> str:
    return f"{base}:projection-epoch-overruns:{{pe}}"


def _base(store: RedisProjectionStore) -> str:
    return store.base or store.namespace


async def read_epoch(store: RedisProjectionStore) -> int:
    raw = await store.run_script("projection epoch", READ_SCRIPT, [epoch_key(_base(store))], [])
    return 0 if raw is None else int(raw)


async def bump_epoch(store: RedisProjectionStore, mark: str, checkpoint_next: int) -> tuple[bool, int]:
    """(bumped, the epoch now): bumped unless `mark` last bumped it for this same offset (the
    rule of app.domain.retention.is_new_overrun, applied atomically in the script)."""
    base = _base(store)
    bumped, epoch = await store.run_script(
        "projection epoch bump",
        BUMP_SCRIPT,
        [epoch_key(base), overruns_key(base)],
        [mark, str(int(checkpoint_next))],
    )
    return bool(int(bumped)), int(epoch)
