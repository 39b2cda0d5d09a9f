"""`projector simulate`: realistic mailbox traffic for the running system (app/simulate/workload.py
generates it, app/simulate/drive.py sends it)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import IO

from app.cli.args import (
    add_progress_argument,
    non_negative_float,
    non_negative_int,
    probability,
    progress_shown,
)
from app.settings import Settings
from app.simulate.drive import Report, SimulateError, simulate
from app.simulate.workload import Mix, SimParams

# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--users", type=non_negative_int, default=200, metavar="N", help="users (default 200)"
    )
    parser.add_argument(
        "--conversations",
        type=non_negative_int,
        default=50,
        metavar="M",
        help="conversations: every 10th a big group, half of the rest 1:1 chats (default 50)",
    )
    parser.add_argument(
        "--group-size",
        type=non_negative_int,
        default=100,
        metavar="N",
        help="members of a big group, capped at --users (default 100)",
    )
    parser.add_argument(
        "--messages",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="messages to send; 0 = no limit (stop with --duration or Ctrl-C) (default 1000)",
    )
    parser.add_argument(
        "--duration",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="stop after S seconds (0 = no limit)",
    )
    parser.add_argument(
        "--rate",
        type=non_negative_float,
        default=100.0,
        metavar="MSG/S",
        help="messages per second; 0 = as fast as possible (default 100)",
    )
    parser.add_argument(
        "--lanes",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="mailbox write lanes (default: PROJECTOR_LANES, i.e. ProcessingSettings.lanes)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="random seed: same seed, same traffic (default 1)"
    )
    parser.add_argument(
        "--start-ms",
        type=non_negative_int,
        default=None,
        metavar="MS",
        help="event time (ts) of the first batch; default now (fixed + --no-kafka: identical --out per seed)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="also write every produced record (markers too, once per partition) as JSON lines",
    )
    parser.add_argument(
        "--bad-records",
        type=probability,
        default=0.0,
        metavar="P",
        help="chance per message of a bad record the worker must dead-letter (default 0)",
    )
    parser.add_argument(
        "--markers",
        type=probability,
        default=0.0,
        metavar="SHARE",
        help="share of users who mark conversations unread (docs/contract.md §10; default 0)",
    )
    parser.add_argument(
        "--badge-conversations",
        type=probability,
        default=0.0,
        metavar="SHARE",
        help="share of users who choose the 'conversations' badge mode (§10; default 0)",
    )
    parser.add_argument(
        "--badge-messages",
        type=probability,
        default=0.0,
        metavar="SHARE",
        help="share of users who choose the 'messages' badge mode explicitly (§10; default 0)",
    )
    parser.add_argument(
        "--duplicates",
        type=probability,
        default=0.0,
        metavar="P",
        help="chance per message of a lane writing an entry twice (a retry; default 0)",
    )
    parser.add_argument(
        "--drop-entries",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="leave N entries out on purpose (every 97th, counted by their lane's watermark "
        "markers but never sent nor written to --out): a loss the workers must report as "
        "projector_entries_missing (default 0)",
    )
    parser.add_argument(
        "--lane-lag-ms",
        type=non_negative_int,
        default=0,
        metavar="MS",
        help="hold lane 0's watermark markers back MS after its entries (a slow mailbox writer: "
        "the other lanes' entries wait above the watermark meanwhile; default 0)",
    )
    parser.add_argument(
        "--member-notices",
        action="store_true",
        help="follow every join/leave in a group with a member notification to its members "
        "(a message with `notification` 24 or 27: docs/contract.md §9)",
    )
    parser.add_argument("--no-cassandra", action="store_true", help="do not write the MessageStore")
    parser.add_argument(
        "--no-kafka", action="store_true", help="do not produce to Kafka (only --out; needs --out)"
    )
    add_progress_argument(parser)


def run(settings: Settings, args: argparse.Namespace) -> int:

    prog = "projector simulate"
    if args.no_kafka and not args.out:
        print(f"{prog}: --no-kafka needs --out (the records have to go somewhere)", file=sys.stderr)
        return 2
    lanes = settings.processing.lanes if args.lanes is None else args.lanes
    rate = float(args.rate)
    start_ms = int(time.time() * 1000) if args.start_ms is None else args.start_ms
    try:
        params = SimParams(
            users=args.users,
            conversations=args.conversations,
            group_size=args.group_size,
            messages=args.messages or None,
            lanes=lanes,
            seed=args.seed,
            start_ms=start_ms,
            # Event time follows the requested rate; unpaced runs still advance 10 ms a message,
            # so flush windows (5 s of ts) close during a replay of the file.
            step_ms=1000.0 / rate if rate > 0 else 10.0,
            mix=Mix(
                bad=args.bad_records,
                retry=args.duplicates,
                markers=args.markers,
                badge_conversations=args.badge_conversations,
                badge_messages=args.badge_messages,
            ),
            member_notices=args.member_notices,
        )
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    _quiet_driver_logs()
    show = progress_shown(args.progress)
    try:
        out: IO[bytes] | None = open(args.out, "wb") if args.out else None  # noqa: SIM115
    except OSError as exc:
        print(f"{prog}: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        report = asyncio.run(
            _run_with_interrupt(
                lambda stop: simulate(
                    settings,
                    params,
                    out=out,
                    rate=rate,
                    duration_s=args.duration or None,
                    use_kafka=not args.no_kafka,
                    use_cassandra=not args.no_cassandra,
                    stop=stop,
                    progress=show,
                    drop_entries=args.drop_entries,
                    lane_lag_s=args.lane_lag_ms / 1000,
                )
            )
        )
    except SimulateError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if out is not None:
            out.close()
    target = "no broker" if args.no_kafka else settings.topics.topic_mailbox_tail
    noise = f", {report.noise} bad or repeated records" if report.noise else ""
    if report.dropped:
        noise += f", {report.dropped} entries dropped on purpose"
    notices = f" ({report.notices} of them member notices)" if report.notices else ""
    print(
        f"simulated {report.messages} messages{notices}: {report.entries} entries{noise} and "
        f"{report.markers} marker records to {target} in {report.elapsed_s:.1f}s"
        + (" (stopped early; closing markers sent)" if report.stopped_early else "")
        + (f"; records in {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


async def _run_with_interrupt(main: Callable[[asyncio.Event], Awaitable[Report]]) -> Report:
    """The first Ctrl-C stops the traffic cleanly (closing markers still go out, so a replay of
    --out leaves nothing pending); a second one interrupts for real."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    # Not the main thread, or a platform without signal handlers: Ctrl-C then interrupts at once.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
    try:
        return await main(stop)
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGINT)


def _quiet_driver_logs() -> None:
    # aiokafka logs every metadata retry as a warning ("Topic ... not found"); the command
    # reports failures itself, once, with what to do.
    import logging

    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    logging.getLogger("cassandra").setLevel(logging.ERROR)
