#!/usr/bin/env bash
# `make test-compiled` (issue 14): the unit and property suites against the mypyc-compiled build.
#
# Builds the wheel as `pip install .` does (isolated build, SESSION_PROJECTOR_COMPILE=1: fails
# instead of falling back to pure Python), unpacks it into build/compiled/site and runs pytest from the
# checkout with that folder first on PYTHONPATH, so `app` is the compiled package (the editable
# install of .venv stays pure). The wheel is rebuilt only when setup.py, pyproject.toml or a
# module under app/ changed. Extra arguments go to pytest (default: the suites below);
# --build-only builds and checks the build without testing it (`make bench` uses that).
# A C compiler and the Python headers are needed: installed with apt when missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
OUT=${COMPILED_BUILD_DIR:-build/compiled}  # another folder keeps a build in use (a bench) intact
SITE="$(realpath -m "$OUT/site")"
LOCAL=.local
SUITES=(tests/unit tests/property)

log() { echo "test-compiled: $*" >&2; }

ensure_toolchain() {
    local include cc
    include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    cc=$("$PY" -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')
    command -v "$cc" >/dev/null 2>&1 && [[ -f "$include/Python.h" ]] && return 0
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "no C compiler ($cc) or no Python.h in $include: installing gcc and python3-dev"
        mkdir -p "$LOCAL"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc python3-dev; } \
            >"$LOCAL/apt-compiled.log" 2>&1; then
            tail -n 20 "$LOCAL/apt-compiled.log" >&2
            log "apt-get install failed (log: $LOCAL/apt-compiled.log)"
            return 1
        fi
        command -v "$cc" >/dev/null 2>&1 && [[ -f "$include/Python.h" ]] && return 0
    fi
    log "the compiled build needs a C compiler ($cc) and $include/Python.h"
    return 1
}

sources_hash() {
    { cat setup.py pyproject.toml; find app -name '*.py' -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-16
}

build() {
    local hash
    hash=$(sources_hash)
    if [[ -f "$OUT/hash" && "$(cat "$OUT/hash")" == "$hash" && -d "$SITE/app" ]]; then
        log "compiled build up to date ($hash)"
        return 0
    fi
    ensure_toolchain
    # setuptools builds in build/ of the checkout: nothing stale from an earlier build goes in.
    rm -rf "$OUT" build/lib.* build/bdist.* build/temp.*
    mkdir -p "$OUT/wheel" "$SITE"
    log "building the compiled wheel (mypyc; a few minutes on 2 cores)"
    if ! SESSION_PROJECTOR_COMPILE=1 "$PY" -m pip wheel --no-deps --quiet -w "$OUT/wheel" . >"$OUT/build.log" 2>&1; then
        tail -n 40 "$OUT/build.log" >&2
        log "the compiled build failed (log: $OUT/build.log)"
        return 1
    fi
    "$PY" -m zipfile -e "$OUT"/wheel/session_projector-*.whl "$SITE"
    echo "$hash" >"$OUT/hash"
}

build
# The compiled package must come first on the path: -P keeps the working directory (the
# checkout, whose app/ is pure) off the front of sys.path, PYTHONPATH puts the compiled build
# ahead of the checkout (which still provides tests/), and pytest's --import-mode=append keeps
# its rootdir behind them. SESSION_PROJECTOR_EXPECT_COMPILED makes
# tests/unit/ops/test_packaging.py check, inside the run, that the compiled modules are imported.
export PYTHONPATH="$SITE:$PWD" SESSION_PROJECTOR_EXPECT_COMPILED=1
"$PY" -P - <<'EOF'
import sys
from app.build import build_info
import app.domain.processor as processor
info = build_info()
if not info.compiled:
    sys.exit(f"test-compiled: app.domain.processor is {processor.__file__}, not the compiled build")
print(f"test-compiled: {info.line()} from {processor.__file__}", file=sys.stderr)
EOF
if [[ "${1:-}" == --build-only ]]; then
    exit 0
fi
PYTEST=("$PY" -P -m pytest -q -p no:cacheprovider --import-mode=append)
if (($#)); then
    exec "${PYTEST[@]}" "$@"
fi
exec "${PYTEST[@]}" -m "not integration and not chaos" "${SUITES[@]}"
