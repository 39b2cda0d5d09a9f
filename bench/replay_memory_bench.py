"""Replay in bounded memory (issue 33, item 4): peak RSS of `projector replay --state-dir` on the
first 0.5M lines, the first 1M lines and all of a 200,000-user stream (5 conversations each,
groups of 4: 1M rows, then 2 messages per conversation fanned out to its members; ~3.5M lines),
for this checkout and for a baseline commit (default: the last one before the shared memtable
budget), side by side.

Each size runs both builds at once, each in its own process (`python -m app replay`, the code
from its own source tree: the baseline's is `git archive`d into the output folder); the peak RSS
is each process's own (wait4's ru_maxrss), the seconds share the cores. Reported per build: the
peak by size, the ratio of the whole stream's peak to the first 1M lines' (the target: within
1 +- 0.10, and the whole stream <= 300 MiB) and this checkout's peak over the baseline's; and
whether the two builds' outputs (deltas.jsonl: the frames, projections.jsonl, badges.jsonl,
stats.json) are byte-identical at every size.

    .venv/bin/python bench/replay_memory_bench.py [--stream FILE] [--baseline REF]
    (or `make bench-replay-memory`; ~15-25 min on 2 cores: not part of `make bench`)

The stream is written once into the output folder (bench/out/replaymem, RMBENCH_OUT moves it)
unless --stream names one; the prefixes are cut from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = Path(os.environ.get("RMBENCH_OUT", str(ROOT / "bench" / "out" / "replaymem")))
# main before the shared memtable budget (app/stores/rocks_tables.py MEMTABLE_BUDGET_BYTES)
BASELINE = "8d9a00f56c9880a455fd5cbc0deb922bd507af70"
OUTPUTS = ("deltas.jsonl", "projections.jsonl", "badges.jsonl", "stats.json")
MIB = 1 << 20


def log(message: str) -> None:
    print(f"[replay-memory-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def baseline_source(ref: str) -> Path:
    """The baseline commit's tree, extracted once into OUT/baseline-<commit>."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    folder = OUT / f"baseline-{commit[:12]}"
    if not (folder / "app" / "__main__.py").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def prefix(stream: Path, lines: int) -> Path:
    """The stream's first `lines` lines, written once next to the outputs."""
    path = OUT / f"{stream.stem}-first{lines}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(stream, "rb") as source, open(tmp, "wb") as out:
            out.writelines(islice(source, lines))
        tmp.rename(path)
    return path


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def run_side_by_side(
    commands: dict[str, tuple[list[str], Path]], timeout: float
) -> dict[str, dict[str, Any]]:
    """Start every command at once (argv, source tree: its cwd and PYTHONPATH); per command its
    exit code, seconds and peak RSS in bytes (of that process alone)."""
    started = time.perf_counter()
    procs = {}
    for name, (argv, source) in commands.items():
        env = {**os.environ, "PYTHONPATH": str(source)}
        procs[name] = subprocess.Popen(argv, cwd=source, env=env, stdout=subprocess.DEVNULL)
    results: dict[str, dict[str, Any]] = {}
    while len(results) < len(procs):
        for name, proc in procs.items():
            if name in results:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if not pid and time.perf_counter() - started > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
            if pid:
                results[name] = {
                    "exit": os.waitstatus_to_exitcode(status),
                    "seconds": round(time.perf_counter() - started, 1),
                    "peak_rss": usage.ru_maxrss * 1024,
                }
        time.sleep(0.2)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stream", type=Path, help="the whole stream (default: generated into the output folder)"
    )
    parser.add_argument(
        "--baseline", default=BASELINE, help="the commit to compare with (default: %(default)s)"
    )
    parser.add_argument(
        "--sizes", default="500000,1000000,all", help="lines of each run (default: %(default)s)"
    )
    parser.add_argument("--hot-rows", type=int, help="--hot-rows of both builds (default: replay's)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per size")
    parser.add_argument("--report", type=Path, default=OUT / "report.json")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)

    stream = args.stream
    if stream is None:
        from bench.state_bench import write_replay_stream

        stream = OUT / "replay-200000x5x2-g4.jsonl"
        if not stream.exists():
            log(f"writing the stream {stream}")
            tmp = stream.with_suffix(".tmp")
            write_replay_stream(tmp, users=200_000, conversations=5, group=4, messages=2)
            tmp.rename(stream)
    builds = {"baseline": baseline_source(args.baseline), "this": ROOT}
    log(f"baseline: {args.baseline} in {builds['baseline']}; this: {ROOT}")

    runs: dict[str, dict[str, Any]] = {}
    for size in args.sizes.split(","):
        source = stream if size == "all" else prefix(stream, int(size))
        commands = {}
        for build, tree in builds.items():
            out, state = OUT / f"out-{build}", OUT / f"state-{build}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
            argv = [sys.executable, "-m", "app", "replay", "--input", str(source), "--out", str(out)]
            argv += ["--state-dir", str(state), "--progress", "never"]
            if args.hot_rows is not None:
                argv += ["--hot-rows", str(args.hot_rows)]
            commands[build] = (argv, tree)
        log(f"{size} lines: both builds side by side")
        results = run_side_by_side(commands, args.timeout)
        digests = {}
        for build in builds:
            out = OUT / f"out-{build}"
            digests[build] = {name: file_digest(out / name) for name in OUTPUTS if (out / name).exists()}
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(OUT / f"state-{build}", ignore_errors=True)
            result = results[build]
            log(
                f"  {build}: exit {result['exit']}, {result['seconds']} s,"
                f" peak RSS {result['peak_rss'] / MIB:.0f} MiB"
            )
        identical = len(digests["this"]) == len(OUTPUTS) and digests["this"] == digests["baseline"]
        runs[size] = {"lines": _count_lines(source), "builds": results, "outputs_identical": identical}
        log(f"  outputs byte-identical: {identical}")

    report = {"baseline": args.baseline, "stream": str(stream), "runs": runs, "summary": summary(runs)}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print_report(runs, report["summary"])
    ok = all(
        run["outputs_identical"] and all(r["exit"] == 0 for r in run["builds"].values())
        for run in runs.values()
    )
    return 0 if ok else 1


def _count_lines(path: Path) -> int:
    with open(path, "rb") as source:
        return sum(block.count(b"\n") for block in iter(lambda: source.read(1 << 22), b""))


def summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per build: the whole stream's peak over the first 1M lines' (the growth with the log's
    length); this build's peak over the baseline's at every size."""
    out: dict[str, Any] = {}
    if "all" in runs and "1000000" in runs:
        out["all_over_1m"] = {
            build: round(
                runs["all"]["builds"][build]["peak_rss"] / runs["1000000"]["builds"][build]["peak_rss"], 3
            )
            for build in ("baseline", "this")
        }
    out["this_over_baseline"] = {
        size: round(run["builds"]["this"]["peak_rss"] / run["builds"]["baseline"]["peak_rss"], 3)
        for size, run in runs.items()
    }
    return out


def print_report(runs: dict[str, dict[str, Any]], summary: dict[str, Any]) -> None:
    print("projector replay --state-dir: peak RSS (MiB), side by side")
    print(f"  {'lines':>10} {'baseline':>9} {'this':>9} {'this/base':>9} {'identical outputs':>18}")
    for run in runs.values():
        base, this = (run["builds"][b]["peak_rss"] / MIB for b in ("baseline", "this"))
        print(
            f"  {run['lines']:>10,} {base:>9.0f} {this:>9.0f} {this / base:>9.3f}"
            f" {run['outputs_identical']!s:>18}"
        )
    if "all_over_1m" in summary:
        growth = summary["all_over_1m"]
        print(
            f"  all / first 1M lines: baseline {growth['baseline']:.3f}, this {growth['this']:.3f}"
            " (target 1 +- 0.10)"
        )
        this_all = runs["all"]["builds"]["this"]["peak_rss"] / MIB
        verdict = "met" if this_all <= 300 and abs(growth["this"] - 1) <= 0.10 else "NOT met"
        print(f"  target (all <= 300 MiB and within 10% of the first 1M lines'): {verdict}")


if __name__ == "__main__":
    sys.exit(main())
