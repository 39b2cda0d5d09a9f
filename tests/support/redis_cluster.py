"""The local Redis Cluster of the tests (scripts/redis_cluster.sh: 3 masters + 3 replicas on
127.0.0.1:7101-7106), and what the tests do to it: read the slot map, kill a master and bring it
back (its failover held until the test lets it happen), reshard with `redis-cli --cluster
reshard`, hold a slot half-migrated.

Like every real server of the suite, a cluster that is not there FAILS the test (`make test`
starts it through scripts/tools.d/redis-cluster.sh; `make redis-cluster-up` by hand).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import redis
from redis.crc import key_slot

from tests.support.paths import ROOT

HOST = "127.0.0.1"
PORTS = tuple(range(7101, 7107))
# Three startup nodes: the client finds the rest (and still starts when one of them is down).
URL = "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in PORTS[:3])
HINT = "the Redis Cluster tests need the local cluster: run `make redis-cluster-up` (`make test` does)"


@dataclass
class Node:
    id: str
    port: int
    flags: set[str]
    master_id: str | None
    slots: list[tuple[int, int]] = field(default_factory=list)
    open_slots: list[str] = field(default_factory=list)

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)

    @property
    def slot_count(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.slots)


def client(port: int) -> redis.Redis:
    return redis.Redis(
        host=HOST, port=port, decode_responses=True, socket_timeout=10, socket_connect_timeout=3
    )


def answers(port: int) -> bool:
    try:
        with client(port) as c:
            return bool(c.ping())
    except redis.RedisError:
        return False


def nodes(via: int | None = None) -> list[Node]:
    """The cluster as one live node sees it (`via`, else the first that answers)."""
    for port in [via] if via is not None else list(PORTS):
        try:
            with client(port) as c:
                text = c.execute_command("CLUSTER", "NODES")  # split: no reply parsing
        except redis.RedisError:
            continue
        out = []
        for line in str(text).splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            node = Node(
                id=parts[0],
                port=int(parts[1].split("@")[0].rsplit(":", 1)[1]),
                flags=set(parts[2].split(",")) - {"myself"},
                master_id=None if parts[3] == "-" else parts[3],
            )
            for item in parts[8:]:
                if item.startswith("["):
                    node.open_slots.append(item)
                else:
                    lo, _, hi = item.partition("-")
                    node.slots.append((int(lo), int(hi or lo)))
            out.append(node)
        return out
    raise AssertionError(f"no node of the local cluster answers; {HINT}")


def slot_of(key: str) -> int:
    return int(key_slot(key.encode()))


def user_slot(user_id: int) -> int:
    """The slot of every key of this user (the store's `{user_id}` hash tag)."""
    return slot_of(f"{{{user_id}}}")


def master_of(slot: int, via: int | None = None) -> Node:
    for node in nodes(via):
        if node.is_master and not node.failed and node.owns(slot):
            return node
    raise AssertionError(f"no live master owns slot {slot}")


def status() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts/redis_cluster.sh"), "status"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def require_healthy(timeout: float = 60) -> None:
    """Fails the test (never skips) when the local cluster is not healthy within `timeout` s
    (a replica still syncing after the previous test's failover is given the time)."""
    deadline = time.monotonic() + timeout
    while (done := status()).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"{done.stdout.strip()}\n{HINT}", pytrace=False)
        time.sleep(1)


def wait_until(what: str, condition: Callable[[], bool], timeout: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(every)


def wait_healthy(timeout: float = 120) -> None:
    """Until scripts/redis_cluster.sh says healthy (replicas synced, no open slot, ...)."""
    wait_until("the local Redis Cluster healthy again", lambda: status().returncode == 0, timeout, 0.5)


@dataclass
class KilledNode:
    """A node killed with SIGKILL, and where it kept its nodes.conf."""

    port: int
    data_dir: str

    def restart(self) -> None:
        """Start it again as scripts/redis_cluster.sh starts nodes: it rejoins from its
        nodes.conf (as a replica of its successor when it was failed over)."""
        subprocess.run(
            ["bash", str(ROOT / "scripts/redis_cluster.sh"), "start-node", str(self.port), self.data_dir],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(f"node {self.port} answering again", lambda: answers(self.port), 30)


def kill_node(port: int) -> KilledNode:
    """SIGKILL the redis-server on `port` (whichever checkout started it)."""
    with client(port) as c:
        pid = int(c.info("server")["process_id"])
        data_dir = str(c.config_get("dir")["dir"])
    os.kill(pid, signal.SIGKILL)
    wait_until(f"node {port} gone", lambda: not answers(port), 30)
    return KilledNode(port, data_dir)


def wait_failover(dead: Node, timeout: float = 90) -> Node:
    """Until a replica of `dead` (a killed master) is promoted and the survivors agree the
    cluster is ok; returns the new master."""
    survivors = [p for p in PORTS if p != dead.port]
    slot = dead.slots[0][0]

    def promoted() -> bool:
        for port in survivors:
            try:
                with client(port) as c:
                    if "cluster_state:ok" not in str(c.execute_command("CLUSTER", "INFO")):
                        return False
            except redis.RedisError:
                return False
        try:
            return master_of(slot, via=survivors[0]).port != dead.port
        except AssertionError:
            return False

    wait_until(f"a replica of {dead.port} promoted", promoted, timeout, 0.25)
    return master_of(slot, via=survivors[0])


@contextlib.contextmanager
def failover_held(master: Node) -> Iterator[list[Node]]:
    """While inside, the replicas of `master` do not take over when it dies
    (`cluster-replica-no-failover`): a test kills the master and keeps it dead until the code
    under test has met it, whatever the load of the machine. On leaving, the replicas may take
    over again, and when the master is dead the first one is told to (`CLUSTER FAILOVER FORCE`:
    an automatic failover would refuse a replica whose link has been down longer than the
    validity factor allows)."""
    replicas = [n for n in nodes() if n.master_id == master.id and not n.failed]
    assert replicas, f"master {master.port} has no live replica"
    for replica in replicas:
        with client(replica.port) as c:
            c.config_set("cluster-replica-no-failover", "yes")
    try:
        yield replicas
    finally:
        for replica in replicas:
            with client(replica.port) as c:
                c.config_set("cluster-replica-no-failover", "no")
        if not answers(master.port):
            with client(replicas[0].port) as c:
                try:
                    c.execute_command("CLUSTER", "FAILOVER", "FORCE")
                except redis.ResponseError as exc:
                    if "to a replica" not in str(exc):  # else it has just taken over by itself
                        raise


def reshard(source: Node, target: Node, count: int) -> str:
    """`redis-cli --cluster reshard`: move `count` slots from `source` to `target` (redis-cli
    takes the source's lowest slots first); returns its output."""
    done = subprocess.run(
        [
            *("redis-cli", "--cluster", "reshard", f"{HOST}:{source.port}"),
            *("--cluster-from", source.id, "--cluster-to", target.id),
            *("--cluster-slots", str(count), "--cluster-yes"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"redis-cli --cluster reshard exited {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def rebalance() -> str:
    """`redis-cli --cluster rebalance`: even out the masters' slots (moves nothing when they
    are within its 2 % threshold)."""
    done = subprocess.run(
        ["redis-cli", "--cluster", "rebalance", f"{HOST}:{PORTS[0]}", "--cluster-use-empty-masters"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"redis-cli --cluster rebalance exited {done.returncode}:\n{done.stdout[-3000:]}"
        )
    return done.stdout


def slots_up_to(node: Node, slot: int) -> int:
    """How many of `node`'s slots are <= `slot`: the count `reshard` needs to move `slot`."""
    return sum(min(hi, slot) - lo + 1 for lo, hi in node.slots if lo <= slot)


def _migrate(source: Node, target: Node, keys: list[str]) -> None:
    if keys:
        with client(source.port) as c:
            c.execute_command("MIGRATE", HOST, target.port, "", 0, 10000, "REPLACE", "KEYS", *keys)


@contextlib.contextmanager
def slot_half_migrated(slot: int, source: Node, target: Node, first: list[str]) -> Iterator[None]:
    """Slot `slot` MIGRATING on `source` / IMPORTING on `target`, with only the keys `first`
    moved, for the duration of the block (commands on keys split this way get ASK or TRYAGAIN);
    afterwards the rest moves and every master is told the new owner, whatever happened inside."""
    with client(target.port) as t, client(source.port) as s:
        t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.id)
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.id)
        try:
            _migrate(source, target, first)
            yield
        finally:
            while True:
                keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                _migrate(source, target, list(keys))
            # The owner first, then the source (it stops redirecting with ASK), then the rest.
            others = [n.port for n in nodes(target.port) if n.is_master and not n.failed]
            for port in dict.fromkeys([target.port, source.port, *others]):
                with client(port) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.id)
