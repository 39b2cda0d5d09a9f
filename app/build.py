"""What this process is: the package version, the Python running it, and whether the compiled
build (mypyc, issue 14: setup.py) is in use. ``projector --version`` prints it and every process
exports it as ``projector_build_info{version,python,compiled} 1`` (app/metrics/process.py), so a
dashboard shows which build each worker and API runs during a rolling upgrade."""

from __future__ import annotations

import importlib.util
import platform
from dataclasses import dataclass
from importlib import metadata
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Final

DISTRIBUTION: Final = "session-projector"
# A module of the compiled set (setup.py's COMPILED_MODULES): the compiled build installs it as
# an extension module next to its .py source, and the import system loads the extension. Its
# spec is looked up, not imported (the API process need not load the processing core).
COMPILED_PROBE: Final = "app.domain.processor"


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    python: str
    compiled: bool

    def line(self) -> str:
        build = "compiled" if self.compiled else "pure Python"
        return f"projector {self.version} ({build}; {platform.python_implementation()} {self.python})"

    def labels(self) -> dict[str, str]:
        return {
            "version": self.version,
            "python": self.python,
            "compiled": "true" if self.compiled else "false",
        }


def version() -> str:
    """The installed distribution's version (pyproject.toml), or 0+unknown when run from a tree
    that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def compiled() -> bool:
    """Whether the compiled build runs here (the module the interpreter loads is a C extension)."""
    spec = importlib.util.find_spec(COMPILED_PROBE)
    origin = spec.origin if spec is not None else None
    return origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES))


def build_info() -> BuildInfo:
    return BuildInfo(version=version(), python=platform.python_version(), compiled=compiled())
