"""`projector replay` as a process (docs/contract.md §7): the four output files are run_replay's results,
stdin works, and bad invocations fail with a clear message and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.replay import ReplayOptions, run_replay
from tests.support.strategies import Builder, Stream, streams

C = "0a0a0a0a-0000-4000-8000-000000000001"


def projector(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    exe = Path(sys.executable).with_name("projector")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "app"]
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=120, env={**os.environ})


def read_outputs(out: Path) -> dict[str, Any]:
    def jsonl(name: str) -> list[Any]:
        return [json.loads(x) for x in (out / name).read_bytes().splitlines() if x.strip()]

    return {
        "projections": jsonl("projections.jsonl"),
        "badges": jsonl("badges.jsonl"),
        "frames": jsonl("deltas.jsonl"),
        "stats": json.loads((out / "stats.json").read_bytes()),
    }


def expected(lines: list[bytes], opts: ReplayOptions) -> dict[str, Any]:
    res = run_replay(lines, opts)
    # through JSON, as the files are (tuples, ints > 2^63 and floats compare the same way)
    return cast(
        dict[str, Any],
        json.loads(
            json.dumps(
                {
                    "projections": res.projections,
                    "badges": res.badges,
                    "frames": res.frames,
                    "stats": res.stats,
                }
            )
        ),
    )


def small_stream() -> list[bytes]:
    b = Builder()
    b.message(1, C, 1, 2, mention=True)
    b.message(1, C, 2, 2)
    b.read(1, C, 1)
    return [line + b"\n" for line in b.finish()]


# deadline off: each example starts two processes
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    stream=streams(),
    window_ms=st.sampled_from((1, 30, 5000)),
    max_dirty_rows=st.sampled_from((2, 100_000)),
    include_muted=st.booleans(),
    state_dir=st.sampled_from((None, 1, 4)),
    hot_mib=st.sampled_from((None, 1)),
)
def test_output_files_equal_run_replay(
    tmp_path: Path,
    stream: Stream,
    window_ms: int,
    max_dirty_rows: int,
    include_muted: bool,
    state_dir: int | None,
    hot_mib: int | None,
) -> None:
    """The files equal run_replay's — in memory, and with the state in a RocksDB folder and a hot
    set of 1 or 4 rows (every chunk persists and evicts; the outputs are read back from it), its
    byte bound the default or 1 MiB."""
    lines = stream.lines()
    src = tmp_path / f"in-{id(stream)}.jsonl"
    src.write_bytes(b"".join(lines))
    out = tmp_path / f"out-{id(stream)}"
    args = ["replay", "--input", str(src), "--out", str(out), "--lanes", str(stream.lanes)]
    args += ["--window-ms", str(window_ms), "--max-dirty-rows", str(max_dirty_rows)]
    if include_muted:
        args.append("--include-muted")
    if state_dir is not None:
        # A new folder per example: object ids repeat across examples, and a folder holding an
        # earlier example's state is refused (it would be read as this run's state).
        state = tmp_path / f"state-{uuid.uuid4().hex}"
        args += ["--state-dir", str(state), "--hot-rows", str(state_dir)]
        if hot_mib is not None:
            args += ["--hot-mib", str(hot_mib)]
    proc = projector(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    opts = ReplayOptions(
        lanes=stream.lanes,
        window_ms=window_ms,
        max_dirty_rows=max_dirty_rows,
        include_muted=include_muted,
    )
    assert read_outputs(out) == expected(lines, opts)


def test_stdin_input(tmp_path: Path) -> None:
    lines = small_stream()
    proc = projector("replay", "--input", "-", "--out", str(tmp_path / "o"), stdin=b"".join(lines))
    assert proc.returncode == 0, proc.stderr.decode()
    assert read_outputs(tmp_path / "o") == expected(lines, ReplayOptions())


def test_defaults_are_the_documented_ones(tmp_path: Path) -> None:
    lines = small_stream()
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines))
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr.decode()
    want = ReplayOptions(lanes=1, window_ms=5000, max_dirty_rows=100_000, include_muted=False)
    assert read_outputs(tmp_path / "o") == expected(lines, want)


def test_bad_lines_are_counted_and_reported(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"{bad\n" + b"".join(small_stream()) + b'{"type":"nope"}\n')
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert read_outputs(tmp_path / "o")["stats"]["dead_letters"] == 2
    text = (proc.stdout + proc.stderr).decode().lower()
    assert "dead" in text or "bad" in text or "invalid" in text, text
    assert "traceback" not in text


def _assert_clear_failure(proc: subprocess.CompletedProcess[bytes], *needles: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    "extra",
    [
        ["--bogus"],
        ["--lanes", "0"],
        ["--lanes", "x"],
        ["--window-ms", "-5"],
        ["--max-dirty-rows"],
        ["--fast-lane-per-user-per-s", "1001"],
        ["--fast-lane-max-members", "-1"],
        ["--hot-mib", "0"],
    ],
)
def test_unknown_or_bad_option_exits_2_with_a_message(tmp_path: Path, extra: list[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(small_stream()))
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"), *extra)
    _assert_clear_failure(proc, extra[0])
    assert proc.returncode == 2


def test_the_fast_lane_options_reach_the_replay(tmp_path: Path) -> None:
    """docs/contract.md §10 on entry ts: a DM flushes its user at once (default), not with 0."""
    b = Builder()
    b.message(1, C, 1, 2, member_count=2)
    b.message(2, C, 1, 2, member_count=9)
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(b.finish()) + b"\n")
    runs: list[tuple[list[str], int, ReplayOptions]] = [
        ([], 1, ReplayOptions()),
        (["--fast-lane-per-user-per-s", "0"], 0, ReplayOptions(fast_lane_per_user_per_s=0)),
        (["--fast-lane-max-members", "9"], 2, ReplayOptions(fast_lane_max_members=9)),
    ]
    for n, (extra, fast, opts) in enumerate(runs):
        out = tmp_path / f"o{n}"
        proc = projector("replay", "--input", str(src), "--out", str(out), *extra)
        assert proc.returncode == 0, proc.stderr.decode()
        got = read_outputs(out)
        assert got["stats"]["fast_flushes"] == fast, (extra, got["stats"])
        assert got == expected(b.finish(), opts)


@pytest.mark.parametrize("missing", ["--input", "--out"])
def test_missing_required_option_exits_2(tmp_path: Path, missing: str) -> None:
    args = {"--input": str(tmp_path / "in.jsonl"), "--out": str(tmp_path / "o")}
    del args[missing]
    proc = projector("replay", *[x for kv in args.items() for x in kv])
    _assert_clear_failure(proc, missing)
    assert proc.returncode == 2


def test_a_state_folder_holding_anything_is_refused(tmp_path: Path) -> None:
    """--state-dir is scratch space for one run: a folder left by another run would be read as
    this run's state (its rows would leak into the outputs), so it is refused before reading."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(small_stream()))
    state = tmp_path / "state"
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o1"), "--state-dir", str(state))
    assert proc.returncode == 0, proc.stderr.decode()
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o2"), "--state-dir", str(state))
    _assert_clear_failure(proc, "not empty")
    assert proc.returncode == 2
    assert not (tmp_path / "o2").exists()


def test_unreadable_input_fails_clearly(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    proc = projector("replay", "--input", str(missing), "--out", str(tmp_path / "o"))
    _assert_clear_failure(proc, str(missing))
    proc = projector("replay", "--input", str(tmp_path), "--out", str(tmp_path / "o"))
    _assert_clear_failure(proc, str(tmp_path))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.jsonl"
        locked.write_bytes(b"".join(small_stream()))
        locked.chmod(0)
        proc = projector("replay", "--input", str(locked), "--out", str(tmp_path / "o"))
        _assert_clear_failure(proc, str(locked))


def test_lines_are_split_on_newline_only(tmp_path: Path) -> None:
    """U+0085, U+2028 and U+2029 may appear raw inside JSON strings: they are not line breaks
    (str.splitlines() would cut the entry in two)."""
    b = Builder()
    e = b.message(1, C, 1, 2)
    e["message_id"] = "m\u0085\u2028\u2029é"
    e["event_id"] = "ev\u2028"
    lines = [
        json.dumps(e, ensure_ascii=False).encode() + b"\r\n",
        b'{"type":"watermark","lane":0,"watermark":1,"ts":0}\n',
    ]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines))
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr.decode()
    got = read_outputs(tmp_path / "o")
    assert got == expected(lines, ReplayOptions())
    assert got["stats"]["applied"] == 1 and got["projections"][0]["last_message_id"] == e["message_id"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=streams(), hot_rows=st.sampled_from((1, 2, 5)))
def test_a_state_folder_with_a_tiny_hot_set_replays_exactly_as_in_memory(
    tmp_path_factory: pytest.TempPathFactory, stream: Stream, hot_rows: int
) -> None:
    """Fed one line at a time, the replay persists and evicts after every line: users and rows
    are read back from RocksDB over and over; everything equals the in-memory replay."""
    from app.replay import Replayer

    lines = [line for line in stream.lines() if line.strip()]
    options = ReplayOptions(lanes=stream.lanes, window_ms=30)
    want = run_replay(lines, options)
    frames: list[Any] = []
    replayer = Replayer(options, frames.append, state_dir=tmp_path_factory.mktemp("state"), hot_rows=hot_rows)
    for line in lines:
        replayer.feed_many([line])
    got = replayer.finish()
    assert list(got.projections) == want.projections
    assert list(got.badges) == want.badges
    assert got.stats == want.stats
    assert frames == want.frames
    residency = replayer.processor.residency
    assert residency is not None and residency.resident_rows <= max(hot_rows, len(want.projections))


def _entry(user: int, seq: int) -> bytes:
    """Message `seq` of one conversation, to `user` at mailbox_seq `seq` (lane 0)."""
    record = {
        "type": "message", "mailbox_seq": seq, "lane": 0, "ts": 1767225600000 + seq,
        "event_id": f"ev-{user}-{seq}", "user_id": user, "conversation_id": C, "conversation_seq": seq,
        "message_id": f"m{seq}", "activity_id": f"019b76daa800000000000000{seq:08x}", "sender_id": 9,
        "created_at": 1767225600000 + seq, "counts_unread": True, "mention": False,
    }  # fmt: skip
    return json.dumps(record).encode()


def _marker(watermark: int, count: int) -> bytes:
    record = {"type": "watermark", "lane": 0, "watermark": watermark, "ts": 1767225700000, "count": count}
    return json.dumps(record).encode()


def test_markers_counts_are_checked_on_one_partitions_log_and_a_loss_reported(tmp_path: Path) -> None:
    """One partition's log: the markers' counts are checked, and an entry the count includes
    that never came is reported."""
    lines = [_entry(1, 1), _entry(1, 2), _entry(1, 3), _marker(3, 3), _entry(1, 5), _marker(5, 5)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert "markers' counts: 1 entries missing (lane 0: 1)" in proc.stderr.decode()


def test_a_file_merging_several_partitions_logs_reports_no_false_loss(tmp_path: Path) -> None:
    """`projector simulate --out` with several partitions keeps one copy of each marker per
    partition, each with that partition's count. Read as one log, the copies' counts say nothing
    about the file (read as counts they reported "4 entries missing" here, where none is):
    replay says the counts were not checked, and writes the same projection as without them."""
    a, b = 1, 2  # user 1's entries went to partition A (3 of 4 per marker), user 2's to B
    lines = [
        _entry(a, 1), _entry(a, 2), _entry(b, 3), _entry(a, 4), _marker(4, 1), _marker(4, 3),
        _entry(a, 5), _entry(b, 6), _entry(a, 7), _entry(a, 8), _marker(8, 2), _marker(8, 6),
    ]  # fmt: skip
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    proc = projector("replay", "--input", str(src), "--out", str(tmp_path / "o"))
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "missing" not in err and "markers' counts not checked" in err, err
    plain = tmp_path / "plain.jsonl"
    uncounted = [json.dumps({k: v for k, v in json.loads(x).items() if k != "count"}).encode() for x in lines]
    plain.write_bytes(b"\n".join(uncounted) + b"\n")
    proc = projector("replay", "--input", str(plain), "--out", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr.decode()
    got, want = read_outputs(tmp_path / "o"), read_outputs(tmp_path / "p")
    assert got["projections"] == want["projections"] and got["badges"] == want["badges"]
