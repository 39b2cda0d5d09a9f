"""The worker's own small web server (GET /metrics), beside faust's."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from app.metrics import WorkerMetrics, metrics_handler
from app.settings import Settings

log = logging.getLogger("projector.worker")


async def start_metrics_server(
    settings: Settings, metrics: WorkerMetrics, sync: Callable[[], None]
) -> web.AppRunner:
    """GET /metrics on worker_web_host:worker_metrics_port (its own aiohttp server, not faust's);
    `sync` pulls the core's figures into the metrics before each scrape."""
    web_app = web.Application()
    web_app.router.add_get("/metrics", metrics_handler(metrics.registry, sync), allow_head=False)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.worker_web_host, settings.worker_metrics_port).start()
    log.info("metrics on http://%s:%d/metrics", settings.worker_web_host, settings.worker_metrics_port)
    return runner
