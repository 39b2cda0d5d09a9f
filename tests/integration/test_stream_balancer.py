"""Issue 32 item 2, the live stream: HAProxy round robin (tests/support/balancer.py) in front of
three gateway instances that each read every frame partition, the real worker fed by
`projector simulate`. Devices follow `/v1/stream` through the balancer with the SDK's
LiveStream; mid-traffic the instance holding most of them is closed, their reconnects land on
the other instances (which never streamed those users) and resume with `Last-Event-ID` from the
frames those instances held (app/gateway/recent_frames.py) — no re-pull — and every device ends
with exactly what a fresh walk and `projector replay` say."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.sdk import LiveSessionList, SessionsClient
from app.sdk.stream import LiveStream
from tests.integration.gateway_stack import (
    Instance,
    assert_device_matches,
    eventually,
    gateway_instance,
    token,
)
from tests.integration.stack import Stack, read_jsonl
from tests.integration.test_gateway_e2e import run_async
from tests.support.balancer import Balancer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SIM = ("--users", "24", "--conversations", "10", "--group-size", "12", "--lanes", "2", "--seed", "9")


async def test_streams_through_a_balancer_resume_on_another_instance_when_theirs_closes(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("sselb", partitions=2)
    preview = tmp_path / "preview.jsonl"
    sim = (*SIM, "--messages", "1500", "--progress", "never")
    stack.run("simulate", *sim, "--rate", "0", "--no-kafka", "--no-cassandra", "--out", str(preview))
    users = sorted({e["user_id"] for e in read_jsonl(preview) if "user_id" in e})
    online = users[:9]
    stack.start_worker()

    async with contextlib.AsyncExitStack() as fleet:
        instances: list[Instance] = []
        closers: list[contextlib.AsyncExitStack] = []
        for _ in range(3):
            own = contextlib.AsyncExitStack()
            instances.append(
                await own.enter_async_context(gateway_instance(stack.settings, gateway_heartbeat_ms=1000))
            )
            closers.append(own)
            fleet.push_async_callback(own.aclose)
        ports = [urlsplit(i.url).port or 0 for i in instances]
        with Balancer.start(tmp_path, ports) as lb:
            stop = asyncio.Event()
            devices: dict[int, tuple[SessionsClient, LiveSessionList, LiveStream]] = {}
            tasks = []
            for user in online:
                api = SessionsClient(lb.url, token(user))
                live = LiveSessionList(api, user, limit=7)
                follow = LiveStream(live, read_timeout_s=20, max_backoff_s=1.0)
                devices[user] = (api, live, follow)
                tasks.append(asyncio.create_task(follow.run(stop)))
            try:
                for _, _, follow in devices.values():
                    await follow.until(lambda f=follow: f.synced, 60)  # type: ignore[misc]
                held = [set(i.gateway.hub.connected_users()) for i in instances]
                assert set().union(*held) == set(online) and all(held), held  # round robin: all 3
                # Past the frame sources' settle time: the deltas every instance reads now vouch.
                await asyncio.sleep(2.5)

                stream = tmp_path / "stream.jsonl"
                traffic = asyncio.create_task(
                    run_async(stack, "simulate", *sim, "--rate", "150", "--out", str(stream))
                )
                # Mid-traffic: the instance holding the most devices goes away.
                await eventually(lambda: all(d[1].view.version > 0 for d in devices.values()), 120, "frames")
                doomed = max(range(3), key=lambda n: len(held[n]))
                moved = held[doomed]
                seeded_before = sum(i.gateway.hub.counters.seeded for i in instances)
                await closers[doomed].aclose()
                survivors = [i for n, i in enumerate(instances) if n != doomed]
                await eventually(
                    lambda: all(devices[u][2].stats.hellos.get("resumed", 0) >= 1 for u in moved),
                    60,
                    "the moved devices resumed elsewhere",
                )
                await traffic
                out = tmp_path / "replay"
                await run_async(stack, "replay", "--input", str(stream), "--out", str(out), "--lanes", "2")
                badges = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
                versions = {u: badges[u]["projection_mailbox_seq"] for u in online}
                await stack.wait_for_versions(versions, timeout=300, alive=stack.alive())

                for user, (api, live, follow) in devices.items():
                    await assert_device_matches(api, live, follow, badges[user])
                    hellos = follow.stats.hellos
                    # One pull at the start; every reconnect resumed: nothing re-pulled, ever.
                    assert hellos.get("fresh") == 1 and "repull" not in hellos, (user, hellos)
                    assert follow.stats.repull_events == 0
                now_held = set().union(*(set(i.gateway.hub.connected_users()) for i in survivors))
                assert now_held == set(online)
                seeded = sum(i.gateway.hub.counters.seeded for i in survivors) - seeded_before
                assert seeded >= len(moved)  # resumed from frames held while streaming elsewhere
                replayed = sum(i.gateway.hub.counters.replayed for i in survivors)
                print(
                    f"\nmoved devices: {len(moved)} of {len(online)}, seeded logs: {seeded}, "
                    f"frames replayed on resume: {replayed}, repulls: 0"
                )
            finally:
                stop.set()
                await asyncio.gather(*tasks)
                for api, _, _ in devices.values():
                    await api.close()
