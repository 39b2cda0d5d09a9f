"""The faust App of the worker, built from its Kafka, topic and worker settings (no I/O until it starts)."""

from __future__ import annotations

import os
from typing import Any

from faust.auth import SASLCredentials, SSLCredentials

from agents.batch_intake import ProjectorApp
from app.connections import kafka_tls
from app.settings import KafkaSettings, TopicSettings, WorkerSettings

# Offsets of the mailbox topic are committed by the intake (what is durable), this often.
COMMIT_INTERVAL_S = 1.0


def new_faust_app(kafka: KafkaSettings, topics: TopicSettings, worker: WorkerSettings) -> ProjectorApp:
    """The faust App with every option from the settings (no I/O until it starts)."""
    datadir = os.path.join(worker.data_dir, topics.app_id)
    return ProjectorApp(
        topics.app_id,
        broker=f"kafka://{kafka.kafka_bootstrap}",
        broker_credentials=faust_credentials(kafka),  # SASL/TLS (app/connections.py)
        # One folder per app id: a store left by another app (or by deleted topics) must never
        # be mistaken for this app's state. faust keeps no tables in it (tables/durable does).
        datadir=datadir,
        topic_partitions=topics.topic_partitions,
        topic_replication_factor=topics.topic_replication_factor,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=worker.worker_web_port > 0,  # 0: no web server (several workers per host)
        web_host=worker.worker_web_host,
        web_port=max(worker.worker_web_port, 1),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=COMMIT_INTERVAL_S,
        # The group protocol from the validated settings (faust's own BROKER_* environment
        # variables would bypass the check). faust refuses a session timeout above its request
        # timeout (default 90 s): the request timeout grows with it.
        broker_session_timeout=kafka.kafka_session_timeout_ms / 1000,
        broker_heartbeat_interval=kafka.kafka_heartbeat_interval_ms / 1000,
        broker_max_poll_interval=kafka.kafka_max_poll_interval_ms / 1000,
        broker_request_timeout=max(90.0, kafka.kafka_session_timeout_ms / 1000 + 30.0),
        # Changelog and frame records go out in batches: without linger every table write of a
        # batch became its own produce request.
        producer_linger_ms=10,
        # One fetch of one partition = one batch for the agent (agents.batch_intake).
        broker_max_poll_records=worker.intake_batch_max_records,
        consumer_max_fetch_size=worker.intake_fetch_max_bytes,
        producer_max_batch_size=512 * 1024,
    )


def faust_credentials(kafka: KafkaSettings) -> Any:
    """faust's ``broker_credentials`` for the Kafka settings (None for PLAINTEXT). faust's aiokafka
    driver turns them into the same options as :func:`app.connections.kafka_client_options` for every consumer
    and producer it builds (its own and the changelogs')."""
    protocol = kafka.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = kafka_tls(kafka)
    if protocol == "SSL":
        return SSLCredentials(context)
    # faust picks SASL_SSL when a context is given, SASL_PLAINTEXT otherwise.
    return SASLCredentials(
        username=kafka.kafka_sasl_username,
        password=kafka.kafka_sasl_password,
        ssl_context=context,
        mechanism=kafka.kafka_sasl_mechanism,
    )
