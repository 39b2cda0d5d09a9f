"""Settings: defaults, parsing from the environment, validation with clear messages."""

from __future__ import annotations

import dataclasses

import pytest

from app.settings import Settings, SettingsError


def test_defaults_match_the_local_servers_and_the_design() -> None:
    s = Settings.from_env({})
    assert s.kafka.kafka_bootstrap == "127.0.0.1:9092"
    assert s.redis.redis_url == "redis://127.0.0.1:6379/0"
    assert s.cassandra.cassandra_contact_points == ("127.0.0.1",)
    assert s.cassandra.cassandra_port == 9042
    assert s.cassandra.cassandra_keyspace == "session_projector"
    assert s.topics.names == (
        "mailbox-tail",
        "session-delta",
        "badge",
        "mailbox-dead-letter",
        "push",
        "reconcile-request",
    )
    assert s.topics.topic_partitions == 4
    assert s.processing.lanes == 1
    assert s.processing.projection_compaction_window_ms == 5000
    assert s.processing.max_dirty_rows == 100_000
    assert s.processing.include_muted is False
    assert s.processing.unread_precise_limit == 200
    assert s.log.log_level == "INFO"


def test_unrelated_environment_is_ignored() -> None:
    assert Settings.from_env({"PATH": "/bin", "HOME": "/root"}) == Settings()


def test_every_field_has_a_prefixed_env_name() -> None:
    names = Settings.env_names()
    sections = [getattr(Settings(), f.name) for f in dataclasses.fields(Settings)]
    assert len(names) == sum(len(dataclasses.fields(section)) for section in sections)
    assert names["PROJECTOR_KAFKA_BOOTSTRAP"] == "kafka_bootstrap"
    assert all(key.startswith("PROJECTOR_") and key.isupper() for key in names)


def test_values_are_parsed_by_type() -> None:
    s = Settings.from_env(
        {
            "PROJECTOR_KAFKA_BOOTSTRAP": "k1:9092,k2:9093",
            "PROJECTOR_CASSANDRA_CONTACT_POINTS": " c1, c2 ,",
            "PROJECTOR_TOPIC_PARTITIONS": " 12 ",
            "PROJECTOR_INCLUDE_MUTED": "Yes",
            "PROJECTOR_LOG_LEVEL": "debug",
        }
    )
    assert s.kafka.kafka_bootstrap == "k1:9092,k2:9093"
    assert s.cassandra.cassandra_contact_points == ("c1", "c2")
    assert s.topics.topic_partitions == 12
    assert s.processing.include_muted is True
    assert s.log.log_level == "DEBUG"


@pytest.mark.parametrize("text", ["0", "false", "no", "off", "FALSE"])
def test_false_spellings(text: str) -> None:
    assert Settings.from_env({"PROJECTOR_INCLUDE_MUTED": text}).processing.include_muted is False


def test_as_env_round_trips() -> None:
    s = Settings.build(include_muted=True, cassandra_contact_points=("a", "b"), lanes=3)
    assert Settings.from_env(s.as_env()) == s
    assert set(s.as_env()) == set(Settings.env_names())


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.processing.lanes = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PROJECTOR_LANES": "two"}, "PROJECTOR_LANES: expected a decimal integer, got 'two'"),
        ({"PROJECTOR_INCLUDE_MUTED": "maybe"}, "expected a boolean"),
        ({"PROJECTOR_LANES": "0"}, "PROJECTOR_LANES: 0 must be >= 1"),
        ({"PROJECTOR_TOPIC_PARTITIONS": "-1"}, "PROJECTOR_TOPIC_PARTITIONS: -1 must be >= 1"),
        ({"PROJECTOR_INTAKE_BATCH_MAX_RECORDS": "0"}, "PROJECTOR_INTAKE_BATCH_MAX_RECORDS: 0 must be >= 1"),
        (
            {"PROJECTOR_INTAKE_FETCH_MAX_BYTES": "100"},
            "PROJECTOR_INTAKE_FETCH_MAX_BYTES: 100 must be >= 1024",
        ),
        ({"PROJECTOR_CASSANDRA_PORT": "70000"}, "PROJECTOR_CASSANDRA_PORT: 70000 is not a TCP port"),
        ({"PROJECTOR_KAFKA_BOOTSTRAP": "localhost"}, "'localhost' is not HOST:PORT"),
        ({"PROJECTOR_REDIS_URL": "http://x"}, "PROJECTOR_REDIS_URL: "),
        ({"PROJECTOR_CASSANDRA_KEYSPACE": "1bad-name"}, "not a CQL identifier"),
        ({"PROJECTOR_TOPIC_BADGE": "bad topic"}, "PROJECTOR_TOPIC_BADGE: "),
        ({"PROJECTOR_TOPIC_BADGE": "mailbox-tail"}, "topic names must be distinct"),
        ({"PROJECTOR_LOG_LEVEL": "loud"}, "PROJECTOR_LOG_LEVEL: 'LOUD'"),
        ({"PROJECTOR_CASSANDRA_CONTACT_POINTS": " , "}, "PROJECTOR_CASSANDRA_CONTACT_POINTS: "),
        (
            {"PROJECTOR_CASSANDRA_CONTACT_POINTS": "10.0.0.1:9042"},
            "PROJECTOR_CASSANDRA_CONTACT_POINTS: '10.0.0.1:9042' is host:port, but a contact point is a host",
        ),
        ({"PROJECTOR_CASSANDRA_CONTACT_POINTS": "[::1]:9042"}, "'[::1]:9042' is host:port"),
        ({"PROJECTOR_TYPO_LANES": "2"}, "PROJECTOR_TYPO_LANES: unknown setting"),
    ],
)
def test_invalid_values_give_clear_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert fragment in str(err.value)


def test_every_message_names_the_environment_variable() -> None:
    """Range, parse and consistency problems all name what the operator sets (issue 15), the
    same way: ``PROJECTOR_X: ...``; a quoted value is never rewritten."""
    with pytest.raises(SettingsError) as err:  # a value that does not parse: checked first
        Settings.from_env({"PROJECTOR_LANES": "0", "PROJECTOR_TOPIC_PARTITIONS": "four"})
    assert err.value.problems == ["PROJECTOR_TOPIC_PARTITIONS: expected a decimal integer, got 'four'"]
    with pytest.raises(SettingsError) as err:
        Settings.from_env(
            {
                "PROJECTOR_LANES": "0",
                "PROJECTOR_KAFKA_BOOTSTRAP": "lanes",
                "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS": "50",
            }
        )
    assert sorted(err.value.problems) == [
        "PROJECTOR_KAFKA_BOOTSTRAP: 'lanes' is not HOST:PORT",
        "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS: 50 is not in 100..10000 "
        "(a third of PROJECTOR_KAFKA_SESSION_TIMEOUT_MS)",
        "PROJECTOR_LANES: 0 must be >= 1",
    ]


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_kafka_bootstrap_is_one_problem(empty: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"PROJECTOR_KAFKA_BOOTSTRAP": empty})
    assert err.value.problems == ["PROJECTOR_KAFKA_BOOTSTRAP: empty"]


def test_a_contact_point_with_a_port_is_named_a_mistake_and_a_bare_ipv6_address_is_not() -> None:
    assert Settings.from_env(
        {"PROJECTOR_CASSANDRA_CONTACT_POINTS": "::1,fe80::1"}
    ).cassandra.cassandra_contact_points == (
        "::1",
        "fe80::1",
    )
    with pytest.raises(SettingsError) as err:
        Settings.from_env(
            {"PROJECTOR_CASSANDRA_CONTACT_POINTS": "a,10.0.0.1:9042", "PROJECTOR_CASSANDRA_PORT": "9142"}
        )
    assert err.value.problems == [
        "PROJECTOR_CASSANDRA_CONTACT_POINTS: '10.0.0.1:9042' is host:port, but a contact point is a host "
        "only: the port goes in PROJECTOR_CASSANDRA_PORT (now 9142)"
    ]


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"PROJECTOR_LANES": "0", "PROJECTOR_MAX_DIRTY_ROWS": "-1"})
    assert len(err.value.problems) == 2


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(SettingsError):
        Settings.build(unread_precise_limit=0)
    with pytest.raises(SettingsError):
        Settings().replace(api_port=0)


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTOR_LANES", "5")
    assert Settings.from_env().processing.lanes == 5


# --- query API settings (issue 5) ---------------------------------------------------------------


def test_api_defaults_follow_the_design() -> None:
    s = Settings()
    assert s.api.api_secret == ""  # not configured: `projector api` / `projector token` refuse to start
    assert s.api.api_snapshot_ttl_ms == 300_000  # seed §6.1: snapshot_ttl 5 min
    assert s.api.api_snapshot_max_rows == 5000  # max_conversations_per_user
    assert s.api.api_snapshot_cache_rows >= s.api.api_snapshot_max_rows
    assert s.api.api_fill_from_state == "empty"
    assert s.api.api_rate_limit_on_store_error == "open"  # issue 32: a store outage fails open, counted


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PROJECTOR_API_SECRET": "short"}, "PROJECTOR_API_SECRET: 5 characters; use at least 32"),
        ({"PROJECTOR_API_TOKEN_TTL_S": "0"}, "PROJECTOR_API_TOKEN_TTL_S: 0 must be >= 1"),
        ({"PROJECTOR_API_SNAPSHOT_TTL_MS": "-5"}, "PROJECTOR_API_SNAPSHOT_TTL_MS: -5 must be >= 1"),
        ({"PROJECTOR_API_SNAPSHOT_MAX_ROWS": "0"}, "PROJECTOR_API_SNAPSHOT_MAX_ROWS: 0 must be >= 1"),
        ({"PROJECTOR_API_SNAPSHOT_CACHE_ROWS": "10"}, "PROJECTOR_API_SNAPSHOT_CACHE_ROWS: 10 must be >="),
        ({"PROJECTOR_API_FILL_FROM_STATE": "sometimes"}, "PROJECTOR_API_FILL_FROM_STATE: 'sometimes'"),
        (
            {"PROJECTOR_API_RATE_LIMIT_ON_STORE_ERROR": "ajar"},
            "PROJECTOR_API_RATE_LIMIT_ON_STORE_ERROR: 'ajar' is not one of open, closed",
        ),
    ],
)
def test_invalid_api_values_give_clear_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert fragment in str(err.value)


def test_the_api_secret_never_shows_in_repr_or_errors() -> None:
    secret = "s3cr3t-" * 6
    assert secret not in repr(Settings.build(api_secret=secret))
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"PROJECTOR_API_SECRET": "tiny-secret"})
    assert "tiny-secret" not in str(err.value)


# --- member directory settings (issue 6) ---------------------------------------------------------


def test_member_stats_budget_defaults_to_the_seeds_2_seconds() -> None:
    assert Settings().api.members_stats_budget_ms == 2000
    assert Settings.from_env({"PROJECTOR_MEMBERS_STATS_BUDGET_MS": "500"}).api.members_stats_budget_ms == 500


@pytest.mark.parametrize("value", ["0", "-1", "60001"])
def test_member_stats_budget_is_bounded(value: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"PROJECTOR_MEMBERS_STATS_BUDGET_MS": value})
    assert "PROJECTOR_MEMBERS_STATS_BUDGET_MS" in str(err.value)


def test_worker_metrics_port_is_off_by_default_and_validated() -> None:
    assert Settings().worker.worker_metrics_port == 0  # off: several workers per host need distinct ports
    assert Settings.from_env({"PROJECTOR_WORKER_METRICS_PORT": "9464"}).worker.worker_metrics_port == 9464
    bad = (("70000", "not a TCP port"), ("-1", "not a TCP port"), ("6066", "also PROJECTOR_WORKER_WEB_PORT"))
    for value, fragment in bad:
        with pytest.raises(SettingsError) as err:
            Settings.from_env({"PROJECTOR_WORKER_METRICS_PORT": value})
        assert "PROJECTOR_WORKER_METRICS_PORT" in str(err.value) and fragment in str(err.value)


# --- unread audit settings (issue 7) -------------------------------------------------------------


def test_unread_audit_defaults() -> None:
    s = Settings()
    assert s.audit.unread_audit_sample_rate == 0.005  # x 144 rounds a day: each idle row ~0.72 times a day
    assert s.audit.unread_audit_interval_ms == 600_000
    assert s.audit.unread_audit_idle_ms == 86_400_000  # "no change for 24 h"
    assert s.audit.unread_audit_max_rows == 20_000
    assert s.audit.unread_audit_zero_sample_rate == 0.001  # rows at 0 unread: a rate of their own


def test_unread_audit_values_parse_and_round_trip() -> None:
    s = Settings.from_env(
        {
            "PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": " 1 ",
            "PROJECTOR_UNREAD_AUDIT_INTERVAL_MS": "2000",
            "PROJECTOR_UNREAD_AUDIT_IDLE_MS": "0",
            "PROJECTOR_UNREAD_AUDIT_ZERO_SAMPLE_RATE": "0.25",
        }
    )
    assert (
        s.audit.unread_audit_sample_rate,
        s.audit.unread_audit_interval_ms,
        s.audit.unread_audit_idle_ms,
    ) == (1.0, 2000, 0)
    assert s.audit.unread_audit_zero_sample_rate == 0.25
    assert (
        Settings.from_env({"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "2.5e-3"}).audit.unread_audit_sample_rate
        == 0.0025
    )
    tuned = Settings.build(unread_audit_sample_rate=0.125)
    assert Settings.from_env(tuned.as_env()) == tuned


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "1.01"},
            "PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE: 1.01 is not in 0..1",
        ),
        (
            {"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "-0.1"},
            "PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE: -0.1 is not in 0..1",
        ),
        ({"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "nan"}, "expected a finite decimal number"),
        ({"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "inf"}, "expected a finite decimal number"),
        ({"PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE": "half"}, "expected a decimal number"),
        (
            {"PROJECTOR_UNREAD_AUDIT_INTERVAL_MS": "999"},
            "PROJECTOR_UNREAD_AUDIT_INTERVAL_MS: 999 is not in 1000..86400000",
        ),
        ({"PROJECTOR_UNREAD_AUDIT_IDLE_MS": "-1"}, "PROJECTOR_UNREAD_AUDIT_IDLE_MS: -1 must be >= 0"),
        ({"PROJECTOR_UNREAD_AUDIT_MAX_ROWS": "0"}, "PROJECTOR_UNREAD_AUDIT_MAX_ROWS: 0 must be >= 1"),
        (
            {"PROJECTOR_UNREAD_AUDIT_ZERO_SAMPLE_RATE": "1.5"},
            "PROJECTOR_UNREAD_AUDIT_ZERO_SAMPLE_RATE: 1.5 is not in 0..1",
        ),
    ],
)
def test_invalid_unread_audit_values_give_clear_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert fragment in str(err.value)


def test_kafka_group_settings_reach_the_faust_consumer() -> None:
    """The group protocol is set through validated PROJECTOR_* settings (faust's own BROKER_*
    variables bypassed the check) and reaches the consumer faust builds."""
    from app.runtime.app import new_faust_app

    settings = Settings.from_env(
        {
            "PROJECTOR_KAFKA_SESSION_TIMEOUT_MS": "120000",
            "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS": "2000",
            "PROJECTOR_KAFKA_MAX_POLL_INTERVAL_MS": "600000",
        }
    )
    conf = new_faust_app(settings.kafka, settings.topics, settings.worker).conf
    assert conf.broker_session_timeout == 120.0
    assert conf.broker_heartbeat_interval == 2.0
    assert conf.broker_max_poll_interval == 600.0
    # faust refuses a session timeout above its request timeout
    assert conf.broker_request_timeout >= conf.broker_session_timeout
    defaults = Settings()
    assert (defaults.kafka.kafka_session_timeout_ms, defaults.kafka.kafka_heartbeat_interval_ms) == (
        30_000,
        3_000,
    )


@pytest.mark.parametrize(("value", "replicas"), [(None, 1), ("0", 0), ("2", 2)])
def test_standby_copies_are_on_by_default_and_never_faust_s(value: str | None, replicas: int) -> None:
    """Standby copies on unless turned off (tables/durable keeps them, with the recovery's own
    reader); faust keeps none: it has no tables (its standby replicas stay at its default, unused)."""
    from app.runtime.app import new_faust_app

    env = {} if value is None else {"PROJECTOR_TABLE_STANDBY_REPLICAS": value}
    settings = Settings.from_env(env)
    assert settings.topics.table_standby_replicas == replicas
    app = new_faust_app(settings.kafka, settings.topics, settings.worker)
    assert not app.tables


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"PROJECTOR_KAFKA_SESSION_TIMEOUT_MS": "5000"},
            "PROJECTOR_KAFKA_SESSION_TIMEOUT_MS: 5000 is not in 6000..1800000",
        ),
        (
            {"PROJECTOR_TABLE_STANDBY_REPLICAS": "9"},
            "PROJECTOR_TABLE_STANDBY_REPLICAS: 9 is not in 0..8",
        ),
        (
            {"PROJECTOR_TABLE_STANDBY_REPLICAS": "-1"},
            "PROJECTOR_TABLE_STANDBY_REPLICAS: -1 is not in 0..8",
        ),
        (
            {"PROJECTOR_KAFKA_SESSION_TIMEOUT_MS": "abc"},
            "PROJECTOR_KAFKA_SESSION_TIMEOUT_MS: expected a decimal integer, got 'abc'",
        ),
        (
            {"PROJECTOR_KAFKA_SESSION_TIMEOUT_MS": "9000", "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS": "4000"},
            "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS: 4000 is not in 100..3000",
        ),
        (
            {"PROJECTOR_KAFKA_MAX_POLL_INTERVAL_MS": "10"},
            "PROJECTOR_KAFKA_MAX_POLL_INTERVAL_MS: 10 is not in",
        ),
    ],
)
def test_invalid_kafka_group_settings_give_clear_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(env)
    assert fragment in str(raised.value)


def test_topic_env_names_every_topic_after_the_prefix() -> None:
    """A stack or benchmark passing `topic_env` leaves no product topic at its default name:
    one that named only the topics it knew created the default `push` on the shared broker."""
    env = Settings.topic_env("run-1")
    s = Settings.from_env(env)
    assert set(s.topics.names) == set(env.values())
    assert all(topic.startswith("run-1-") for topic in s.topics.names)
    assert not set(s.topics.names) & set(Settings().topics.names)
    assert env["PROJECTOR_TOPIC_DEAD_LETTER"] == "run-1-dead-letter"


# --- the fast lane (docs/contract.md §10, issue 33) --------------------------------------------


def test_fast_lane_defaults_are_direct_messages_and_five_a_second_and_reach_the_worker() -> None:
    from app.worker.core import WorkerConfig

    settings = Settings.from_env({})
    assert (settings.processing.fast_lane_max_members, settings.processing.fast_lane_per_user_per_s) == (2, 5)
    tuned = Settings.from_env(
        {"PROJECTOR_FAST_LANE_MAX_MEMBERS": "10", "PROJECTOR_FAST_LANE_PER_USER_PER_S": "0"}
    )
    config = WorkerConfig.from_settings(tuned.processing, tuned.worker).projector
    assert (config.fast_lane_max_members, config.fast_lane_per_user_per_s) == (10, 0)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"PROJECTOR_FAST_LANE_MAX_MEMBERS": "-1"},
            "PROJECTOR_FAST_LANE_MAX_MEMBERS: -1 is not in 0..4294967295",
        ),
        (
            {"PROJECTOR_FAST_LANE_PER_USER_PER_S": "1001"},
            "PROJECTOR_FAST_LANE_PER_USER_PER_S: 1001 is not in 0..1000",
        ),
        (
            {"PROJECTOR_FAST_LANE_PER_USER_PER_S": "fast"},
            "PROJECTOR_FAST_LANE_PER_USER_PER_S: expected a decimal",
        ),
    ],
)
def test_invalid_fast_lane_values_give_one_line_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert err.value.problems == [next(p for p in err.value.problems if fragment in p)]


def test_the_reconcile_interval_is_bounded_and_its_topic_named() -> None:
    s = Settings.from_env({"PROJECTOR_RECONCILE_MIN_INTERVAL_S": "60", "PROJECTOR_TOPIC_RECONCILE": "rc"})
    assert (
        s.reconcile.reconcile_min_interval_s,
        s.topics.topic_reconcile,
        s.reconcile.reconcile_on_login,
    ) == (60, "rc", True)
    assert "rc" in s.topics.names
    for bad in ("0", "86401"):
        with pytest.raises(SettingsError, match="RECONCILE_MIN_INTERVAL_S"):
            Settings.from_env({"PROJECTOR_RECONCILE_MIN_INTERVAL_S": bad})
    with pytest.raises(SettingsError, match=r"(?i)topic_reconcile"):
        Settings.from_env({"PROJECTOR_TOPIC_RECONCILE": "no spaces"})
    with pytest.raises(SettingsError, match="distinct"):
        Settings.from_env({"PROJECTOR_TOPIC_RECONCILE": "badge"})
    assert not Settings.from_env({"PROJECTOR_RECONCILE_ON_LOGIN": "false"}).reconcile.reconcile_on_login
