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


@pytest.fixture(scope="session")
def run_id() -> str:
    """Short id of this pytest run: names made from it do not collide with other runs/checkouts."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def unique_name(run_id: str) -> Callable[..., str]:
    """``unique_name("orders")`` -> ``"t-orders-1a2b3c4d-0"``; ``unique_name("ks", sep="_")``
    gives a CQL-safe identifier (letters, digits, ``_``; starts with a letter; <= 48 chars)."""
    counter = itertools.count()

    def make(prefix: str, sep: str = "-") -> str:
        name = f"t{sep}{prefix}{sep}{run_id}{sep}{next(counter)}"
        if sep == "_":
            name = re.sub(r"[^A-Za-z0-9_]", "_", name)[:48]
        return name

    return make
