"""`make chaos`: run issue 18's fault scenarios at full size against the real servers and write
the report, docs/reliability.md (regenerated from docs/reliability.json on every run).

    python -m tests.chaos.run_all                         every scenario, in the order below
    python -m tests.chaos.run_all --scenarios sigkill,api  a subset (CHAOS_SCENARIOS=... in make)
    python -m tests.chaos.run_all --render                re-render the report, run nothing

Each scenario is one pytest test marked `chaos`, run in its own pytest process (a crash or a
hang of one cannot take the others down; pytest-timeout bounds it). The test records its numbers
(tests/chaos/results.py); this runner adds what it saw itself: passed / failed / skipped (with
pytest's message), when, on which commit, how long. Results of scenarios not selected this time
stay in docs/reliability.json as they were measured, with their date and commit: the report
always says when and where each number comes from, and a scenario that never ran says
"not yet run". Nothing here writes a result a test did not produce.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "reliability.json"
REPORT = ROOT / "docs" / "reliability.md"


@dataclass(frozen=True)
class Scenario:
    name: str
    target: str  # pytest node id, relative to the repository root
    fault: str
    load: str
    checked: str
    timeout_s: int


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "sigkill",
        "tests/integration/test_chaos_sigkill.py::test_twenty_sigkills_during_a_million_entries",
        "20 worker SIGKILLs at random moments (2 workers share 6 partitions, killed in turn; "
        "2 kills also delete the data dir)",
        "1,000,000+ entries simulated at ~1,400/s, 3 lanes, 1% bad records, 2% duplicates",
        "rows, badges and folded session-delta frames equal `projector replay`; unread lost / counted "
        "twice; each live worker's local tables for the partitions it owns equal their changelogs",
        7200,
    ),
    Scenario(
        "broker-cluster",
        "tests/integration/test_chaos_brokers.py::test_full_size_cluster_leader_killed",
        "3-broker KRaft cluster (RF 3, min ISR 2): the leader of a mailbox-tail partition "
        "SIGKILLed mid-stream, restarted later",
        "simulated stream at a steady rate through the kill",
        "rows and badges equal replay; the killed broker back in the ISR; worker never exits",
        2400,
    ),
    Scenario(
        "broker-single",
        "tests/integration/test_chaos_brokers.py::test_full_size_single_broker_killed",
        "a private single-node Kafka (its own port and data) SIGKILLed mid-stream, down for a "
        "while, restarted",
        "simulated stream before and after the outage",
        "rows and badges equal replay; worker never exits",
        2400,
    ),
    Scenario(
        "redis-loss",
        "tests/integration/test_chaos_redis_loss.py::test_full_size_redis_loss",
        "a private Redis: FLUSHALL mid-stream, then a restart with no persistence",
        "simulated stream through both losses",
        "automatic restore: the projection equals replay again with no command run",
        2400,
    ),
    Scenario(
        "cassandra-cut",
        "tests/integration/test_chaos_links.py::test_full_size_cassandra_link_cut",
        "the worker's link to Cassandra cut for 60 s (Toxiproxy disabled; the shared "
        "Cassandra itself is not stopped)",
        "simulated stream at a steady rate through the cut; API polled every ~0.2 s",
        "worker keeps projecting during the cut; API answers 200 with the stored value or 503, "
        "never another count; mirror converges after (no row owed; UserConversationState equals "
        "replay's rows column by column; a rebuild from state differs from the live projection "
        "only where state cannot know: rows with a leave in their history); rows and badges "
        "equal replay",
        2400,
    ),
    Scenario(
        "toxics",
        "tests/integration/test_chaos_links.py::test_full_size_toxics_on_every_link",
        "Toxiproxy on each link (Kafka via a private broker advertising the proxy, Redis, "
        "Cassandra): 200 ms latency, a stall, connection resets",
        "simulated stream at a steady rate, one link poisoned at a time",
        "rows and badges equal replay; worker peak RSS bounded; worker never exits",
        3600,
    ),
    Scenario(
        "garbage",
        "tests/integration/test_garbage_worker.py::test_full_size_garbage_run",
        "100,000 fuzzed mailbox records (wrong types, 2^64 overflows, NaN, invalid UTF-8, "
        "1 MiB strings, deep nesting, wrong shapes)",
        "mixed at random places into ~40,000 valid records, 4 partitions, 3 lanes",
        "0 crashes / tracebacks; every bad record (and nothing else) dead-lettered with a "
        "reason; valid records' projection equals replay",
        3600,
    ),
    Scenario(
        "api-fuzz",
        "tests/integration/test_api_fuzz.py::test_full_size_api_fuzz",
        "schemathesis over every operation of /openapi.json (stateful links included), two "
        "users' real tokens",
        ">= 5,000 generated requests against a real `projector api`",
        "0 5xx, 0 schema violations, 0 cross-user reads, no traceback in the API log",
        3600,
    ),
    Scenario(
        "overload",
        "tests/integration/test_chaos_overload.py::test_full_size_twice_capacity",
        "offered load at 2x the worker's measured capacity for 5 minutes",
        "capacity measured first on a backlog, same machine, same run",
        "lag grows; worker RSS bounded; nothing crashes; catches up after; equals replay",
        3600,
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def _junit_outcome(path: Path) -> tuple[str, str]:
    """(passed | failed | skipped | error, pytest's message) from a one-test JUnit file."""
    if not path.exists():
        return "error", "pytest wrote no result (killed, or the test was not collected)"
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    if not cases:
        return "error", "no test collected (wrong node id?)"
    case = cases[0]
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            message = (found.get("message") or found.text or "").strip()
            return outcome, message.splitlines()[0][:400] if message else ""
    return "passed", ""


def run_scenario(scenario: Scenario, results: dict[str, Any], logs: Path) -> None:
    numbers_dir = Path(tempfile.mkdtemp(prefix=f"chaos-{scenario.name}-"))
    junit = numbers_dir / "junit.xml"
    log = logs / f"{scenario.name}.log"
    env = {**os.environ, "CHAOS_OUT": str(numbers_dir)}
    started = time.monotonic()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"== chaos {scenario.name}: {scenario.target} (log: {log})", flush=True)
    with log.open("wb") as out:
        try:
            done = subprocess.run(
                [
                    *(sys.executable, "-m", "pytest", "-q", "-s", "-m", "chaos", scenario.target),
                    *("-p", "no:cacheprovider", f"--junitxml={junit}"),
                    # Its own basetemp, kept until the scenario runs again: the streams, worker
                    # logs and replay files of a failed run stay there to be looked at.
                    f"--basetemp={logs / ('tmp-' + scenario.name)}",
                    f"--timeout={scenario.timeout_s}",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=scenario.timeout_s + 300,
                check=False,
            )
            outcome, message = _junit_outcome(junit)
            if done.returncode not in (0, 1) and outcome == "passed":
                outcome, message = "error", f"pytest exited {done.returncode}"
        except subprocess.TimeoutExpired:
            outcome, message = "error", f"no answer within {scenario.timeout_s + 300} s"
    numbers_file = numbers_dir / f"{scenario.name}.json"
    numbers = orjson.loads(numbers_file.read_bytes()) if numbers_file.exists() else {}
    results[scenario.name] = {
        "outcome": outcome,
        "message": message,
        "numbers": numbers,
        "when": when,
        "commit": _commit(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(f"== chaos {scenario.name}: {outcome} {message}".rstrip(), flush=True)


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:g}"
    if isinstance(value, dict):
        if value and all(isinstance(v, dict) for v in value.values()):  # one group per link, etc.
            return "; ".join(f"**{k}**: {_number(v)}" for k, v in value.items())
        return ", ".join(f"{str(k).replace('_', ' ')} {_number(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_number(v) for v in value)
    return str(value)


def render(results: dict[str, Any]) -> str:
    verdicts = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "skipped": "not run"}
    lines = [
        "# Reliability report (issue 18)",
        "",
        "Generated by `make chaos` (tests/chaos/run_all.py) from docs/reliability.json: do not",
        "edit by hand. Every number below was measured by the scenario's test on the real local",
        "servers (Kafka, Redis, Cassandra; a 2-core machine shared with other jobs), at the date",
        "and commit shown. `make chaos CHAOS_SCENARIOS=a,b` re-runs a subset; the rows of the",
        "others keep their last measurement. `make test` runs a small version of each scenario",
        "(listed at the end).",
        "",
        "| Scenario | Fault | Load | Checked | Result | Numbers |",
        "|---|---|---|---|---|---|",
    ]
    for s in SCENARIOS:
        got = results.get(s.name)
        if got is None:
            result, numbers = "not yet run", ""
        else:
            result = verdicts.get(got["outcome"], got["outcome"])
            if got["outcome"] == "skipped":
                result = f"not yet run: {got['message']}"
            elif got["outcome"] != "passed" and got["message"]:
                result += f": {got['message']}"
            shown = {k: v for k, v in got["numbers"].items() if k != "scale"}
            numbers = "; ".join(
                f"**{k}**: {_number(v)}" if isinstance(v, dict) else f"{k.replace('_', ' ')} {_number(v)}"
                for k, v in shown.items()
            )
            scale = got["numbers"].get("scale", 1)
            when = f"{got['when']}, {got['commit']}, {got['wall_s']:,.0f} s wall"
            if scale != 1:
                when += f", at {scale:g} of full size"
            result += f" ({when})"
        cells = [f"`{s.name}`", s.fault, s.load, s.checked, result, numbers]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    lines += [
        "",
        "## How to read it",
        "",
        "- A FAIL is a finding, not a broken run: the message is the test's own assertion, the",
        "  numbers are what it measured before it. Each scenario's pytest basetemp (streams, worker",
        "  logs, replay files) stays in .local/chaos/tmp-<scenario> until it runs again.",
        "- Cassandra is shared by every engineer's tests here, so it is never stopped: the worker's",
        "  (and the API's) link to it goes through Toxiproxy and is cut there (connections dropped,",
        "  new ones refused), which is what a client sees of a stopped node.",
        "- Lost / double counted: unread counts below / above replay's, summed over rows.",
        "- overload: capacity is measured in the same run on a backlog, but other jobs share the two",
        "  cores, so the rate the worker reaches in the window may differ from the capacity measured",
        "  minutes earlier (applied per s in window).",
        "",
        "## How each scenario runs",
        "",
    ]
    for s in SCENARIOS:
        lines.append(f"- `{s.name}`: `{s.target}` (timeout {s.timeout_s:,} s).")
    lines += [
        "",
        "## The small versions `make test` runs",
        "",
        "- sigkill: tests/integration/test_crash_safety.py (8 kills, 2 workers, ~20,000 records)",
        "- broker kill: tests/chaos/test_kafka_cluster.py (`make chaos-infra-check`: the cluster's "
        "own failover) and tests/integration/test_chaos_brokers.py's small private-broker run",
        "- Redis loss: tests/integration/test_chaos_redis_loss.py (runs once automatic restore "
        "is on main; skipped with the reason otherwise)",
        "- Cassandra cut and link toxics: tests/integration/test_chaos_links.py (one worker: Redis "
        "latency, stall and resets, then an 8 s Cassandra cut with the API polled and the "
        "mirror's convergence checked), tests/integration/test_worker_store_outage.py "
        "(Redis gone longer than the retry budget)",
        "- garbage: tests/integration/test_garbage_worker.py (3,000 fuzzed records)",
        "- API fuzz: tests/integration/test_api_fuzz.py (a few hundred requests)",
        "- overload: tests/integration/test_chaos_overload.py's small run",
        "",
    ]
    return "\n".join(lines)


def _load() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(RESULTS.read_bytes()) if RESULTS.exists() else {}
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default="", help="comma-separated names (default: all)")
    parser.add_argument("--render", action="store_true", help="only re-render the report")
    parser.add_argument("--logs", type=Path, default=ROOT / ".local" / "chaos")
    args = parser.parse_args(argv)
    wanted = [n.strip() for n in args.scenarios.split(",") if n.strip()] or [s.name for s in SCENARIOS]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    if not args.render:
        args.logs.mkdir(parents=True, exist_ok=True)
        for name in wanted:
            mine: dict[str, Any] = {}
            run_scenario(BY_NAME[name], mine, args.logs)
            # Read again and written after every scenario: a long run stopped half-way keeps what
            # it measured, and two runs of different scenarios side by side keep each other's.
            results = _load()
            results.update(mine)
            RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            REPORT.write_text(render(results))
    results = _load()
    REPORT.write_text(render(results))
    print(f"report: {REPORT.relative_to(ROOT)}")
    failed = [n for n in wanted if results.get(n, {}).get("outcome") in ("failed", "error")]
    return 1 if failed and not args.render else 0


if __name__ == "__main__":
    raise SystemExit(main())
