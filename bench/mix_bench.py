"""The product's real mix (issue 33 item 5): group fan-out at half the worker's capacity with the
product's 5 s window, and a stream of direct messages and mentions through it, measured entry ->
event on the live stream (the SDK over the gateway's SSE), side by side with the worker on the
group traffic alone.

The traffic (one model, `Traffic`, for every phase): groups of `--group-size` members (disjoint
member sets, as J-1's one group), each sending `--group-rate` messages a second (J-1's 20), every
message fanned out to every member (sender included, its own entry not counting as unread) with
`member_count` = the group's size, so it waits for the window. Through it, the fast lane
(docs/contract.md §10): every `--mention-every`th message of a group mentions one of the group's
first `--fast-per-group` members (the "fast" members), and `--dm-rate` direct messages a second go
between pairs of fast members (each pair its own conversation, `member_count` 2, two entries: the
sender's and the recipient's). The next `--sample-per-group` members of each group receive only
group traffic. One lane; a watermark marker after each tick's entries.

Three parts, in one run:

1. **Throughput, side by side** (bench/worker_bench.py's machinery: `Bench.run_one`, the same
   probes, the same clock): the real `projector worker` at the product's window on a
   pre-produced backlog of `--backlog-seconds` of that traffic from `--backlog-groups` groups,
   once without the direct messages and mentions (`group`: today's worker on group traffic) and
   once with them (`mix`), interleaved over `--reps` repetitions. The `group` median is the
   worker's capacity at that window; the ratio mix / group (median of per-repetition ratios)
   says whether the lane eats the compaction (target >= 0.9).
2. **Live**: a fresh worker (window `--window-ms`) and `projector api` with its gateway (as
   deployed, bench/gateway_bench.py's helpers), the traffic paced in real time with as many
   groups as make `--load` (0.5) x the measured capacity, for `--live-seconds` (50: J-1's span,
   so a group row gets 1,000 messages). SDK `LiveStream`s (in a process of their own, so the
   producer's loop does not delay them) follow every fast member and every sampled member. An
   entry's latency ends when the SDK applies the first SESSION_DELTA whose version covers it;
   the first `--warmup-seconds` are not measured. Fast-lane entries (direct messages, mentions):
   p50 <= 60 ms, p99 <= 239 ms; the sampled members' group entries: p99 <= window + 300 ms.
   Each entry's time is also split at the frame's Kafka timestamp: entry -> frame (the worker)
   and frame -> SDK event (the gateway hop and the SDK).
3. **J-1 for the group traffic**, from the live phase's frames (the session-delta topic): a
   group row's writes = the frames of its user that carry it after the set-up; a write is the
   fast lane's when the frame's version is one of that user's fast-lane entries (a frame's
   version is its user's last applied entry, docs/contract.md §3.9, and a fast flush runs right
   after its entry). Window writes per row <= ceil(span / window) + 1 (11 for 50 s) and
   messages / window writes >= 90; all writes (the fast ones included) and their ratio beside.

    .venv/bin/python bench/mix_bench.py [--reps 2 --live-seconds 50 ...]   (or `make bench-mix`)

Writes bench/out/mix_report.json and prints a table. Exit 1 if a run failed.
Internal mode (the SDK process): `--follow URL SECRET` (users on stdin).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import math
import os
import random
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gateway_bench, worker_bench  # noqa: E402
from bench.harness import baseline_settings, percentile  # noqa: E402

FIRST_USER = 1_000_000
T0_MS = 1_767_225_600_000  # the backlog's event time origin (2026-01-01)
# Issue 33's targets for this bench.
FAST_P50_MS = 60.0
FAST_P99_MS = 239.0
GROUP_P99_OVER_WINDOW_MS = 300.0
MIX_OVER_GROUP = 0.9
FOLLOW_WAVE = 50  # SDK streams opened at a time


def log(message: str) -> None:
    print(f"[mix-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the traffic (pure) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    groups: int
    group_size: int = 50
    group_rate: float = 20.0  # messages a second per group (J-1's)
    fast_per_group: int = 10  # members who receive the direct messages and mentions
    sample_per_group: int = 2  # members followed over SSE who receive only group traffic
    dm_rate: float = 10.0  # direct messages a second, in all (two entries each)
    dm_partners: int = 2  # direct-message partners per fast member (at least)
    mention_every: int = 20  # every Nth message of a group mentions one fast member (0: none)
    all_mention_every: int = 0  # every Nth message of a group is an @all (0: none)
    seed: int = 33

    def __post_init__(self) -> None:
        if self.groups < 1 or self.group_size < 3:
            raise ValueError("at least one group of at least 3 members (2 is a direct message)")
        if self.fast_per_group + self.sample_per_group > self.group_size:
            raise ValueError("--fast-per-group + --sample-per-group must fit in a group")
        if self.dm_rate > 0 and self.groups * self.fast_per_group < 2:
            raise ValueError("direct messages need at least two fast members")


# An entry before it is numbered: (user, kind, fields without mailbox_seq / ts / created_at /
# activity_id). Kinds: "join" (set-up), "group" (window lane), "mention", "dm" (fast lane).
Pending = tuple[int, str, dict[str, Any]]


def conversation_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass(slots=True)
class Group:
    conversation: str
    members: list[int]
    fast: list[int]
    sample: list[int]
    sent: int = 0  # messages so far (the last conversation_seq)


@dataclass(slots=True)
class Pair:
    conversation: str
    users: tuple[int, int]
    sent: int = 0


@dataclass
class Traffic:
    """The seeded traffic: `due(upto_ms)` gives the entries due up to an offset (ms since the
    start), in order; group g's message k is due at (k-1)/rate + g/(rate*groups) seconds (the
    groups staggered), direct message j at j/dm_rate seconds. `dms` / `mentions` False leave
    that part out (the group-only stream)."""

    shape: Shape
    dms: bool = True
    mentions: bool = True
    groups: list[Group] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    _dm_sent: int = 0

    def __post_init__(self) -> None:
        s = self.shape
        rng = random.Random(s.seed)
        user = FIRST_USER
        for _ in range(s.groups):
            members = list(range(user, user + s.group_size))
            user += s.group_size
            self.groups.append(
                Group(
                    conversation_id(rng),
                    members,
                    members[: s.fast_per_group],
                    members[s.fast_per_group : s.fast_per_group + s.sample_per_group],
                )
            )
        fast = self.fast_users
        seen: set[tuple[int, int]] = set()
        if len(fast) >= 2:
            for a in fast:
                for b in rng.sample([u for u in fast if u != a], min(s.dm_partners, len(fast) - 1)):
                    key = (min(a, b), max(a, b))
                    if key not in seen:
                        seen.add(key)
                        self.pairs.append(Pair(conversation_id(rng), key))
        self._rng = rng

    @property
    def fast_users(self) -> list[int]:
        return [u for g in self.groups for u in g.fast]

    @property
    def sample_users(self) -> list[int]:
        return [u for g in self.groups for u in g.sample]

    def setup(self) -> list[Pending]:
        """Every membership's join: the groups', then the direct-message pairs' (if any)."""
        out: list[Pending] = []
        for g in self.groups:
            for i, member in enumerate(g.members):
                role = "owner" if i == 0 else "member"
                out.append((member, "join", join(member, g.conversation, role)))
        if self.dms and self.shape.dm_rate > 0:
            for pair in self.pairs:
                for member in pair.users:
                    out.append((member, "join", join(member, pair.conversation, "member")))
        return out

    def due(self, upto_ms: float) -> list[Pending]:
        """The entries due at offsets < upto_ms not given yet, in due order."""
        s = self.shape
        period = 1000.0 / s.group_rate
        stagger = period / s.groups
        events: list[tuple[float, int, int]] = []  # (due ms, 0 group / 1 dm, index)
        for index, g in enumerate(self.groups):
            k = g.sent
            while k * period + index * stagger < upto_ms:
                events.append((k * period + index * stagger, 0, index))
                k += 1
        if self.dms and s.dm_rate > 0 and self.pairs:
            j = self._dm_sent
            while j * 1000.0 / s.dm_rate < upto_ms:
                events.append((j * 1000.0 / s.dm_rate, 1, j))
                j += 1
        events.sort()
        out: list[Pending] = []
        for _, kind, index in events:
            if kind == 0:
                self._group_message(self.groups[index], index, out)
            else:
                self._direct_message(out)
        return out

    def _group_message(self, g: Group, index: int, out: list[Pending]) -> None:
        s = self.shape
        g.sent += 1
        k = g.sent
        sender = g.members[(k * 7) % len(g.members)]
        mentioned: set[int] = set()
        if self.mentions and s.all_mention_every and k % s.all_mention_every == 0:
            mentioned = set(g.members) - {sender}
        elif self.mentions and s.mention_every and g.fast and k % s.mention_every == 0:
            target = g.fast[(k // s.mention_every) % len(g.fast)]
            if target == sender:
                target = g.fast[(k // s.mention_every + 1) % len(g.fast)]
            if target != sender:
                mentioned = {target}
        for member in g.members:
            mention = member in mentioned
            out.append(
                (
                    member,
                    "mention" if mention else "group",
                    message(member, g.conversation, k, f"g{index}-{k}", sender, len(g.members), mention),
                )
            )

    def _direct_message(self, out: list[Pending]) -> None:
        pair = self.pairs[self._rng.randrange(len(self.pairs))]
        self._dm_sent += 1
        pair.sent += 1
        sender, recipient = pair.users if pair.sent % 2 else pair.users[::-1]
        for member in (sender, recipient):
            out.append(
                (
                    member,
                    "dm",
                    message(member, pair.conversation, pair.sent, f"d{self._dm_sent}", sender, 2, False),
                )
            )


def join(user: int, conversation: str, role: str) -> dict[str, Any]:
    return {
        "type": "join",
        "lane": 0,
        "event_id": f"j-{conversation}-{user}",
        "user_id": user,
        "conversation_id": conversation,
        "joined_at_conversation_seq": 0,
        "role": role,
    }


def message(
    user: int, conversation: str, seq: int, message_key: str, sender: int, members: int, mention: bool
) -> dict[str, Any]:
    return {
        "type": "message",
        "lane": 0,
        "event_id": f"e{message_key}",
        "user_id": user,
        "conversation_id": conversation,
        "conversation_seq": seq,
        "message_id": f"m{message_key}",
        "sender_id": sender,
        "counts_unread": user != sender,
        "mention": mention,
        "member_count": members,
    }


def stamp(entry: dict[str, Any], seq: int, ts: int) -> dict[str, Any]:
    """The entry with its mailbox_seq and event time (and a message's time-sortable activity)."""
    entry["mailbox_seq"] = seq
    entry["ts"] = ts
    if entry["type"] == "message":
        entry["created_at"] = ts
        entry["activity_id"] = f"{ts:016x}{seq:016x}"
    return entry


def backlog_lines(traffic: Traffic, seconds: float, tick_ms: float = 10.0) -> Iterator[bytes]:
    """The set-up, then `seconds` of traffic as mailbox-tail JSON lines (event time from T0_MS at
    the traffic's own pace), one lane: bench/worker_bench.py's `load_stream` re-marks them."""
    seq = 0
    for _, _, entry in traffic.setup():
        seq += 1
        yield orjson.dumps(stamp(entry, seq, T0_MS))
    ticks = math.ceil(seconds * 1000 / tick_ms)
    for tick in range(1, ticks + 1):
        upto = min(tick * tick_ms, seconds * 1000)
        for _, _, entry in traffic.due(upto):
            seq += 1
            yield orjson.dumps(stamp(entry, seq, T0_MS + int(upto)))


# -- analysis (pure) -----------------------------------------------------------------------------


def figures(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.50), 1),
        "p90_ms": round(percentile(values, 0.90), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "max_ms": round(max(values), 1),
    }


Tracked = dict[int, list[tuple[int, int, str]]]  # user -> [(mailbox_seq, produced ns, kind)]
Applied = dict[int, list[tuple[int, int]]]  # user -> [(version, ns)] in the order applied


def first_covering(versions: list[tuple[int, int]], seq: int) -> int | None:
    """The time of the first (version, time) whose version covers `seq`; versions ascending."""
    i = bisect.bisect_left(versions, (seq, -1))
    return versions[i][1] if i < len(versions) else None


def entry_latencies(
    tracked: Tracked, applied: Applied, frames: Applied | None = None
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]], int]:
    """Per kind: entry -> SDK event (ms: the first SESSION_DELTA the SDK applied whose version
    covers the entry), and, given the frames' Kafka times (`frames`, ms), entry -> frame and
    frame -> SDK event. Also how many entries no applied frame covered."""
    to_sdk: dict[str, list[float]] = {}
    to_frame: dict[str, list[float]] = {}
    hop: dict[str, list[float]] = {}
    missing = 0
    for user, entries in tracked.items():
        # The SDK applies only newer versions, so its list ascends; keep it sorted regardless.
        got = sorted(applied.get(user, []))
        published = sorted(frames.get(user, [])) if frames is not None else []
        for seq, produced, kind in entries:
            at = first_covering(got, seq)
            if at is None:
                missing += 1
                continue
            to_sdk.setdefault(kind, []).append((at - produced) / 1e6)
            if frames is not None:
                frame_ms = first_covering(published, seq)
                if frame_ms is not None:
                    to_frame.setdefault(kind, []).append(frame_ms - produced / 1e6)
                    hop.setdefault(kind, []).append(at / 1e6 - frame_ms)
    return to_sdk, to_frame, hop, missing


def j1_figures(
    frames: list[tuple[int, int, list[str]]],
    rows: dict[tuple[int, str], int],
    fast_seqs: dict[int, set[int]],
    after_seq: int,
    span_s: float,
    window_ms: int,
) -> dict[str, Any]:
    """J-1 over the group rows: `frames` (user, version, conversations written) of the live run,
    `rows` the group rows with the messages each received, `fast_seqs` each user's fast-lane
    entries; writes after the set-up (version > after_seq) only."""
    writes = dict.fromkeys(rows, 0)
    fast = dict.fromkeys(rows, 0)
    for user, version, conversations in frames:
        if version <= after_seq:
            continue
        is_fast = version in fast_seqs.get(user, ())
        for conversation in conversations:
            row = (user, conversation)
            if row in writes:
                writes[row] += 1
                fast[row] += int(is_fast)
    window = {row: writes[row] - fast[row] for row in rows}
    messages = sum(rows.values())
    bound = math.ceil(span_s * 1000 / window_ms) + 1
    max_window = max(window.values(), default=0)
    # As bench/harness.py's J-1 verdict: messages / the bound (90 for J-1's 1,000 messages over
    # 50 s at a 5 s window: what this bench's live phase paces by default).
    min_ratio = math.floor(max(rows.values(), default=0) / bound)
    ratio_window = messages / max(1, sum(window.values()))
    ratio_all = messages / max(1, sum(writes.values()))
    return {
        "rows": len(rows),
        "messages_per_row_max": max(rows.values(), default=0),
        "span_s": round(span_s, 2),
        "bound": bound,
        "max_window_writes_per_row": max_window,
        "max_writes_per_row": max(writes.values(), default=0),
        "max_fast_writes_per_row": max(fast.values(), default=0),
        "fast_writes": sum(fast.values()),
        "rows_never_written": sum(1 for w in writes.values() if w == 0),
        "compression_ratio_window_writes": round(ratio_window, 2),
        "compression_ratio_all_writes": round(ratio_all, 2),
        "min_compression_ratio": min_ratio,
        "passed": max_window <= bound and ratio_window >= min_ratio,
    }


# -- the SDK process -----------------------------------------------------------------------------


async def follow(url: str, secret: str) -> None:
    """Follow the users named on stdin's first line; report when synced; obey commands."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    users: list[int] = orjson.loads(await stdin.readline())["users"]
    applied: Applied = {u: [] for u in users}
    stop = asyncio.Event()
    started = time.monotonic()
    clients: list[tuple[Any, Any]] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        # In waves: each stream's hello pulls its list (three requests), and hundreds at once
        # exhaust the API's store connections (refused hellos, reconnects).
        for wave in range(0, len(users), FOLLOW_WAVE):
            more, running = gateway_bench.follow_users(
                url,
                secret,
                users[wave : wave + FOLLOW_WAVE],
                lambda user, version, ns: applied[user].append((version, ns)),
                stop,
            )
            clients += more
            tasks += running
            await gateway_bench.until_synced(more, 120)
        print(
            orjson.dumps({"ready": len(clients), "sync_s": time.monotonic() - started}).decode(), flush=True
        )
        views = {follow.live.user_id: follow for _, follow in clients}
        while line := (await stdin.readline()).decode().strip():
            command, _, arg = line.partition(" ")
            if command == "wait":  # until every named user's view covers its seq
                want = {int(u): s for u, s in orjson.loads(arg).items()}
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and any(
                    views[u].live.view.version < s for u, s in want.items()
                ):
                    await asyncio.sleep(0.1)
                behind = [u for u, s in want.items() if views[u].live.view.version < s]
                print(orjson.dumps({"behind": behind[:20], "behind_count": len(behind)}).decode(), flush=True)
            elif command == "dump":
                stats = [f.stats for _, f in clients]
                print(
                    orjson.dumps(
                        {
                            "applied": {str(u): v for u, v in applied.items()},
                            "repulls": sum(s.repull_events for s in stats),
                            "syncs": sum(f.live.syncs for _, f in clients),
                            "disconnects": sum(s.disconnects for s in stats),
                            "frames": sum(s.frames for s in stats),
                        }
                    ).decode(),
                    flush=True,
                )
            elif command == "quit":
                break
    finally:
        stop.set()
        await gateway_bench.close_followers(clients, tasks)


# -- the main process ----------------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


class CpuShares:
    """Cores used by some processes, and by the machine, from now to `cores()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.started = time.monotonic()
        self.cpu = {name: gateway_bench.cpu_s(pid) for name, pid in pids.items()}
        self.machine = machine_cpu()

    def cores(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                out[name] = round((gateway_bench.cpu_s(pid) - self.cpu[name]) / elapsed, 2)
        busy, total = machine_cpu()
        share = (busy - self.machine[0]) / max(1.0, total - self.machine[1])
        out["machine"] = round(share * (os.cpu_count() or 1), 2)
        return out


class MixBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # bench/worker_bench.py's runner: its private namespace, topics, processes and cleanup.
        flags = {
            "--bootstrap": args.bootstrap,
            "--window-ms": str(args.window_ms),
            "--partitions": "1",
            "--worker-batch-records": "0",  # the product's fetch batches
            "--timeout": str(args.timeout),
            "--work-dir": str(ROOT / "bench/out/mix"),
            "--contenders": "worker",
        }
        self.worker_args = worker_bench.parse([part for flag in flags.items() for part in flag])
        self.worker_args.keep_logs = args.keep_logs
        self.worker_args.wrapper = args.wrapper
        self.bench = worker_bench.Bench(self.worker_args, kind="mbench")
        self.secret = secrets.token_urlsafe(32)

    def shape(self, groups: int) -> Shape:
        a = self.args
        return Shape(
            groups=groups,
            group_size=a.group_size,
            group_rate=a.group_rate,
            fast_per_group=a.fast_per_group,
            sample_per_group=a.sample_per_group,
            dm_rate=a.dm_rate,
            dm_partners=a.dm_partners,
            mention_every=a.mention_every,
            all_mention_every=a.all_mention_every,
        )

    # -- 1. throughput -------------------------------------------------------------------------

    async def backlog(self, name: str, traffic: Traffic) -> tuple[str, worker_bench.Stream]:
        """Write `traffic` to a file, re-mark it as the worker bench does, produce it."""
        bench, a = self.bench, self.args
        path = bench.work / f"{name}.jsonl"
        with path.open("wb") as out:
            for line in backlog_lines(traffic, a.backlog_seconds):
                out.write(line + b"\n")
        stream = worker_bench.load_stream(path, 1, a.marker_every, "first-message")
        path.unlink()
        topic = f"{bench.prefix}-{name}-mailbox-tail"
        await bench.kafka.create([topic], 1)
        started = time.monotonic()
        await bench.kafka.produce(topic, stream.records)
        # Only the counts and the last seqs are needed from here on (run_one): free the records.
        stream.records, stream.entry_values = [], []
        log(
            f"{name}: {stream.entries:,} entries ({stream.timed:,} timed) produced to {topic} "
            f"in {time.monotonic() - started:.1f} s"
        )
        return topic, stream

    async def throughput(self) -> dict[str, Any]:
        a, bench = self.args, self.bench
        shape = self.shape(a.backlog_groups)
        streams = {
            "group": await self.backlog("group", Traffic(shape, dms=False, mentions=False)),
            "mix": await self.backlog("mix", Traffic(shape)),
        }
        runs: list[worker_bench.Run] = []
        names = list(streams)
        for rep in range(a.reps):
            for name in names[rep % 2 :] + names[: rep % 2]:
                topic, stream = streams[name]
                run = await bench.run_one("worker", rep, stream, topic, tag=f"-{name}")
                run.contender = name
                runs.append(run)
                if run.ok:
                    log(
                        f"rep {rep + 1}/{a.reps} {name:5s} {run.entries_per_s:9,.0f} entries/s "
                        f"({run.seconds:.2f} s, cpu {run.cpu_s:.2f} s)"
                    )
                else:
                    log(f"rep {rep + 1}/{a.reps} {name} FAILED: {run.error[:2000]}")
        ok = [r for r in runs if r.ok]
        summary: dict[str, Any] = {}
        for name in names:
            mine = [r for r in ok if r.contender == name]
            if mine:
                rates = [r.entries_per_s for r in mine]
                summary[name] = {
                    "runs": len(mine),
                    "timed_entries": streams[name][1].timed,
                    "entries_per_s": statistics.median(rates),
                    "entries_per_s_range": [min(rates), max(rates)],
                    "entries_per_cpu_s": statistics.median([r.entries_per_cpu_s for r in mine]),
                    "frames": statistics.median([r.extra.get("frames", 0) for r in mine]),
                }
        ratios: dict[str, Any] = {}
        for key, attr in (("mix_over_group", "entries_per_s"), ("cpu_mix_over_group", "entries_per_cpu_s")):
            per_rep = []
            for rep in range(a.reps):
                m = next((r for r in ok if r.rep == rep and r.contender == "mix"), None)
                g = next((r for r in ok if r.rep == rep and r.contender == "group"), None)
                if m and g:
                    per_rep.append(getattr(m, attr) / getattr(g, attr))
            if per_rep:
                ratios[key] = statistics.median(per_rep)
                ratios[f"{key}_per_rep"] = per_rep
        return {
            "backlog_groups": a.backlog_groups,
            "backlog_seconds": a.backlog_seconds,
            "summary": summary,
            "ratios": ratios,
            "failed": [f"{r.contender} rep {r.rep}: {r.error[:500]}" for r in runs if not r.ok],
        }

    # -- 2 + 3. live -----------------------------------------------------------------------------

    async def live(
        self, capacity: float, tag: str = "", settings: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """One live run; `settings`: worker settings of this run only (the baseline's)."""
        a, bench = self.args, self.bench
        per_group = a.group_rate * a.group_size
        groups = a.live_groups or max(1, round(a.load * capacity / per_group))
        traffic = Traffic(self.shape(groups))
        name = f"{bench.prefix}-live{tag}"
        topic = f"{name}-mailbox-tail"
        env = {**bench.worker_env(name, a.window_ms, topic), **(settings or {})}
        deltas = env["PROJECTOR_TOPIC_SESSION_DELTA"]
        bench.check(
            await asyncio.to_thread(
                subprocess.run,
                [*worker_bench.projector_argv(), "bootstrap"],
                cwd=ROOT,
                env=env,
                capture_output=True,
            )
        )
        log(
            f"live: {groups} groups of {a.group_size} at {a.group_rate:g} msg/s = {groups * per_group:,.0f} "
            f"group entries/s ({groups * per_group / capacity:.2f} x capacity {capacity:,.0f}/s), "
            f"{a.dm_rate:g} direct messages/s, a mention every {a.mention_every} messages; "
            f"{len(traffic.fast_users)} fast + {len(traffic.sample_users)} sampled users over SSE"
        )
        argv, worker_env, cwd = bench.worker_command("worker", env)
        argv = [*shlex.split(a.wrapper), *argv]
        worker = bench.spawn(argv, worker_env, bench.work / f"{name}-worker.log", cwd)
        api_log = bench.work / f"{name}-api.log"
        api_env = {
            **env,
            "PROJECTOR_API_SECRET": self.secret,
            "PROJECTOR_API_FILL_FROM_STATE": "never",
            "PROJECTOR_GATEWAY_HEARTBEAT_MS": "5000",
        }
        api = bench.spawn([*worker_bench.projector_argv(), "api", "--port", "0"], api_env, api_log)
        url = await self.api_url(api, api_log)
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=a.bootstrap,
            acks="all",
            enable_idempotence=True,  # in send order: a marker never overtakes its entries
            linger_ms=0,
            max_batch_size=1 << 20,
        )
        await producer.start()
        sdk: asyncio.subprocess.Process | None = None
        send_errors: list[BaseException] = []

        def sent(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and future.exception() is not None and not send_errors:
                send_errors.append(future.exception())  # type: ignore[arg-type]

        seq = 0
        last_seq: dict[int, int] = {}

        async def send(entries: list[Pending], ts_ms: int, track: Tracked | None, measured: bool) -> None:
            """A tick's entries, then the lane's marker, in record batches of the one partition
            (a send per record costs the producer ~3x the CPU, and the bench shares two cores
            with the worker). An entry is produced when it is appended (its record's time)."""
            nonlocal seq
            if not entries:
                return
            batch = producer.create_batch()

            def append(key: bytes | None, value: bytes) -> None:
                nonlocal batch
                if batch.append(timestamp=None, key=key, value=value) is None:  # full
                    batches.append(batch)
                    batch = producer.create_batch()
                    batch.append(timestamp=None, key=key, value=value)

            batches: list[Any] = []
            for user, kind, entry in entries:
                seq += 1
                value = orjson.dumps(stamp(entry, seq, ts_ms))
                if track is not None and measured and user in track:
                    track[user].append((seq, time.time_ns(), kind))
                append(str(user).encode(), value)
                last_seq[user] = seq
            append(None, worker_bench.marker(seq, ts_ms))
            for full in [*batches, batch]:
                full.close()
                (await producer.send_batch(full, topic, partition=0)).add_done_callback(sent)

        followed = traffic.fast_users + traffic.sample_users
        tracked: Tracked = {u: [] for u in followed}
        fast_seqs: dict[int, set[int]] = {}
        try:
            # The set-up: every membership's join, then its frames (the first window).
            await send(traffic.setup(), int(time.time() * 1000), None, False)
            await producer.flush()
            setup_seq = seq
            await self.frames_reaching(deltas, dict(last_seq), worker, "the set-up's frames")
            sdk = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--follow", url, self.secret,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=(bench.work / f"{name}-sdk.log").open("ab"), limit=1 << 28,
            )  # fmt: skip
            ready = await self.ask(sdk, orjson.dumps({"users": followed}).decode(), 180)
            log(f"live: {ready['ready']} SDK streams synced in {ready['sync_s']:.1f} s; pacing")
            tick_s = a.tick_ms / 1000
            cpu = CpuShares({"worker": worker.pid, "api": api.pid, "sdk": sdk.pid, "bench": os.getpid()})
            started = time.monotonic()
            # each group's first and last message sent (wall clock): the row's span for J-1
            first_sent: list[float | None] = [None] * len(traffic.groups)
            last_sent: list[float] = [0.0] * len(traffic.groups)
            tick = 0
            seconds = a.live_seconds
            while True:
                tick += 1
                upto_ms = min(tick * a.tick_ms, seconds * 1000)
                before = [g.sent for g in traffic.groups]
                entries = traffic.due(upto_ms)
                now = time.time()
                for g, group in enumerate(traffic.groups):
                    if group.sent > before[g]:
                        first_sent[g] = now if first_sent[g] is None else first_sent[g]
                        last_sent[g] = now
                await send(entries, int(now * 1000), tracked, upto_ms > a.warmup_seconds * 1000)
                for user, kind, entry in entries:
                    if kind in ("dm", "mention"):
                        fast_seqs.setdefault(user, set()).add(entry["mailbox_seq"])
                if upto_ms >= seconds * 1000:
                    break
                await asyncio.sleep(max(0.0, started + tick * tick_s - time.monotonic()))
            paced_s = time.monotonic() - started
            cores = cpu.cores()
            await producer.flush()
            if send_errors:
                raise RuntimeError(f"live: a send failed: {send_errors[0]!r}")
            produced = seq - setup_seq
            log(f"live: {produced:,} entries in {paced_s:.1f} s ({produced / paced_s:,.0f}/s); draining")
            covered = await self.ask(
                sdk, "wait " + orjson.dumps({str(u): last_seq[u] for u in followed}).decode(), 180
            )
            await self.frames_reaching(deltas, dict(last_seq), worker, "frames never reached the last seqs")
            dump = await self.ask(sdk, "dump", 120)
        finally:
            await producer.stop()
            if sdk is not None and sdk.returncode is None:
                assert sdk.stdin is not None
                sdk.stdin.write(b"quit\n")
                with contextlib.suppress(Exception):
                    await sdk.stdin.drain()
                try:
                    await asyncio.wait_for(sdk.wait(), timeout=30)
                except TimeoutError:
                    sdk.kill()
            bench.stop(worker, signal.SIGINT if a.wrapper else signal.SIGTERM)
            bench.stop(api)
        records = await bench.kafka.read(deltas)
        frames: list[tuple[int, int, list[str]]] = []
        frame_times: Applied = {}
        for record in records:
            frame = orjson.loads(record.value)
            user, version = frame["user_id"], frame["projection_mailbox_seq"]
            frames.append((user, version, [row["conversation_id"] for row in frame["conversations"]]))
            if user in tracked:
                frame_times.setdefault(user, []).append((version, record.timestamp))
        applied: Applied = {int(u): [(v, ns) for v, ns in got] for u, got in dump["applied"].items()}
        to_sdk, to_frame, hop, missing = entry_latencies(tracked, applied, frame_times)
        # The sampled members get no fast-lane entry: their group entries wait for the window only.
        group_sample = entry_latencies({u: tracked[u] for u in traffic.sample_users}, applied)[0].get(
            "group", []
        )
        fast_all = to_sdk.get("dm", []) + to_sdk.get("mention", [])
        rows = {(u, g.conversation): g.sent for g in traffic.groups for u in g.members}
        spans = [last - first for first, last in zip(first_sent, last_sent, strict=True) if first is not None]
        j1 = j1_figures(frames, rows, fast_seqs, setup_seq, max(spans, default=0.0), a.window_ms)
        return {
            "groups": groups,
            "group_entries_per_s": groups * per_group,
            "load_over_capacity": groups * per_group / capacity,
            "capacity_entries_per_s": capacity,
            "dm_per_s": a.dm_rate,
            "mention_every": a.mention_every,
            "fast_users": len(traffic.fast_users),
            "sample_users": len(traffic.sample_users),
            "entries": produced,
            "paced_seconds": round(paced_s, 2),
            "achieved_entries_per_s": round(produced / paced_s),
            "warmup_seconds": a.warmup_seconds,
            "fast_lane": figures(fast_all),
            "fast_lane_dm": figures(to_sdk.get("dm", [])),
            "fast_lane_mention": figures(to_sdk.get("mention", [])),
            "fast_lane_entry_to_frame": figures(to_frame.get("dm", []) + to_frame.get("mention", [])),
            "fast_lane_frame_to_sdk": figures(hop.get("dm", []) + hop.get("mention", [])),
            "group_sampled": figures(group_sample),
            "group_all_followed": figures(to_sdk.get("group", [])),
            "group_entry_to_frame": figures(to_frame.get("group", [])),
            "entries_not_covered": missing,
            "sdk_not_caught_up": covered["behind_count"],
            "sdk": {k: v for k, v in dump.items() if k != "applied"},
            "frames": len(frames),
            # Cores each process used while the traffic was paced, and the whole machine's (Kafka,
            # Redis, Cassandra and other jobs included): where the two cores went.
            "cores_while_paced": cores,
            "j1": j1,
        }

    async def api_url(self, api: subprocess.Popen[bytes], log_path: Path) -> str:
        """Wait for `projector api` to announce its URL in its log."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if api.poll() is not None:
                raise RuntimeError(f"projector api exited {api.returncode}: {worker_bench.tail(log_path)}")
            for line in log_path.read_text(errors="replace").splitlines() if log_path.exists() else []:
                url = gateway_bench.listening_url(line)
                if url is not None:
                    return url
            await asyncio.sleep(0.2)
        raise RuntimeError(f"projector api did not start: {worker_bench.tail(log_path)}")

    @staticmethod
    async def ask(proc: asyncio.subprocess.Process, command: str, timeout: float) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(command.encode() + b"\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=timeout)
        if not line:
            raise RuntimeError("the SDK process ended")
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def frames_reaching(
        self, topic: str, want: dict[int, int], worker: subprocess.Popen[bytes], what: str
    ) -> None:
        """Until every user in `want` has a SESSION_DELTA at or past its seq."""
        deadline = time.monotonic() + self.args.timeout
        while True:
            top: dict[int, int] = {}
            for record in await self.bench.kafka.read(topic):
                frame = orjson.loads(record.value)
                user = frame["user_id"]
                top[user] = max(top.get(user, 0), frame["projection_mailbox_seq"])
            if all(top.get(u, 0) >= s for u, s in want.items()):
                return
            if worker.poll() is not None:
                raise RuntimeError(f"live: the worker exited {worker.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"live: {what}")
            await asyncio.sleep(0.5)


# -- report --------------------------------------------------------------------------------------


def verdicts(report: dict[str, Any]) -> dict[str, bool | None]:
    live = report.get("live") or {}
    ratios = (report.get("throughput") or {}).get("ratios", {})
    fast = live.get("fast_lane", {})
    group = live.get("group_sampled", {})
    window = report["params"]["window_ms"]
    j1 = live.get("j1")

    def met(value: float | None, ok: bool) -> bool | None:
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else ok

    return {
        "fast_p50": met(fast.get("p50_ms"), fast.get("p50_ms", math.inf) <= FAST_P50_MS),
        "fast_p99": met(fast.get("p99_ms"), fast.get("p99_ms", math.inf) <= FAST_P99_MS),
        "group_p99": met(
            group.get("p99_ms"), group.get("p99_ms", math.inf) <= window + GROUP_P99_OVER_WINDOW_MS
        ),
        "mix_over_group": met(
            ratios.get("mix_over_group"), ratios.get("mix_over_group", 0) >= MIX_OVER_GROUP
        ),
        "j1": None if not j1 else bool(j1["passed"]),
    }


def render(report: dict[str, Any]) -> str:
    out: list[str] = []
    window = report["params"]["window_ms"]
    marks = verdicts(report)

    def mark(key: str) -> str:
        return {True: "met", False: "NOT met", None: "n/a"}[marks[key]]

    tp = report.get("throughput") or {}
    summary = tp.get("summary", {})
    out.append(
        f"mix bench: worker window {window} ms; throughput on a backlog of {tp.get('backlog_seconds')} s of "
        f"{tp.get('backlog_groups')} groups' traffic, {report['params']['reps']} interleaved repetitions"
    )
    for name, s in summary.items():
        lo, hi = s["entries_per_s_range"]
        out.append(
            f"  {name:5s} {s['entries_per_s']:9,.0f} entries/s ({lo:,.0f}..{hi:,.0f}), "
            f"{s['entries_per_cpu_s']:,.0f} per CPU s, {s['timed_entries']:,} timed entries"
        )
    ratios = tp.get("ratios", {})
    if "mix_over_group" in ratios:
        out.append(
            f"  mix / group: wall {ratios['mix_over_group']:.3f},"
            f" cpu {ratios.get('cpu_mix_over_group', math.nan):.3f}"
            f"  (target >= {MIX_OVER_GROUP}: {mark('mix_over_group')})"
        )
    live = report.get("live")
    if live:

        def line(label: str, f: dict[str, Any]) -> str:
            if not f.get("n"):
                return f"  {label:34s} (none)"
            return (
                f"  {label:34s} p50 {f['p50_ms']:7.1f}  p90 {f['p90_ms']:7.1f}  p99 {f['p99_ms']:7.1f}"
                f"  max {f['max_ms']:7.1f} ms  (n={f['n']:,})"
            )

        out.append(
            f"live: {live['groups']} groups ({live['group_entries_per_s']:,.0f} group entries/s = "
            f"{live['load_over_capacity']:.2f} x capacity), {live['dm_per_s']:g} DMs/s, a mention every "
            f"{live['mention_every']} messages; {live['entries']:,} entries in {live['paced_seconds']} s "
            f"({live['achieved_entries_per_s']:,}/s); {live['fast_users']} + {live['sample_users']}"
            " SDK streams"
        )
        out.append(line("fast lane, entry -> SDK event", live["fast_lane"]))
        out.append(
            f"    (target p50 <= {FAST_P50_MS:g}: {mark('fast_p50')},"
            f" p99 <= {FAST_P99_MS:g}: {mark('fast_p99')})"
        )
        out.append(line("  direct messages", live["fast_lane_dm"]))
        out.append(line("  mentions", live["fast_lane_mention"]))
        out.append(line("  entry -> frame (worker)", live["fast_lane_entry_to_frame"]))
        out.append(line("  frame -> SDK event (gateway, SDK)", live["fast_lane_frame_to_sdk"]))
        out.append(line("group (sampled members) -> SDK", live["group_sampled"]))
        out.append(f"    (target p99 <= {window + GROUP_P99_OVER_WINDOW_MS:g}: {mark('group_p99')})")
        out.append(line("  group, every followed member", live["group_all_followed"]))
        out.append(line("  group entry -> frame", live["group_entry_to_frame"]))
        j1 = live["j1"]
        out.append(
            f"J-1 (group rows, {j1['rows']:,} rows, {j1['messages_per_row_max']} messages each"
            f" over {j1['span_s']} s): "
            f"window writes per row max {j1['max_window_writes_per_row']} (<= {j1['bound']}), "
            f"ratio {j1['compression_ratio_window_writes']} (>= {j1['min_compression_ratio']}):"
            f" {mark('j1')}; "
            f"all writes max {j1['max_writes_per_row']}, ratio {j1['compression_ratio_all_writes']} "
            f"({j1['fast_writes']:,} fast writes, at most {j1['max_fast_writes_per_row']} a row)"
        )
        if live["entries_not_covered"] or live["sdk_not_caught_up"]:
            out.append(
                f"  WARNING: {live['entries_not_covered']} entries never covered by an applied frame, "
                f"{live['sdk_not_caught_up']} streams behind at the end"
            )
        cores = live["cores_while_paced"]
        out.append("  cores while paced: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()))
        sdk = live["sdk"]
        out.append(
            f"  SDK: {sdk['frames']:,} frames, {sdk['repulls']} repull events, {sdk['syncs']} pulls, "
            f"{sdk['disconnects']} disconnects"
        )
    base = report.get("live_baseline")
    if live and base:
        label = ",".join(f"{k}={v}" for k, v in base["settings"].items())
        out.append(f"baseline live run, same traffic ({label}):")
        for key, what in (("fast_lane", "fast lane"), ("group_sampled", "group (sampled)")):
            mine, theirs = live[key], base[key]
            if mine.get("n") and theirs.get("n"):
                out.append(
                    f"  {what:16s} p50 {theirs['p50_ms']:7.1f}  p99 {theirs['p99_ms']:7.1f} ms;"
                    f" this run / baseline: p50 {mine['p50_ms'] / theirs['p50_ms']:.3f},"
                    f" p99 {mine['p99_ms'] / theirs['p99_ms']:.3f}"
                )
    for note in report.get("notes", []):
        out.append(f"note: {note}")
    return "\n".join(out)


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=env("PROJECTOR_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--reps", type=int, default=int(env("MBENCH_REPS", "2")))
    p.add_argument("--window-ms", type=int, default=int(env("MBENCH_WINDOW_MS", "5000")))
    p.add_argument("--load", type=float, default=float(env("MBENCH_LOAD", "0.5")), help="share of capacity")
    p.add_argument("--group-size", type=int, default=int(env("MBENCH_GROUP_SIZE", "50")))
    p.add_argument("--group-rate", type=float, default=float(env("MBENCH_GROUP_RATE", "20")))
    p.add_argument("--fast-per-group", type=int, default=int(env("MBENCH_FAST_PER_GROUP", "10")))
    p.add_argument("--sample-per-group", type=int, default=int(env("MBENCH_SAMPLE_PER_GROUP", "2")))
    p.add_argument("--dm-rate", type=float, default=float(env("MBENCH_DM_RATE", "10")))
    p.add_argument("--dm-partners", type=int, default=int(env("MBENCH_DM_PARTNERS", "2")))
    p.add_argument("--mention-every", type=int, default=int(env("MBENCH_MENTION_EVERY", "20")))
    p.add_argument("--all-mention-every", type=int, default=int(env("MBENCH_ALL_MENTION_EVERY", "0")))
    p.add_argument("--backlog-groups", type=int, default=int(env("MBENCH_BACKLOG_GROUPS", "30")))
    p.add_argument("--backlog-seconds", type=float, default=float(env("MBENCH_BACKLOG_SECONDS", "20")))
    p.add_argument("--marker-every", type=int, default=500)
    p.add_argument("--live-seconds", type=float, default=float(env("MBENCH_LIVE_SECONDS", "50")))
    p.add_argument("--warmup-seconds", type=float, default=float(env("MBENCH_WARMUP_SECONDS", "5")))
    p.add_argument(
        "--live-groups", type=int, default=0, help="groups in the live phase (0: from the capacity)"
    )
    p.add_argument(
        "--capacity",
        type=float,
        default=0.0,
        help="skip the throughput part and take this capacity (entries/s)",
    )
    p.add_argument(
        "--baseline",
        default=env("MBENCH_BASELINE", "PROJECTOR_WORKER_VISIBLE_BEFORE_DURABLE=false"),
        help="worker settings (K=V,...) of a second live run side by side, the baseline; '' skips it",
    )
    p.add_argument("--tick-ms", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=float(env("MBENCH_TIMEOUT", "300")), help="per run, s")
    p.add_argument("--report", type=Path, default=ROOT / "bench/out/mix_report.json")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument(
        "--wrapper",
        default="",
        help="prefix for every worker's command, e.g. a profiler (stopped with SIGINT)",
    )
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    mix = MixBench(args)
    bench = mix.bench
    await bench.kafka.start()
    report: dict[str, Any] = {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    }
    notes: list[str] = []
    failed = False
    started = time.monotonic()
    try:
        bench.check(
            await asyncio.to_thread(
                subprocess.run,
                [*worker_bench.projector_argv(), "bootstrap"],
                cwd=ROOT,
                env=bench.base_env(),
                capture_output=True,
            )
        )
        capacity = args.capacity
        if capacity <= 0:
            report["throughput"] = await mix.throughput()
            failed = bool(report["throughput"]["failed"])
            capacity = report["throughput"]["summary"].get("group", {}).get("entries_per_s", math.nan)
        else:
            notes.append(f"throughput not measured: capacity given as {capacity:,.0f} entries/s")
        if math.isnan(capacity):
            notes.append("no capacity measured: the live phase did not run")
            failed = True
        else:
            try:
                report["live"] = await mix.live(capacity)
                if args.baseline:
                    # The same live run with the former rule, side by side on the same machine.
                    setting = baseline_settings(args.baseline)
                    log(f"live baseline: {args.baseline}")
                    report["live_baseline"] = {
                        "settings": setting,
                        **await mix.live(capacity, "-base", setting),
                    }
            except RuntimeError as exc:
                failed = True
                notes.append(f"live phase failed: {exc}")
                log(f"live FAILED: {exc}")
    finally:
        await bench.cleanup()
    report["verdicts"] = verdicts(report)
    report["notes"] = notes
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_bytes(
        orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"
    )
    print(render(report))
    print(f"report: {args.report} ({report['elapsed_s']} s)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--follow"]:
        asyncio.run(follow(argv[1], argv[2]))
        return 0
    return asyncio.run(amain(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
