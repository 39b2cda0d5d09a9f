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
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "prometheus: promtool/prometheus are missing: install Debian's package with" \
        "sudo apt-get install -y --no-install-recommends prometheus" >&2
    exit 1
fi
mkdir -p "$LOCAL/prometheus"
log="$LOCAL/prometheus/apt.log"
# Keep the package's maintainer scripts from starting its daemon (on :9090, as the prometheus
# user): without systemd, invoke-rc.d would run the init script. Only a policy we created is
# removed again.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
fi
cleanup() { if [[ "$own_policy" == 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT
echo "prometheus: installing Debian's prometheus package (apt-get; log: $log)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "prometheus: apt-get install prometheus failed (log: $log)" >&2
    exit 1
fi
echo "prometheus: $(prometheus --version 2>&1 | head -n 1)"
