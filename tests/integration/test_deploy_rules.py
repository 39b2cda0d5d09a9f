"""The operator kit against Debian's promtool (installed by scripts/tools.d/prometheus.sh): the
alert rules load, their unit tests pass, every dashboard query parses as PromQL, the example
configuration is valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_kit import ALERTS, ALERTS_TEST, PROMETHEUS_CONFIG, queries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail(
            "promtool is missing: `make tools` (scripts/tools.d/prometheus.sh) installs it", pytrace=False
        )
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_alert_rules() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_runs_the_alert_unit_tests() -> None:
    done = promtool("test", "rules", str(ALERTS_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_broken_threshold_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: with one alert's threshold moved, promtool reports that alert."""
    broken = ALERTS.read_text().replace("[5m])) > 0.05", "[5m])) > 0.5")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    done = promtool("test", "rules", str(tmp_path / "alerts_test.yml"))
    assert done.returncode != 0 and "ProjectorApiErrors" in done.stdout + done.stderr


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (its PromQL parser, the
    server's): a syntax error names the rule, i.e. the panel."""
    found = queries("5m")
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(found)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(found)} rules found" in done.stdout
    # ... and a broken one is reported (the check can fail).
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "rate(x[5m]"}]}]})
    )
    assert promtool("check", "rules", str(path)).returncode != 0


def test_the_example_prometheus_config_is_valid() -> None:
    done = promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
