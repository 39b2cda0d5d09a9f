"""Reading a Kafka topic whole, for checks and diagnoses against the broker's own log."""

from __future__ import annotations

# (partition, offset, key, value), in offset order per partition.
LogRecord = tuple[int, int, bytes | None, bytes | None]


async def read_topic(bootstrap: str, topic: str, partitions: int) -> list[LogRecord]:
    """Every record the topic's partitions hold up to their end offsets as of the call."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[LogRecord] = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                out += [(tp.partition, r.offset, r.key, r.value) for r in records if r.offset < ends[tp]]
        return out
    finally:
        await consumer.stop()
