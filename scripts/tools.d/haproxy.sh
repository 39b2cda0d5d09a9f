#!/usr/bin/env bash
# HAProxy (Debian's `haproxy` package) for the fleet tests (issue 32): a round-robin balancer in
# front of several `projector api` processes, as a deployment without sticky routing runs them
# (tests/integration/test_api_balancer.py, tests/support/balancer.py).
#
# Installed with apt-get when missing (as root). The package's own service is never started:
# the tests run their own haproxy on free ports with a temporary configuration.
set -euo pipefail
: "${LOCAL:?run through scripts/tools.sh}"
if command -v haproxy >/dev/null 2>&1; then
    echo "haproxy: $(haproxy -v 2>&1 | head -n 1)"
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "haproxy: missing: install Debian's package with" \
        "sudo apt-get install -y --no-install-recommends haproxy" >&2
    exit 1
fi
mkdir -p "$LOCAL/haproxy"
log="$LOCAL/haproxy/apt.log"
# Keep the package's maintainer scripts from starting its daemon (on :80 with /etc/haproxy's
# configuration): without systemd, invoke-rc.d would run the init script. Only a policy we
# created is removed again.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
fi
cleanup() { if [[ "$own_policy" == 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT
echo "haproxy: installing Debian's haproxy package (apt-get; log: $log)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "haproxy: apt-get install haproxy failed (log: $log)" >&2
    exit 1
fi
echo "haproxy: $(haproxy -v 2>&1 | head -n 1)"
