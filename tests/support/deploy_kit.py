"""The operator kit's files (deploy/) as the tests read them: the dashboard's queries with its
variables resolved, the alert rules and their unit tests."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "session-projector.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"

WORKER_JOB = "projector-worker"
API_JOB = "projector-api"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel but the rows (nested row panels included)."""
    out: list[dict[str, Any]] = []
    for panel in (board or dashboard())["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def variables(rate_interval: str) -> dict[str, str]:
    """What Grafana puts in for each variable: the dashboard's defaults, `All` as its allValue,
    and `$__rate_interval` as given (it depends on the scrape interval)."""
    out = {"__rate_interval": rate_interval}
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        if var.get("includeAll") and var["current"].get("value") == "$__all":
            out[var["name"]] = var["allValue"]
        else:
            out[var["name"]] = var["current"]["value"]
    return out


def queries(rate_interval: str = "5m") -> list[tuple[str, str]]:
    """(panel title / refId, PromQL with the variables resolved) for every target."""
    values = variables(rate_interval)

    def resolve(expr: str) -> str:
        # Longest names first ($worker_job before a hypothetical $worker).
        for name in sorted(values, key=len, reverse=True):
            expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
        return expr

    out = []
    for panel in panels():
        for target in panel["targets"]:
            expr = resolve(target["expr"])
            assert "$" not in expr, f"unresolved variable in {panel['title']}: {expr}"
            out.append((f"{panel['title']} / {target['refId']}", expr))
    return out


METRIC_RE = re.compile(r"\b(projector_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up)\b")
