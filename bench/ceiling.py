"""Speed ceiling: the least any projector must do per line, in this language.

Decode each line (orjson) and bump a counter keyed by (user_id, conversation_id); nothing else.
A projector's entries/s divided by this one's says how much of the time goes to the actual work
rather than to reading and decoding. Prints a JSON object of counts on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson


def run(path: Path) -> dict[str, object]:
    counts: dict[tuple[object, object], int] = {}
    loads = orjson.loads
    lines = 0
    with path.open("rb") as fp:
        for line in fp:
            entry = loads(line)
            key = (entry.get("user_id"), entry.get("conversation_id"))
            counts[key] = counts.get(key, 0) + 1
            lines += 1
    return {"lines": lines, "keys": len(counts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, required=True)
    args = parser.parse_args(argv)
    print(orjson.dumps(run(args.input)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
