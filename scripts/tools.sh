#!/usr/bin/env bash
# Extra tools the test suite needs beyond the three servers (a browser, promtool, proxies, ...).
#
#   scripts/tools.sh            run every installer in scripts/tools.d/ (idempotent, quick when done)
#   scripts/tools.sh NAME ...   run only scripts/tools.d/NAME.sh
#
# Each installer is a bash file that installs what is missing (Debian packages with apt-get when
# running as root; PyPI/npm/Go modules into the checkout's .venv or .local/) and prints one line.
# Nothing is assumed pre-installed: CI runs these on a fresh machine through `make test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
export LOCAL="$ROOT/.local"
mkdir -p "$LOCAL"
shopt -s nullglob
if [[ $# -gt 0 ]]; then
    installers=()
    for name in "$@"; do installers+=("$ROOT/scripts/tools.d/$name.sh"); done
else
    installers=("$ROOT"/scripts/tools.d/*.sh)
fi
for installer in "${installers[@]}"; do
    [[ -f "$installer" ]] || { echo "tools.sh: no installer $installer" >&2; exit 2; }
    bash "$installer"
done
