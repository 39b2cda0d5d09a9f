"""A crash-safety run that is hard to pass (issue 11): a worker SIGKILLed again and again at random
moments while traffic keeps arriving, so a backlog builds while it is down; CPU contention from
busy loops; the local data dir kept at some restarts and lost at others. The end state (every
user's rows and badge in the projection store) must equal `projector replay` of the exact
stream that was produced.

Used by the integration suite at a CI size and by `make chaos-crash` at full size, N runs in a row.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tests.integration.stack import Stack, read_jsonl
from tests.support.probes import peak_rss_kib
from tests.support.topic_log import LogRecord, read_topic


@dataclass(frozen=True)
class CrashPlan:
    users: int = 40
    conversations: int = 30
    group_size: int = 20
    messages: int = 1500
    rate: float = 40.0  # messages/s: the traffic runs messages/rate seconds
    kills: int = 5
    workers: int = 1  # >1: they share the partitions and are killed one at a time, in turn
    lose_data_at: frozenset[int] = frozenset({2})  # kill numbers after which the data dir is deleted
    busy_loops: int = 2  # processes spinning on a core each, beside the worker
    after_ready_s: tuple[float, float] = (1.0, 9.0)  # kill this long after a "Worker ready"
    down_s: tuple[float, float] = (1.0, 4.0)  # the worker stays dead this long (backlog builds)
    bad_records: float = 0.01
    duplicates: float = 0.02
    seed: int = 1
    catch_up_s: float = 400.0
    check_frames: bool = False  # also fold session-delta frames with the client rule (issue 18)
    # A worker that exits on its own is restarted (as a supervisor would) and counted instead of
    # ending the run: the run then still measures equality, and the exits are reported.
    restart_crashed: bool = False
    ready_timeout_s: float = 240.0  # a restart with big changelogs on a loaded machine needs more
    # Lane 0's markers trail its entries this long (`simulate --lane-lag-ms`): at every kill,
    # entries of the other lanes wait above the watermark, in the state the persists must keep.
    lane_lag_ms: int = 0
    # One more kill in the traffic's last second, while its last entries wait for the lagging
    # lane: a loss then has no later entry of its row to hide behind (a missed message is
    # otherwise healed by the next one's recount from the MessageStore).
    tail_kill: bool = False


@dataclass
class CrashReport:
    kills: int = 0
    data_lost: int = 0
    records: int = 0
    users: int = 0
    rows: int = 0
    gaps_refused: int = 0
    mismatched_rows: int = 0
    mismatched_badges: int = 0
    lost_unread: int = 0  # unread counts below replay's, summed over rows (entries lost)
    double_counted: int = 0  # unread counts above replay's, summed over rows
    crashes: int = 0  # workers that exited on their own (not killed by the run)
    tail_kill_late_s: float | None = None  # with CrashPlan.tail_kill: how late it came (0: on time)
    kills_in_traffic: int = 0  # kills while the simulator was still producing
    crash_lines: list[str] = field(default_factory=list)
    peak_rss_kib: int = 0  # the largest VmHWM of any worker process (read just before each kill)
    catch_up_s: float = 0.0  # from the end of the traffic until every user equals replay's version
    # Records a live worker's local table for a partition it owns lacks or holds differently from
    # the partition's changelog (a hole a table recovery left: the rows restored from it are
    # older than the changelog's, and the entries between are lost once they are restored).
    local_table_differences: int = 0
    local_partitions_checked: int = 0
    frames: int = 0
    frame_users_equal: int = 0  # users whose folded frames equal replay's rows
    # The end state against the independent model of DESIGN.md (tests/property/model.py), not
    # only against `projector replay` (the product's own core): "" when equal, else the first
    # difference.
    model_difference: str = ""
    frame_users_gap: int = 0  # users whose frames signalled a gap (the client re-pulls)
    frame_users_wrong: int = 0  # users whose folded frames differ with no gap signalled
    elapsed_s: float = 0.0
    timeline: list[str] = field(default_factory=list)

    def _tail(self) -> str:
        if self.tail_kill_late_s is None:
            return ""
        return ", tail kill " + (f"{self.tail_kill_late_s:.1f}s late" if self.tail_kill_late_s else "on time")

    def line(self) -> str:
        return (
            f"{self.kills} kills ({self.kills_in_traffic} during traffic, {self.data_lost} with the "
            f"data dir lost{self._tail()}), {self.records} records, "
            f"{self.users} users, {self.rows} rows: {self.mismatched_rows} rows and "
            f"{self.mismatched_badges} badges differ from replay; model "
            f"{'equal' if not self.model_difference else 'DIFFERS: ' + self.model_difference}; "
            f"{self.gaps_refused} refused "
            f"batches read again; {self.local_table_differences} local table records differ from "
            f"their changelog ({self.local_partitions_checked} owned partitions checked); "
            f"{self.elapsed_s:.0f} s"
        )


def stack_overrides() -> dict[str, str]:
    """A short window and a short group session, so a killed worker's partitions come back fast."""
    return {
        "PROJECTOR_PROJECTION_COMPACTION_WINDOW_MS": "200",
        "PROJECTOR_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "PROJECTOR_KAFKA_HEARTBEAT_INTERVAL_MS": "1000",
    }


def _busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]


class WorkerExited(AssertionError):
    """A worker exited although nobody killed it."""


async def _ready(stack: Stack, index: int, proc: subprocess.Popen[bytes], seen: int, timeout: float) -> int:
    """Wait until the worker's log says "Worker ready" more often than `seen` times."""
    path = stack.tmp / f"worker-{index}.log"
    deadline = time.monotonic() + timeout
    while True:
        count = path.read_text(errors="replace").count("Worker ready") if path.exists() else 0
        if count > seen:
            return count
        if proc.poll() is not None:
            raise WorkerExited(f"worker {index} exited {proc.returncode}:\n{stack.log_tail(index)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker not ready after {timeout}s:\n{stack.log_tail(index)}")
        await asyncio.sleep(0.2)


async def _expected_traffic_end(stream: Path, plan: CrashPlan) -> float:
    """When the paced traffic will have produced its last message (monotonic): its first record
    in --out starts the schedule of messages / rate seconds."""
    while not stream.exists() or stream.stat().st_size == 0:
        await asyncio.sleep(0.05)
    return time.monotonic() + plan.messages / plan.rate


async def run_crash_scenario(stack: Stack, tmp: Path, plan: CrashPlan) -> CrashReport:
    report = CrashReport()
    started = time.monotonic()
    rnd = random.Random(plan.seed)
    stream = tmp / f"crash-stream-{plan.seed}.jsonl"
    lanes = stack.settings.processing.lanes
    loops = _busy_loops(plan.busy_loops)
    traffic_end: asyncio.Task[float] | None = None
    try:
        traffic = asyncio.create_task(
            asyncio.to_thread(
                stack.run,
                "simulate",
                *("--users", str(plan.users), "--conversations", str(plan.conversations)),
                *("--group-size", str(plan.group_size), "--messages", str(plan.messages)),
                *("--rate", str(plan.rate), "--lanes", str(lanes), "--seed", str(plan.seed)),
                *("--bad-records", str(plan.bad_records), "--duplicates", str(plan.duplicates)),
                *("--out", str(stream), "--progress", "never"),
                *("--lane-lag-ms", str(plan.lane_lag_ms)),
                timeout=plan.messages / plan.rate + 600,
            )
        )
        traffic_end = asyncio.create_task(_expected_traffic_end(stream, plan))
        # Worker w runs with data dir worker-{w}-data and logs to worker-{w}.log; `procs[w]` is
        # its current process (a restart appends to the same log).
        procs = {w: stack.start_worker(w) for w in range(plan.workers)}
        readies = dict.fromkeys(procs, 0)
        tail_at: float | None = None  # when the tail kill is due (monotonic), once known
        tail_done = not plan.tail_kill
        kill = 0
        while kill < plan.kills or not tail_done:
            kill += 1
            victim = (kill - 1) % plan.workers
            while True:
                try:
                    readies[victim] = await _ready(
                        stack, victim, procs[victim], readies[victim], timeout=plan.ready_timeout_s
                    )
                    break
                except WorkerExited:
                    if not plan.restart_crashed:
                        raise
                    report.crashes += 1
                    report.crash_lines.append(_crash_line(stack, victim))
                    report.timeline.append(
                        f"{time.monotonic() - started:6.1f}s worker {victim} exited by itself"
                    )
                    readies[victim] = _log_count(stack, victim)
                    procs[victim] = stack.start_worker(victim)
            pause = rnd.uniform(*plan.after_ready_s)
            if plan.tail_kill and tail_at is None and traffic_end.done():
                tail_at = traffic_end.result() - rnd.uniform(0.0, 1.0)
            if tail_at is not None and not tail_done and time.monotonic() + pause >= tail_at:
                tail_done = True
                late = time.monotonic() - tail_at
                pause = max(0.0, -late)
                report.tail_kill_late_s = max(0.0, late)
                report.timeline.append(
                    f"{time.monotonic() - started:6.1f}s the next kill is the tail kill"
                    + (f" ({late:.1f}s late: the victim was not ready)" if late > 0 else "")
                )
            await asyncio.sleep(pause)
            report.peak_rss_kib = max(report.peak_rss_kib, peak_rss_kib(procs[victim].pid))
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=30)
            report.kills += 1
            report.kills_in_traffic += not traffic.done()
            lost = kill in plan.lose_data_at
            note = " + data dir lost" if lost else ""
            report.timeline.append(f"{time.monotonic() - started:6.1f}s kill {kill} (worker {victim}){note}")
            await asyncio.sleep(rnd.uniform(*plan.down_s))  # traffic goes on: a backlog builds
            if lost:
                shutil.rmtree(stack.tmp / f"worker-{victim}-data", ignore_errors=True)
                report.data_lost += 1
            procs[victim] = stack.start_worker(victim)
        await traffic
        traffic_done = time.monotonic()
        report.timeline.append(f"{traffic_done - started:6.1f}s traffic done")
    finally:
        if traffic_end is not None:  # still polling when the simulator never wrote a record
            traffic_end.cancel()
        for loop in loops:
            loop.kill()
            loop.wait()
    out = tmp / f"crash-replay-{plan.seed}"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", str(lanes))
    rows_expected = read_jsonl(out / "projections.jsonl")
    badges_expected = read_jsonl(out / "badges.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in badges_expected}
    report.records = sum(1 for line in stream.read_bytes().splitlines() if line.strip())
    report.users, report.rows = len(versions), len(rows_expected)

    def supervise() -> None:
        for w, proc in procs.items():
            if proc.poll() is None:
                continue
            if not plan.restart_crashed:
                raise AssertionError(f"worker {w} exited {proc.returncode}:\n{stack.log_tail(w)}")
            report.crashes += 1
            report.crash_lines.append(_crash_line(stack, w))
            procs[w] = stack.start_worker(w)

    try:
        await stack.wait_for_versions(versions, timeout=plan.catch_up_s, alive=supervise)
        report.catch_up_s = time.monotonic() - traffic_done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                report.peak_rss_kib = max(report.peak_rss_kib, peak_rss_kib(proc.pid))
        rows, badges = await stack.projection(sorted(versions))
        differing_rows = _differences(rows, rows_expected, ("user_id", "conversation_id"))
        differing_badges = _differences(badges, badges_expected, ("user_id",))
        report.mismatched_rows, report.mismatched_badges = len(differing_rows), len(differing_badges)
        report.lost_unread, report.double_counted = unread_drift(rows, rows_expected)
        report.model_difference = _against_model(
            stream, lanes, stack.settings.processing.include_muted, rows, badges
        )
        if differing_rows or differing_badges:
            users = {int(k[0]) for k in (*differing_rows, *differing_badges)}
            _print_partition_history(stack, plan.workers, users)
            await write_forensics(stack, tmp / "forensics.txt", users)
        log = "".join(
            (stack.tmp / f"worker-{w}.log").read_text(errors="replace")
            for w in range(plan.workers)
            if (stack.tmp / f"worker-{w}.log").exists()
        )
        report.gaps_refused = log.count("refused a batch") + log.count("nothing is on its way")
        report.elapsed_s = time.monotonic() - started
    report.local_partitions_checked, report.local_table_differences = await local_tables_against_changelogs(
        stack, procs
    )
    if plan.check_frames:
        await _check_frames(stack, report, versions, rows_expected, plan.catch_up_s)
    return report


def _against_model(
    stream: Path, lanes: int, include_muted: bool, rows: list[dict[str, Any]], badges: list[dict[str, Any]]
) -> str:
    """The store's rows and badges against tests/property/model.py on the exact stream."""
    from types import SimpleNamespace

    from tests.property.invariants import badges_equal_model, rows_equal_model
    from tests.property.model import run_model

    model = run_model(stream.read_bytes().splitlines(), lanes, include_muted)
    state = SimpleNamespace(projections=rows, badges=badges)
    try:
        rows_equal_model(state, model)
        badges_equal_model(state, model)
    except AssertionError as exc:
        return str(exc)[:500]
    return ""


def owned_partitions(log_text: str) -> set[int]:
    """The mailbox partitions a worker's log says it owns now: claimed since its last start or
    release."""
    owned: set[int] = set()
    for line in log_text.splitlines():
        if "after start-up" in line or "starting projector" in line:
            owned.clear()
        elif "released partitions" in line:
            released = line.rsplit("released partitions [", 1)[1].split("]", 1)[0]
            owned.difference_update(int(p) for p in released.split(",") if p.strip())
        elif " claimed: persist " in line:
            owned.add(int(line.split("partition ", 1)[1].split(" ", 1)[0]))
    return owned


async def local_tables_against_changelogs(
    stack: Stack, procs: dict[int, subprocess.Popen[bytes]], settle_s: float = 60.0
) -> tuple[int, int]:
    """(partitions checked, keys differing): every live worker's local store for the partitions
    it owns, read-only beside the running worker, against the state the changelog's accepted
    chain of persists gives (tests/support/durable.chain_states: the independent model, not the
    reader the worker runs). After the last persist they are equal. Read again until every
    partition is owned and equal, or `settle_s` passed (a persist may be on its way)."""
    deadline = time.monotonic() + settle_s
    while True:
        chains = await _changelog_states(stack)
        checked = differing = 0
        details: list[str] = []
        for w, proc in procs.items():
            log_path = stack.tmp / f"worker-{w}.log"
            if proc.poll() is not None or not log_path.exists():
                continue
            for partition in sorted(owned_partitions(log_path.read_text(errors="replace"))):
                local = _read_local_store(stack, w, partition)
                if local is None:
                    continue  # not opened yet
                checked += 1
                want = chains.get(partition, {})
                keys = [k for k in local.keys() | want.keys() if local.get(k) != want.get(k)]
                differing += len(keys)
                details += [
                    f"worker {w} partition {partition} key {k.hex()}: local {_summary(local.get(k))}, "
                    f"changelog {_summary(want.get(k))}"
                    for k in keys[:5]
                ]
        if (
            differing == 0 and checked == stack.settings.topics.topic_partitions
        ) or time.monotonic() > deadline:
            for line in details[:10]:  # what differs, for the failure's diagnosis
                print(f"local store differs: {line}")
            return checked, differing
        await asyncio.sleep(1.0)


async def _changelog_states(stack: Stack) -> dict[int, dict[bytes, bytes]]:
    """Per partition, the state after the last persist of the changelog's accepted chain."""
    from tables.durable.kafka import KafkaChangelog
    from tests.support.durable import chain_states

    changelog = KafkaChangelog(stack.settings.kafka.kafka_bootstrap, stack.settings.topics.changelog_topic)
    await changelog.start()
    try:
        states: dict[int, dict[bytes, bytes]] = {}
        for partition in range(stack.settings.topics.topic_partitions):
            records = []
            start, end = 0, await changelog.end_offset(partition)
            while start < end:
                batch, start = await changelog.read(partition, start, end)
                records += batch
            chain = chain_states(records)
            states[partition] = chain[-1][2] if chain else {}
        return states
    finally:
        await changelog.stop()


def _summary(value: bytes | None) -> str:
    """A record for a diagnosis line: absent, or its size and the start of what it decodes to."""
    if value is None:
        return "absent"
    return f"{len(value)} B {str(_decoded(value))[:160]}"


def _read_local_store(stack: Stack, worker: int, partition: int) -> dict[bytes, bytes] | None:
    """The worker's local store of the partition (tables/durable/store.py), opened read-only (the
    worker keeps it open), its state keys only (not the position's)."""
    from rocksdict import AccessType, Options, Rdict

    path = (
        stack.tmp
        / f"worker-{worker}-data"
        / stack.settings.topics.app_id
        / "state"
        / f"partition-{partition}"
    )
    if not path.exists():
        return None
    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items = cast(list[tuple[bytes, bytes]], list(db.items()))  # raw mode: bytes both
        return {k: v for k, v in items if not k.startswith(b"\x00")}
    finally:
        db.close()


async def _check_frames(
    stack: Stack,
    report: CrashReport,
    versions: dict[int, int],
    rows_expected: list[dict[str, Any]],
    timeout: float,
) -> None:
    """Fold every session-delta frame with the client rule (app/domain/client.py): a user whose
    chain had no gap must hold exactly replay's rows; a gap is allowed (a kill between the
    store write and the frame: the client re-pulls), a silent difference is not."""
    from app.domain.client import SessionView

    def complete(frames: list[dict[str, Any]]) -> bool:
        seen: dict[int, int] = {}
        for f in frames:
            if f.get("type") == "SESSION_DELTA":
                seen[int(f["user_id"])] = max(
                    seen.get(int(f["user_id"]), 0), int(f["projection_mailbox_seq"])
                )
        return all(seen.get(u, 0) >= v for u, v in versions.items())

    frames = await stack.consume(stack.settings.topics.topic_session_delta, complete, timeout=timeout)
    report.frames = len(frames)
    views: dict[int, SessionView] = {}
    gapped: set[int] = set()
    for frame in frames:
        user = int(frame["user_id"])
        if user in gapped:
            continue
        view = views.setdefault(user, SessionView(user))
        if view.apply(frame).needs_repull:
            gapped.add(user)
    wanted: dict[int, list[dict[str, Any]]] = {}
    for row in rows_expected:
        wanted.setdefault(int(row["user_id"]), []).append(row)
    for user in versions:
        if user in gapped:
            report.frame_users_gap += 1
            continue
        known = views.get(user)
        got = [dict(r) for _, r in sorted(known.known().items())] if known else []
        if got == wanted.get(user, []):
            report.frame_users_equal += 1
        else:
            report.frame_users_wrong += 1


def unread_drift(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> tuple[int, int]:
    """(unread counts missing, unread counts too many) summed over rows, against replay: a
    lost entry shows as the first, one applied twice as the second."""
    mine = {(r["user_id"], r["conversation_id"]): int(r.get("unread_count", 0)) for r in got}
    theirs = {(r["user_id"], r["conversation_id"]): int(r.get("unread_count", 0)) for r in want}
    lost = double = 0
    for key in mine.keys() | theirs.keys():
        diff = mine.get(key, 0) - theirs.get(key, 0)
        lost += max(0, -diff)
        double += max(0, diff)
    return lost, double


def _log_count(stack: Stack, index: int) -> int:
    path = stack.tmp / f"worker-{index}.log"
    return path.read_text(errors="replace").count("Worker ready") if path.exists() else 0


def _crash_line(stack: Stack, index: int) -> str:
    """The last line of the worker's last traceback (the exception it died of)."""
    lines = [line for line in stack.log_tail(index, 400).splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith((" ", "\t")) and ("Error" in line or "Exception" in line):
            return line.strip()[:200]
    return lines[-1][:200] if lines else "(empty log)"


# Worker log lines that tell a partition's story in a crash run (printed when a run fails: CI keeps
# only the test's output, and a loss that shows up once in thirty runs must be diagnosable from it).
_HISTORY_MARKS = (
    "restored partition",
    "starting at offset",
    "released partitions",
    "refused a batch",
    "would skip",
    "hold no record",
    "nothing is on its way",
    "entries missing",
    "faust cleared",
    "not applied",
    "superseded",
    "held but not assigned",
    "seek interrupted",
    "Heartbeat",
    "Joined group",
    "starting projector",
    "Restore complete",
)


async def _read_topic(stack: Stack, topic: str) -> list[LogRecord]:
    """Every record of the topic still in the log: (partition, offset, key, value)."""
    return await read_topic(
        stack.settings.kafka.kafka_bootstrap, topic, stack.settings.topics.topic_partitions
    )


def _decoded(value: bytes | None) -> Any:
    import msgspec

    if value is None:
        return None
    try:
        return msgspec.msgpack.decode(value)
    except msgspec.DecodeError:
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            return value[:60].hex()


async def write_forensics(stack: Stack, path: Path, users: set[int]) -> None:
    """For a failure's diagnosis: every version the changelog still holds of the differing
    users' records (rows, users, waiting entries) and of their partitions' checkpoints, each with its
    changelog offset, and where each of their mailbox entries sits in the mailbox log. The logs
    are not compacted during a test run, so this is the whole history: it tells an entry never
    persisted from one persisted and later overwritten (a restore from a store with a hole)."""
    from app.kafka.ops import partition_for

    wanted = {u.to_bytes(8, "big") for u in users}
    partitions = {partition_for(str(u).encode(), stack.settings.topics.topic_partitions) for u in users}
    lines: list[str] = []
    for partition, offset, _key, value in await _read_topic(stack, stack.settings.topics.topic_mailbox_tail):
        entry = _decoded(value)
        if isinstance(entry, dict) and entry.get("user_id") in users:
            lines.append(f"mailbox p{partition}@{offset}: {entry}")
    # The state changelog: a key is a kind letter + user id (8) + ...; "c" is a checkpoint.
    for partition, offset, key, value in await _read_topic(stack, stack.settings.topics.changelog_topic):
        if key is None:
            continue
        if (key == b"c" and partition in partitions) or key[1:9] in wanted:
            summary = str(_decoded(value))
            lines.append(f"state p{partition}@{offset} key {key.hex()}: {summary[:400]}")
    path.write_text("\n".join(lines) + "\n")
    print(f"forensics: {len(lines)} lines in {path}")


def _print_partition_history(stack: Stack, workers: int, users: set[int], limit: int = 120) -> None:
    """Each differing user's mailbox partition, and the workers' log lines about it and about
    the group (restores, hand-overs, refused or re-read fetches, dropped changelog records)."""
    from app.kafka.ops import partition_for

    partitions = {
        partition_for(str(u).encode(), stack.settings.topics.topic_partitions) for u in sorted(users)[:5]
    }
    for w in range(workers):
        path = stack.tmp / f"worker-{w}.log"
        if not path.exists():
            continue
        lines = [
            line[:240]
            for line in path.read_text(errors="replace").splitlines()
            if any(mark in line for mark in _HISTORY_MARKS)
            and (
                "partition" not in line
                or "partitions" in line
                or any(f"partition {p}" in line for p in partitions)
            )
        ]
        print(f"worker {w}, partitions {sorted(partitions)} (last {limit} of {len(lines)} lines):")
        print("\n".join(f"  {line}" for line in lines[-limit:]))


def _differences(
    got: list[dict[str, Any]], want: list[dict[str, Any]], key: tuple[str, ...]
) -> list[tuple[Any, ...]]:
    """The keys whose items differ (or exist on one side only); the first five are printed."""
    mine = {tuple(item[k] for k in key): item for item in got}
    theirs = {tuple(item[k] for k in key): item for item in want}
    differing = [k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)]
    for k in sorted(differing, key=str)[:5]:  # what differs, for the failure's diagnosis
        print(f"differs {k}:\n  store  {mine.get(k)}\n  replay {theirs.get(k)}")
    return differing
