"""The `projector` command: thin subcommands that call into the rest of the package."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.settings import Settings

# subcommand -> (module, help). Each module exposes `add_arguments(parser)` and
# `run(settings, args) -> int`. Only the chosen subcommand's module is imported, so `projector
# replay` never pays for faust or the database drivers, and one broken optional module cannot take
# the others down. The Settings are built once, here, and handed to the command.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("app.cli.replay", "Run mailbox entries from a file through the core; write projections"),
    "bootstrap": ("app.cli.bootstrap", "Create the Cassandra schema and the Kafka topics (idempotent)"),
    "worker": ("app.cli.worker", "Run a projector worker (faust) on mailbox-tail; settings from PROJECTOR_*"),
    "simulate": (
        "app.cli.simulate",
        "Generate mailbox traffic: messages stored first, then entries and markers",
    ),
    "api": ("app.cli.api", "Serve the query API (session list pages, badge) over HTTP"),
    "token": ("app.cli.token", "Mint a bearer token for the query API: token USER_ID [--ttl SECONDS]"),
    "profiles": (
        "app.cli.profiles",
        "Load public member profiles (names, avatars) into Cassandra: profiles load FILE.jsonl",
    ),
    "rebuild": (
        "app.cli.rebuild",
        "Rebuild projections from Cassandra state into a fresh namespace, diff with the live one, --swap",
    ),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="projector", description=__doc__)
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the version and build (compiled or not) and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((arg for arg in argv if arg in SUBCOMMANDS), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            runner: Callable[[Settings, argparse.Namespace], int] = module.run
            sub_parser.set_defaults(runner=runner)
    return parser


class _Version(argparse.Action):
    """--version, resolved only when asked (reading the installed metadata costs a few ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from app.build import build_info

        print(build_info().line())
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(arguments).parse_args(arguments)
    runner: Callable[[Settings, argparse.Namespace], int] = args.runner
    from app.settings import Settings, SettingsError

    try:
        return runner(Settings.from_env(), args)
    except SettingsError as exc:  # every subcommand reads the environment the same way
        print(f"projector {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
