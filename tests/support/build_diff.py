"""Differential testing of the two builds (issue 30): the same input through the pure-Python core
and the mypyc-compiled one, byte-identical outputs demanded.

Each build runs in a process of its own (tests/support/build_child.py; one Python process cannot
import both `app` packages), started once and fed request after request. The compiled build is
the one `make test-compiled` unpacks (scripts/test_compiled.sh --build-only makes it, or finds it
up to date); the pure one is the checkout.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from tests.support.paths import ROOT

COMPILED_SITE = ROOT / os.environ.get("COMPILED_BUILD_DIR", "build/compiled") / "site"


def ensure_compiled_build() -> Path:
    """The compiled build's folder, built first when missing or stale (the build script's hash
    check makes this a second when it is up to date). DIFF_COMPILED_SITE names another build's
    folder, used as it is: how a build with a planted fault is shown to fail the harness."""
    given = os.environ.get("DIFF_COMPILED_SITE")
    if given:
        return Path(given)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test_compiled.sh"), "--build-only"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the compiled build failed:\n{done.stderr.decode(errors='replace')[-3000:]}")
    return COMPILED_SITE


class BuildProcess:
    """One build's child process. `compiled_site` None: the checkout's pure code."""

    def __init__(self, compiled_site: Path | None) -> None:
        path = [str(compiled_site)] if compiled_site is not None else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "tests.support.build_child"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        hello = orjson.loads(self._read())
        self.compiled: bool = hello["compiled"]
        self.line: str = hello["line"]
        if self.compiled != (compiled_site is not None):
            self.close()
            raise RuntimeError(
                f"asked for the {'compiled' if compiled_site else 'pure'} build, got {self.line}"
            )

    def _read(self) -> bytes:
        out = self.proc.stdout
        assert out is not None
        head = out.read(4)
        if len(head) < 4:
            raise RuntimeError(f"the build's process ended (exit {self.proc.wait()})")
        return _read_exactly(out, struct.unpack(">I", head)[0])

    def ask(self, request: dict[str, Any]) -> bytes:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(struct.pack(">I", len(data)) + data)
        stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise RuntimeError("the build's process ended mid-answer")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


@dataclass
class Verdict:
    pure: bytes
    compiled: bytes

    @property
    def same(self) -> bool:
        return self.pure == self.compiled

    def explain(self) -> str:
        """Where the two answers part: the first differing key path and both values."""
        return _first_difference(orjson.loads(self.pure), orjson.loads(self.compiled), "$")


def _first_difference(a: Any, b: Any, path: str) -> str:
    # Compared as bytes, not with ==: True == 1 in Python, and that is the kind of difference
    # looked for.
    if type(a) is not type(b):
        return f"{path}: pure {a!r:.300} / compiled {b!r:.300}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or _differ(a[key], b[key]):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            if _differ(x, y):
                return _first_difference(x, y, f"{path}[{index}]")
        if len(a) != len(b):
            return f"{path}: pure has {len(a)} items, compiled {len(b)}"
    return f"{path}: pure {a!r:.300} / compiled {b!r:.300}"


def _differ(a: Any, b: Any) -> bool:
    return orjson.dumps(a) != orjson.dumps(b)


class Differential:
    """Both builds, side by side: `check` sends one request to each and compares the answers."""

    def __init__(self, compiled_site: Path) -> None:
        self.pure = BuildProcess(None)
        self.compiled = BuildProcess(compiled_site)
        self.requests = 0
        self.lines = 0

    def check(self, request: dict[str, Any]) -> Verdict:
        if request.get("state_dir") == "new":
            with tempfile.TemporaryDirectory(prefix="build-diff-") as base:
                answers = [
                    build.ask({**request, "state_dir": str(Path(base) / name)})
                    for name, build in (("pure", self.pure), ("compiled", self.compiled))
                ]
            verdict = Verdict(*answers)
        else:
            verdict = Verdict(self.pure.ask(request), self.compiled.ask(request))
        self.requests += 1
        self.lines += len(request["lines"])
        return verdict

    def close(self) -> None:
        self.pure.close()
        self.compiled.close()
