"""The package as shipped (issue 15): `projector --version`, `python -m app`, `py.typed`, and
runtime dependencies that are exactly what the shipped code imports (dev tools stay dev)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib import metadata, resources

import pytest

import app
from app.build import build_info, version
from app.cli import main
from tests.support.paths import ROOT

SHIPPED = ("app", "agents", "tables")
# Runtime dependencies the code does not import by name: the libraries use them when present.
USED_INDIRECTLY = {
    "hiredis": "redis-py's C reply parser",
    "rocksdict": "faust's rocksdb:// table store",
}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pyproject() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data


def _third_party_imports() -> set[str]:
    found: set[str] = set()
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in SHIPPED}


def test_version_prints_the_package_version_and_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"projector {metadata.version('session-projector')} (pure Python; ")
    assert version() == metadata.version("session-projector")


def test_the_compiled_flag_is_read_from_the_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_info().compiled is False  # the pure build sets nothing
    monkeypatch.setattr(app, "COMPILED", True, raising=False)
    assert build_info().labels()["compiled"] == "true"
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "(compiled; " in capsys.readouterr().out


def test_python_dash_m_app_is_the_projector_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("projector ")
    usage = subprocess.run(
        [sys.executable, "-m", "app", "no-such-command"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_the_package_is_marked_typed() -> None:
    assert resources.files("app").joinpath("py.typed").is_file()
    package_data = _pyproject()["tool"]["setuptools"]["package-data"]  # type: ignore[index]
    assert "py.typed" in package_data["app"]


def test_runtime_dependencies_are_what_the_shipped_code_imports() -> None:
    project = _pyproject()["project"]
    runtime = {_name(r) for r in project["dependencies"]}  # type: ignore[index]
    dev = {_name(r) for r in project["optional-dependencies"]["dev"]}  # type: ignore[index]
    distributions = metadata.packages_distributions()
    imported = {
        dist.lower().replace("_", "-")
        for name in _third_party_imports()
        for dist in distributions.get(name, [name])
    }
    missing = imported - runtime
    assert not missing, f"imported by the shipped code but not a runtime dependency: {sorted(missing)}"
    unused = runtime - imported - set(USED_INDIRECTLY)
    assert not unused, f"runtime dependencies nothing in {SHIPPED} imports (dev only?): {sorted(unused)}"
    assert "pyyaml" in dev and "pyyaml" not in runtime  # only tests read YAML
