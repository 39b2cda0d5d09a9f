# Sourced by the installers in scripts/tools.d/ whose tool comes in a Debian package that also
# ships a daemon (haproxy, prometheus): the tests run their own server on free ports, so the
# package's service must never start.
#
#   install_daemon_package LABEL PACKAGE MISSING
#
# Installs PACKAGE with apt-get (as root; log in $LOCAL/LABEL/apt.log) with a policy-rc.d that
# refuses every service start for the duration (without systemd, invoke-rc.d would run the init
# script); only a policy created here is removed again. Not root or no apt-get: says what is
# MISSING and how to install it, and exits 1. A failed install prints the log's tail and exits 1.

install_daemon_package() {
    local label="$1" package="$2" missing="$3"
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "$label: $missing: install Debian's package with" \
            "sudo apt-get install -y --no-install-recommends $package" >&2
        exit 1
    fi
    mkdir -p "$LOCAL/$label"
    local log="$LOCAL/$label/apt.log"
    local policy=/usr/sbin/policy-rc.d
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # the installer's exit, whichever way it ends
    fi
    echo "$label: installing Debian's $package package (apt-get; log: $log)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package"; } \
        >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "$label: apt-get install $package failed (log: $log)" >&2
        exit 1
    fi
}
