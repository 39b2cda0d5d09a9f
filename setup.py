"""Build hook: the optional mypyc-compiled build of the replay hot path (issue 14).

Everything else about the package is declared in pyproject.toml; this file only decides whether
the modules in COMPILED_MODULES go into the wheel as C extensions next to their .py sources (an
extension module wins at import). They are mypy --strict already, which is what mypyc needs.

SESSION_PROJECTOR_COMPILE (read at build time only, never by the running program; not a
PROJECTOR_* name, because app/settings/ refuses PROJECTOR_* variables it does not know):
  auto (default)  compile when mypyc imports and a C compiler is found; otherwise, or when the
                  compilation fails, build the pure-Python package (a warning says why)
  1 / yes         compile, and fail the build when that is not possible
  0 / no          never compile
An editable install (`pip install -e .`, `make setup`) is always pure Python: the dev tree is the
code that runs, edits take effect without a rebuild, and the tests' tracebacks show the lines.
`projector --version` and the `projector_build_info{compiled}` metric say which build runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The replay/processing hot path. Left out on purpose: app/domain/entries.py (msgspec Struct
# classes with tag= must stay interpreted classes; its per-chunk loop is in decoding.py) and
# the modules that are not on the per-entry path.
COMPILED_MODULES = [
    "app/domain/arrivals.py",
    "app/domain/badge.py",
    "app/domain/conversation.py",
    "app/domain/decoding.py",
    "app/domain/flush.py",
    "app/domain/processor.py",
    "app/domain/projector.py",
    "app/domain/record_fields.py",
    "app/domain/seqs.py",
    "app/domain/unread.py",
    "app/domain/watermark.py",
    "app/replay/driver.py",
]

_MODE = os.environ.get("SESSION_PROJECTOR_COMPILE", "auto").strip().lower() or "auto"
_YES = {"1", "yes", "true", "on"}
_NO = {"0", "no", "false", "off"}
if _MODE not in _YES | _NO | {"auto"}:
    sys.exit(f"SESSION_PROJECTOR_COMPILE must be auto, 1/yes or 0/no, not {_MODE!r}")
_EDITABLE = any(command in sys.argv for command in ("editable_wheel", "develop"))


def _warn(text: str) -> None:
    print(f"session-projector build: {text}", file=sys.stderr)


def _compiler_found() -> bool:
    command = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return bool(command) and shutil.which(command[0]) is not None


def _extensions() -> list[Any]:
    if _EDITABLE or _MODE in _NO:
        return []
    required = _MODE in _YES
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        if required:
            raise
        _warn(f"mypyc is not available ({exc}): pure-Python build")
        return []
    if not _compiler_found():
        if required:
            sys.exit("SESSION_PROJECTOR_COMPILE asks for the compiled build but no C compiler is here")
        _warn("no C compiler found: pure-Python build")
        return []
    try:
        return list(mypycify(COMPILED_MODULES, opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypyc reports type errors with SystemExit
        if required:
            raise
        _warn(f"mypyc could not compile ({exc!r}): pure-Python build")
        return []


class _BuildExt(build_ext):
    """In auto mode a C compilation that fails leaves the pure-Python package (the wheel holds
    every .py source either way)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if _MODE in _YES:
                raise
            _warn(f"C compilation failed ({exc}): pure-Python build")
            # No half-compiled package: the modules call each other natively, all or none.
            for extension in self.extensions:
                for path in (self.get_ext_fullpath(extension.name), self.get_ext_filename(extension.name)):
                    if os.path.exists(path):
                        os.remove(path)
            self.extensions = []


setup(ext_modules=_extensions(), cmdclass={"build_ext": _BuildExt})
