#!/usr/bin/env bash
# Node.js and npm (Debian's packages when missing) and the TypeScript SDK's dev dependencies
# (sdk-ts/: typescript, @types/node and better-sqlite3 for the host cache's tests, pinned in its
# package.json and package-lock.json, installed with `npm ci` from the npm registry; better-sqlite3
# compiles its addon with node-gyp when no prebuilt one is reachable: g++, make and python3, about
# a minute of CPU, once per lockfile change). The SDK's build, unit tests and `npm pack`
# (make sdk) and the outside consumer's test (tests/integration/test_sdk_consumer.py) need them.
# Idempotent: quick when node >= 18, npm and an install matching the lockfile are present.
set -euo pipefail
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
SDK="$ROOT/sdk-ts"

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 || [[ "$(node_major)" -lt 18 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "node.sh: node >= 18 and npm are needed and this is not root: apt-get install nodejs npm" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # A node that came with the machine (not Debian's) may bring its own npm: only add what is missing.
    packages=()
    command -v node >/dev/null 2>&1 || packages+=(nodejs)
    command -v npm >/dev/null 2>&1 || packages+=(npm)
    [[ ${#packages[@]} -eq 0 ]] && packages=(nodejs npm)
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    if [[ "$(node_major)" -lt 18 ]]; then
        echo "node.sh: node $(node --version) is too old: the SDK needs >= 18 (fetch, AbortSignal, node --test)" >&2
        exit 1
    fi
fi

# npm ci only when the lockfile changed since the last install (npm keeps a copy of what it
# installed in node_modules/.package-lock.json; a stamp of the lockfile's hash is simpler to trust).
STAMP="$SDK/node_modules/.installed-lock-sha256"
want="$(sha256sum "$SDK/package-lock.json" | cut -d' ' -f1)"
if [[ ! -x "$SDK/node_modules/.bin/tsc" || "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
    (cd "$SDK" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" >"$STAMP"
fi
echo "node: $(node --version); npm $(npm --version); tsc $("$SDK/node_modules/.bin/tsc" --version | awk '{print $2}')"
