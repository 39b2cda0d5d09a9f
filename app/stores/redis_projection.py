"""Redis projection store: the serving copy of every user's conversation list (docs/contract.md §3.9, §5).

Layout (``ns`` = the namespace, default ``proj``; ``{42}`` is a literal Redis Cluster hash tag, so
all of one user's keys land on one slot and one Lua script may touch them together)::

    {ns}:rows:{<user_id>}    hash  conversation_id -> row JSON (orjson bytes, the §4 row as the
                                   flush produced it; stored whatever `listed` says, so serving
                                   can tell "deleted" from "never known")
    {ns}:meta:{<user_id>}    hash  version            the user's projection_mailbox_seq (decimal)
                                   structure_version  moves on pin/unpin/archive/unarchive/leave/delete
                                   total_unread, total_mention, muted_unread   the badge
                                   archived_unread, archived_mention, conversations_mode,
                                   include_muted   the badge's §10 part (ints; modes 0/1)
    {ns}:writes:{<user_id>}  hash  conversation_id -> persistent writes so far (only when the
                                   store counts writes: a test/audit hook for J-1)

A rebuild (issue #7) writes a fresh namespace and swaps readers over afterwards; the namespace
is therefore restricted to ``[A-Za-z0-9._-]`` (no ``:`` and no glob characters), which makes
``{ns}:*`` match this namespace's keys and nobody else's.

    {base}:serving           string  the namespace that serves (set by `projector rebuild --swap`;
                                     absent = the base, RedisSettings.projection_namespace)

A store built by ``from_settings(redis)`` without a namespace *follows* that key: the worker
resolves it before every write, the API at most once a second, so a swap (one atomic SET) moves
both over without a restart. A store given a namespace explicitly stays on it.

Writes: one Lua script per user batch compares the stored version with the batch's and, only if
the stored one is older, writes the rows, the badge, the version and the structure version —
atomically, so a reader never sees rows of one flush with the badge of another, and re-sending
a batch after a crash is refused (idempotent). Many users share one round trip: on one server a
single call of the script's batched form (each user still its own atomic step, in order), on a
cluster one pipeline per master.

Corrections (the unread audit, issue 7): another script rewrites some rows and the badge of one
user only while the stored version is exactly the one the audit compared against, and leaves the
version alone (`correct`).

Redis Cluster (``PROJECTOR_REDIS_URL=redis+cluster://...``, app/stores/redis_client.py). Every
multi-key operation stays inside one hash slot BY CONSTRUCTION:

* a user's keys are ``{ns}:<kind>:{<user_id>}`` and the namespace may not contain ``{`` or ``}``
  (checked here and in Settings), so the first ``{...}`` of every key of user U is exactly
  ``{U}``: all of U's keys hash to CRC16("U") mod 16384, whatever the namespace (a rebuild's
  namespace too) — tests/unit/test_redis_url.py checks this;
* each Lua script call is given the keys of ONE user (rows, meta, writes) and touches no other
  key; each MULTI (``load``, ``load_rows``, the API's snapshot read) reads the keys of one user;
* pipelines of many users (a flush's trip, ``versions``) are not transactions: the cluster
  client splits them per node, and each command in them is single-user;
* nothing is global but ``{base}:serving``, the rebuild's swap pointer: ONE string key, only ever
  read with GET and written with SET (one atomic command on whichever node owns its slot), never
  inside a script or MULTI with other keys. The structure version is per user, in the user's meta
  hash; there is no cross-user invariant a slot boundary could break;
* ``user_ids`` and ``delete_all`` SCAN every master (redis-py's cluster ``scan_iter``) and UNLINK
  per slot. During a slot migration a SCAN may miss or repeat a key; both are used by the rebuild
  and the tests on a namespace nobody writes to at the same time.

Failures that pass (a connection refused or reset, a timeout, CLUSTERDOWN during a failover,
TRYAGAIN during a migration, a redirection loop) are retried with exponential backoff and jitter
for up to `retry_budget_s` (``PROJECTOR_REDIS_RETRY_BUDGET_MS`` through `from_settings`), on top
of redis-py's own MOVED/ASK/TRYAGAIN handling; only then do they become ProjectionStoreError.
Re-sending is safe because every write is conditional: a write script refuses a version the
store already holds, a correction applies only at the version it names, and reads repeat freely.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.domain.projection_store import StoredProjection, StoredRows
from app.stores.projection_codec import (
    EncodedBatch,
    decode_rows,
    encode_batches,
    encode_corrections,
    extra_fields,
)
from app.stores.redis_client import RedisClient, open_redis
from app.stores.resp import pack_evalsha_batch

if TYPE_CHECKING:
    from app.domain.flush import Correction, UserFlush
    from app.settings import RedisSettings

_T = TypeVar("_T")

log = logging.getLogger(__name__)

# What redis-py raises when the store failed (as opposed to a bug of ours); the cluster client's
# topology errors are not RedisErrors.
STORE_ERRORS = (RedisError, RedisClusterException, OSError)


def is_transient(exc: BaseException) -> bool:
    """A store failure that passes by itself (worth a retry), as opposed to a refusal (a wrong
    type, a script error, bad credentials) that a retry would only repeat."""
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(
        exc,
        RedisConnectionError  # refused, reset, closed (BusyLoading and MaxConnections are ones too)
        | RedisTimeoutError
        | ClusterError  # CLUSTERDOWN, MASTERDOWN, "TTL exhausted" (too many redirections)
        | TryAgainError  # a multi-key command while its slot's keys are split by a migration
        | AskError  # MOVED/ASK left after redis-py's own redirections (a topology in motion)
        | ReadOnlyError  # a write that reached a master just demoted to replica
        | SlotNotCoveredError  # a slot without a master, mid-failover
        | OSError
        | asyncio.TimeoutError,
    ):
        return True
    if isinstance(exc, RedisClusterException):
        # The cluster client's topology refresh failed: no startup node reachable, or the nodes
        # disagree / do not cover every slot while a failover is under way.
        text = str(exc)
        return any(s in text for s in ("cannot be connected", "not covered", "could not agree"))
    return False


class _Backoff:
    """redis-py's exponential backoff with full jitter, bounded by a total time budget."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.failures = 0
        self.deadline = time.monotonic() + budget_s
        self._backoff = ExponentialWithJitterBackoff(base=0.05, cap=2.0)

    async def wait(self) -> bool:
        """Sleep before the next attempt; False (at once) when the budget is spent."""
        remaining = self.deadline - time.monotonic()
        if self.budget_s <= 0 or remaining <= 0:
            return False
        delay = min(self._backoff.compute(self.failures), remaining)
        self.failures += 1
        await asyncio.sleep(delay)
        return True


_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

# A following reader (the API) checks the serving key at most this often.
SERVING_RECHECK_S = 1.0


def own_key(namespace: str) -> re.Pattern[str]:
    """The names of a namespace's keys: a user's rows, meta and write counts, and what the API
    fleet keeps there (app/stores/redis_fleet.py: rate buckets, snapshot records, reconcile slots),
    and the projection epoch (app/stores/redis_epoch.py: hash tag ``{pe}``, not a user)."""
    return re.compile(
        rf"{re.escape(namespace)}:(?:(rows|meta|writes|rate|snap|reconcile):\{{(\d+)\}}(?::r\d+)?"
        r"|projection-epoch(?:-overruns)?:\{pe\})"
    )


def _extra(meta: Sequence[Any]) -> list[int]:
    """EXTRA_FIELDS' values from a SERVED_FIELDS read (absent: 0); ValueError when unreadable."""
    start = len(SERVED_FIELDS) - len(EXTRA_FIELDS)
    return [0 if value is None else int(_text(value)) for value in meta[start : start + len(EXTRA_FIELDS)]]


def serving_key(base: str) -> str:
    """The key naming the namespace that serves for this base (see the module docstring)."""
    return f"{base}:serving"


META_FIELDS = ("version", "structure_version", "total_unread", "total_mention", "muted_unread")
# docs/contract.md §10's part of the badge (projection_codec.badge_extra); absent: 0 (a user
# written before them: messages mode, not including muted, no archived totals kept).
EXTRA_FIELDS = ("archived_unread", "archived_mention", "conversations_mode", "include_muted")
# What readers get: META_FIELDS, then `corrections`: how many times rows were rewritten without
# a new version (a correction, a restore at the stored version), so that a snapshot loaded
# before such a write is known to be stale (issue 32; app/api/snapshots.py). Written by
# CORRECT_SCRIPT and RESTORE_SCRIPT only (HINCRBY), absent (0) until then.
SERVED_FIELDS = (*META_FIELDS, "corrections", *EXTRA_FIELDS)

# How many fixed ARGV precede the (conversation_id, row) pairs in the write script.
_FIXED_ARGS = 10

# Both scripts' row write, spliced into each: HSET KEYS[1] with the (conversation_id, row JSON)
# pairs ARGV[first..last] (locals of the script). In slices: unpack() of thousands of values
# overflows Lua's C stack ("too many results to unpack"), and a heavy user has 5,000
# conversations (10,000 values). The first HSET fails on a wrong-typed key before anything is
# written, so an error cannot leave half a batch behind.
_HSET_ROWS_LUA = """local slice = 1000
for i = first, last, slice do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + slice - 1, last)))
end"""

# WRITE_SCRIPT's and RESTORE_SCRIPT's version gate: `stored` (the stored version, '0' when none)
# and `incoming`; the script returns false (refused, nothing written) when the stored version is
# newer, or with `equal_refused` as new.
def _version_gate_lua(equal_refused: bool) -> str:
    comparison = "<=" if equal_refused else "<"
    return f"""local stored = redis.call('HGET', KEYS[2], 'version')
local incoming = ARGV[1]
if stored then
  if #incoming < #stored or (#incoming == #stored and incoming {comparison} stored) then
    return false
  end
else
  stored = '0'
end"""


# WRITE_SCRIPT's and RESTORE_SCRIPT's meta write (their ARGV layout), the version last.
_HSET_META_LUA = """redis.call('HSET', KEYS[2], 'structure_version', ARGV[2], 'total_unread', ARGV[3],
  'total_mention', ARGV[4], 'muted_unread', ARGV[5], 'archived_unread', ARGV[7],
  'archived_mention', ARGV[8], 'conversations_mode', ARGV[9], 'include_muted', ARGV[10],
  'version', incoming)"""


# KEYS: rows, meta[, writes (only when counting)]. ARGV: version, structure_version, total_unread,
# total_mention, muted_unread, count_writes ('1'/'0'), then EXTRA_FIELDS' four values, then
# conversation_id, row JSON, ...
#
# Versions are compared as canonical decimal strings (length, then bytes), not with tonumber():
# Lua numbers are doubles, and a mailbox_seq above 2^53 would compare wrongly and could let an
# older batch overwrite a newer one. Python always sends str(int), so the strings are canonical.
#
# The meta (version last) is written only after every row (_HSET_ROWS_LUA).
WRITE_SCRIPT = f"""
{_version_gate_lua(equal_refused=True)}
local first = 11
local last = #ARGV
{_HSET_ROWS_LUA}
if ARGV[6] == '1' then
  for i = first, last, 2 do
    redis.call('HINCRBY', KEYS[3], ARGV[i], 1)
  end
end
{_HSET_META_LUA}
return stored
"""


# The projection repair's write (issue 18, `restore`; app/worker/repair.py): WRITE_SCRIPT's
# layout, but a version EQUAL to the stored one is written too (only an older batch is refused),
# and writes are never counted (that hook measures the flush path's compaction, J-1). After a
# data loss a flush may have written some of a user's rows at version V into the emptied store;
# the restore then writes every row at V (the same values: V is what the state holds), which the
# flush path's "newer only" rule would refuse.
RESTORE_SCRIPT = f"""
{_version_gate_lua(equal_refused=False)}
local first = 11
local last = #ARGV
{_HSET_ROWS_LUA}
{_HSET_META_LUA}
redis.call('HINCRBY', KEYS[2], 'corrections', 1)
return stored
"""


# The unread audit's repair (ProjectionStore.correct). KEYS: rows, meta. ARGV: the version the
# audit compared against, total_unread, total_mention, muted_unread, EXTRA_FIELDS' four values,
# then conversation_id, row JSON, ... Written only while the stored version is exactly that one
# (a flush in between, or a store that never held it, refuses it: the next audit looks again);
# the version and the structure version are left alone, so the flush path's "newer versions
# only" rule is untouched; `corrections` counts the rewrite (a snapshot the API loaded before it
# is stale: issue 32).
# Same canonical decimal strings as WRITE_SCRIPT, and the same row write.
CORRECT_SCRIPT = f"""
local stored = redis.call('HGET', KEYS[2], 'version')
if stored ~= ARGV[1] then
  return 0
end
local first = 9
local last = #ARGV
{_HSET_ROWS_LUA}
redis.call('HSET', KEYS[2], 'total_unread', ARGV[2], 'total_mention', ARGV[3], 'muted_unread', ARGV[4],
  'archived_unread', ARGV[5], 'archived_mention', ARGV[6], 'conversations_mode', ARGV[7],
  'include_muted', ARGV[8])
redis.call('HINCRBY', KEYS[2], 'corrections', 1)
return 1
"""


# A user's rows and meta read in one atomic step, for a cluster (see `read_user`). KEYS: rows,
# meta. ARGV: 'all' (every row: HGETALL), or 'some' then the conversation ids (HMGET, in slices
# for the same unpack() limit as the writes). Returns {rows, meta}; a missing row or meta field
# is false in Lua and comes back as nil.
READ_SCRIPT = """
local rows
if ARGV[1] == 'all' then
  rows = redis.call('HGETALL', KEYS[1])
else
  rows = {}
  local slice = 1000
  for i = 2, #ARGV, slice do
    local part = redis.call('HMGET', KEYS[1], unpack(ARGV, i, math.min(i + slice - 1, #ARGV)))
    for j = 1, #part do
      rows[#rows + 1] = part[j]
    end
  end
end
return {rows, redis.call('HMGET', KEYS[2], META)}
""".replace("META", ", ".join(f"'{name}'" for name in SERVED_FIELDS))


# One EVALSHA for a whole trip on a single server: `body` (any of the scripts above: it reads
# only KEYS and ARGV and returns) runs once per call, in call order, each with its own KEYS and
# ARGV. ARGV: the number of calls n, then (key count, arg count) per call, then every call's args
# one after another; KEYS: every call's keys in order. Returns one reply per call: a failing call
# (WRONGTYPE, a Lua error) gives its error in place and the others go on, as a pipeline of single
# calls with raise_on_error=False did. Why: a trip of single calls cost the worker one reply to
# read and one script invocation per user (~25% of a flush's store write, measured); a script
# is atomic per user either way, and a trip was never atomic as a whole.
_BATCH_LUA = """local function one(KEYS, ARGV)
BODY
end
local n = tonumber(ARGV[1])
local out = {}
local k, a = 1, 2 + 2 * n
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j - 1] end
  for j = 1, na do args[j] = ARGV[a + j - 1] end
  k, a = k + nk, a + na
  local ok, reply = pcall(one, keys, args)
  if ok then
    out[i] = reply
  elseif type(reply) == 'table' and reply.err then
    out[i] = reply
  else
    out[i] = redis.error_reply(tostring(reply))
  end
end
return out"""


class _Script:
    """A Lua script run by digest (EVALSHA); `sha` is replaced when the server reloads it.
    `batched`: the same script run once per call of a whole trip in one EVALSHA (_BATCH_LUA)."""

    def __init__(self, text: str, *, batch: bool = True) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
        self.batched = _Script(_BATCH_LUA.replace("BODY", text), batch=False) if batch else None


# The name other store modules use (app/stores/redis_fleet.py).
Script = _Script


class ProjectionStoreError(RuntimeError):
    """The projection store could not do what was asked (server down, timeout, bad data)."""


def _text(value: object) -> str:
    """Redis replies are bytes unless the client decodes them; accept both."""
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisProjectionStore:
    """`ProjectionStore` on Redis (see the module docstring for the layout).

    `max_users_per_trip` and `max_fields_per_trip` bound one round trip: Redis runs a trip's
    scripts back to back (on one server in one call, which no other client's command
    interleaves), and a multi-field HSET costs ~1 ms per 512 fields here, so
    the field budget keeps one trip from blocking the server (and other readers) for long. A user
    is never split across trips: a user bigger than the budget goes alone.
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str = "proj",
        count_writes: bool = False,
        *,
        max_users_per_trip: int = 256,
        max_fields_per_trip: int = 4096,
        retry_budget_s: float = 0.0,
    ) -> None:
        if not _NAMESPACE_RE.fullmatch(namespace):
            raise ValueError(
                f"namespace {namespace!r} must be 1-64 of [A-Za-z0-9._-] (no ':' or glob characters)"
            )
        if max_users_per_trip < 1 or max_fields_per_trip < 1:
            raise ValueError("max_users_per_trip and max_fields_per_trip must be >= 1")
        if not 0 <= retry_budget_s <= 600:
            raise ValueError("retry_budget_s must be in 0..600")
        self.client = client
        self.retry_budget_s = retry_budget_s
        self.namespace = namespace
        self.count_writes = count_writes
        self.max_users_per_trip = max_users_per_trip
        self.max_fields_per_trip = max_fields_per_trip
        self._write_script = _Script(WRITE_SCRIPT)
        self._restore_script = _Script(RESTORE_SCRIPT)
        self._correct_script = _Script(CORRECT_SCRIPT)
        self._read_script = _Script(READ_SCRIPT)
        self._owns_client = False
        # Only keys of exactly this layout are ever deleted by delete_all.
        self._own_key = own_key(namespace)
        # Following the serving key (from_settings without a namespace): the base it belongs to.
        self.base: str | None = None
        self._checked_at = float("-inf")

    @classmethod
    def from_settings(
        cls,
        redis: RedisSettings,
        namespace: str | None = None,
        count_writes: bool = False,
        *,
        retry_budget_s: float | None = None,
    ) -> RedisProjectionStore:
        """A store on its own client for `redis.redis_url` (one server or a cluster: see
        app/stores/redis_client.py), `flush_batch_size` users per round trip, retrying passing
        failures for `redis.redis_retry_budget_ms` unless `retry_budget_s` says otherwise (the
        API: 0); `aclose()` closes that client. No I/O until the first call.

        Without `namespace`: the serving namespace of `redis.projection_namespace`, followed
        (see :meth:`follow_serving`); with one: exactly that namespace."""
        from app.connections import redis_client_options

        # Credentials and TLS files next to the URL: app/connections.py, for every Redis client.
        client = open_redis(redis.redis_url, **redis_client_options(redis))
        base = redis.projection_namespace
        budget = redis.redis_retry_budget_ms / 1000 if retry_budget_s is None else retry_budget_s
        store = cls(
            client,
            namespace or base,
            count_writes,
            max_users_per_trip=redis.flush_batch_size,
            retry_budget_s=budget,
        )
        store._owns_client = True
        if namespace is None:
            store.base = base
        return store

    async def follow_serving(self, max_age_s: float = 0.0) -> str:
        """When following: re-read ``{base}:serving`` (if the last read is older than
        `max_age_s`) and move onto the namespace it names; returns the namespace in use."""
        if self.base is None:
            return self.namespace
        now = time.monotonic()
        if now - self._checked_at < max_age_s:
            return self.namespace
        base = self.base
        raw = await self._guard("serving", lambda: self.client.get(serving_key(base)))
        self._checked_at = now
        target = self.base if raw is None else _text(raw)
        if target != self.namespace and _NAMESPACE_RE.fullmatch(target):
            self.namespace = target
            self._own_key = own_key(target)
        return self.namespace

    async def aclose(self) -> None:
        """Close the client if this store created it (a client passed in belongs to the caller)."""
        if self._owns_client:
            await self.client.aclose()

    # -- keys -----------------------------------------------------------------------------------

    def rows_key(self, user_id: int) -> str:
        return f"{self.namespace}:rows:{{{user_id}}}"

    def meta_key(self, user_id: int) -> str:
        return f"{self.namespace}:meta:{{{user_id}}}"

    def writes_key(self, user_id: int) -> str:
        return f"{self.namespace}:writes:{{{user_id}}}"

    # -- the port -------------------------------------------------------------------------------

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        encoded = encode_batches(batches)  # ValueError/TypeError before any I/O
        await self.follow_serving()  # the worker writes where the API reads, swap or not
        results: list[int | None] = []
        # Trips run one after another, in call order: if a user appears twice in one call, the
        # earlier batch is compared and written first, as in the in-memory store.
        for trip in self._trips(encoded):
            results.extend(await self._guard("write", functools.partial(self._write_trip, trip)))
        return results

    async def restore(self, batches: Sequence[UserFlush]) -> list[int | None]:
        """`write`, for the projection repair (RESTORE_SCRIPT): a batch whose version equals the
        stored one is written too; only an older one is refused (None)."""
        encoded = encode_batches(batches)
        await self.follow_serving()
        results: list[int | None] = []
        for trip in self._trips(encoded):
            call = functools.partial(self._write_trip, trip, self._restore_script, False)
            results.extend(await self._guard("restore", call))
        return results

    async def inventory(self, user_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Per user, the stored version (0: none) and how many rows the store holds: whether a
        user's projection is whole, without reading it (one pipelined round trip per slice)."""

        def queue(pipe: Any, user_id: int) -> None:
            pipe.hget(self.meta_key(user_id), "version")
            pipe.hlen(self.rows_key(user_id))

        replies = await self._per_user_reads("inventory", user_ids, 2, queue)
        return [
            (0 if version is None else int(_text(version)), int(rows))
            for version, rows in zip(replies[::2], replies[1::2], strict=True)
        ]

    async def versions(self, user_ids: Sequence[int]) -> list[int]:
        def queue(pipe: Any, user_id: int) -> None:
            pipe.hget(self.meta_key(user_id), "version")

        replies = await self._per_user_reads("versions", user_ids, 1, queue)
        return [0 if reply is None else int(_text(reply)) for reply in replies]

    async def _per_user_reads(
        self, what: str, user_ids: Sequence[int], fields_per_user: int, queue: Callable[[Any, int], None]
    ) -> list[Any]:
        """The replies of the commands `queue` adds to a pipeline per user (`fields_per_user`
        fields each), in order: one pipelined round trip per slice of at most
        max_fields_per_trip fields, each under the store's guard as `what`."""
        replies: list[Any] = []
        step = max(1, self.max_fields_per_trip // fields_per_user)
        for start in range(0, len(user_ids), step):
            chunk = user_ids[start : start + step]

            async def read(chunk: Sequence[int] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for user_id in chunk:
                    queue(pipe, user_id)
                return list(await pipe.execute())

            replies.extend(await self._guard(what, read))
        return replies

    async def load(self, user_id: int) -> StoredProjection:
        raw_rows, meta = await self.read_user(user_id)
        try:
            values = [0 if value is None else int(_text(value)) for value in meta[: len(META_FIELDS)]]
            rows = decode_rows({_text(k): v for k, v in raw_rows.items()})
        except ValueError as exc:  # a bad int or bad JSON (orjson.JSONDecodeError is a ValueError)
            raise ProjectionStoreError(
                f"projection store: user {user_id} has unreadable data under "
                f"{self.namespace}:*:{{{user_id}}}: {exc}"
            ) from None
        version, structure_version, total_unread, total_mention, muted_unread = values
        extra = _extra(meta)
        return StoredProjection(
            user_id=user_id,
            rows=rows,
            total_unread=total_unread,
            total_mention=total_mention,
            muted_unread=muted_unread,
            projection_mailbox_seq=version,
            structure_version=structure_version,
            **extra_fields(extra),
        )

    async def load_rows(self, user_id: int, conversation_ids: Sequence[str]) -> StoredRows:
        wanted = list(conversation_ids)
        raw_rows, meta = (
            await self.read_some(user_id, wanted) if wanted else ([], await self.read_meta(user_id))
        )
        try:
            version, _, total_unread, total_mention, muted_unread = (
                0 if value is None else int(_text(value)) for value in meta[: len(META_FIELDS)]
            )
            extra = _extra(meta)
            present = {cid: raw for cid, raw in zip(wanted, raw_rows, strict=True) if raw is not None}
            decoded = decode_rows(present)
        except ValueError as exc:
            raise ProjectionStoreError(
                f"projection store: user {user_id} has unreadable data under "
                f"{self.namespace}:*:{{{user_id}}}: {exc}"
            ) from None
        return StoredRows(
            user_id=user_id,
            rows={cid: decoded.get(cid) for cid in wanted},
            total_unread=total_unread,
            total_mention=total_mention,
            muted_unread=muted_unread,
            projection_mailbox_seq=version,
            **extra_fields(extra),
        )

    async def read_user(self, user_id: int) -> tuple[dict[Any, bytes], list[Any]]:
        """Every row of the user (conversation id -> row JSON, as stored) and the SERVED_FIELDS
        values (bytes or None), from the same instant: a flush between two separate reads would
        pair old rows with a new badge."""
        if isinstance(self.client, RedisCluster):
            rows, meta = await self._guard("load", lambda: self._read_script_call(user_id, ["all"]))
            return dict(zip(rows[::2], rows[1::2], strict=True)), meta

        async def multi() -> list[Any]:
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(self.rows_key(user_id))
            pipe.hmget(self.meta_key(user_id), list(SERVED_FIELDS))
            return list(await pipe.execute())

        raw_rows, meta = await self._guard("load", multi)
        return raw_rows, meta

    async def read_some(self, user_id: int, wanted: Sequence[str]) -> tuple[list[Any], list[Any]]:
        """As `read_user`, for the rows of `wanted` only (None where the store has none)."""
        if isinstance(self.client, RedisCluster):
            rows, meta = await self._guard(
                "load_rows", lambda: self._read_script_call(user_id, ["some", *wanted])
            )
            return rows, meta

        async def multi() -> list[Any]:
            pipe = self.client.pipeline(transaction=True)
            pipe.hmget(self.rows_key(user_id), list(wanted))
            pipe.hmget(self.meta_key(user_id), list(SERVED_FIELDS))
            return list(await pipe.execute())

        rows, meta = await self._guard("load_rows", multi)
        return rows, meta

    async def read_meta(self, user_id: int) -> list[Any]:
        """The SERVED_FIELDS values of the user (one HMGET: atomic on its own)."""
        meta: list[Any] = await self._guard(
            "meta", lambda: self.client.hmget(self.meta_key(user_id), list(SERVED_FIELDS))
        )
        return meta

    async def _read_script_call(self, user_id: int, args: list[str]) -> list[Any]:
        # Why a script and not MULTI on a cluster: redis-py's asyncio cluster client (8.1) runs
        # every command queued in a cluster MULTI through asyncio.run() in a helper thread, which
        # opens (topology refresh) or uses connections on a throwaway event loop ("attached to a
        # different loop", "Event loop is closed"). One read-only script over the user's two
        # keys (one slot) is just as atomic and follows MOVED/ASK/TRYAGAIN like any command.
        keys = [self.rows_key(user_id), self.meta_key(user_id)]
        script = self._read_script
        try:
            reply = await self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = _text(await self.client.script_load(script.text))
            reply = await self.client.evalsha(script.sha, len(keys), *keys, *args)
        return list(reply)

    async def run_script(
        self, what: str, script: _Script, keys: list[str], args: Sequence[str | bytes]
    ) -> Any:
        """One call of `script` (by digest, loaded again if the server lost it), guarded like every
        other call: for scripts of other modules over one user's keys (app/stores/redis_fleet.py)."""

        async def call() -> Any:
            try:
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                script.sha = _text(await self.client.script_load(script.text))
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)

        return await self._guard(what, call)

    async def correct(self, corrections: Sequence[Correction]) -> list[bool]:
        encoded = encode_corrections(corrections)  # ValueError/TypeError before any I/O
        if not encoded:
            return []
        await self.follow_serving()  # correct where the flushes write
        calls: list[tuple[list[str], list[str | bytes]]] = []
        for correction in encoded:
            keys = [self.rows_key(correction.user_id), self.meta_key(correction.user_id)]
            args: list[str | bytes] = [
                str(correction.version),
                str(correction.total_unread),
                str(correction.total_mention),
                str(correction.muted_unread),
                *map(str, correction.extra),
            ]
            for conversation_id, row in correction.rows:
                args.append(conversation_id)
                args.append(row)
            calls.append((keys, args))
        replies = await self._guard("correct", lambda: self._eval_each(self._correct_script, calls))
        results: list[bool] = []
        for correction, reply in zip(encoded, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._call_error(
                    "correct", f"correcting user {correction.user_id}", correction.version, reply
                )
            results.append(int(reply) == 1)
        return results

    # -- rebuild / test helpers -----------------------------------------------------------------

    async def write_counts(self, user_id: int) -> dict[str, int]:
        """Persistent writes per conversation of this user (empty unless `count_writes`)."""
        raw = await self._guard("write_counts", lambda: self.client.hgetall(self.writes_key(user_id)))
        return {_text(k): int(_text(v)) for k, v in raw.items()}

    async def user_ids(self) -> list[int]:
        """Every user with a stored projection in this namespace, ascending (SCAN: no blocking)."""

        async def scan() -> list[int]:
            found: set[int] = set()  # SCAN may return a key more than once
            async for key in self.client.scan_iter(match=f"{self.namespace}:meta:*", count=1000):
                m = self._own_key.fullmatch(_text(key))
                if m is not None and m[1] == "meta":
                    found.add(int(m[2]))
            return sorted(found)

        return await self._guard("user_ids", scan)

    async def delete_all(self) -> int:
        """Delete this namespace (SCAN + UNLINK in batches); returns how many users it held."""

        async def run() -> int:
            users: set[str] = set()  # SCAN may return a key more than once: count each user once
            doomed: list[str] = []
            async for key in self.client.scan_iter(match=f"{self.namespace}:*", count=1000):
                name = _text(key)
                m = self._own_key.fullmatch(name)
                if m is None:
                    continue  # someone else's key that happens to share the prefix: keep it
                if m[1] == "meta":
                    users.add(m[2])
                doomed.append(name)
                if len(doomed) >= 1000:
                    await self.client.unlink(*doomed)
                    doomed.clear()
            if doomed:
                await self.client.unlink(*doomed)
            return len(users)

        return await self._guard("delete_all", run)

    # -- internals ------------------------------------------------------------------------------

    def _trips(self, batches: list[EncodedBatch]) -> list[list[EncodedBatch]]:
        """Split into round trips by user count and field budget, keeping the order."""
        trips: list[list[EncodedBatch]] = []
        current: list[EncodedBatch] = []
        fields = 0
        for batch in batches:
            size = len(batch.rows) + len(META_FIELDS)
            if current and (
                len(current) >= self.max_users_per_trip or fields + size > self.max_fields_per_trip
            ):
                trips.append(current)
                current, fields = [], 0
            current.append(batch)
            fields += size
        if current:
            trips.append(current)
        return trips

    def _script_call(self, batch: EncodedBatch, count: bool) -> tuple[list[str], list[str | bytes]]:
        keys = [self.rows_key(batch.user_id), self.meta_key(batch.user_id)]
        if count:
            # Only then: while a cluster slot migrates, a multi-key command naming a key that
            # does not exist is answered TRYAGAIN until the migration ends, and the writes key
            # never exists unless writes are counted.
            keys.append(self.writes_key(batch.user_id))
        args: list[str | bytes] = [
            str(batch.version),
            str(batch.structure_version),
            str(batch.total_unread),
            str(batch.total_mention),
            str(batch.muted_unread),
            "1" if count else "0",
            *map(str, batch.extra),
        ]
        for conversation_id, row in batch.rows:
            args.append(conversation_id)
            args.append(row)
        return keys, args

    async def _write_trip(
        self, trip: list[EncodedBatch], script: _Script | None = None, count: bool | None = None
    ) -> list[int | None]:
        # (keys, args) per user, in order
        counting = self.count_writes if count is None else count
        calls = [self._script_call(batch, counting) for batch in trip]
        replies = await self._eval_each(script or self._write_script, calls)
        results: list[int | None] = []
        for batch, reply in zip(trip, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._call_error("write", f"writing user {batch.user_id}", batch.version, reply)
            results.append(None if reply is None else int(_text(reply)))
        return results

    async def _eval_each(
        self, script: _Script, calls: list[tuple[list[str], list[str | bytes]]]
    ) -> list[Any]:
        """`script` once per (keys, args) call, in one round trip; a reply per call, errors in place.

        Calls that failed in a way that passes (connection reset, failover, TRYAGAIN, ...; the
        whole pipeline or single calls) are re-sent, and only those, with backoff within the
        retry budget; then their errors stay in place for the caller. If the server lost the
        script (restart, SCRIPT FLUSH, a replica promoted that never loaded it), it is loaded
        (on every master of a cluster) and the NOSCRIPT calls re-sent: they did not run.

        Why re-sending is safe: both scripts are conditional on the stored version, so a call
        that did run before its reply was lost is refused the second time (the write script
        then answers "already stored" for it: the caller cannot tell it from a crash replay,
        and treats it the same way)."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        backoff = _Backoff(self.retry_budget_s)
        reloaded = False
        while todo:
            try:
                got = await self._evalsha_trip(script, [calls[i] for i in todo])
            except STORE_ERRORS as exc:  # the whole trip failed: every call's outcome unknown
                got = [exc] * len(todo)
            for i, reply in zip(todo, got, strict=True):
                replies[i] = reply
            lost = [i for i in todo if isinstance(replies[i], NoScriptError)]
            passing = [i for i in todo if is_transient(replies[i])]
            if lost and not reloaded:
                for loaded in (script, script.batched):
                    if loaded is not None:
                        load = functools.partial(self.client.script_load, loaded.text)
                        loaded.sha = _text(await self._guard("script load", load))
                reloaded = True  # once at once; a NOSCRIPT again (a node just promoted) waits
                todo = sorted(lost + passing)  # in call order: a user twice in a trip
                if not passing:
                    continue
            else:
                todo = sorted(lost + passing)  # in call order: a user twice in a trip
                reloaded = False
            if not todo:
                break
            first = replies[todo[0]]
            if not await backoff.wait():
                break  # the caller raises with the error in place
            log.warning(
                "projection store (%s): %d of %d calls failed (%s: %s); retry %d",
                self.namespace,
                len(todo),
                len(calls),
                type(first).__name__,
                first,
                backoff.failures,
            )
        return replies

    def _call_error(self, what: str, doing: str, version: int, exc: Exception) -> ProjectionStoreError:
        """A script call's error left in place (after the retries, for one that passes)."""
        if is_transient(exc):
            return ProjectionStoreError(
                f"projection store ({self.namespace}) unreachable during {what}: {doing} "
                f"(version {version}) failed: {type(exc).__name__}: {exc}"
            )
        return ProjectionStoreError(f"projection store: {doing} (version {version}) failed: {exc}")

    async def _evalsha_trip(
        self, script: _Script, calls: list[tuple[list[str], list[str | bytes]]]
    ) -> list[Any]:
        groups = self._by_master(calls)
        if len(groups) == 1:
            return await self._evalsha_pipeline(script, calls)
        # A cluster: one pipeline per master, concurrently. A master that fails (killed, mid-
        # failover) then fails only its own users' calls: the others' replies (what each store
        # held before) come back and their frames go out, instead of the whole trip being re-sent
        # and answered "already stored".
        answers = await asyncio.gather(
            *(self._evalsha_pipeline(script, [calls[i] for i in group]) for group in groups),
            return_exceptions=True,
        )
        replies: list[Any] = [None] * len(calls)
        for group, answer in zip(groups, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, STORE_ERRORS):
                    raise answer
                answer = [answer] * len(group)
            for i, reply in zip(group, answer, strict=True):
                replies[i] = reply
        return replies

    async def _evalsha_pipeline(
        self, script: _Script, calls: list[tuple[list[str], list[str | bytes]]]
    ) -> list[Any]:
        # transaction=False: each script is atomic on its own; MULTI around many users would
        # only add a server-side queue, not safety (and on a cluster could not span their slots).
        # Errors come back in place (raise_on_error False) so one bad user cannot hide which
        # others were written.
        # execute_command, not pipe.evalsha(): redis-py's cluster pipeline refuses the method
        # (a blanket block), while it routes the command itself by its KEYS like any other.
        if not isinstance(self.client, RedisCluster):
            return await self._evalsha_packed(script, calls)
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def _evalsha_packed(
        self, script: _Script, calls: list[tuple[list[str], list[str | bytes]]]
    ) -> list[Any]:
        """One server: the whole trip is one EVALSHA of the script's batched form, packed once
        (app/stores/resp.py) and written on a pooled connection; its reply holds one reply per
        call, a call's error in place. An error for the whole command (NOSCRIPT: the server lost
        the batched script) stands in place of every call's reply (`_eval_each` loads the
        scripts again and re-sends). A connection that failed mid-trip is dropped (its unread
        reply would answer the next user of the socket) and the error raised: the caller retries
        the trip (`_eval_each`; the scripts are conditional on the version)."""
        client = self.client
        assert not isinstance(client, RedisCluster)  # a cluster's trips go per master (above)
        batched = script.batched
        assert batched is not None
        buffer = pack_evalsha_batch(batched.sha, calls)
        pool = client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        try:
            await connection.send_packed_command(buffer)
            try:
                reply = await connection.read_response()
            except ResponseError as exc:
                return [exc] * len(calls)
        except BaseException:
            await connection.disconnect()
            raise
        finally:
            await pool.release(connection)
        if not isinstance(reply, list) or len(reply) != len(calls):
            raise ResponseError(f"a batched script call answered {reply!r:.200} for {len(calls)} calls")
        return reply

    def _by_master(self, calls: list[tuple[list[str], list[str | bytes]]]) -> list[list[int]]:
        """Call indexes grouped by the master that owns their slot, as the cluster client knows
        the slot map now (one group, in order, for a single server or before the client has
        read the map). A stale map costs nothing: the pipeline still follows MOVED."""
        client = self.client
        if not isinstance(client, RedisCluster) or not client.nodes_manager.slots_cache:
            return [list(range(len(calls)))]
        groups: dict[str, list[int]] = {}
        cache = client.nodes_manager.slots_cache
        for i, (keys, _) in enumerate(calls):
            owners = cache.get(client.keyslot(keys[0]))
            groups.setdefault(owners[0].name if owners else "", []).append(i)
        return list(groups.values())

    async def _guard(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run `call()`, again after a failure that passes (within the retry budget), and
        translate what is left into ProjectionStoreError at the boundary."""
        backoff = _Backoff(self.retry_budget_s)
        while True:
            try:
                return await call()
            except ProjectionStoreError:
                raise
            except STORE_ERRORS as exc:
                if is_transient(exc) and await backoff.wait():
                    log.warning(
                        "projection store (%s): %s failed (%s: %s); retry %d",
                        self.namespace,
                        what,
                        type(exc).__name__,
                        exc,
                        backoff.failures,
                    )
                    continue
                kind = "unreachable" if is_transient(exc) else "refused the command"
                raise ProjectionStoreError(
                    f"projection store ({self.namespace}) {kind} during {what}: {type(exc).__name__}: {exc}"
                ) from None
