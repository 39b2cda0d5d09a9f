"""Run the J-1 benchmark: replay vs the naive projector vs the decode-only ceiling, side by side.

With --compiled-site (a folder holding the mypyc-compiled build, `scripts/test_compiled.sh
--build-only`), the compiled replay (`replay_c`) runs as a fourth command in the same rotation,
its ratios are reported next to the pure build's, and its output files must be byte-identical
to the pure replay's (a difference fails the run).

Each repetition runs the three commands one after the other, in an order that rotates from one
repetition to the next, so machine noise (other jobs, frequency changes) hits all of them alike;
ratios are taken within a repetition and their median is reported. Each command is timed as a
whole process (wall clock) and its peak resident memory and CPU times come from the kernel's own
accounting of the finished process. They are read through /usr/bin/time when it is installed:
Linux starts a child's peak-RSS figure at its parent's resident size at the fork, so a command
forked straight from this (larger) Python process would report at least the harness's own size;
forked from the small `time` process it reports its own. Without /usr/bin/time the harness reads
os.wait4 and says so in the notes.

Reports entries/s for each command (entries = mailbox entries in the stream, markers excluded),
peak RSS, the write ratio (naive writes / replay projection_writes), the speed ratios, and the J-1
verdict from the replay's stats.json (max_writes_per_user_conversation <= ceil(span/window) + 1,
compression_ratio >= messages / that bound, i.e. <= 11 and >= 90 for the J-1 stream).
Prints a table and writes a JSON report. Exit status 1 if a command failed or J-1 does not hold.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    command: str
    rep: int
    wall_s: float
    user_s: float
    sys_s: float
    peak_rss_kib: int
    exit_code: int
    stdout: str
    stderr_tail: str


TIME = Path("/usr/bin/time")


def timed(
    name: str, rep: int, argv: list[str], timeout_s: float, log_dir: Path, env: dict[str, str] | None = None
) -> Run:
    out_path = log_dir / f"{name}.{rep}.out"
    err_path = log_dir / f"{name}.{rep}.err"
    usage_path = log_dir / f"{name}.{rep}.usage"
    via_time = TIME.exists()
    if via_time:
        # user s, sys s, peak RSS KiB, exit status of the command
        argv = [str(TIME), "-o", str(usage_path), "-f", "%U %S %M %x", *argv]
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, env=env)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
    exit_code = os.waitstatus_to_exitcode(status)
    proc.returncode = exit_code  # reaped here, so Popen must not wait for it again
    user_s, sys_s, peak_kib = usage.ru_utime, usage.ru_stime, usage.ru_maxrss
    if via_time:
        fields = usage_path.read_text().split()
        # `time` writes "Command exited with non-zero status N" first when the command fails.
        if len(fields) >= 4:
            user_s, sys_s = float(fields[-4]), float(fields[-3])
            peak_kib, exit_code = int(fields[-2]), int(fields[-1])
    stderr = err_path.read_text(errors="replace")
    return Run(
        command=name,
        rep=rep,
        wall_s=wall,
        user_s=user_s,
        sys_s=sys_s,
        peak_rss_kib=peak_kib,
        exit_code=exit_code,
        stdout=out_path.read_text(errors="replace"),
        stderr_tail=stderr[-2000:],
    )


def projector_argv() -> list[str]:
    script = Path(sys.executable).parent / "projector"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "app"]


def replay_available() -> tuple[bool, str]:
    probe = subprocess.run(
        [*projector_argv(), "replay", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.returncode == 0, (probe.stderr or probe.stdout).strip()[-500:]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (NaN for no values): the one rule every bench's p50/p99 uses."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def baseline_settings(text: str) -> dict[str, str]:
    """`K=V,K=V` from a bench's `--baseline` option: the settings of its side-by-side run."""
    settings: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--baseline: {part!r} is not NAME=VALUE")
        settings[name.strip()] = value.strip()
    return settings


def summarize(runs: list[Run], entries: int) -> dict[str, object]:
    walls = [r.wall_s for r in runs]
    med = median(walls)
    cpu = median([r.user_s + r.sys_s for r in runs])
    return {
        "runs": len(runs),
        "wall_s": {"min": min(walls), "median": med, "max": max(walls)},
        "cpu_s_median": cpu,
        "entries_per_s": entries / med if med > 0 else math.nan,
        # CPU time is what the command itself spent: less sensitive to a busy machine than wall.
        "entries_per_cpu_s": entries / cpu if cpu > 0 else math.nan,
        "peak_rss_mib": max(r.peak_rss_kib for r in runs) / 1024,
    }


def pairwise(runs: list[Run], slow: str, fast: str, *, cpu: bool = False) -> float:
    """Median over repetitions of time(fast)/time(slow): slow's speed as a fraction of fast's."""
    by_rep: dict[int, dict[str, float]] = {}
    for r in runs:
        by_rep.setdefault(r.rep, {})[r.command] = r.user_s + r.sys_s if cpu else r.wall_s
    ratios = [t[fast] / t[slow] for t in by_rep.values() if slow in t and fast in t and t[slow]]
    return median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, default=Path("bench/out/j1.jsonl"))
    parser.add_argument("--meta", type=Path, default=Path("bench/out/j1.meta.json"))
    parser.add_argument("--replay-out", type=Path, default=Path("bench/out/replay"))
    parser.add_argument("--report", type=Path, default=Path("bench/out/report.json"))
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument(
        "--compiled-site", type=Path, default=None, help="folder of the compiled build: run it too (replay_c)"
    )
    args = parser.parse_args(argv)

    meta = orjson.loads(args.meta.read_bytes())
    entries: int = meta["entries"]
    log_dir = args.report.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    commands: dict[str, list[str]] = {}
    notes: list[str] = []
    if not args.skip_replay:
        ok, why = replay_available()
        if ok:
            commands["replay"] = [
                *projector_argv(),
                "replay",
                "--input",
                str(args.input),
                "--out",
                str(args.replay_out),
                "--lanes",
                str(args.lanes),
                "--window-ms",
                str(args.window_ms),
            ]
        else:
            notes.append(f"replay not available (`projector replay --help` failed): {why}")
    envs: dict[str, dict[str, str]] = {}
    compiled_out = args.replay_out.with_name(args.replay_out.name + "-compiled")
    if "replay" in commands and args.compiled_site is not None:
        # `python -P -m app` with the compiled build first on the path: the installed `projector`
        # script would run the editable (pure) package, and without -P `-m` puts the working
        # directory (this checkout, pure too) before PYTHONPATH.
        envs["replay_c"] = {**os.environ, "PYTHONPATH": str(args.compiled_site.resolve())}
        commands["replay_c"] = [sys.executable, "-P", "-m", "app", *commands["replay"][1:]]
        commands["replay_c"][commands["replay_c"].index("--out") + 1] = str(compiled_out)
    commands["naive"] = [sys.executable, "bench/naive_projector.py", "--input", str(args.input)]
    commands["ceiling"] = [sys.executable, "bench/ceiling.py", "--input", str(args.input)]

    names = list(commands)
    # Warm the page cache so the first command measured does not pay for the disk.
    with args.input.open("rb") as fp:
        while fp.read(1 << 20):
            pass
    if not TIME.exists():
        notes.append(
            f"{TIME} not found: peak RSS read with os.wait4 includes the harness's own size "
            f"({resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB) as a floor"
        )
    runs: list[Run] = []
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            run = timed(name, rep, commands[name], args.timeout, log_dir, envs.get(name))
            print(
                f"  rep {rep + 1}/{args.reps} {name:8s} {run.wall_s:8.2f} s "
                f"rss {run.peak_rss_kib / 1024:7.1f} MiB exit {run.exit_code}",
                file=sys.stderr,
                flush=True,
            )
            runs.append(run)

    failed = [r for r in runs if r.exit_code != 0]
    for r in failed:
        notes.append(f"{r.command} rep {r.rep} exited {r.exit_code}: {r.stderr_tail[-400:]}")
    ok_runs = [r for r in runs if r.exit_code == 0]
    summary = {
        name: summarize([r for r in ok_runs if r.command == name], entries)
        for name in names
        if any(r.command == name for r in ok_runs)
    }

    report: dict[str, object] = {
        "stream": meta,
        "commands": {name: " ".join(argv) for name, argv in commands.items()},
        "summary": summary,
        "runs": [{k: v for k, v in asdict(r).items() if k != "stdout"} for r in runs],
        "notes": notes,
    }

    naive_stats = next((orjson.loads(r.stdout) for r in ok_runs if r.command == "naive"), None)
    replay_stats = None
    stats_path = args.replay_out / "stats.json"
    if "replay" in summary and stats_path.exists():
        replay_stats = orjson.loads(stats_path.read_bytes())
    report["naive_stats"] = naive_stats
    report["replay_stats"] = replay_stats

    ratios: dict[str, float] = {}
    pairs = [("replay", "ceiling"), ("replay", "naive"), ("naive", "ceiling")]
    pairs += [("replay_c", "ceiling"), ("replay", "replay_c")]
    for slow, fast in pairs:
        if slow in summary and fast in summary:
            ratios[f"speed_{slow}_over_{fast}"] = pairwise(ok_runs, slow, fast)
            ratios[f"cpu_speed_{slow}_over_{fast}"] = pairwise(ok_runs, slow, fast, cpu=True)
    if naive_stats and replay_stats and replay_stats.get("projection_writes"):
        ratios["writes_naive_over_replay"] = (
            naive_stats["projection_writes"] / replay_stats["projection_writes"]
        )
    report["ratios"] = ratios
    compiled_same = None
    if "replay_c" in summary and "replay" in summary:
        compiled_same = all(
            (args.replay_out / name).read_bytes() == (compiled_out / name).read_bytes()
            for name in ("deltas.jsonl", "projections.jsonl", "badges.jsonl", "stats.json")
        )
        report["compiled_outputs_identical"] = compiled_same
        if not compiled_same:
            notes.append(f"the compiled replay's output differs from the pure one's ({compiled_out})")

    j1: dict[str, object] | None = None
    if replay_stats is not None:
        bound = math.ceil(meta["span_ms"] / args.window_ms) + 1
        min_ratio = math.floor(meta["params"]["messages"] / bound)
        # The fast lane (docs/contract.md §10): the stream's mentions flush their users at once,
        # so the bound is on the window's writes: ceil(span / window) + 1 + each row's fast
        # flushes. Compression stays all writes' (the fast ones included).
        max_writes = replay_stats.get("max_window_writes_per_user_conversation")
        fast_writes = replay_stats.get("fast_writes", 0)
        compression = replay_stats.get("compression_ratio")
        j1 = {
            "max_window_writes_per_user_conversation": max_writes,
            "max_writes_per_user_conversation": replay_stats.get("max_writes_per_user_conversation"),
            "fast_flushes": replay_stats.get("fast_flushes"),
            "fast_writes": fast_writes,
            "bound": bound,
            "compression_ratio": compression,
            "min_compression_ratio": min_ratio,
            "applied": replay_stats.get("applied"),
            "pending": replay_stats.get("pending"),
            "passed": isinstance(max_writes, int)
            and max_writes <= bound
            and isinstance(compression, int | float)
            and compression >= min_ratio
            and replay_stats.get("applied") == entries,
        }
    report["j1"] = j1

    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print_table(report, entries, args.reps)
    print(f"report: {args.report}")
    if failed or (j1 is not None and not j1["passed"]) or compiled_same is False:
        return 1
    return 0


def print_table(report: dict[str, object], entries: int, reps: int) -> None:
    summary = report["summary"]
    assert isinstance(summary, dict)
    print()
    print(f"J-1 stream: {entries:,} entries; {reps} interleaved repetitions (median)")
    print(
        f"{'command':10s} {'entries/s':>10s} {'per cpu s':>10s} {'wall s min/med/max':>22s}"
        f" {'cpu s':>7s} {'peak RSS MiB':>13s}"
    )
    for name, s in summary.items():
        wall = s["wall_s"]
        print(
            f"{name:10s} {s['entries_per_s']:10,.0f} {s['entries_per_cpu_s']:10,.0f} "
            f"{wall['min']:6.2f}/{wall['median']:6.2f}/{wall['max']:6.2f}"
            f" {s['cpu_s_median']:7.2f} {s['peak_rss_mib']:13.1f}"
        )
    ratios = report["ratios"]
    assert isinstance(ratios, dict)
    for key, value in ratios.items():
        print(f"{key:32s} {value:10.3f}")
    j1 = report["j1"]
    if isinstance(j1, dict):
        verdict = "PASS" if j1["passed"] else "FAIL"
        print(
            f"J-1 {verdict}: max_window_writes_per_user_conversation="
            f"{j1['max_window_writes_per_user_conversation']}"
            f" (<= {j1['bound']}; all writes {j1['max_writes_per_user_conversation']},"
            f" fast flushes {j1['fast_flushes']}), compression_ratio={j1['compression_ratio']}"
            f" (>= {j1['min_compression_ratio']}), applied={j1['applied']}, pending={j1['pending']}"
        )
    if "compiled_outputs_identical" in report:
        same = report["compiled_outputs_identical"]
        print(f"compiled replay's output {'identical to' if same else 'DIFFERS from'} the pure one's")
    notes = report["notes"]
    assert isinstance(notes, list)
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
