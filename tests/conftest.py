"""Fixtures every test layer may use. Keep this small; layer-specific fixtures live next to
their tests (tests/integration/conftest.py has the real-server ones)."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from app.settings import Settings

# The real-server fixtures (integration tests and the contract suites' server parametrizations).
pytest_plugins = ["tests.support.servers"]

# No per-example deadline and no "too slow" health check: CI runs this suite on 2 loaded cores
# in one long process, where a GC pause or a busy neighbour makes an example slow by chance.
# "Data too large" only says some draws were discarded (big generated streams): fewer examples,
# not a finding. Examples are still bounded by their sizes and by pytest-timeout; failures are
# about results.
hypothesis_settings.register_profile(
    "projector",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.load_profile("projector")


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The settings the code under test would get (environment, else the local defaults)."""
    return Settings.from_env()


_NAMES = itertools.count()


@pytest.fixture(scope="session")
def run_id() -> str:
    """Short id of this pytest run: names made from it do not collide with other runs/checkouts."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def unique_name(run_id: str) -> Callable[..., str]:
    """``unique_name("orders")`` -> ``"t-orders-1a2b3c4d-0"``; ``unique_name("ks", sep="_")``
    gives a CQL-safe identifier (letters, digits, ``_``; starts with a letter; <= 48 chars)."""

    def make(prefix: str, sep: str = "-") -> str:
        # One counter for the whole run: two tests must never share a topic, group or keyspace
        # (a group left by a killed worker would stall the next test's join).
        name = f"t{sep}{prefix}{sep}{run_id}{sep}{next(_NAMES)}"
        if sep == "_":
            name = re.sub(r"[^A-Za-z0-9_]", "_", name)[:48]
        return name

    return make
