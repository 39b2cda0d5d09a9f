"""What this process is: the package version, the Python running it, and whether the compiled
build (mypyc, issue 14) is in use. ``projector --version`` prints it and every process exports it
as ``projector_build_info{version,python,compiled} 1`` (app/metrics.py), so a dashboard shows which
build each worker and API runs during a rolling upgrade."""

from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Final

DISTRIBUTION: Final = "session-projector"
# The compiled build sets this module-level flag (``COMPILED = True`` in the module below); it is
# read with a default, so the pure build needs nothing.
COMPILED_FLAG_MODULE: Final = "app"
COMPILED_FLAG: Final = "COMPILED"


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
    module = importlib.import_module(COMPILED_FLAG_MODULE)
    return bool(getattr(module, COMPILED_FLAG, False))


def build_info() -> BuildInfo:
    return BuildInfo(version=version(), python=platform.python_version(), compiled=compiled())
