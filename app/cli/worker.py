"""`projector worker`: one worker of the fleet (the same app as `faust -A app.main worker`)."""

from __future__ import annotations

import argparse
import sys

from app.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Every setting comes from PROJECTOR_* environment variables (see README); several "
        "workers with the same PROJECTOR_APP_ID share the partitions of mailbox-tail."
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    from app.logs import configure_logging, faust_worker_options

    # Before the app is built (its imports and connects log); faust's worker then applies
    # the same set-up when it starts (faust_worker_options), so one format covers every line.
    configure_logging(settings.log, "worker")
    from app.runtime.preflight import CannotStart, preflight
    from app.runtime.worker import run_worker
    from app.stores.cassandra_exec import StoreError
    from app.stores.cassandra_session import CassandraUnavailable

    try:
        # Source topic there, Kafka and Redis answering: one line and exit 1 otherwise, before
        # faust starts (Cassandra and its keyspace are asked when the core is built).
        checked = preflight(settings)
        # until stopped; exits the process
        run_worker(settings, faust_worker_options(settings.log), reconcile_requests=checked.reconcile_topic)
    except (CannotStart, CassandraUnavailable, StoreError) as exc:
        print(f"projector worker: {exc}", file=sys.stderr)
        return 1
    return 0
