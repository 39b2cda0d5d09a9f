#!/usr/bin/env bash
# `make run` (after `make services-up`): create the schema and topics, then run the main job — a
# projector worker fed by the traffic simulator — and check its projection against replay.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"

echo "==> projector bootstrap (Cassandra schema + Kafka topics, idempotent)"
"$PY" -m app bootstrap
exec "$PY" scripts/run_demo.py "$@"
