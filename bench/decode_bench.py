"""Micro-benchmark of the hot path's first step: `decode_record` against a bare `orjson.loads`.

Two inputs of the same size, made here (no files): the J-1 stream's lines (`bench/gen_j1.py`: one
conversation, so the validated-conversation cache always hits, markers between batches) and a
mixed stream (every entry type, a new conversation id on most lines: the cache misses). Each is
decoded by `decode_record` and by `orjson.loads` (the baseline: the least a JSON decoder does per
line) in interleaved repetitions; the report is the median ns per line of each and the median of
the per-repetition ratios, which is the figure to compare across changes (absolute times drift on
a shared machine).

`--against FILE` adds another version of app/domain/entries.py (e.g. `git show
main:app/domain/entries.py > /tmp/entries_main.py`), timed in the same interleaved loop: the
before/after ratio of a decoder change, on the same machine at the same moment.

Usage: .venv/bin/python -m bench.decode_bench [--lines 100000] [--reps 7] [--against FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson

from app.domain.entries import ENTRY_TYPES, decode_record
from bench.gen_j1 import Params, generate


def j1_lines(count: int) -> list[bytes]:
    params = Params(members=200, messages=count // 200 + 1, lanes=4)
    out = []
    for record in generate(params):
        out.append(orjson.dumps(record))
        if len(out) == count:
            break
    return out


def mixed_lines(count: int, seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    fields: dict[str, dict[str, object]] = {
        "message": {
            "conversation_seq": 17,
            "message_id": "msg-17",
            "activity_id": "0190f3a2b4c50000000000000000a1b2",
            "sender_id": 12_345_678_901,
            "created_at": 1_767_225_600_000,
            "counts_unread": True,
            "mention": False,
        },
        "read": {"read_conversation_seq": 12},
        "recall": {
            "target_conversation_seq": 9,
            "target_sender_id": 3,
            "target_counts_unread": True,
            "target_mention": False,
        },
        "join": {"joined_at_conversation_seq": 4},
        "leave": {"left_at_conversation_seq": 20, "reason": "left"},
        "pin": {"pin_rank": 3},
        "clear_history": {"hidden_before_conversation_seq": 8},
        "delete_conversation": {"deleted_before_conversation_seq": 8},
    }
    fields["delete_message"] = fields["recall"]
    kinds = ["message"] * 12 + list(ENTRY_TYPES)
    out = []
    for seq in range(1, count + 1):
        kind = rnd.choice(kinds)
        if seq % 50 == 0:
            out.append(orjson.dumps({"type": "watermark", "lane": 0, "watermark": seq, "ts": seq}))
            continue
        out.append(
            orjson.dumps(
                {
                    "type": kind,
                    "mailbox_seq": seq,
                    "lane": 0,
                    "ts": 1_767_225_600_000 + seq,
                    "event_id": f"ev-{seq}",
                    "user_id": rnd.randrange(1, 2**63),
                    "conversation_id": str(uuid.UUID(int=rnd.getrandbits(128))),
                    **fields.get(kind, {}),
                }
            )
        )
    return out


def timed(fn: Callable[[bytes], object], lines: list[bytes]) -> float:
    start = time.perf_counter_ns()
    for line in lines:
        fn(line)
    return (time.perf_counter_ns() - start) / len(lines)


def load_decoder(path: Path) -> Callable[[bytes, int], object]:
    spec = importlib.util.spec_from_file_location("entries_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["entries_against"] = module  # msgspec resolves the Structs' annotations by module
    spec.loader.exec_module(module)
    found: Callable[[bytes, int], object] = module.decode_record
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another entries.py to time side by side")
    args = parser.parse_args(argv)
    contenders: dict[str, Callable[[bytes], object]] = {
        "decode_record": lambda line: decode_record(line, 4),
        "orjson_loads": orjson.loads,
    }
    if args.against:
        other = load_decoder(args.against)
        contenders["against"] = lambda line: other(line, 4)
    report: dict[str, object] = {}
    for name, lines in (("j1", j1_lines(args.lines)), ("mixed", mixed_lines(args.lines))):
        times: dict[str, list[float]] = {key: [] for key in contenders}
        order = list(contenders)
        for _ in range(args.reps):
            order = order[1:] + order[:1]  # rotate: a busy moment slows every contender alike
            for key in order:
                times[key].append(timed(contenders[key], lines))
        figures: dict[str, object] = {f"{key}_ns": round(statistics.median(t)) for key, t in times.items()}
        ours, base = times["decode_record"], times["orjson_loads"]
        figures["ratio_to_orjson"] = round(
            statistics.median(o / b for o, b in zip(ours, base, strict=True)), 3
        )
        if "against" in times:
            figures["ratio_to_against"] = round(
                statistics.median(o / b for o, b in zip(ours, times["against"], strict=True)), 3
            )
        report[name] = figures
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
