#!/usr/bin/env bash
# `make run` (after `make services-up`): create the schema and topics, then run the processing core
# on a small generated demo stream with `projector replay` and show where the outputs are.
# Placeholder until the worker lands: it will then feed the simulator's stream to `projector worker`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
OUT="$ROOT/.local/run/demo"

echo "==> projector bootstrap (Cassandra schema + Kafka topics, idempotent)"
"$PY" -m app.cli bootstrap

if ! "$PY" -m app.cli replay --help >/dev/null 2>&1; then
    echo "==> \`projector replay\` is not available yet: nothing more to run."
    exit 0
fi

mkdir -p "$OUT"
echo "==> generating a demo stream"
python3 scripts/demo_stream.py "$OUT/mailbox.jsonl"
echo "==> projector replay"
"$PY" -m app.cli replay --input "$OUT/mailbox.jsonl" --out "$OUT/result" --progress never

echo
echo "Outputs in $OUT/result:"
for f in stats.json projections.jsonl badges.jsonl deltas.jsonl; do
    [[ -f "$OUT/result/$f" ]] && printf '  %-18s %6s lines\n' "$f" "$(wc -l <"$OUT/result/$f")"
done
if [[ -f "$OUT/result/stats.json" ]]; then
    echo "stats: $(cat "$OUT/result/stats.json")"
fi
if [[ -f "$OUT/result/badges.jsonl" ]]; then
    echo "badges:"
    sed 's/^/  /' "$OUT/result/badges.jsonl"
fi
