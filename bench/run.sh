#!/usr/bin/env bash
# `make bench`: generate the J-1 stream once, then time replay / naive projector / decode ceiling
# side by side (interleaved repetitions) and report entries/s, peak RSS, write and speed ratios
# and the J-1 verdict. Sizes and repetitions come from the environment:
#   BENCH_MEMBERS (1000) BENCH_MESSAGES (1000) BENCH_LANES (4) BENCH_REPS (3) BENCH_TIMEOUT (1800 s/run)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
OUT=bench/out
MEMBERS=${BENCH_MEMBERS:-1000}
MESSAGES=${BENCH_MESSAGES:-1000}
LANES=${BENCH_LANES:-4}
REPS=${BENCH_REPS:-3}
TIMEOUT=${BENCH_TIMEOUT:-1800}

mkdir -p "$OUT"
"$PY" bench/gen_j1.py --members "$MEMBERS" --messages "$MESSAGES" --lanes "$LANES" \
    --out "$OUT/j1.jsonl" --meta "$OUT/j1.meta.json"
exec "$PY" bench/harness.py --input "$OUT/j1.jsonl" --meta "$OUT/j1.meta.json" \
    --replay-out "$OUT/replay" --report "$OUT/report.json" \
    --lanes "$LANES" --window-ms 5000 --reps "$REPS" --timeout "$TIMEOUT" "$@"
