#!/usr/bin/env bash
# Headless Chromium (Debian's package) and Playwright for Python (the driver only, into .venv):
# the browser tests (tests/integration/test_ops_console.py, test_browser_client.py). Never
# `playwright install`: its browser downloads are not reachable here; tests point Playwright at
# /usr/bin/chromium (executable_path). Idempotent: quick when both are present.
set -euo pipefail
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
if ! command -v chromium >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "chromium.sh: chromium is missing and this is not root: apt-get install chromium" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
if ! "$ROOT/.venv/bin/python" -c 'import playwright' >/dev/null 2>&1; then
    "$ROOT/.venv/bin/pip" install -q 'playwright>=1.45,<2'
fi
echo "chromium: $(chromium --version 2>/dev/null | head -1); playwright $("$ROOT/.venv/bin/python" -c 'from importlib.metadata import version; print(version("playwright"))')"
