"""A trip of script calls packed into one RESP command, built once from bytes.

Why: a flush writes hundreds of users per round trip, one script call each with ~10 arguments.
redis-py's pipeline packs every command again through its generic encoder (type checks, str ->
bytes per argument, a list of chunks per command): measured as the largest CPU share of a flush's
store write. The arguments here are already bytes or ASCII strings (keys, decimal numbers, the
rows' JSON), so the whole trip is one `bytes` built in a single pass and written with one call.
"""

from __future__ import annotations

from collections.abc import Sequence

Call = tuple[Sequence[str], Sequence[str | bytes]]  # (keys, args) of one script call


def _bulk(value: str | bytes) -> bytes:
    data = value if isinstance(value, bytes) else value.encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack_evalsha_batch(sha: str, calls: Sequence[Call]) -> bytes:
    """One `EVALSHA sha numkeys key... arg...` for the batched form of a script (see
    `_BATCH_LUA` in app/stores/redis_projection.py): KEYS = every call's keys in order; ARGV = the
    number of calls, (key count, arg count) per call, then every call's args in order."""
    keys_out: list[bytes] = []
    counts: list[bytes] = [_bulk(str(len(calls)))]
    args_out: list[bytes] = []
    key_total = arg_total = 0
    for keys, args in calls:
        counts.append(_bulk(str(len(keys))))
        counts.append(_bulk(str(len(args))))
        key_total += len(keys)
        arg_total += len(args)
        keys_out.extend(map(_bulk, keys))
        args_out.extend(map(_bulk, args))
    head = b"*%d\r\n" % (3 + key_total + len(counts) + arg_total)
    return b"".join(
        [head, _bulk("EVALSHA"), _bulk(sha), _bulk(str(key_total)), *keys_out, *counts, *args_out]
    )
