"""The worker's readiness: what `GET /readyz` on its metrics port checks (app/runtime/web.py).

Ready when every check answers ``ok``:

* ``assignment``: the worker has joined its group and no rebalance is under way (an empty
  assignment, settled, counts: more workers than partitions leaves spares);
* ``kafka`` and ``source_topic``: a metadata request answers and names mailbox-tail (one request
  for both, app/kafka/health.py);
* ``redis``: PING on the projection store's client; ``store_writes``: no failure streak of the
  flushes' writes (a Redis that answers PING may still refuse writes: read-only, out of memory);
* ``cassandra``: ``SELECT release_version FROM system.local``, in a thread.

Each check within CHECK_BUDGET_S, the round cached RESULTS_MAX_AGE_S (app/health.py): a probe
never blocks the event loop the worker processes on, and a storm of probes costs one round.
Live (``/livez``) is the process answering HTTP on its loop: a worker that is not ready is still
live (it rides out a store outage; restarting it would not help).
"""

from __future__ import annotations

from typing import Any, Final

from app.health import NotReady, Readiness, in_thread
from app.kafka.health import KafkaProbe
from app.worker.core import WorkerCore

CHECK_BUDGET_S: Final = 2.0
RESULTS_MAX_AGE_S: Final = 1.0


def worker_readiness(
    topic: str,
    app: Any,
    intake: Any,
    core: WorkerCore,
    probe: KafkaProbe,
    *,
    redis_client: Any,
    cassandra_session: Any,
) -> Readiness:
    """`topic`: mailbox-tail; `app`: the faust App (`rebalancing`); `intake`: agents.mailbox.MailboxIntake."""

    async def assignment() -> None:
        if intake.assignments == 0:
            raise NotReady("waiting", "no partitions assigned yet (joining the consumer group)")
        if app.rebalancing:
            raise NotReady("rebalancing", "a rebalance is under way")

    async def kafka() -> None:
        await probe.metadata()

    async def source_topic() -> None:
        if await probe.topic_partitions(topic) is None:
            raise NotReady("missing", f"topic {topic!r} does not exist: create it with `projector bootstrap`")

    async def redis() -> None:
        await redis_client.ping()

    async def store_writes() -> None:
        backoff = core.store_backoff
        if backoff is not None and core.store_failing:
            raise NotReady("failing", f"{backoff.failures} failed attempts: {backoff.last_error}")

    async def cassandra() -> None:
        await in_thread(
            cassandra_session.execute, "SELECT release_version FROM system.local", timeout=CHECK_BUDGET_S
        )

    return Readiness(
        {
            "assignment": assignment,
            "kafka": kafka,
            "source_topic": source_topic,
            "redis": redis,
            "store_writes": store_writes,
            "cassandra": cassandra,
        },
        budget_s=CHECK_BUDGET_S,
        max_age_s=RESULTS_MAX_AGE_S,
    )
