"""Transport ceiling for the worker bench: a plain aiokafka consume -> produce loop.

    python bench/aiokafka_loop.py --bootstrap 127.0.0.1:9092 --input TOPIC --output TOPIC --group G

Consumes every record of --input (a consumer group, earliest offset), decodes each JSON value
(orjson) and produces one small record per input to --output (same key): what any Kafka
consumer of mailbox-tail pays before doing any work. Runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

import orjson


async def run(args: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        args.input,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    # Same producer settings as the simulator's (acks=all, small linger, big batches).
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap, acks="all", linger_ms=5, max_batch_size=256 * 1024
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await producer.start()
    await consumer.start()
    loads, dumps, output = orjson.loads, orjson.dumps, args.output
    pending: list[Any] = []
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=args.max_records)
            for records in batches.values():
                for record in records:
                    doc = loads(record.value)
                    if doc.get("type") == "bench_probe":  # forwarded as is, like the naive agent
                        pending.append(await producer.send(output, value=record.value, key=record.key))
                        continue
                    value = dumps(
                        {
                            "type": doc.get("type"),
                            "user_id": doc.get("user_id"),
                            "seq": doc.get("mailbox_seq"),
                        }
                    )
                    pending.append(await producer.send(output, value=value, key=record.key))
            # Acks are checked one batch behind (never awaited one by one).
            if len(pending) > 50_000:
                await asyncio.gather(*pending)
                pending.clear()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.gather(*pending)
        await consumer.stop()
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--max-records", type=int, default=4096)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
