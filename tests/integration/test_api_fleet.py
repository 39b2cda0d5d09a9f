"""Issue 32 on the real servers: several API apps on one projection store (a single Redis and
the Redis Cluster) behave as one service: one rate limit for the fleet."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest

from app.settings import Settings
from tests.support import redis_cluster
from tests.support.clock import ManualClock
from tests.support.fleet import fleet
from tests.support.rows import flush, make_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

T0 = 1_800_000_000_000
ME = 3232


@pytest.fixture(params=["redis", "cluster"])
def store_url(request: pytest.FixtureRequest, servers: Settings) -> Iterator[str]:
    if request.param == "cluster":
        redis_cluster.require_healthy()
        yield redis_cluster.URL
    else:
        yield servers.redis_url


async def test_two_instances_enforce_the_configured_rate_not_twice_it(
    servers: Settings, store_url: str, unique_name: Callable[..., str]
) -> None:
    clock = ManualClock(T0)  # both instances' clock: the refill is the test's to move
    settings = dataclasses.replace(servers, api_rate_limit_per_s=2.0, api_rate_limit_burst=10)
    async with fleet(settings, unique_name("rate"), 2, url=store_url, clock=clock) as f:
        await f.store.write([flush(ME, [make_row(ME, 1, act=1)], 1, 1)])
        statuses = [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(30)]
        # One bucket of 10 for the fleet; per-process buckets let 20 through.
        assert statuses == [200] * 10 + [429] * 20, statuses
        assert (await f.get(1, "/v1/badge", ME + 1))[0] == 200  # another user's bucket is full
        status, body = await f.get(0, "/v1/badge", ME)
        assert status == 429 and body["error"]["code"] == "rate_limited"
        clock.now += 1_000  # 2 tokens a second, for the fleet
        assert [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(4)] == [200, 200, 429, 429]
        clock.now += 60_000  # a long pause refills to the burst, no more
        assert sum([(await f.get(n % 2, "/v1/badge", ME))[0] == 200 for n in range(14)]) == 10
        # The clock of one instance behind the other's adds no token (the bucket's time only moves on).
        clock.now -= 30_000
        assert [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(3)] == [429] * 3
        metrics = await f.http.get(f.instances[0].url + "/metrics")
        text = await metrics.text()
        assert "projector_api_rate_limited_total" in text
