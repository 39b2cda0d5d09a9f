"""The settings: built once from the environment, frozen, one section per part of the product.

Nothing else in the code base reads ``os.environ``: every knob is a field of one section, set by
the environment variable ``PROJECTOR_<FIELD NAME IN UPPER CASE>`` (``PROJECTOR_KAFKA_BOOTSTRAP``,
``PROJECTOR_TOPIC_PARTITIONS``, ...). The place that assembles a process hands each part only
its section (``settings.kafka``, ``settings.redis``, ...). Defaults match the local servers that
``make services-up`` starts, and ``docker/compose.yaml`` (a unit test keeps the two in step).

Value syntax: ints in decimal; floats as decimal numbers (``0.005``); booleans
``true/false/1/0/yes/no/on/off``; lists (contact points) comma-separated. An unknown
``PROJECTOR_*`` variable is an error, so a typo cannot silently fall back to a default. All
problems are reported together in one :class:`SettingsError`.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.settings.api import (
    API_SECRET_MIN_CHARS,
    ApiSettings,
    GatewaySettings,
    LogSettings,
    OpsSettings,
    gateway_partition_set,
)
from app.settings.base import ENV_PREFIX, SettingsError, env_text, field_names, parse, with_env_names
from app.settings.kafka import KafkaSettings, TopicSettings
from app.settings.stores import CassandraSettings, RedisSettings, replication_per_dc
from app.settings.worker import AuditSettings, ProcessingSettings, ReconcileSettings, WorkerSettings

__all__ = [
    "API_SECRET_MIN_CHARS",
    "ENV_PREFIX",
    "ApiSettings",
    "AuditSettings",
    "CassandraSettings",
    "GatewaySettings",
    "KafkaSettings",
    "LogSettings",
    "OpsSettings",
    "ProcessingSettings",
    "ReconcileSettings",
    "RedisSettings",
    "Settings",
    "SettingsError",
    "TopicSettings",
    "WorkerSettings",
    "gateway_partition_set",
    "replication_per_dc",
]


@dataclass(frozen=True, slots=True)
class Settings:
    """Every section of one process's configuration; checks the rules that span sections."""

    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    topics: TopicSettings = dataclasses.field(default_factory=TopicSettings)
    redis: RedisSettings = dataclasses.field(default_factory=RedisSettings)
    cassandra: CassandraSettings = dataclasses.field(default_factory=CassandraSettings)
    processing: ProcessingSettings = dataclasses.field(default_factory=ProcessingSettings)
    worker: WorkerSettings = dataclasses.field(default_factory=WorkerSettings)
    audit: AuditSettings = dataclasses.field(default_factory=AuditSettings)
    reconcile: ReconcileSettings = dataclasses.field(default_factory=ReconcileSettings)
    api: ApiSettings = dataclasses.field(default_factory=ApiSettings)
    gateway: GatewaySettings = dataclasses.field(default_factory=GatewaySettings)
    ops: OpsSettings = dataclasses.field(default_factory=OpsSettings)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)

    def __post_init__(self) -> None:
        problems = _cross_section_problems(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(Settings)}
        )
        if problems:
            raise SettingsError(with_env_names(problems, _ALL_FIELDS))

    # ------------------------------------------------------------------------------------------
    @classmethod
    def env_names(cls) -> dict[str, str]:
        """``{"PROJECTOR_KAFKA_BOOTSTRAP": "kafka_bootstrap", ...}`` for every field of every section."""
        return {ENV_PREFIX + name.upper(): name for name in _SECTION_OF}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build the settings from ``environ`` (default: the process environment)."""
        env = os.environ if environ is None else environ
        names = cls.env_names()
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key in sorted(env):
            if not key.startswith(ENV_PREFIX):
                continue
            name = names.get(key)
            if name is None:
                problems.append(f"{key}: unknown setting (known: {', '.join(sorted(names))})")
                continue
            try:
                values[name] = parse(_HINTS[name], env[key])
                if name == "log_level":  # `info` is as clear as `INFO`
                    values[name] = values[name].upper()
            except ValueError as exc:
                problems.append(f"{key}: {exc}, got {env[key]!r}")
        if problems:
            raise SettingsError(problems)
        return cls.build(**values)

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """The settings with these fields (by field name, any section) and defaults elsewhere;
        every section's problems and the cross-section ones are reported together."""
        return cls()._with(values)

    def replace(self, **values: Any) -> Settings:
        """A copy with these fields (by field name, any section) changed, validated again."""
        return self._with(values)

    def _with(self, values: dict[str, Any]) -> Settings:
        unknown = sorted(set(values) - set(_SECTION_OF))
        if unknown:
            raise TypeError(f"not a settings field: {', '.join(unknown)}")
        changes: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            changes.setdefault(_SECTION_OF[name], {})[name] = value
        sections: dict[str, Any] = {}
        problems: list[str] = []
        for f in dataclasses.fields(Settings):
            current = getattr(self, f.name)
            try:
                sections[f.name] = dataclasses.replace(current, **changes.get(f.name, {}))
            except SettingsError as exc:
                problems.extend(exc.problems)
        if problems:  # the rules between the sections that could be built, as well
            cross = _cross_section_problems(sections)
            raise SettingsError(problems + with_env_names(cross, _ALL_FIELDS))
        return Settings(**sections)

    def as_env(self) -> dict[str, str]:
        """The environment that reproduces these settings (for subprocesses and containers)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(Settings):
            section = getattr(self, f.name)
            for field in dataclasses.fields(section):
                out[ENV_PREFIX + field.name.upper()] = env_text(getattr(section, field.name))
        return out

    @classmethod
    def topic_env(cls, prefix: str) -> dict[str, str]:
        """Every topic setting named after `prefix` (see :meth:`TopicSettings.topic_env`)."""
        return TopicSettings.topic_env(prefix)


def _cross_section_problems(sections: Mapping[str, Any]) -> list[str]:
    """The rules between sections, over those present (a section that failed is left out)."""
    p: list[str] = []
    topics, gateway = sections.get("topics"), sections.get("gateway")
    if isinstance(topics, TopicSettings) and isinstance(gateway, GatewaySettings):
        parts = gateway.partition_set
        if parts is not None and max(parts) >= topics.topic_partitions:
            p.append(
                f"gateway_partitions: {max(parts)} is not a partition of the frame topics "
                f"(0..{topics.topic_partitions - 1})"
            )
    api, ops = sections.get("api"), sections.get("ops")
    if isinstance(api, ApiSettings) and isinstance(ops, OpsSettings):
        if api.api_secret_previous and api.api_secret_previous == ops.ops_secret:
            p.append("api_secret_previous: must differ from ops_secret")
        if ops.ops_secret and ops.ops_secret == api.api_secret:
            # One secret for both would make every user token an operator credential's sibling.
            p.append("ops_secret: must differ from api_secret")
    return p


_SECTION_CLASSES: dict[str, type[Any]] = {
    f.name: typing.get_type_hints(Settings)[f.name] for f in dataclasses.fields(Settings)
}
# field name -> the attribute of Settings holding its section (field names are unique).
_SECTION_OF: dict[str, str] = {
    field.name: section for section, cls in _SECTION_CLASSES.items() for field in dataclasses.fields(cls)
}
_HINTS: dict[str, Any] = {
    name: hint for cls in _SECTION_CLASSES.values() for name, hint in typing.get_type_hints(cls).items()
}
_ALL_FIELDS = field_names(*_SECTION_CLASSES.values())
