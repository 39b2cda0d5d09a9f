#!/usr/bin/env bash
# Toxiproxy (a TCP proxy whose links the tests make slow, stalled or reset: issue 18), built by
# the project from its Go module with `go install` into .local/bin: toxiproxy-server and
# toxiproxy-cli. Pinned; rebuilt only when the pin changes (the version is kept next to them).
# Needs Go >= 1.22.
set -euo pipefail
VERSION=v2.12.0
MODULE=github.com/Shopify/toxiproxy/v2
BIN="$LOCAL/bin"
STAMP="$BIN/.toxiproxy-version"

if [[ -x "$BIN/toxiproxy-server" && -x "$BIN/toxiproxy-cli" && "$(cat "$STAMP" 2>/dev/null)" == "$VERSION" ]]; then
    echo "[toxiproxy] $VERSION present in $BIN"
    exit 0
fi
# Go comes with the machine (/usr/local/go on the polyglot image); Debian's golang-go (1.19 on
# bookworm) is too old for this module, so it is not a fallback: say what is needed instead.
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
    export PATH="/usr/local/go/bin:$PATH"
fi
go_minor="$(go env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
if [[ -z "$go_minor" || "$go_minor" -lt 22 ]]; then
    echo "[toxiproxy] ERROR: Go >= 1.22 is needed to build toxiproxy $VERSION (found: $(go env GOVERSION 2>/dev/null || echo none))" >&2
    exit 1
fi
t0=$SECONDS
mkdir -p "$BIN" "$LOCAL/toxiproxy"
echo "[toxiproxy] building $MODULE $VERSION with $(go version | awk '{print $3}') (first time only)..."
# pkg@version: built from the module's own go.mod/go.sum (checked against the checksum database),
# whatever the working directory; -X sets the version the binaries report.
if ! (cd "$LOCAL/toxiproxy" && GOBIN="$BIN" go install \
    -ldflags "-X $MODULE.Version=$VERSION" "$MODULE/cmd/server@$VERSION" "$MODULE/cmd/cli@$VERSION") >"$LOCAL/toxiproxy/build.log" 2>&1; then
    tail -n 30 "$LOCAL/toxiproxy/build.log" >&2
    echo "[toxiproxy] ERROR: go install failed (log: $LOCAL/toxiproxy/build.log)" >&2
    exit 1
fi
# The module's commands are cmd/server and cmd/cli; go install names binaries after their
# directories, so give them the names everyone knows.
mv -f "$BIN/server" "$BIN/toxiproxy-server"
mv -f "$BIN/cli" "$BIN/toxiproxy-cli"
echo "$VERSION" >"$STAMP"
echo "[toxiproxy] $VERSION built into $BIN in $((SECONDS - t0))s"
