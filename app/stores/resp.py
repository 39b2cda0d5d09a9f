"""A pipeline of EVALSHA calls packed into one RESP buffer, built once from bytes.

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


def pack_evalsha(sha: str, calls: Sequence[Call]) -> bytes:
    """`EVALSHA sha numkeys key... arg...` per call, as the Redis protocol puts it on the wire."""
    head = _bulk("EVALSHA") + _bulk(sha)
    out: list[bytes] = []
    append = out.append
    for keys, args in calls:
        append(b"*%d\r\n" % (3 + len(keys) + len(args)))
        append(head)
        append(_bulk(str(len(keys))))
        for key in keys:
            append(_bulk(key))
        for arg in args:
            append(_bulk(arg))
    return b"".join(out)
