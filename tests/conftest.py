"""Fixtures every test layer may use. Keep this small; layer-specific fixtures live next to
their tests (tests/integration/conftest.py has the real-server ones)."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable

import pytest

from app.settings import Settings


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
