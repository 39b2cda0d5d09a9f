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
# Its daemon (on :80 with /etc/haproxy's configuration) never starts: scripts/debian_daemon_package.sh.
source "$ROOT/scripts/debian_daemon_package.sh"
install_daemon_package haproxy haproxy "missing"
echo "haproxy: $(haproxy -v 2>&1 | head -n 1)"
