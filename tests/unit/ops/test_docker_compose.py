"""docker/compose.yaml agrees with app/settings/: every PROJECTOR_* variable is a real setting,
the values validate, and ports/topic names match the Settings defaults (and the local servers)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from app.settings import Settings
from tests.support.paths import ROOT

COMPOSE = ROOT / "docker" / "compose.yaml"
PROJECTOR_SERVICES = ("bootstrap", "worker", "api")
DEFAULTS = Settings()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


# `${NAME:?message}`: compose takes the value from the host environment and refuses to start
# without it. The tests stand in a valid value, as a host would provide.
_REQUIRED_FROM_HOST = re.compile(r"\$\{(?P<name>[A-Z_]+):\?[^}]*\}")
HOST_VALUES = {"PROJECTOR_API_SECRET": "x" * 32}


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the `- KEY=value` form
        env = dict(item.split("=", 1) for item in env)
    return {str(k): _REQUIRED_FROM_HOST.sub(lambda m: HOST_VALUES[m["name"]], str(v)) for k, v in env.items()}


def test_the_stack_has_every_role(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"kafka", "redis", "cassandra", *PROJECTOR_SERVICES} <= set(services)
    for role in PROJECTOR_SERVICES:
        assert services[role]["command"] == [role]  # the image's entrypoint is `projector`
    assert "cassandra:5.0" in services["cassandra"]["image"]


@pytest.mark.parametrize("role", PROJECTOR_SERVICES)
def test_every_projector_variable_is_a_known_setting_and_valid(compose: dict[str, Any], role: str) -> None:
    env = _env(compose["services"][role])
    known = Settings.env_names()
    ours = {k: v for k, v in env.items() if k.startswith("PROJECTOR_")}
    assert ours, f"{role} sets no PROJECTOR_* variable"
    unknown = sorted(set(ours) - set(known))
    assert not unknown, f"{role}: not Settings fields: {unknown}"
    Settings.from_env(ours)  # raises SettingsError with every problem


@pytest.mark.parametrize("role", PROJECTOR_SERVICES)
def test_ports_and_topics_agree_with_settings_defaults(compose: dict[str, Any], role: str) -> None:
    s = Settings.from_env(_env(compose["services"][role]))
    # Same topic names and partitioning as the local stack: changelogs and consumers depend on them.
    assert s.topics.names == DEFAULTS.topics.names
    assert s.topics.topic_partitions == DEFAULTS.topics.topic_partitions
    assert s.cassandra.cassandra_keyspace == DEFAULTS.cassandra.cassandra_keyspace
    # Same ports; only the host names differ (compose service names).
    assert int(s.kafka.kafka_bootstrap.rpartition(":")[2]) == int(
        DEFAULTS.kafka.kafka_bootstrap.rpartition(":")[2]
    )
    assert s.kafka.kafka_bootstrap.rpartition(":")[0] == "kafka"
    assert urlparse(s.redis.redis_url).port == urlparse(DEFAULTS.redis.redis_url).port
    assert urlparse(s.redis.redis_url).hostname == "redis"
    assert s.cassandra.cassandra_port == DEFAULTS.cassandra.cassandra_port
    assert s.cassandra.cassandra_contact_points == ("cassandra",)
    assert s.api.api_port == DEFAULTS.api.api_port
    assert s.worker.worker_web_port == DEFAULTS.worker.worker_web_port


def test_kafka_listens_where_settings_point_and_never_auto_creates(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["kafka"])
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"


def test_published_ports_are_loopback_only_and_match_the_api(compose: dict[str, Any]) -> None:
    published = {name: service.get("ports", []) for name, service in compose["services"].items()}
    for name, ports in published.items():
        for spec in ports:
            assert str(spec).startswith("127.0.0.1:"), f"{name} publishes {spec} beyond loopback"
    assert published["api"] == [f"127.0.0.1:{DEFAULTS.api.api_port}:{DEFAULTS.api.api_port}"]


def test_the_api_secret_comes_from_the_host_never_from_the_file(compose: dict[str, Any]) -> None:
    raw = compose["services"]["api"]["environment"]["PROJECTOR_API_SECRET"]
    assert _REQUIRED_FROM_HOST.fullmatch(raw), raw
    settings = Settings.from_env(_env(compose["services"]["api"]))
    assert settings.api.api_secret == HOST_VALUES["PROJECTOR_API_SECRET"]
    for role in ("bootstrap", "worker"):  # only the API needs the key
        assert "PROJECTOR_API_SECRET" not in _env(compose["services"][role])


def test_the_worker_serves_metrics_on_its_own_port(compose: dict[str, Any]) -> None:
    s = Settings.from_env(_env(compose["services"]["worker"]))
    # Not published to the host (scraped inside the compose network); distinct from faust's port.
    assert s.worker.worker_metrics_port > 0
    assert s.worker.worker_metrics_port not in (s.worker.worker_web_port, s.api.api_port)


def test_the_api_healthcheck_asks_readyz_on_the_api_port(compose: dict[str, Any]) -> None:
    from app.api.health import READYZ_PATH

    api = compose["services"]["api"]
    settings = Settings.from_env(_env(api))
    command = " ".join(api["healthcheck"]["test"])
    assert api["healthcheck"]["test"][0] == "CMD"
    assert f"http://127.0.0.1:{settings.api.api_port}{READYZ_PATH}" in command  # no token: a public route


def test_the_worker_healthcheck_asks_readyz_on_the_worker_metrics_port(compose: dict[str, Any]) -> None:
    from app.runtime.web import READYZ_PATH

    worker = compose["services"]["worker"]
    settings = Settings.from_env(_env(worker))
    command = " ".join(worker["healthcheck"]["test"])
    assert worker["healthcheck"]["test"][0] == "CMD"
    # Health rides on the metrics server: it needs that port (no token: public routes).
    assert settings.worker.worker_metrics_port > 0
    assert f"http://127.0.0.1:{settings.worker.worker_metrics_port}{READYZ_PATH}" in command


def test_the_monitoring_profile_mounts_the_operator_kit(compose: dict[str, Any]) -> None:
    root = COMPOSE.parent
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]  # not started by a plain `up`
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            assert (root / source).exists(), f"{name} mounts {source}, which does not exist"
    scrape = yaml.safe_load((root / "../deploy/prometheus/prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]}
    worker = Settings.from_env(_env(services["worker"]))
    api = Settings.from_env(_env(services["api"]))
    # The example scrape config reaches the compose services on their real ports.
    assert targets == {
        "projector-worker": [f"worker:{worker.worker.worker_metrics_port}"],
        "projector-api": [f"api:{api.api.api_port}"],
    }
