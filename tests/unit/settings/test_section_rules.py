"""Each section's own rules, checked on the section alone (no other section is built), and the
rules between sections, checked where the sections are assembled."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.settings import (
    ApiSettings,
    CassandraSettings,
    GatewaySettings,
    KafkaSettings,
    LogSettings,
    OpsSettings,
    ProcessingSettings,
    RedisSettings,
    Settings,
    SettingsError,
    TopicSettings,
    WorkerSettings,
)

SECRET = "s" * 32


def problems_of(build: Callable[[], object]) -> list[str]:
    with pytest.raises(SettingsError) as err:
        build()
    return err.value.problems


def test_kafka_bootstrap_heartbeat_and_sasl() -> None:
    assert problems_of(lambda: KafkaSettings(kafka_bootstrap="k1:9092,k2")) == [
        "PROJECTOR_KAFKA_BOOTSTRAP: 'k2' is not HOST:PORT"
    ]
    assert problems_of(
        lambda: KafkaSettings(kafka_session_timeout_ms=9000, kafka_heartbeat_interval_ms=4000)
    ) == [
        "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS: 4000 is not in 100..3000 "
        "(a third of PROJECTOR_KAFKA_SESSION_TIMEOUT_MS)"
    ]
    assert problems_of(lambda: KafkaSettings(kafka_security_protocol="SASL_PLAINTEXT")) == [
        "PROJECTOR_KAFKA_SASL_MECHANISM: '' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 "
        "(needed with SASL_PLAINTEXT)",
        "PROJECTOR_KAFKA_SASL_USERNAME/PROJECTOR_KAFKA_SASL_PASSWORD: both needed with SASL_PLAINTEXT",
    ]
    assert problems_of(lambda: KafkaSettings(kafka_sasl_username="u")) == [
        "PROJECTOR_KAFKA_SASL_*: set, but PROJECTOR_KAFKA_SECURITY_PROTOCOL 'PLAINTEXT' is not "
        "SASL_PLAINTEXT/SASL_SSL"
    ]
    assert KafkaSettings(kafka_security_protocol="SSL").tls and not KafkaSettings().tls


def test_topic_names_are_kafka_names_distinct_and_derive_the_changelog() -> None:
    topics = TopicSettings(app_id="fleet-2")
    assert topics.changelog_topic == "fleet-2-state-changelog"
    assert topics.names[0] == "mailbox-tail" and len(topics.names) == 6
    assert problems_of(lambda: TopicSettings(topic_push="badge")) == [
        "topic names must be distinct: ('mailbox-tail', 'session-delta', 'badge', 'mailbox-dead-letter', "
        "'badge', 'reconcile-request')"
    ]
    assert problems_of(lambda: TopicSettings(app_id="a b")) == [
        "PROJECTOR_APP_ID: 'a b' must be usable in a topic name ([A-Za-z0-9._-])"
    ]
    env = TopicSettings.topic_env("run-7")
    assert Settings.from_env(env).topics.names == tuple(env.values())


def test_redis_url_namespace_and_credentials() -> None:
    (problem,) = problems_of(lambda: RedisSettings(redis_url="http://user:hunter2@h:1"))
    assert problem.startswith("PROJECTOR_REDIS_URL: ") and "hunter2" not in problem
    assert problems_of(lambda: RedisSettings(projection_namespace="a:b")) == [
        "PROJECTOR_PROJECTION_NAMESPACE: 'a:b' must match [A-Za-z0-9._-]{1,64}"
    ]
    assert problems_of(lambda: RedisSettings(redis_url="redis://u:p@h:6379/0", redis_password="p")) == [
        "PROJECTOR_REDIS_PASSWORD: the PROJECTOR_REDIS_URL carries credentials too; give them in one place"
    ]
    assert problems_of(lambda: RedisSettings(redis_username="u")) == [
        "PROJECTOR_REDIS_USERNAME: needs PROJECTOR_REDIS_PASSWORD"
    ]
    assert "p4ss" not in repr(RedisSettings(redis_password="p4ss"))


def test_cassandra_contact_points_keyspace_and_data_centers() -> None:
    assert problems_of(lambda: CassandraSettings(cassandra_contact_points=("h:9042",))) == [
        "PROJECTOR_CASSANDRA_CONTACT_POINTS: 'h:9042' is host:port, but a contact point is a host only: "
        "the port goes in PROJECTOR_CASSANDRA_PORT (now 9042)"
    ]
    assert problems_of(lambda: CassandraSettings(cassandra_keyspace="9ks"))[0].startswith(
        "PROJECTOR_CASSANDRA_KEYSPACE: '9ks' is not a CQL identifier"
    )
    assert problems_of(lambda: CassandraSettings(cassandra_replication_per_dc=("dc1:3",))) == [
        "PROJECTOR_CASSANDRA_REPLICATION_PER_DC: needs PROJECTOR_CASSANDRA_LOCAL_DC "
        "(the DC this process talks to)"
    ]
    both = CassandraSettings(cassandra_local_dc="dc1", cassandra_replication_per_dc=("dc1:3", "dc2:2"))
    assert both.replication_per_dc == {"dc1": 3, "dc2": 2}
    assert problems_of(lambda: CassandraSettings(cassandra_username="u")) == [
        "PROJECTOR_CASSANDRA_USERNAME/PROJECTOR_CASSANDRA_PASSWORD: give both or neither"
    ]


def test_processing_badge_mode_and_log_choices() -> None:
    assert ProcessingSettings(badge_mode="conversations").badge_mode == "conversations"
    assert problems_of(lambda: ProcessingSettings(badge_mode="users")) == [
        "PROJECTOR_BADGE_MODE: 'users' is not one of messages, conversations"
    ]
    assert problems_of(lambda: LogSettings(log_level="LOUD", log_format="xml")) == [
        "PROJECTOR_LOG_FORMAT: 'xml' is not one of json, text",
        "PROJECTOR_LOG_LEVEL: 'LOUD' is not one of CRITICAL, DEBUG, ERROR, INFO, WARNING",
    ]


def test_worker_ports_and_local_state() -> None:
    assert WorkerSettings(worker_web_port=0, worker_metrics_port=0).worker_metrics_port == 0
    assert problems_of(lambda: WorkerSettings(worker_metrics_port=6066)) == [
        "PROJECTOR_WORKER_METRICS_PORT: 6066 is also PROJECTOR_WORKER_WEB_PORT "
        "(one process cannot bind it twice)"
    ]
    assert problems_of(lambda: WorkerSettings(data_dir=" ", worker_web_port=70000)) == [
        "PROJECTOR_WORKER_WEB_PORT: 70000 is not a TCP port (0..65535)",
        "PROJECTOR_DATA_DIR: empty",
    ]


def test_api_secrets_and_snapshot_cache() -> None:
    assert problems_of(lambda: ApiSettings(api_secret="short")) == [
        "PROJECTOR_API_SECRET: 5 characters; use at least 32"
    ]
    assert problems_of(lambda: ApiSettings(api_secret=SECRET, api_secret_previous=SECRET)) == [
        "PROJECTOR_API_SECRET_PREVIOUS: equals PROJECTOR_API_SECRET (nothing is being rotated)"
    ]
    assert problems_of(lambda: ApiSettings(api_snapshot_max_rows=10, api_snapshot_cache_rows=9)) == [
        "PROJECTOR_API_SNAPSHOT_CACHE_ROWS: 9 must be >= PROJECTOR_API_SNAPSHOT_MAX_ROWS (10)"
    ]
    assert SECRET not in repr(ApiSettings(api_secret=SECRET))


def test_gateway_partitions_and_ops_urls() -> None:
    assert GatewaySettings(gateway_partitions="0-2,5").partition_set == frozenset({0, 1, 2, 5})
    assert GatewaySettings().partition_set is None  # every partition
    assert problems_of(lambda: GatewaySettings(gateway_partitions="3-1")) == [
        "PROJECTOR_GATEWAY_PARTITIONS: '3-1' is not a range of partitions"
    ]
    assert problems_of(lambda: OpsSettings(ops_metrics_urls=("ftp://w1",))) == [
        "PROJECTOR_OPS_METRICS_URLS: 'ftp://w1' is not an http(s) URL"
    ]


def test_the_rules_between_sections_are_checked_where_they_are_assembled() -> None:
    # Each section alone is valid; together they are not.
    gateway, topics = GatewaySettings(gateway_partitions="0-4"), TopicSettings(topic_partitions=4)
    assert problems_of(lambda: Settings(gateway=gateway, topics=topics)) == [
        "PROJECTOR_GATEWAY_PARTITIONS: 4 is not a partition of the frame topics (0..3)"
    ]
    assert problems_of(
        lambda: Settings(api=ApiSettings(api_secret=SECRET), ops=OpsSettings(ops_secret=SECRET))
    ) == ["PROJECTOR_OPS_SECRET: must differ from PROJECTOR_API_SECRET"]
    # A section that fails and a rule between two others are reported together.
    assert sorted(
        problems_of(
            lambda: Settings.from_env(
                {
                    "PROJECTOR_LANES": "0",
                    "PROJECTOR_GATEWAY_PARTITIONS": "9",
                    "PROJECTOR_TOPIC_PARTITIONS": "2",
                }
            )
        )
    ) == [
        "PROJECTOR_GATEWAY_PARTITIONS: 9 is not a partition of the frame topics (0..1)",
        "PROJECTOR_LANES: 0 must be >= 1",
    ]
