"""`projector replay`: a file (or stdin) of mailbox entries → projections, badges, deltas, stats."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from app.cli.args import (
    add_progress_argument,
    int_in,
    non_negative_int,
    positive_int,
    progress_shown,
    scratch_folder_problem,
)
from app.domain.conversation import ROW_BYTES
from app.domain.fast_lane import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_MAX_MEMBERS_MAX,
    FAST_LANE_MAX_MEMBERS_MIN,
    FAST_LANE_PER_USER_PER_S,
    FAST_LANE_PER_USER_PER_S_MAX,
    FAST_LANE_PER_USER_PER_S_MIN,
)
from app.replay import Frame, Replayer, ReplayOptions
from app.replay.driver import DEFAULT_HOT_ROWS
from app.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, metavar="FILE|-", help="JSON-lines entries; - for stdin")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    parser.add_argument(
        "--lanes", type=positive_int, default=1, metavar="N", help="mailbox write lanes (default 1)"
    )
    parser.add_argument(
        "--window-ms",
        type=non_negative_int,
        default=5000,
        metavar="MS",
        help="projection_compaction_window on entry ts (default 5000)",
    )
    parser.add_argument(
        "--max-dirty-rows",
        type=non_negative_int,
        default=100_000,
        metavar="N",
        help="flush early when more dirty rows are held (default 100000)",
    )
    parser.add_argument(
        "--fast-lane-max-members",
        type=int_in(FAST_LANE_MAX_MEMBERS_MIN, FAST_LANE_MAX_MEMBERS_MAX),
        default=FAST_LANE_MAX_MEMBERS,
        metavar="N",
        help="fast lane: a message whose member_count is at most N flushes its user at once "
        f"(docs/contract.md §10; default {FAST_LANE_MAX_MEMBERS}: direct messages)",
    )
    parser.add_argument(
        "--fast-lane-per-user-per-s",
        type=int_in(FAST_LANE_PER_USER_PER_S_MIN, FAST_LANE_PER_USER_PER_S_MAX),
        default=FAST_LANE_PER_USER_PER_S,
        metavar="N",
        help="fast lane: at most N fast flushes per user and second of entry ts, beyond them the "
        f"window (default {FAST_LANE_PER_USER_PER_S}; 0: no fast lane)",
    )
    parser.add_argument(
        "--include-muted", action="store_true", help="count muted conversations in total_unread"
    )
    parser.add_argument(
        "--badge-mode",
        choices=("messages", "conversations"),
        default="messages",
        help="the badge mode of users who sent no badge_preferences entry (docs/contract.md §10)",
    )
    add_progress_argument(parser)
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the state in RocksDB in DIR (new or empty; scratch space for this run) and only a "
        "bounded hot set in memory: replay a log of any size (default: all in memory)",
    )
    parser.add_argument(
        "--hot-rows",
        type=positive_int,
        default=DEFAULT_HOT_ROWS,
        metavar="N",
        help=f"with --state-dir: rows kept in memory at most (default {DEFAULT_HOT_ROWS})",
    )
    parser.add_argument(
        "--hot-mib",
        type=positive_int,
        metavar="MIB",
        help="with --state-dir: MiB of rows kept in memory at most, estimated per row (default: what "
        f"--hot-rows rows without messages take, {ROW_BYTES} bytes each)",
    )


class _Progress:
    """A one-line progress indicator on stderr for long inputs."""

    def __init__(self, total_bytes: int | None, enabled: bool) -> None:
        self.total = total_bytes
        self.enabled = enabled
        self.started = time.monotonic()
        self.last = 0.0

    def update(self, lines: int, done_bytes: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.5:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        text = f"\rreplay: {lines:,} lines, {lines / elapsed:,.0f}/s"
        if self.total:
            share = done_bytes / self.total
            eta = elapsed / share - elapsed if share > 0 else 0.0
            text += f", {share:6.1%}, ETA {eta:5.0f}s"
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _chunks(stream: IO[bytes], size: int = 1 << 20) -> Iterator[list[bytes]]:
    """Lines in chunks of about `size` bytes (whole lines), so progress is updated per chunk
    rather than per line; `readlines` splits them in C instead of a Python loop per line."""
    while chunk := stream.readlines(size):
        yield chunk


def run(settings: Settings, args: argparse.Namespace) -> int:
    # The hot loop allocates many short-lived tuples and almost no reference cycles; the default
    # GC thresholds would rescan the growing state every few hundred allocations.
    gc.set_threshold(200_000, 50, 100)
    options = ReplayOptions(
        lanes=args.lanes,
        window_ms=args.window_ms,
        max_dirty_rows=args.max_dirty_rows,
        include_muted=args.include_muted,
        badge_mode=args.badge_mode,
        fast_lane_max_members=args.fast_lane_max_members,
        fast_lane_per_user_per_s=args.fast_lane_per_user_per_s,
    )
    if args.state_dir:
        problem = scratch_folder_problem(Path(args.state_dir))
        if problem:
            print(f"projector replay: --state-dir {args.state_dir}: {problem}", file=sys.stderr)
            return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"projector replay: cannot create output folder {out}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        source: IO[bytes] = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"projector replay: cannot read input {args.input}: {exc.strerror}", file=sys.stderr)
        return 1
    total = None
    if args.input != "-":
        try:
            total = os.fstat(source.fileno()).st_size
        except OSError:
            total = None
    show = progress_shown(args.progress)
    progress = _Progress(total, show)
    try:
        with source, open(out / "deltas.jsonl", "wb") as deltas:

            def write_frame(frame: Frame) -> None:
                deltas.write(orjson.dumps(frame, option=orjson.OPT_APPEND_NEWLINE))

            state_dir = Path(args.state_dir) if args.state_dir else None
            hot_bytes = args.hot_mib << 20 if args.hot_mib is not None else None
            replayer = Replayer(
                options, write_frame, state_dir=state_dir, hot_rows=args.hot_rows, hot_bytes=hot_bytes
            )
            lines = done = 0
            try:
                for chunk in _chunks(source):
                    lines += replayer.feed_many(chunk)
                    done += sum(map(len, chunk))
                    progress.update(lines, done)
            except OSError as exc:
                print(f"\nprojector replay: error reading {args.input}: {exc.strerror}", file=sys.stderr)
                return 1
            result = replayer.finish(lazy=True)
            progress.update(lines, done, force=True)
            progress.close()
    except OSError as exc:
        print(f"projector replay: cannot write to {out}: {exc.strerror}", file=sys.stderr)
        return 1
    _write_jsonl(out / "projections.jsonl", result.projections)
    _write_jsonl(out / "badges.jsonl", result.badges)
    (out / "stats.json").write_bytes(orjson.dumps(result.stats, option=orjson.OPT_INDENT_2))
    stats = result.stats
    if stats["dead_letters"]:
        shown = result.dead_letter_reasons[:5]
        print(
            f"projector replay: {stats['dead_letters']} bad line(s) counted as dead letters; first: "
            + "; ".join(shown),
            file=sys.stderr,
        )
    arrivals = replayer.processor.arrivals
    if arrivals.conflicting:
        # Not in stats.json (its keys are the contract's). The input is read as ONE partition's
        # log; copies of one marker with different counts are several partitions' logs merged,
        # whose per-partition counts say nothing about the whole file (reporting a difference
        # would be a false loss: `make run` once printed "3915 entries missing" for none).
        print(
            "projector replay: markers' counts not checked: one marker came with different counts "
            "(the input merges several partitions' logs, e.g. simulate --out with several "
            "partitions; each count is one partition's)",
            file=sys.stderr,
        )
    elif arrivals.checked:
        missing = arrivals.missing_by_lane()
        detail = ", ".join(f"lane {lane}: {n}" for lane, n in enumerate(missing) if n)
        print(
            f"projector replay: markers' counts: {sum(missing)} entries missing"
            + (f" ({detail})" if detail else ""),
            file=sys.stderr,
        )
    print(
        f"replayed {stats['entries']} entries: applied {stats['applied']}, duplicates "
        f"{stats['duplicates']}, dead letters {stats['dead_letters']}, pending {stats['pending']}, "
        f"{stats['flushes']} flushes, {stats['projection_writes']} projection writes → {out}",
        file=sys.stderr,
    )
    return 0


def _write_jsonl(path: Path, items: Iterable[dict[str, Any]]) -> None:
    with open(path, "wb") as handle:
        for item in items:
            handle.write(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE))
