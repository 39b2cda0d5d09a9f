"""Before a worker starts faust: its source topic exists (with the partition count its changelog
tables are made for), Kafka and Redis answer, and Cassandra holds the keyspace. Each problem is
one line saying what to fix, and `projector worker` exits 1.

Without this, faust started anyway: a missing topic ended in "Ignoring missing topic" and
"Worker ready" with nothing to do; Kafka down in a 67-line traceback; Redis down in a few hundred
lines of failed flushes. At start a server that does not answer is a mistake to report (the
supervisor restarts the worker); during a run the worker rides it out (README "Deploying a
fleet").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.connections import quiet_logger, redis_hosts, unreachable_hint
from app.kafka.health import KafkaProbe, KafkaUnreachable
from app.settings import CassandraSettings, KafkaSettings, RedisSettings, Settings, TopicSettings

# Each server gets this long to answer.
PREFLIGHT_TIMEOUT_S = 10.0


log = logging.getLogger("projector.worker")


class CannotStart(RuntimeError):
    """The worker cannot start; the message is the one line to print."""


@dataclass(frozen=True, slots=True)
class Checked:
    """What the checks found that the worker adapts to."""

    reconcile_topic: bool = True  # topic reconcile-request exists (else no reconcile on request)


def preflight(settings: Settings, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> Checked:
    """Run the checks on a loop of their own (faust makes and owns the worker's loop, and
    asyncio.run would leave none behind for it). Raises CannotStart."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(check_servers(settings, timeout_s))
    finally:
        loop.close()


async def check_servers(settings: Settings, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> Checked:
    await check_source_topic(settings.kafka, settings.topics, timeout_s)
    reconcile = await check_reconcile_topic(settings.kafka, settings.topics, timeout_s)
    await check_redis(settings.redis, timeout_s)
    await asyncio.to_thread(check_cassandra, settings.cassandra, timeout_s)
    return Checked(reconcile_topic=reconcile)


async def check_reconcile_topic(kafka: KafkaSettings, topics: TopicSettings, timeout_s: float) -> bool:
    """Topic reconcile-request (docs/contract.md §10) must have mailbox-tail's partition count:
    faust co-partitions topics by their count, and a request must reach the owner of the user's
    partition. Absent (a deployment bootstrapped before it): the worker runs without reconcile on
    request (said once), and subscribes to nothing that does not exist (a broker that creates
    topics on first use would make it with its own count)."""
    topic = topics.topic_reconcile
    probe = KafkaProbe(kafka, topics.app_id, request_timeout_s=timeout_s)
    try:
        with quiet_logger("aiokafka"):
            partitions = await asyncio.wait_for(probe.topic_partitions(topic), timeout=timeout_s * 2)
    except (KafkaUnreachable, TimeoutError) as exc:
        raise CannotStart(f"Kafka at {kafka.kafka_bootstrap}: {exc or 'no answer'}") from None
    finally:
        await probe.close()
    if partitions is None:
        log.warning(
            "topic %r (PROJECTOR_TOPIC_RECONCILE) does not exist: no reconcile on login or request "
            "until `projector bootstrap` creates it and the worker restarts",
            topic,
        )
        return False
    if partitions != topics.topic_partitions:
        raise CannotStart(
            f"topic {topic!r} has {partitions} partitions but mailbox-tail has {topics.topic_partitions}: "
            "reconcile requests must be co-partitioned with mailbox-tail (recreate it with "
            "`projector bootstrap`)"
        )
    return True


def check_cassandra(cassandra: CassandraSettings, timeout_s: float) -> None:
    """Cassandra answers and holds the keyspace (the driver would log a traceback per statement
    it cannot prepare, then fail)."""
    from app.stores.cassandra_session import CassandraUnavailable, open_cluster

    try:
        cluster, _ = open_cluster(cassandra, connect_timeout=timeout_s, require_keyspace=True)
    except CassandraUnavailable as exc:
        raise CannotStart(str(exc)) from None
    cluster.shutdown()


async def check_source_topic(kafka: KafkaSettings, topics: TopicSettings, timeout_s: float) -> None:
    topic = topics.topic_mailbox_tail
    probe = KafkaProbe(kafka, topics.app_id, request_timeout_s=timeout_s)
    try:
        # aiokafka logs a line per failed connect; the one line that matters is ours.
        with quiet_logger("aiokafka"):
            partitions = await asyncio.wait_for(probe.topic_partitions(topic), timeout=timeout_s * 2)
    except KafkaUnreachable as exc:
        raise CannotStart(str(exc)) from None
    except TimeoutError:
        raise CannotStart(
            f"Kafka at {kafka.kafka_bootstrap} did not answer within {timeout_s * 2:g} s"
        ) from None
    finally:
        await probe.close()
    if partitions is None:
        raise CannotStart(
            f"topic {topic!r} (PROJECTOR_TOPIC_MAILBOX_TAIL) does not exist on Kafka at "
            f"{kafka.kafka_bootstrap}: create it with `projector bootstrap`"
        )
    if partitions != topics.topic_partitions:
        # The changelog tables are made with topic_partitions partitions, co-partitioned with
        # the source: faust refuses the assignment later, in a traceback.
        raise CannotStart(
            f"topic {topic!r} has {partitions} partitions but PROJECTOR_TOPIC_PARTITIONS is "
            f"{topics.topic_partitions}: set PROJECTOR_TOPIC_PARTITIONS={partitions}"
        )


async def check_redis(redis: RedisSettings, timeout_s: float) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException, RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from app.stores.redis_projection import RedisProjectionStore

    hosts = redis_hosts(redis.redis_url)
    where = ",".join(hosts)  # never the URL: it may carry a password
    store = RedisProjectionStore.from_settings(redis)
    try:
        await asyncio.wait_for(store.client.ping(), timeout=timeout_s)
    # A cluster client that reaches no node raises RedisClusterException (not a RedisError).
    except (RedisConnectionError, RedisTimeoutError, RedisClusterException, TimeoutError, OSError) as exc:
        reason = str(exc).rstrip(".") or type(exc).__name__
        raise CannotStart(f"cannot reach Redis at {where} ({reason}){unreachable_hint(hosts)}") from None
    except RedisError as exc:  # it answers, and refuses (credentials, ACL, protocol)
        raise CannotStart(f"Redis at {where} refused the connection ({type(exc).__name__}: {exc})") from None
    finally:
        await store.aclose()
