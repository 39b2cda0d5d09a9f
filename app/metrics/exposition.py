"""The text exposition format of a registry: served on ``GET /metrics``, and read back by tests and
smoke checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.exposition import generate_latest


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_handler(
    registry: CollectorRegistry, before: Callable[[], None] | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler serving ``registry`` (``before`` runs first: a sync of pulled values)."""

    async def handle(request: web.Request) -> web.Response:
        if before is not None:
            before()
        # CONTENT_TYPE_LATEST carries a charset; aiohttp wants it in its own argument.
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


def names(text: str) -> set[str]:
    """Metric family names present in an exposition text (for tests and smoke checks)."""
    out: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            out.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    return out


def sample(text: str, name: str, labels: Iterable[tuple[str, str]] = ()) -> float:
    """One sample's value in an exposition text (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = dict(labels)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items()):
                return float(s.value)
    return 0.0
