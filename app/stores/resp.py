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
    # `_bulk` inlined: a flush packs a dozen values per user, and the call was a third of it.
    keys_out: list[bytes] = []
    counts: list[bytes] = [_bulk(str(len(calls)))]
    args_out: list[bytes] = []
    add_key = keys_out.append
    add_count = counts.append
    add_arg = args_out.append
    small = _SMALL_COUNTS
    key_total = arg_total = 0
    for keys, args in calls:
        key_count = len(keys)
        arg_count = len(args)
        add_count(small[key_count] if key_count < _SMALL else _bulk(str(key_count)))
        add_count(small[arg_count] if arg_count < _SMALL else _bulk(str(arg_count)))
        key_total += key_count
        arg_total += arg_count
        for key in keys:
            data = key if isinstance(key, bytes) else key.encode()
            add_key(b"$%d\r\n%b\r\n" % (len(data), data))
        for arg in args:
            data = arg if isinstance(arg, bytes) else arg.encode()
            add_arg(b"$%d\r\n%b\r\n" % (len(data), data))
    head = b"*%d\r\n" % (3 + key_total + len(counts) + arg_total)
    return b"".join(
        [head, _bulk("EVALSHA"), _bulk(sha), _bulk(str(key_total)), *keys_out, *counts, *args_out]
    )


# The bulk strings of small counts (a call's key and arg counts), made once.
_SMALL = 256
_SMALL_COUNTS = [_bulk(str(n)) for n in range(_SMALL)]
