"""One place that builds the projection store's Redis client from `PROJECTOR_REDIS_URL` (see
app/redis_url.py for the forms): a plain `redis.asyncio.Redis` for one server, redis-py's own
`redis.asyncio.RedisCluster` for ``redis+cluster://``. The worker, the API, `projector rebuild`
and the unread audit all get their client here (through `RedisProjectionStore.from_settings`).

What the cluster client does by itself (redis-py): it learns the slot map from any startup node,
sends each command to the slot's master, follows ``MOVED`` (a slot moved: it patches its map, and
re-reads the whole map every few redirections) and ``ASK`` (a slot being migrated: ``ASKING`` then
the command on the importing node), waits and re-sends on ``TRYAGAIN`` (a multi-key command while
its slot's keys are split between two nodes), and on a connection error or ``CLUSTERDOWN`` re-reads
the topology and tries again up to `CLUSTER_RETRIES` times. A failover takes longer than those
retries (the cluster needs node-timeout to notice a dead master, then an election): that wait is
the store's retry budget (`RedisProjectionStore`, `PROJECTOR_REDIS_RETRY_BUDGET_MS`), layered on top.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from app.redis_url import RedisTarget, parse_redis_url

RedisClient = redis.Redis | RedisCluster

# Without a socket timeout a command to a node that hangs (stopped, partitioned, a stalled proxy)
# waits forever; with one it fails and the retries above take over. The URL may set others.
DEFAULT_SOCKET_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# redis-py's own attempts per command on connection errors / CLUSTERDOWN (topology re-read between).
CLUSTER_RETRIES = 3


def open_redis(url: str | RedisTarget, **options: Any) -> RedisClient:
    """A client for `url` (no I/O until its first command). `options` are redis-py connection
    keywords given apart from the URL (app/connections.redis_client_options: password, TLS
    files); the URL's own credentials and options win over them, as with redis-py's from_url."""
    target = parse_redis_url(url) if isinstance(url, str) else url
    kwargs: dict[str, Any] = {
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT_S,
        **options,
        **target.options,
    }
    if target.username is not None:
        kwargs["username"] = target.username
    if target.password is not None:
        kwargs["password"] = target.password
    if target.tls:
        kwargs["ssl"] = True
    if target.cluster:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            # A slot without a master (mid-failover) fails only the commands for that slot, with
            # an error the store retries, instead of failing the client's topology refresh.
            require_full_coverage=False,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=CLUSTER_RETRIES),
            **kwargs,
        )
    if target.unix_path is not None:
        return redis.Redis(unix_socket_path=target.unix_path, db=target.db, **kwargs)
    host, port = target.nodes[0]
    return redis.Redis(host=host, port=port, db=target.db, **kwargs)
