"""The TypeScript SDK (sdk-ts/) as an outside project uses it (issue 34, item 4; seed 004's SDK
evidence): `npm pack` makes the tgz, a consumer project (tests/sdk_consumer/, copied to a
temporary folder) installs it from that file, compiles under strict TypeScript against the
package's public entry point only (no DOM lib, library types checked), and runs its node tests
against a real `projector api` subprocess on the local servers:

* the user's list walked page by page with cursors (every row once, in order, the u64 user id
  an exact string) and the badge;
* the browser's view of the package: a page using the member store and the avatar loader
  compiles with the DOM lib and without Node's types; the host entry point
  (`@session-projector/sdk/host`, the SQLite cache) is importable;
* the member directory: capability probe, pages of 50 with an AbortSignal (and one aborted in
  flight), presentation, read receipts (basicOnly), the member store (merged, cached, shown from
  the cache first on the next start), 2001 (not a member) and 2002 (a disabled conversation)
  clearing the store and its cache while a 404 keeps them, every member call aborted in flight
  by its AbortSignal, and a backend without the paging API answering a clear request error;
* the live stream: hello, then a SESSION_DELTA and a BADGE_UPDATE applied by the rule, then a
  resume with Last-Event-ID that replays the frame written while the client was away without a
  re-pull.

No worker runs: the test writes the projection store and the frame topics the way a worker's
flush does (store first, then the frames), so the versions are known exactly.
Needs node >= 18, npm and the SDK's dev dependencies (scripts/tools.d/node.sh, `make tools`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.domain.listing import Folder
from app.stores.cassandra_members import CassandraMemberReader
from app.stores.cassandra_messages import CassandraMessageStore, NewMessage
from app.stores.cassandra_profiles import CassandraProfileStore, ProfileRow
from app.stores.cassandra_session import open_cluster
from app.stores.cassandra_state import UserConversationStateWriter
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port
from tests.support.api import SECRET
from tests.support.rows import cid, expected_order, flush, make_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

USER = 11982011376358104761  # JavaScript would read 11982011376358105000
STRANGER = 77
SDK = ROOT / "sdk-ts"
CONSUMER = ROOT / "tests" / "sdk_consumer"
V0 = 100
DISABLED_GROUP = str(uuid.UUID(int=0x5D4C0000_0000_4000_8000_000000000002))


def _need_node() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing or not (SDK / "node_modules" / ".bin" / "tsc").exists():
        pytest.fail(
            f"node/npm/the SDK's dev dependencies are missing ({missing or 'sdk-ts/node_modules'}): "
            "run `make tools` (scripts/tools.d/node.sh)"
        )


def _run(
    args: list[str], cwd: Path, log: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, timeout=timeout, check=False, env=env, text=True
    )
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}  (in {cwd})\n{done.stdout}\n{done.stderr}\n")
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done.stdout


def pack(dest: Path, log: Path) -> Path:
    """The SDK's tgz, packed now from the checkout (prepack builds it with strict tsc)."""
    out = _run(["npm", "pack", "--silent", "--pack-destination", str(dest)], SDK, log)
    tgz = dest / out.strip().splitlines()[-1]
    assert tgz.is_file(), out
    return tgz


def install_consumer(tgz: Path, into: Path, log: Path) -> Path:
    """tests/sdk_consumer copied to `into`, the tgz installed from its file, compiled."""
    shutil.copytree(CONSUMER, into, ignore=shutil.ignore_patterns("node_modules", "build"))
    _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", str(tgz)], into, log)
    # Installed from that immutable file: the lockfile pins the tgz's own sha512.
    lock = json.loads((into / "package-lock.json").read_text())
    entry = lock["packages"]["node_modules/@session-projector/sdk"]
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
    assert entry["integrity"] == digest, entry
    _run(["npx", "--no-install", "tsc", "-p", "tsconfig.json"], into, log)
    # Only the public entry point: a deep import into the package does not resolve.
    probe = into / "deep"
    probe.mkdir()
    (probe / "deep.ts").write_text(
        'import { MemberStore } from "@session-projector/sdk/dist/store.js";\nexport { MemberStore };\n'
    )
    (probe / "tsconfig.json").write_text(
        json.dumps(
            {
                "extends": "../tsconfig.json",
                "compilerOptions": {"rootDir": ".", "noEmit": True},
                "include": ["deep.ts"],
            }
        )
    )
    deep = subprocess.run(
        ["npx", "--no-install", "tsc", "-p", "deep/tsconfig.json"],
        cwd=into,
        capture_output=True,
        text=True,
        check=False,
    )
    assert deep.returncode != 0 and "TS2307" in deep.stdout, deep.stdout + deep.stderr
    # A browser page's use compiles with the DOM lib and without Node's types.
    _run(["npx", "--no-install", "tsc", "-p", "browser/tsconfig.json"], into, log)
    return into


class Api:
    """`projector api` (with its gateway) as a subprocess."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.port = free_port()
        self.env = {
            **stack.env,
            "PROJECTOR_API_SECRET": SECRET,
            "PROJECTOR_API_FILL_FROM_STATE": "never",
            "PROJECTOR_API_RATE_LIMIT_PER_S": "0",
            "PROJECTOR_GATEWAY_HEARTBEAT_MS": "1000",
        }
        self.log = tmp / "api.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*PROJECTOR, "api", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 90
        while "projector api: listening on" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise AssertionError(f"projector api exited:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"projector api did not start:\n{self.log.read_text()[-3000:]}")
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Projection:
    """The user's projection in the stack's store, written as a worker's flush would be, with
    the frames of each flush on the stack's topics (store first, then the frames)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.store = RedisProjectionStore.from_settings(stack.settings.redis)
        self.rows: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.producer: Any = None

    def badge(self) -> Badge:
        counted = [
            r for r in self.rows.values() if r["listed"] and not r["archived"] and r["membership"] == "active"
        ]
        return Badge(total_unread=sum(r["unread_count"] for r in counted), total_mention=0, muted_unread=0)

    async def seed(self, rows: list[dict[str, Any]], version: int) -> None:
        self.rows = {r["conversation_id"]: r for r in rows}
        self.version = version
        [written] = await self.store.write([flush(USER, rows, version, 1, self.badge())])
        assert written is not None

    async def step(self, rows: list[dict[str, Any]]) -> UserFlush:
        from aiokafka import AIOKafkaProducer

        if self.producer is None:
            self.producer = AIOKafkaProducer(bootstrap_servers=self.stack.settings.kafka.kafka_bootstrap)
            await self.producer.start()
        version = self.version + 1
        for row in rows:
            self.rows[row["conversation_id"]] = row
        batch = UserFlush(
            user_id=USER,
            rows=rows,
            badge=self.badge(),
            projection_mailbox_seq=version,
            prev_projection_mailbox_seq=self.version,
            structure_version=1,
            driving_event_id=f"e{version}",
            driving_mailbox_seq=version,
        )
        [written] = await self.store.write([batch])
        assert written is not None
        key = str(USER).encode()
        settings = self.stack.settings
        await self.producer.send_and_wait(
            settings.topics.topic_session_delta, orjson.dumps(batch.session_delta()), key=key
        )
        await self.producer.send_and_wait(
            settings.topics.topic_badge, orjson.dumps(batch.badge_update()), key=key
        )
        self.version = version
        return batch

    async def aclose(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
        await self.store.aclose()


@pytest.fixture
async def stack(make_stack: Callable[..., Stack]) -> AsyncIterator[Stack]:
    yield make_stack("sdkc", partitions=2, lanes=1)


async def seed_members(stack: Stack, group: str, message_seq: int) -> tuple[list[str], list[str], list[str]]:
    """A 120-member group (USER owns it; ids up to 2^64-1), one message in it, read by some:
    (members, readers, unreaders) as the API orders them (ascending user id, decimal strings)."""
    sender = 1000
    members = sorted([USER, *range(sender, sender + 117), 2**63, 2**64 - 1])
    readers = [u for u in members if u % 3 == 0 and u != sender]
    cluster, session = await asyncio.to_thread(open_cluster, stack.settings.cassandra)
    try:
        keyspace = stack.settings.cassandra.cassandra_keyspace
        writer = UserConversationStateWriter(session, keyspace)
        for user_id in members:
            writer.stage_member(group, user_id, "owner" if user_id == USER else "member", "active", 1, None)
        for user_id in readers:
            writer.stage(user_id, group, {"read_seq": message_seq})
        await writer.flush()
        message = NewMessage(group, message_seq, "m-sdk", "0" * 31 + "9", sender, 1, True, frozenset())
        await asyncio.to_thread(CassandraMessageStore(session, keyspace).put_messages, [message])
        # A second group USER is an active member of, disabled by its owner: 2002.
        writer.stage_member(DISABLED_GROUP, USER, "member", "active", 1, None)
        writer.stage_member(DISABLED_GROUP, sender, "owner", "active", 1, None)
        await writer.flush()
        await CassandraMemberReader(session, keyspace).set_disabled(
            DISABLED_GROUP, int(time.time() * 1000), "disabled by its owner"
        )
        # One public profile (the consumer reads it through MembersClient.profiles).
        await CassandraProfileStore(session, keyspace).put(
            [ProfileRow(2**64 - 1, "Zoë", "https://cdn.example/max.png")], 1
        )
    finally:
        cluster.shutdown()
    unreaders = [u for u in members if u not in readers and u != sender]
    return [str(u) for u in members], [str(u) for u in readers], [str(u) for u in unreaders]


async def test_an_outside_consumer_installs_the_tgz_and_runs_against_a_real_api(
    stack: Stack, tmp_path: Path
) -> None:
    _need_node()
    log = tmp_path / "npm.log"
    tgz = pack(tmp_path, log)
    consumer = install_consumer(tgz, tmp_path / "consumer", log)

    group = str(uuid.UUID(int=0x5D4C0000_0000_4000_8000_000000000001))
    message_seq = 8
    members, readers, unreaders = await seed_members(stack, group, message_seq)

    rows = [make_row(USER, n, act=n * 10, unread=n % 4) for n in range(1, 31)]
    rows.append(make_row(USER, 31, act=None))  # no message yet: sorts last
    rows += [make_row(USER, 40 + n, act=500 + n, archived=True, unread=1) for n in range(3)]
    rows = [{**r, "projection_mailbox_seq": V0} for r in rows]
    projection = Projection(stack)
    await projection.seed(rows, V0)
    main, archived = expected_order(rows, Folder.MAIN), expected_order(rows, Folder.ARCHIVED)
    badge = projection.badge()

    moved = make_row(USER, 5, act=10_000, unread=4, version=V0 + 1)  # a new message: to the top
    read = {**projection.rows[cid(7)], "unread_count": 0, "projection_mailbox_seq": V0 + 2}  # read elsewhere
    after_delta = badge.total_unread - projection.rows[cid(5)]["unread_count"] + 4
    after_resume = after_delta - projection.rows[cid(7)]["unread_count"]
    assert projection.rows[cid(7)]["unread_count"] > 0

    api = Api(stack, tmp_path)
    await api.start()
    control = tmp_path / "control"
    control.mkdir()
    expect = {
        "main": main,
        "archived": archived,
        "version": V0,
        "badge": badge._asdict(),
        "members": members,
        "stranger_token": TokenSigner(SECRET).mint(STRANGER, int(time.time()) + 3600),
        "message_seq": message_seq,
        "readers": readers,
        "unreaders": unreaders,
        "delta": {"conversation_id": cid(5), "unread_count": 4, "total_unread": after_delta},
        "resumed": {"conversation_id": cid(7), "unread_count": 0, "total_unread": after_resume},
    }
    env = {
        **os.environ,
        "SP_API_URL": api.url,
        "SP_TOKEN": TokenSigner(SECRET).mint(USER, int(time.time()) + 3600),
        "SP_USER_ID": str(USER),
        "SP_GROUP": group,
        "SP_DISABLED_GROUP": DISABLED_GROUP,
        "SP_CONTROL": str(control),
        "SP_EXPECT": json.dumps(expect),
    }
    proc = await asyncio.create_subprocess_exec(
        "node",
        "--test",
        "--test-reporter=spec",
        "build/consumer.test.js",
        cwd=consumer,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:

        async def drive() -> None:
            await until_file(control / "live", proc)
            await projection.step([moved])
            await until_file(control / "stopped", proc)
            await projection.step([read])
            await asyncio.sleep(1.5)  # the gateway logs the frame for the client that is away
            (control / "go").write_text("{}")

        driver = asyncio.ensure_future(drive())
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=400)
        text = output.decode(errors="replace")
        (tmp_path / "consumer.log").write_text(text)
        if driver.done() and driver.exception() is not None:
            raise driver.exception()  # type: ignore[misc]
        driver.cancel()
        assert proc.returncode == 0, (
            f"the consumer's tests failed:\n{text[-8000:]}\napi log:\n{api.log.read_text()[-3000:]}"
        )
        for name in (
            "walks the user's list with cursors",
            "reads the badge",
            "probes the member API and pages the directory with an AbortSignal",
            "one member store per account/group",
            "the host entry point: the SQLite cache takes any database of better-sqlite3's shape",
            "a backend without the paging API is a clear request error",
            "2001 and 2002 clear the store and its cache; any other refusal keeps them",
            "every member call takes an AbortSignal: aborted in flight, it rejects as an abort",
            "the live stream: hello, frames by the rule, then a resume with Last-Event-ID",
        ):
            assert name in text, f"{name!r} did not run:\n{text[-4000:]}"
        assert "# fail 0" in text or "ℹ fail 0" in text, text[-4000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        api.stop()
        await projection.aclose()


async def until_file(path: Path, proc: asyncio.subprocess.Process, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.returncode is not None:
            raise AssertionError(f"the consumer ended before writing {path.name}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the consumer did not write {path.name} within {timeout}s")
        await asyncio.sleep(0.05)


HOST_CACHE_SCRIPT = """
import Database from "better-sqlite3";
import { SqliteMemberCache } from "./dist/host/index.js";
const [path, mode, key] = process.argv.slice(1);
const cache = new SqliteMemberCache(new Database(path), key);
const where = { environment: "prod", account: "11982011376358104761", group: "g-1" };
if (mode === "write") {
  const member = (id, name, stats) => ({
    memberRef: id, userId: id, role: id === "5" ? "admin" : "member", state: "active",
    joinedAt: 3, leftAt: null,
    displayName: name, remark: null, avatarUrl: name ? "https://cdn/" + id : null,
    recordCount: stats ? 7 : null, mentionCount: stats ? 1 : null, statsKnown: stats,
    profileFailed: false, presented: true,
  });
  const members = [member("18446744073709551615", "Zoë", true), member("5", null, false)];
  const ok = await cache.store(where, members);
  console.log(JSON.stringify({ ok }));
} else {
  const roster = await cache.load(where);
  const row = (m) => [m.userId, m.role, m.displayName, m.recordCount, m.statsKnown];
  const rows = roster && roster.members.map(row);
  console.log(JSON.stringify(rows));
}
"""


async def test_the_host_cache_reads_and_writes_the_python_hosts_format(tmp_path: Path) -> None:
    """sdk-ts's SqliteMemberCache and app/members/cache.py share one file format and signature:
    a roster the one writes, the other reads (and a different runtime key is a miss)."""
    _need_node()
    from app.members.cache import CacheKey as PyKey
    from app.members.cache import SqliteMemberCache as PyCache
    from app.members.model import Member

    log = tmp_path / "npm.log"
    _run(["npm", "run", "--silent", "build"], SDK, log)
    key = "runtime-key-0123456789abcdef"
    where = PyKey("prod", "11982011376358104761", "g-1")

    def node(path: Path, mode: str, signing: str = key) -> Any:
        out = _run(
            ["node", "--input-type=module", "-e", HOST_CACHE_SCRIPT, str(path), mode, signing], SDK, log
        )
        return json.loads(out.strip().splitlines()[-1])

    written = tmp_path / "from-node.sqlite"
    assert node(written, "write") == {"ok": True}
    py = PyCache(written, key.encode(), clock_ms=lambda: int(time.time() * 1000))
    try:
        roster = await py.load(where)
    finally:
        await py.close()
    assert roster is not None
    got = [(m.user_id, m.role, m.display_name, m.record_count, m.stats_known) for m in roster.members]
    assert got == [(5, "admin", None, None, False), (2**64 - 1, "member", "Zoë", 7, True)]

    from_python = tmp_path / "from-python.sqlite"
    py = PyCache(from_python, key.encode(), clock_ms=lambda: int(time.time() * 1000))
    try:
        members = [
            Member(user_id=2**64 - 1, display_name="Zoë", record_count=7, mention_count=1, stats_known=True),
            Member(user_id=5, role="owner"),
        ]
        assert await py.store(where, members)
    finally:
        await py.close()
    assert node(from_python, "read") == [
        ["5", "owner", None, None, False],
        ["18446744073709551615", "member", "Zoë", 7, True],
    ]
    assert node(from_python, "read", "another-runtime-key-00000") is None
