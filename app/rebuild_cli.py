"""`projector rebuild (--from-state (--users ID,...|--all-known) | --by-replay) --namespace NS [--swap]`.

Rebuilds users' rows into the fresh Redis namespace NS from Cassandra (app/rebuild.py) or by
re-consuming mailbox-tail through the worker's core (app/rebuild_replay.py), with a progress
line, then diffs NS against the live (serving) namespace: rows added/removed/changed per
field and badge differences, printed and written as JSON (``--report``). ``--swap`` then makes NS
the serving namespace (``SET {base}:serving NS``, atomic; the worker and the API follow it).

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
from pathlib import Path
from typing import Any

import orjson


def _user_list(text: str) -> list[int]:
    try:
        users = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated user ids, got {text!r}") from None
    if not users or users[0] < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative user ids, got {text!r}")
    return users


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


def run(args: argparse.Namespace) -> int:
    from app.settings import Settings

    settings = Settings.from_env()  # a SettingsError is reported by app.cli.main
    if args.from_state and args.users is None and not args.all_known:
        print("projector rebuild: --from-state needs --users ID,... or --all-known", file=sys.stderr)
        return 2
    if args.by_replay and (args.users is not None or args.all_known):
        print("projector rebuild: --by-replay rebuilds every user of the log", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(settings, args))
    except RebuildRefused as exc:
        print(f"projector rebuild: {exc}", file=sys.stderr)
        return 2


class RebuildRefused(Exception):
    pass


def worker_config(settings: Any) -> Any:
    from app.worker.core import WorkerConfig

    return WorkerConfig(
        lanes=settings.lanes,
        window_ms=settings.projection_compaction_window_ms,
        max_dirty_rows=settings.max_dirty_rows,
        include_muted=settings.include_muted,
        unread_precise_limit=settings.unread_precise_limit,
    )


async def _run(settings: Any, args: argparse.Namespace) -> int:
    from app.rebuild import Progress, diff_namespaces, rebuild_from_state
    from app.rebuild_replay import rebuild_by_replay
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster
    from app.stores.cassandra_state import UserConversationStateWriter
    from app.stores.redis_projection import RedisProjectionStore, serving_key

    namespace: str = args.namespace
    live = RedisProjectionStore.from_settings(settings)  # follows {base}:serving
    try:
        target = RedisProjectionStore(live.client, namespace, max_users_per_trip=settings.flush_batch_size)
    except ValueError as exc:
        await live.aclose()
        raise RebuildRefused(str(exc)) from None
    cluster, session = await asyncio.to_thread(open_cluster, settings)
    try:
        serving = await live.follow_serving()
        if namespace == serving:
            raise RebuildRefused(f"{namespace!r} is the serving namespace: rebuild into a fresh one")
        keyspace = settings.cassandra_keyspace
        state = UserConversationStateWriter(session, keyspace)
        messages = CassandraMessageStore(session, keyspace)
        cleared = await target.delete_all()
        if cleared:
            print(f"rebuild: cleared {cleared} users left in {namespace!r}", file=sys.stderr)
        started = time.monotonic()
        report: dict[str, Any]
        if args.by_replay:
            replayed = await rebuild_by_replay(
                bootstrap=settings.kafka_bootstrap,
                topic=settings.topic_mailbox_tail,
                partitions=settings.topic_partitions,
                config=worker_config(settings),
                messages=messages,
                target=target,
                progress_mode=args.progress,
            )
            users = sorted(set(await target.user_ids()) | set(await live.user_ids()))
            # Same core, same entries: every field must agree, versions included.
            diff = await diff_namespaces(live, target, users, ignore=())
            report = {"mode": "by-replay", "replay": dataclasses.asdict(replayed)}
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
                limit=settings.unread_precise_limit,
                include_muted=settings.include_muted,
                progress=Progress(len(users), mode=args.progress),
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
        if args.swap:
            # One SET: every follower (worker before each write, API within a second) moves over.
            await live.client.set(serving_key(settings.projection_namespace), namespace)
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
