"""One build's side of the differential harness (tests/support/build_diff.py): a process that
imports whichever `app` its PYTHONPATH puts first (the checkout's pure code or the compiled
wheel), then answers requests on stdin with canonical bytes of everything the core produced.

Run as `python -P -m tests.support.build_child`; the parent starts one per build. Frames on both
pipes: 4-byte big-endian length + a pickled request / the response bytes. A request is a dict:
  mode      "replay" (the replay driver, event time), "processor" (PartitionProcessor.on_records
            in batches on processing time, as the worker calls it, with a persist after every
            batch and a restore from the snapshot half-way: the crash/replay path) or "load"
            (`loads`: state records through their loaders, for records of the wrong types)
  lines     the raw records
  options   ReplayOptions' fields
  seed      the batch sizes and clock steps of the processor mode
  state_dir a new folder for `--state-dir` replay (RocksDB state, bounded hot set), or None
The answer is orjson of plain values: true stays distinct from 1, a float from an int, so a
coercion in one build shows as a byte difference.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
import struct
import sys
from pathlib import Path
from typing import IO, Any

import msgspec
import orjson

from app.build import build_info
from app.domain.arrivals import ArrivalLedger
from app.domain.conversation import ConversationState
from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig, UserState
from app.domain.watermark import WatermarkGate
from app.replay import Replayer, ReplayOptions, run_replay
from app.stores.memory_messages import InMemoryMessageStore


def plain(value: Any) -> Any:
    """`value` as JSON-able data with its types kept apart (bool, int, float, str, bytes): every
    class, compiled or interpreted, as its name and fields."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"int": str(value)} if abs(value) >= 1 << 63 else value  # orjson: 64-bit ints only
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, dict):
        return {"dict": [[plain(k), plain(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"set": sorted((plain(v) for v in value), key=orjson.dumps)}
    if isinstance(value, msgspec.Struct):
        return {type(value).__name__: plain(msgspec.structs.asdict(value))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {type(value).__name__: plain(fields)}
    if value is msgspec.UNSET:
        return "UNSET"
    slots = [name for cls in type(value).__mro__ for name in getattr(cls, "__slots__", ())]
    if slots:
        return {
            type(value).__name__: plain(
                {name: getattr(value, name) for name in slots if hasattr(value, name)}
            )
        }
    if hasattr(value, "__dict__"):
        return {type(value).__name__: plain(vars(value))}
    raise TypeError(f"no plain form for {type(value).__name__}")


def replay_outputs(request: dict[str, Any]) -> Any:
    options = ReplayOptions(**request["options"])
    state_dir = request.get("state_dir")
    if state_dir is None:
        result = run_replay(request["lines"], options)
        frames = result.frames
    else:
        frames = []
        replayer = Replayer(
            options, frames.append, state_dir=Path(state_dir), hot_rows=request.get("hot_rows", 3)
        )
        replayer.feed_many(request["lines"])
        result = replayer.finish()
    return {
        "projections": list(result.projections),
        "badges": list(result.badges),
        "frames": frames,
        "stats": result.stats,
        "dead_letter_reasons": result.dead_letter_reasons,
    }


def processor_outputs(request: dict[str, Any]) -> Any:
    """The worker's path: batches as fetches come, processing time, a persist after each batch
    (the changelog records of what changed), a restart from the snapshot half-way."""
    opts = request["options"]
    config = ProjectorConfig(
        window_ms=opts.get("window_ms", 5000), max_dirty_rows=opts.get("max_dirty_rows", 100_000)
    )
    options: dict[str, Any] = {
        "lanes": opts.get("lanes", 1),
        "mirror": True,
        "member_stats": True,
        "track_changes": True,
    }
    store = InMemoryMessageStore()
    processor = PartitionProcessor(config, store, **options)
    lines: list[bytes] = request["lines"]
    rnd = random.Random(request.get("seed", 0))
    restart_at = len(lines) // 2
    restarted = False
    now = 1_000
    out: list[Any] = []
    offset = 0
    while offset < len(lines):
        if not restarted and offset >= restart_at:
            snapshot = processor.snapshot()
            out.append(["snapshot", snapshot])
            processor = PartitionProcessor.restore(config, store, snapshot, **options)
            restarted = True
        size = rnd.randint(1, 40)
        step = processor.on_records(lines[offset : offset + size], now)
        out.append(["step", offset, step])
        changes = processor.changes_since_persist()
        out.append(
            [
                "persist",
                sorted([u, c, processor.row_record(u, c)] for u, c in changes.rows),
                sorted([u, processor.user_record(u)] for u in changes.users),
                processor.gate_record() if changes.gate else None,
                sorted(changes.pending_added.items()),
                changes.pending_released,
            ]
        )
        now += rnd.choice((0, 5, 50))
        out.append(["deadline", now, processor.on_deadline(now)])
        offset += size
    out.append(["end", processor.on_end(), processor.stats, processor.snapshot()])
    return out


def load_outputs(request: dict[str, Any]) -> Any:
    """Each state record through its loader (`loads`: [(what, record)]), and what came out: the
    loaded object's own record again, or the error it raised."""
    out: list[Any] = []
    for what, record in request["loads"]:
        try:
            if what == "row":
                out.append(ConversationState.load(record, 7, "00000000-0000-0000-0000-000000000001").dump())
            elif what == "user":
                out.append(UserState.load(record, []).dump())
            elif what == "gate":
                out.append(WatermarkGate.load(3, record, []).dump())
            elif what == "arrivals":
                out.append(ArrivalLedger.load(3, record, [None, None, None], []).dump())
            else:
                raise AssertionError(f"no loader {what!r}")
        except Exception as exc:  # the outcome compared, whichever it is
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def _read_frame(stream: IO[bytes]) -> bytes | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    return stream.read(size)


def main() -> None:
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    hello = orjson.dumps({"compiled": build_info().compiled, "line": build_info().line()})
    sink.write(struct.pack(">I", len(hello)) + hello)
    sink.flush()
    while (frame := _read_frame(source)) is not None:
        request = pickle.loads(frame)
        try:
            run = {"replay": replay_outputs, "processor": processor_outputs, "load": load_outputs}[
                request["mode"]
            ]
            answer = orjson.dumps({"ok": plain(run(request))})
        except Exception as exc:  # the harness compares failures too: an exception is an output
            answer = orjson.dumps({"raised": f"{type(exc).__name__}: {exc}"})
        sink.write(struct.pack(">I", len(answer)) + answer)
        sink.flush()


if __name__ == "__main__":
    main()
