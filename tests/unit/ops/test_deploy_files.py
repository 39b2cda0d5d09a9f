"""The operator kit's files (issue 15) without a Prometheus: the Grafana dashboard is valid,
provisioning-ready JSON whose queries use only metrics the code exports, every alert uses them
too and has a unit test in alerts_test.yml. (promtool and a real Prometheus check the same files
in tests/integration/test_deploy_rules.py and test_operator_kit.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from app.metrics import ApiMetrics, RebuildMetrics, WorkerMetrics, exposition
from tests.support.deploy_kit import (
    ALERTS,
    ALERTS_TEST,
    DEPLOY,
    METRIC_RE,
    PROMETHEUS_CONFIG,
    dashboard,
    panels,
    queries,
)

# What issue 15 asks the dashboard to show, by a word of each panel title.
REQUIRED_PANELS = (
    "throughput",
    "watermark lag",
    "pending",
    "dead letters by reason",
    "flush latency",
    "compression ratio",
    "unread drift",
    "mirror: owed rows",
    "api latency",
    "snapshot hits",
)


def exported_names() -> set[str]:
    """Every sample name the worker's and the API's registries expose (labelled children made)."""
    worker, api = WorkerMetrics(), ApiMetrics()
    worker.watermark_lag.labels("0").set(0)
    worker.partition_owed_rows.labels("0").set(0)
    api.observe_request("/v1/badge", "GET", 200, 0.001)
    names: set[str] = {"up"}  # Prometheus' own per target
    for registry in (worker.registry, api.registry, RebuildMetrics().registry):
        for line in exposition(registry).decode().splitlines():
            if line and not line.startswith("#"):
                names.add(line.split("{")[0].split(" ")[0])
    return names


def test_the_dashboard_is_provisioning_ready_json() -> None:
    board = dashboard()
    assert board["uid"] == "session-projector" and board["title"]
    assert "__inputs" not in board  # not an export needing an import dialog
    assert "id" not in board or board["id"] is None  # provisioning assigns it
    names = [v["name"] for v in board["templating"]["list"]]
    assert names[0] == "datasource" and {"worker_job", "api_job"} <= set(names)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert target["expr"].strip()


def test_the_dashboard_has_every_panel_the_issue_asks_for() -> None:
    titles = [p["title"].lower() for p in panels()]
    missing = [word for word in REQUIRED_PANELS if not any(word in title for title in titles)]
    assert not missing, f"no panel for {missing}: {titles}"


def test_every_dashboard_query_uses_exported_metrics() -> None:
    exported = exported_names()
    for where, expr in queries():
        used = set(METRIC_RE.findall(expr))
        assert used, (where, expr)
        unknown = used - exported
        assert not unknown, f"{where}: {sorted(unknown)} is not exported by the code"


def _alerts() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        rules.extend(rule for rule in group["rules"] if "alert" in rule)
    return rules


def test_every_alert_uses_exported_metrics_and_says_how_bad_it_is() -> None:
    exported = exported_names()
    rules = _alerts()
    assert len(rules) >= 10
    for rule in rules:
        unknown = set(METRIC_RE.findall(rule["expr"])) - exported
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} is not exported by the code"
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    silent = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }
    names = {rule["alert"] for rule in _alerts()}
    assert names - fired == set(), "alerts without a firing test"
    # A firing test alone cannot tell a threshold from "always on": most have a quiet case too.
    assert len(names & silent) >= len(names) - 3, sorted(names - silent)


@pytest.mark.parametrize(
    "path",
    [
        PROMETHEUS_CONFIG,
        DEPLOY / "grafana" / "provisioning" / "dashboards" / "session-projector.yml",
        DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml",
    ],
)
def test_the_example_configs_are_yaml(path: Any) -> None:
    assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_the_example_scrape_config_names_the_jobs_the_rules_and_dashboard_use() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"projector-worker", "projector-api"}
    assert config["rule_files"] == ["alerts.yml"]
