"""The worker bench (bench/worker_bench.py) runs end to end at toy size and writes its report.

Timings are never asserted: only that every contender ran, the worker's frames reached every
user's last mailbox_seq, and the report holds the figures `make bench` prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_worker_bench_toy_run_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "worker_report.json"
    options = {
        "--users": "40",
        "--conversations": "8",
        "--group-size": "15",
        "--messages": "60",
        "--marker-every": "50",
        # ~1,000 entries: in the product's batches (20,000 records) the whole run would be one
        # batch, and a batch's reactions to both probes come at once.
        "--worker-batch-records": "100",
        "--reps": "1",
        "--latency-seconds": "2",
        "--latency-loads": "",
        "--latency-fixed-rates": "200",
        # and one phase at half of what the worker does with the latency window (worker-lw)
        "--latency-lw-loads": "0.5",
        "--latency-contenders": "worker",
        # every phase twice: the report's summary line per phase is the median of its runs
        "--latency-reps": "2",
        # the worker of a commit as a contender of its own (before/after in one run)
        "--base-ref": "HEAD",
        "--timeout": "180",
        "--report": str(report),
        "--work-dir": str(tmp_path / "work"),
    }
    done = subprocess.run(
        [sys.executable, "bench/worker_bench.py", *(part for pair in options.items() for part in pair)],
        cwd=ROOT,
        capture_output=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    assert b"worker_over_naive" in done.stdout and b"latency worker" in done.stdout
    data = orjson.loads(report.read_bytes())
    assert data["stream"]["entries"] > 0
    assert set(data["summary"]) == {
        "worker",
        "aiokafka",
        "naive",
        "worker-gcoff",
        "worker-base",
        "worker-lw",
    }
    for figures in data["summary"].values():
        assert figures["runs"] == 1 and figures["entries_per_s"]["median"] > 0
    assert {
        "worker_over_naive",
        "worker_over_aiokafka",
        "cpu_worker_over_aiokafka",
        "worker_over_worker_base",
        "worker_over_worker_gcoff",
    } <= set(data["ratios"])
    for name in ("worker", "worker-gcoff", "worker-base", "worker-lw"):
        worker_run = next(r for r in data["runs"] if r["contender"] == name)
        assert worker_run["ok"] and worker_run["extra"]["all_users_reached_last_seq"]
    # The GC's cost is measured in the worker's own log line, tuned and not (Python's thresholds).
    tuned = next(r for r in data["runs"] if r["contender"] == "worker")["extra"]["gc"]
    plain = next(r for r in data["runs"] if r["contender"] == "worker-gcoff")["extra"]["gc"]
    assert tuned["thresholds"].startswith("50000/") and plain["thresholds"] == "700/10/10"
    assert tuned["frozen"] > 0 and plain["frozen"] == 0
    assert [lat["rep"] for lat in data["latencies"]] == [0, 0, 1, 1]
    at_window, fixed = data["latencies"][:2]
    assert fixed["contender"] == "worker" and fixed["rate_entries_per_s"] == 200
    lw_rate = data["summary"]["worker-lw"]["entries_per_s"]["median"]
    assert at_window["rate_chosen"].startswith("0.5 x worker-lw")
    assert at_window["rate_entries_per_s"] == pytest.approx(max(100.0, 0.5 * lw_rate))
    for latency in data["latencies"]:
        assert latency["window_ms"] == 100 and latency["entries"] > 0
        assert 0 <= latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    # one summary line per phase, over both of its runs, at the rate both ran at
    summary = data["latency_summary"]
    assert [(line["rate_entries_per_s"], line["runs"]) for line in summary] == [
        (at_window["rate_entries_per_s"], 2),
        (200, 2),
    ]
    assert b"median of 2 run(s)" in done.stdout
    # everything private to the run is gone
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())
