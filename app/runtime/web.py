"""The worker's own small web server beside faust's: GET /metrics, /livez and /readyz.

One port (PROJECTOR_WORKER_METRICS_PORT) for everything an orchestrator and Prometheus ask of a
worker: several workers per host already need a port each for their metrics, and a second port
per worker for health would be one more to allocate and open for no gain. No token, like the
API's /metrics and health routes: they reveal no user data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from aiohttp import web

from app.health import Readiness
from app.metrics import WorkerMetrics, metrics_handler
from app.settings import WorkerSettings

log = logging.getLogger("projector.worker")

LIVEZ_PATH: Final = "/livez"
READYZ_PATH: Final = "/readyz"
# Seconds a prober is told to wait after a 503 (the API's value: app/api/health.py).
RETRY_AFTER_S: Final = 5


async def start_metrics_server(
    worker: WorkerSettings,
    metrics: WorkerMetrics,
    sync: Callable[[], None],
    readiness: Readiness | None = None,
) -> web.AppRunner:
    """GET /metrics (and, with `readiness`, /livez and /readyz) on
    worker_web_host:worker_metrics_port (its own aiohttp server, not faust's); `sync` pulls the
    core's figures into the metrics before each scrape."""
    web_app = web.Application()
    web_app.router.add_get("/metrics", metrics_handler(metrics.registry, sync), allow_head=False)
    if readiness is not None:
        add_health_routes(web_app, readiness)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, worker.worker_web_host, worker.worker_metrics_port).start()
    log.info(
        "metrics and health on http://%s:%d (/metrics, /livez, /readyz)",
        worker.worker_web_host,
        worker.worker_metrics_port,
    )
    return runner


def add_health_routes(web_app: web.Application, readiness: Readiness) -> None:
    async def livez(request: web.Request) -> web.Response:
        # Answered by the loop the worker processes on: a stuck loop answers nothing.
        return web.json_response({"status": "live"})

    async def readyz(request: web.Request) -> web.Response:
        ready, checks = await readiness.ready()
        if ready:
            return web.json_response({"status": "ready", "checks": checks})
        failed = sorted(name for name, outcome in checks.items() if outcome != "ok")
        return web.json_response(
            {"status": "not_ready", "failed": failed, "checks": checks},
            status=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    web_app.router.add_get(LIVEZ_PATH, livez)
    web_app.router.add_get(READYZ_PATH, readyz)
