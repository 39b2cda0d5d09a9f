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
# The compiled build (issue 14) runs as a fourth command when it can be built (BENCH_COMPILED=0
# skips it): scripts/test_compiled.sh builds it once per code change into build/compiled/site.
compiled=()
if [ "${BENCH_COMPILED:-1}" != 0 ]; then
    if bash scripts/test_compiled.sh --build-only; then
        compiled=(--compiled-site build/compiled/site)
    else
        echo "bench: the compiled build is not available: the pure build runs alone" >&2
    fi
fi
"$PY" bench/gen_j1.py --members "$MEMBERS" --messages "$MESSAGES" --lanes "$LANES" \
    --out "$OUT/j1.jsonl" --meta "$OUT/j1.meta.json"
status=0
"$PY" bench/harness.py --input "$OUT/j1.jsonl" --meta "$OUT/j1.meta.json" \
    --replay-out "$OUT/replay" --report "$OUT/report.json" \
    --lanes "$LANES" --window-ms 5000 --reps "$REPS" --timeout "$TIMEOUT" "${compiled[@]}" "$@" || status=$?

# Worker bench (issue #4): `projector worker` vs a plain aiokafka loop vs a naive faust agent on
# the real Kafka (servers must be up: `make services-up`); sizes from WBENCH_* (bench/README.md).
# BENCH_WORKER=0 skips it.
if [ "${BENCH_WORKER:-1}" != 0 ]; then
    bash scripts/services.sh up >/dev/null
    "$PY" bench/worker_bench.py --reps "${WBENCH_REPS:-$REPS}" "${compiled[@]}" || status=$?
fi
# Live push gateway bench (issue 16): delivery latency produce -> SDK event (worker window
# 100 ms), idle SSE connections held by one gateway process, fan-out frames/s; each next to a
# plain Kafka consumer / the process before the connections (bench/README.md). Sizes from
# GBENCH_* ; BENCH_GATEWAY=0 skips it.
if [ "${BENCH_GATEWAY:-1}" != 0 ]; then
    bash scripts/services.sh up >/dev/null
    "$PY" bench/gateway_bench.py || status=$?
fi
# State beyond memory (issue 13): the worker's core owning 10,000,000 generated rows (generated
# once into bench/out/state/, reused) vs a small fully resident state, restart to first batch vs
# an empty state, memory per hot row, replay with --state-dir (bench/README.md). No servers.
# Sizes from SBENCH_*; BENCH_STATE=0 skips it.
if [ "${BENCH_STATE:-1}" != 0 ]; then
    "$PY" bench/state_bench.py || status=$?
fi
# One persist (issue 31): the checkpointed append (one changelog round trip) vs the four-step
# commit it replaced (four acknowledged round trips), side by side on the real broker; a flush
# cycle's worth of state at 4,000 entries/s and the 5 s window. BENCH_PERSIST=0 skips it.
if [ "${BENCH_PERSIST:-1}" != 0 ]; then
    bash scripts/services.sh up >/dev/null
    PYTHONPATH=. "$PY" bench/durable_persist_bench.py --reps "${PBENCH_REPS:-40}" || status=$?
fi
# The product's mix (issue 33 item 5): the worker at the 5 s window fed group traffic at 0.5 x its
# capacity (measured side by side on a backlog, with and without a stream of direct messages and
# mentions), `projector api` with its gateway, SDK streams over SSE: fast-lane and group entries
# produced -> SDK event, J-1 of the group rows (bench/README.md). ~3 minutes; sizes from MBENCH_*;
# BENCH_MIX=0 skips it (alone: `make bench-mix`).
if [ "${BENCH_MIX:-1}" != 0 ]; then
    bash scripts/services.sh up >/dev/null
    "$PY" bench/mix_bench.py || status=$?
fi
exit "$status"
