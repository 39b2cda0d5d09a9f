#!/usr/bin/env bash
# Prometheus and promtool (Debian's `prometheus` package) for the operator-kit tests:
# `promtool check rules` / `promtool test rules` on deploy/prometheus/, and a real Prometheus
# server scraping a worker and the API (tests/integration/test_operator_kit.py).
#
# Installed with apt-get when missing (as root). The package's own service is never started:
# the tests run their own server on a free port with a temporary config and data dir.
set -euo pipefail
: "${LOCAL:?run through scripts/tools.sh}"
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    echo "prometheus: $(prometheus --version 2>&1 | head -n 1)"
    exit 0
fi
# Its daemon (on :9090, as the prometheus user) never starts: scripts/debian_daemon_package.sh.
source "$ROOT/scripts/debian_daemon_package.sh"
install_daemon_package prometheus prometheus "promtool/prometheus are missing"
echo "prometheus: $(prometheus --version 2>&1 | head -n 1)"
