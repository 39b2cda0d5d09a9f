"""The operator console (issue 17), served by the API process under /ops/ when
``PROJECTOR_OPS_SECRET`` is set; see views.py for the routes and auth.py for the credential and
the CSRF defence. Its Kafka side comes in through the `OpsBus` port (app/kafka/ops.py): this
package imports no faust, mode or aiokafka."""

from __future__ import annotations

from typing import Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from app.api.tokens import TokenSigner
from app.metrics import OpsMetrics
from app.settings import Settings

from .auth import Gatekeeper, OperatorSigner
from .fleet import Fleet, http_fetch
from .ports import OPS_KEY, OpsDeps

PREFIX: Final = "/ops"

__all__ = ["OPS_KEY", "PREFIX", "OpsDeps", "is_console_path", "mount"]


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def mount(
    app: web.Application,
    settings: Settings,
    deps: OpsDeps | None,
    metrics_registry: CollectorRegistry,
) -> bool:
    """Serve the console under /ops/ on `app` when it is configured (an ops secret and its
    dependencies); returns whether it was mounted."""
    if not settings.ops.ops_secret or deps is None:
        return False
    from . import views

    gate = Gatekeeper(
        OperatorSigner(settings.ops.ops_secret),
        TokenSigner(settings.api.api_secret) if settings.api.api_secret else None,
    )
    session_box: dict[str, aiohttp.ClientSession] = {}

    async def default_fetch(url: str) -> str:
        session = session_box.get("s")
        if session is None or session.closed:
            session = session_box["s"] = aiohttp.ClientSession()
        return await http_fetch(session)(url)

    fleet = Fleet(
        deps=deps,
        urls=settings.ops.ops_metrics_urls,
        partitions=settings.topics.topic_partitions,
        base_namespace=settings.redis.projection_namespace,
        fetch=deps.metrics_fetch or default_fetch,
    )
    console = views.build(settings, deps, gate, OpsMetrics(metrics_registry), fleet)

    async def close_http(_: web.Application) -> None:
        session = session_box.get("s")
        if session is not None:
            await session.close()

    console.on_cleanup.append(close_http)
    app.add_subapp(PREFIX, console)
    return True
