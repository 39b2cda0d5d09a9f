"""`projector rebuild (--from-state (--users ID,...|--all-known) | --by-replay [--from-timestamp T])
--namespace NS [--swap] [--metrics-port PORT]`.

Rebuilds users' rows into the fresh Redis namespace NS from Cassandra (app/rebuild/from_state.py) or by
re-consuming mailbox-tail through the worker's core (app/rebuild/by_replay.py), with a progress
line, then diffs NS against the live (serving) namespace: rows added/removed/changed per
field and badge differences, printed and written as JSON (``--report``). ``--swap`` then makes NS
the serving namespace (``SET {base}:serving NS``, atomic; the worker and the API follow it).

``--by-replay --from-timestamp T`` is for a log partly past retention: the log is read from T
on; the users it names start from their rows rebuilt from state (entries at or below the state's
version drop as duplicates, later ones are applied through the core), every other user is
rebuilt from state. The result is a full replay's on every field state can know; a row's
``projection_mailbox_seq`` (and the user's version) is exact when the row (user) has an entry at
or after T above the state's version, else state's ``updated_mailbox_seq``.

``--metrics-port PORT`` serves the progress gauges (projector_rebuild_work_items / _work_done /
_progress_ratio, app/metrics/rebuild.py) on ``GET /metrics`` while the rebuild runs, and for
``--metrics-hold`` seconds after it (a scraper's interval is longer than a short rebuild).

Without ``--swap`` nothing that serves changes: NS is a namespace nobody reads. Rebuilding into
the namespace that serves is refused.

Caveat of a swap while the worker runs: rows the worker changes between the rebuild's read of a
user and the swap stay as the rebuild read them in NS until their next change (state-based
rebuild is for a lost projection or a log past retention; quiesce the worker to swap exactly).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from app.cli.args import non_negative_float, non_negative_int, positive_int, scratch_folder_problem
from app.settings import Settings

if TYPE_CHECKING:
    from app.domain.ports import MessageStore
    from app.domain.projection_store import ProjectionStore
    from app.metrics import RebuildMetrics
    from app.rebuild.by_replay import BaseLoader, ReplayRebuild

MAX_PORT = 65535
MAX_HOLD_S = 3600  # a --metrics-hold longer than an hour is a mistake


def _user_list(text: str) -> list[int]:
    try:
        users = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated user ids, got {text!r}") from None
    if not users or users[0] < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative user ids, got {text!r}")
    return users


def _timestamp_ms(text: str) -> int:
    """T for --from-timestamp: milliseconds since the epoch, or an ISO 8601 time with its zone."""
    text = text.strip()
    if text.isdigit():
        ms = int(text)
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected milliseconds since the epoch or an ISO 8601 time with a zone "
                f"(e.g. 2026-01-01T00:00:00Z), got {text!r}"
            ) from None
        if moment.tzinfo is None:
            # Kafka record times are UTC instants: a local wall time would silently shift T.
            raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z or +HH:MM)")
        ms = round(moment.timestamp() * 1000)
        if ms < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is before 1970-01-01T00:00:00Z")
    now_ms = time.time_ns() // 1_000_000
    if ms > now_ms:
        raise argparse.ArgumentTypeError(f"{text!r} is in the future (now is {now_ms} ms): nothing to replay")
    return ms


def _port(text: str) -> int:
    port = non_negative_int(text)
    if port > MAX_PORT:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..{MAX_PORT}; 0 = off)")
    return port


def _seconds(text: str) -> float:
    value = non_negative_float(text)
    if value > MAX_HOLD_S:
        raise argparse.ArgumentTypeError(f"{text} is not in 0..{MAX_HOLD_S} seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--from-state",
        action="store_true",
        help="from Cassandra UserConversationState + MessageStore heads (the log is past retention)",
    )
    mode.add_argument(
        "--by-replay",
        action="store_true",
        help="re-consume mailbox-tail from the beginning through the worker's core (every user)",
    )
    parser.add_argument(
        "--from-timestamp",
        type=_timestamp_ms,
        metavar="T",
        help=(
            "with --by-replay, for a log partly past retention: read each partition from its first "
            "record at or after T (Kafka record time; ms since the epoch or ISO 8601 with a zone). "
            "Entries before T are not read: the users the log names from T start from their rows "
            "rebuilt from UserConversationState + MessageStore at the state's version (older "
            "entries drop as duplicates, newer ones are applied through the worker's core); every "
            "other user is rebuilt from state. Identical to a full replay on every field state can "
            "know; a row's projection_mailbox_seq is exact when it has an entry from T above the "
            "state's version"
        ),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=(
            "with --by-replay: keep the core's state in RocksDB in DIR (an empty or new folder, "
            "scratch space for this run) and only a bounded hot set in memory, so a log of any size "
            "rebuilds in bounded memory (default: the state in memory)"
        ),
    )
    parser.add_argument(
        "--hot-rows",
        type=positive_int,
        metavar="N",
        help="with --state-dir: rows per partition kept in memory at most (default PROJECTOR_HOT_ROWS)",
    )
    parser.add_argument("--namespace", required=True, metavar="NS", help="the fresh namespace to write")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--users", type=_user_list, metavar="ID,...", help="these users")
    who.add_argument(
        "--all-known",
        action="store_true",
        help="every user with UserConversationState or a row in the live namespace (--from-state)",
    )
    parser.add_argument(
        "--report", type=Path, metavar="FILE", help="diff report JSON (default rebuild-NS.json)"
    )
    parser.add_argument("--swap", action="store_true", help="make NS the serving namespace afterwards")
    parser.add_argument(
        "--progress", choices=("auto", "always", "never"), default="auto", help="progress line on stderr"
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        metavar="PORT",
        help="serve the progress gauges on GET http://HOST:PORT/metrics (Prometheus; default 0 = off)",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", metavar="HOST", help="address for --metrics-port"
    )
    parser.add_argument(
        "--metrics-hold",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="keep /metrics up this long after the rebuild, so a scraper sees the final values",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.from_state and args.users is None and not args.all_known:
        print("projector rebuild: --from-state needs --users ID,... or --all-known", file=sys.stderr)
        return 2
    if args.by_replay and (args.users is not None or args.all_known):
        print("projector rebuild: --by-replay rebuilds every user of the log", file=sys.stderr)
        return 2
    if args.from_timestamp is not None and not args.by_replay:
        print("projector rebuild: --from-timestamp goes with --by-replay", file=sys.stderr)
        return 2
    if (args.state_dir is not None or args.hot_rows is not None) and not args.by_replay:
        print("projector rebuild: --state-dir and --hot-rows go with --by-replay", file=sys.stderr)
        return 2
    if args.hot_rows is not None and args.state_dir is None:
        print("projector rebuild: --hot-rows goes with --state-dir", file=sys.stderr)
        return 2
    if args.state_dir is not None:
        problem = scratch_folder_problem(args.state_dir)
        if problem:
            print(f"projector rebuild: --state-dir {args.state_dir}: {problem}", file=sys.stderr)
            return 2
    from app.rebuild.by_replay import ReplaySourceError
    from app.runtime.preflight import CannotStart
    from app.stores.cassandra_session import CassandraUnavailable
    from app.stores.redis_projection import ProjectionStoreError

    try:
        return asyncio.run(_run(settings, args))
    except RebuildRefused as exc:
        print(f"projector rebuild: {exc}", file=sys.stderr)
        return 2
    except (ReplaySourceError, CassandraUnavailable, CannotStart) as exc:
        # A server that does not answer (or a topic not there): one line, nothing half-done to
        # undo (the target namespace serves nobody until --swap).
        print(f"projector rebuild: {exc}", file=sys.stderr)
        return 1
    except ProjectionStoreError as exc:
        from app.connections import redis_hosts, unreachable_hint

        reason = str(exc).rstrip(".")
        hint = unreachable_hint(redis_hosts(settings.redis.redis_url))
        print(f"projector rebuild: {reason}{hint}", file=sys.stderr)
        return 1


class RebuildRefused(Exception):
    pass


def worker_config(settings: Settings, hot_rows: int | None = None) -> Any:
    """The worker's configuration for a rebuild by replay: its hot set bounded in rows (`hot_rows`
    or the setting) and, as `projector replay`'s, in the bytes that many rows without messages
    take (only a `--state-dir` rebuild keeps a hot set at all)."""
    from app.replay.driver import default_hot_bytes
    from app.worker.core import WorkerConfig

    config = WorkerConfig.from_settings(settings.processing, settings.worker)
    rows = hot_rows if hot_rows is not None else config.hot_rows
    return dataclasses.replace(config, hot_rows=rows, hot_bytes=default_hot_bytes(rows))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    from app.metrics import RebuildMetrics

    metrics = RebuildMetrics(namespace=args.namespace)  # the console shows which namespace
    server = (
        await _serve_metrics(metrics, args.metrics_host, args.metrics_port) if args.metrics_port else None
    )
    try:
        code = await _rebuild(settings, args, metrics)
        if server is not None and args.metrics_hold:
            await asyncio.sleep(args.metrics_hold)  # the final values, for the next scrape
        return code
    finally:
        if server is not None:
            await server.cleanup()


async def _serve_metrics(metrics: RebuildMetrics, host: str, port: int) -> Any:
    """GET /metrics with the rebuild's gauges: a small aiohttp server of this process."""
    from aiohttp import web

    from app.metrics import metrics_handler

    web_app = web.Application()
    web_app.router.add_get("/metrics", metrics_handler(metrics.registry), allow_head=False)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise RebuildRefused(f"--metrics-port {port}: cannot listen on {host}: {exc.strerror}") from None
    print(f"rebuild: metrics on http://{host}:{port}/metrics", file=sys.stderr)
    return runner


async def _replay_log(
    settings: Settings,
    args: argparse.Namespace,
    messages: MessageStore,
    target: ProjectionStore,
    metrics: RebuildMetrics,
    *,
    from_ms: int | None = None,
    base: BaseLoader | None = None,
) -> ReplayRebuild:
    """mailbox-tail through the worker's core into `target`: from the beginning, or from
    `from_ms` on the rows `base` loads (see app/rebuild/by_replay.py)."""
    from app.connections import kafka_security_options
    from app.rebuild.by_replay import rebuild_by_replay
    from app.stores.rocks_tables import RocksTables

    tables = RocksTables(args.state_dir) if args.state_dir is not None else None
    try:
        return await rebuild_by_replay(
            bootstrap=settings.kafka.kafka_bootstrap,
            topic=settings.topics.topic_mailbox_tail,
            partitions=settings.topics.topic_partitions,
            config=worker_config(settings, args.hot_rows),
            messages=messages,
            target=target,
            progress_mode=args.progress,
            metrics=metrics,
            from_ms=from_ms,
            base=base,
            kafka_options=kafka_security_options(settings.kafka),
            tables=tables,
        )
    finally:
        if tables is not None:
            tables.close()


def _replay_report(replayed: ReplayRebuild) -> dict[str, Any]:
    report = dataclasses.asdict(replayed)
    # The users the tail named serve the split (the rest come from state); a set, possibly of every
    # user: no figure for the report.
    report.pop("tail_users")
    return report


async def _rebuild(settings: Settings, args: argparse.Namespace, metrics: RebuildMetrics) -> int:
    from app.rebuild.diff import diff_namespaces
    from app.rebuild.from_state import StateBase, rebuild_from_state
    from app.rebuild.progress import Progress
    from app.runtime.preflight import PREFLIGHT_TIMEOUT_S, check_redis
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster
    from app.stores.cassandra_state import UserConversationStateWriter
    from app.stores.redis_projection import RedisProjectionStore, serving_key

    namespace: str = args.namespace
    # A Redis that does not answer at start is a mistake to report in one line (CannotStart), as
    # for the worker; once under way, the store's retry budget rides out a passing failure.
    await check_redis(settings.redis, PREFLIGHT_TIMEOUT_S)
    live = RedisProjectionStore.from_settings(settings.redis)  # follows {base}:serving
    try:
        target = RedisProjectionStore(
            live.client,
            namespace,
            max_users_per_trip=settings.redis.flush_batch_size,
            retry_budget_s=live.retry_budget_s,
        )
    except ValueError as exc:
        await live.aclose()
        raise RebuildRefused(str(exc)) from None
    cluster, session = await asyncio.to_thread(open_cluster, settings.cassandra, require_keyspace=True)
    try:
        serving = await live.follow_serving()
        if namespace == serving:
            raise RebuildRefused(f"{namespace!r} is the serving namespace: rebuild into a fresh one")
        keyspace = settings.cassandra.cassandra_keyspace
        state = UserConversationStateWriter(session, keyspace)
        messages = CassandraMessageStore(session, keyspace)
        cleared = await target.delete_all()
        if cleared:
            print(f"rebuild: cleared {cleared} users left in {namespace!r}", file=sys.stderr)
        started = time.monotonic()
        report: dict[str, Any]
        if args.by_replay and args.from_timestamp is not None:
            limit = settings.processing.unread_precise_limit
            base = StateBase(state, messages, messages, limit)

            async def load_base(user_ids: list[int]) -> Any:
                return await asyncio.to_thread(base.load, user_ids)

            replayed = await _replay_log(
                settings, args, messages, target, metrics, from_ms=args.from_timestamp, base=load_base
            )
            # Users the log from T does not name: from state alone (the log says nothing newer).
            known = set(await asyncio.to_thread(state.user_ids)) | set(await live.user_ids())
            rest = sorted(known - replayed.tail_users)
            from_state = await rebuild_from_state(
                rest,
                state=state,
                heads=messages,
                messages=messages,
                target=target,
                limit=limit,
                include_muted=settings.processing.include_muted,
                badge_mode=settings.processing.badge_mode,
                progress=Progress(len(rest), mode=args.progress, metrics=metrics),
            )
            users = sorted(known | set(await target.user_ids()))
            diff = await diff_namespaces(live, target, users)
            report = {
                "mode": "by-replay-from-timestamp",
                "replay": _replay_report(replayed),
                "users_from_state_only": from_state.users,
            }
            rebuilt_users, rebuilt_rows = replayed.users + from_state.users, diff.rows_rebuilt
        elif args.by_replay:
            replayed = await _replay_log(settings, args, messages, target, metrics)
            users = sorted(set(await target.user_ids()) | set(await live.user_ids()))
            # Same core, same entries: every field must agree, versions included.
            diff = await diff_namespaces(live, target, users, ignore=())
            report = {"mode": "by-replay", "replay": _replay_report(replayed)}
            rebuilt_users, rebuilt_rows = replayed.users, diff.rows_rebuilt
        else:
            if args.all_known:
                known = set(await asyncio.to_thread(state.user_ids)) | set(await live.user_ids())
                users = sorted(known)
            else:
                users = list(args.users)
            result = await rebuild_from_state(
                users,
                state=state,
                heads=messages,
                messages=messages,
                target=target,
                limit=settings.processing.unread_precise_limit,
                include_muted=settings.processing.include_muted,
                badge_mode=settings.processing.badge_mode,
                progress=Progress(len(users), mode=args.progress, metrics=metrics),
            )
            diff = await diff_namespaces(live, target, users)
            report = {"mode": "from-state", "listed_rows_rebuilt": result.listed_rows}
            rebuilt_users, rebuilt_rows = result.users, result.rows
        seconds = time.monotonic() - started
        report.update(
            {
                "namespace": namespace,
                "live_namespace": serving,
                "users_compared": len(users),
                "users_rebuilt": rebuilt_users,
                "rows_rebuilt": rebuilt_rows,
                "seconds": round(seconds, 3),
                "diff": diff.as_dict(),
                "swapped": False,
            }
        )
        metrics.diffed(report["diff"])  # the console's fleet view shows the counts
        if args.swap:
            # One SET: every follower (worker before each write, API within a second) moves over.
            await live.client.set(serving_key(settings.redis.projection_namespace), namespace)
            report["swapped"] = True
        path: Path = args.report or Path(f"rebuild-{namespace}.json")
        path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
        d = diff.as_dict()
        print(
            f"rebuild: {rebuilt_users} users, {rebuilt_rows} rows into {namespace!r} in {seconds:.1f}s; "
            f"vs {serving!r}: {d['rows_added']} added, {d['rows_removed']} removed, "
            f"{d['rows_changed']} changed {d['fields_changed'] or ''}, "
            f"{d['badges_differing']} badges differ; report {path}"
            + (f"; now serving {namespace!r}" if args.swap else "")
        )
        return 0
    finally:
        cluster.shutdown()
        await live.aclose()
