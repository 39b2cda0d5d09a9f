"""The `projector` command: thin subcommands that call into the rest of the package."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, help). Each module exposes `add_arguments(parser)` and `run(args) -> int`;
# modules are imported lazily so that `projector replay` never pays for faust or the drivers.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("app.replay_cli", "Run mailbox entries from a file through the core; write projections"),
    "bootstrap": ("app.bootstrap", "Create the Cassandra schema and the Kafka topics (idempotent)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="projector", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        runner: Callable[[argparse.Namespace], int] = module.run
        sub_parser.set_defaults(runner=runner)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runner: Callable[[argparse.Namespace], int] = args.runner
    try:
        return runner(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
