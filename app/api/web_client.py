"""The browser client (issue 16): a static page served by the API at /app/.

Plain JavaScript, no build step: ``app/web/`` holds the files exactly as the browser gets them
(``sp-client.js``: the client library — API calls, the page walk, the live stream and the client
rule; ``app.js``: the page; ``index.html``; ``style.css``). Served from memory with a strict
Content-Security-Policy (scripts and connections to this origin only, no inline script), no
referrer (the stream URL carries a ticket), and no caching beyond revalidation.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Final

from aiohttp import web

from app.api.http import ApiContext, Route

APP_PATH: Final = "/app/"
_FILES: Final = {
    "index.html": "text/html",
    "sp-client.js": "text/javascript",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, bytes]:
    folder = resources.files("app") / "web"
    return {name: (folder / name).read_bytes() for name in _FILES}


def routes(ctx: ApiContext) -> list[Route]:
    files = _load()

    def serve(name: str) -> Any:
        body, content_type = files[name], _FILES[name]

        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type, charset="utf-8", headers=_HEADERS)

        return handler

    out = [Route("GET", APP_PATH, serve("index.html"), _operation("index.html"), public=True)]
    out += [
        Route("GET", APP_PATH + name, serve(name), _operation(name), public=True)
        for name in _FILES
        if name != "index.html"
    ]
    return out


def _operation(name: str) -> dict[str, Any]:
    return {
        "operationId": "webClient_" + name.replace(".", "_").replace("-", "_"),
        "summary": f"The browser client: {name} (no token needed; the page asks for one)",
        "security": [],
        "responses": {"200": {"description": name, "content": {_FILES[name]: {}}}},
    }
