"""What every section promises on its own: frozen, valid defaults, each bounded field refused
outside its range with one line naming its environment variable, only its own fields, and
reachable from the environment without touching the other sections."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.settings import (
    ApiSettings,
    AuditSettings,
    CassandraSettings,
    GatewaySettings,
    KafkaSettings,
    LogSettings,
    OpsSettings,
    ProcessingSettings,
    ReconcileSettings,
    RedisSettings,
    Settings,
    SettingsError,
    TopicSettings,
    WorkerSettings,
)

SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaSettings,
    "topics": TopicSettings,
    "redis": RedisSettings,
    "cassandra": CassandraSettings,
    "processing": ProcessingSettings,
    "worker": WorkerSettings,
    "audit": AuditSettings,
    "reconcile": ReconcileSettings,
    "api": ApiSettings,
    "gateway": GatewaySettings,
    "ops": OpsSettings,
    "log": LogSettings,
}

# (section, field, its range) for every bounded field of every section.
BOUNDED = [
    (section, f.name, f.metadata["range"])
    for section in SECTIONS.values()
    for f in dataclasses.fields(section)
    if "range" in f.metadata
]


def test_settings_holds_exactly_the_sections() -> None:
    fields = {f.name: getattr(Settings(), f.name) for f in dataclasses.fields(Settings)}
    assert {name: type(section) for name, section in fields.items()} == SECTIONS


def test_no_field_is_in_two_sections() -> None:
    names = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    assert len(names) == len(set(names)) == len(Settings.env_names())


@pytest.mark.parametrize("section", SECTIONS.values(), ids=SECTIONS)
def test_a_section_is_frozen_and_its_defaults_are_valid(section: type[Any]) -> None:
    built = section()
    first = dataclasses.fields(section)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, first, getattr(built, first))


@pytest.mark.parametrize(
    ("section", "name", "bounds"), BOUNDED, ids=[f"{s.__name__}.{n}" for s, n, _ in BOUNDED]
)
def test_a_value_outside_its_range_is_one_line_naming_the_variable(
    section: type[Any], name: str, bounds: tuple[float, float | None]
) -> None:
    low, high = bounds
    outside = [low - 1] if high is None else [low - 1, high + 1]
    for value in outside:
        with pytest.raises(SettingsError) as err:
            section(**{name: type(getattr(section(), name))(value)})
        env = f"PROJECTOR_{name.upper()}"
        given = type(getattr(section(), name))(value)
        line = (
            f"{env}: {given} must be >= {low}" if high is None else f"{env}: {given} is not in {low}..{high}"
        )
        assert line in err.value.problems
        if len(err.value.problems) == 1:  # alone, it is the whole message, on one line
            assert str(err.value) == f"invalid settings: {line}"
    try:  # the bound itself is in range (another field's rule may refuse the combination)
        section(**{name: type(getattr(section(), name))(low)})
    except SettingsError as exc:
        assert not any(problem.startswith(f"PROJECTOR_{name.upper()}:") for problem in exc.problems)


@pytest.mark.parametrize("section", SECTIONS.values(), ids=SECTIONS)
def test_a_section_takes_only_its_own_fields(section: type[Any]) -> None:
    own = {f.name for f in dataclasses.fields(section)}
    foreign = next(name for name in Settings.env_names().values() if name not in own)
    with pytest.raises(TypeError):
        section(**{foreign: Settings().as_env()[f"PROJECTOR_{foreign.upper()}"]})


# One variable per section and a value other than its default.
ONE_VARIABLE = {
    "kafka": ("PROJECTOR_KAFKA_BOOTSTRAP", "k1:9093", "k1:9093"),
    "topics": ("PROJECTOR_TOPIC_PARTITIONS", "12", 12),
    "redis": ("PROJECTOR_PROJECTION_NAMESPACE", "p2", "p2"),
    "cassandra": ("PROJECTOR_CASSANDRA_PORT", "9142", 9142),
    "processing": ("PROJECTOR_INCLUDE_MUTED", "yes", True),
    "worker": ("PROJECTOR_WORKER_METRICS_PORT", "9464", 9464),
    "audit": ("PROJECTOR_UNREAD_AUDIT_SAMPLE_RATE", "0.5", 0.5),
    "reconcile": ("PROJECTOR_RECONCILE_ON_LOGIN", "off", False),
    "api": ("PROJECTOR_API_PORT", "8081", 8081),
    "gateway": ("PROJECTOR_GATEWAY_PARTITIONS", "0-1", "0-1"),
    "ops": ("PROJECTOR_OPS_METRICS_URLS", "http://w1:9464/metrics", ("http://w1:9464/metrics",)),
    "log": ("PROJECTOR_LOG_FORMAT", "json", "json"),
}


def test_every_section_has_a_variable_below() -> None:
    assert set(ONE_VARIABLE) == set(SECTIONS)


@pytest.mark.parametrize("attribute", ONE_VARIABLE)
def test_the_environment_reaches_one_section_and_leaves_the_others(attribute: str) -> None:
    env, text, value = ONE_VARIABLE[attribute]
    built = Settings.from_env({env: text})
    assert getattr(getattr(built, attribute), env.removeprefix("PROJECTOR_").lower()) == value
    assert getattr(built, attribute) != getattr(Settings(), attribute)
    for other in SECTIONS:
        if other != attribute:
            assert getattr(built, other) == getattr(Settings(), other)


def test_build_and_replace_take_field_names_of_any_section_and_validate_again() -> None:
    built = Settings.build(lanes=3, api_port=9000, topic_partitions=8)
    assert (built.processing.lanes, built.api.api_port, built.topics.topic_partitions) == (3, 9000, 8)
    assert built.replace(lanes=4).processing.lanes == 4
    assert built.replace(lanes=4).api == built.api  # the sections not named are kept as they are
    with pytest.raises(SettingsError, match="PROJECTOR_API_PORT: 0 is not a TCP port"):
        built.replace(api_port=0)
    with pytest.raises(TypeError, match="not a settings field: lane"):
        Settings.build(lane=3)
