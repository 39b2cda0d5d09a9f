"""The browser client (issues 16 and 34): a static page served by the API at /app/.

``app/web/`` holds the page exactly as the browser gets it (``app.js``: the page, ``index.html``,
``style.css``); it has no client rules of its own. Those come from the TypeScript SDK
(``sdk-ts/``): its browser build, the ES modules of the package's ``dist/`` (the host-only
``dist/host/`` left out), is served under ``/app/sdk/`` and the page imports
``/app/sdk/index.js`` — no bundler, no second copy of the session-list or member-store rules.

Where the build comes from (``api_web_sdk``): a packed tgz (what ``make sdk`` writes to
``.local/sdk/``) or a built ``dist/`` folder; unset, the checkout's ``sdk-ts/dist`` when built,
else the newest tgz in ``.local/sdk/``. Without one the page is still served, its SDK modules are
not, and the API says so once at start.

Everything is served from memory with a strict Content-Security-Policy (scripts and connections
to this origin only, no inline script; avatars from this origin or https), no referrer, and no
caching beyond revalidation.
"""

from __future__ import annotations

import logging
import tarfile
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from app.api.http import ApiContext, Route

log = logging.getLogger(__name__)

APP_PATH: Final = "/app/"
SDK_PATH: Final = APP_PATH + "sdk/"
_FILES: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' https: data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
_ROOT: Final = Path(__file__).resolve().parents[2]  # the checkout (app/api/web_client.py)
_MAX_MODULE_BYTES: Final = 2 * 1024 * 1024


class WebSdkError(ValueError):
    """The configured SDK build cannot be read (a bad tgz or folder)."""


def _load() -> dict[str, bytes]:
    folder = resources.files("app") / "web"
    return {name: (folder / name).read_bytes() for name in _FILES}


def _browser_module(name: str) -> bool:
    """A module of the package's browser build: dist/*.js, not dist/host/ (Node only)."""
    return name.endswith(".js") and "/" not in name and not name.startswith(".")


def _from_dist(dist: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dist.iterdir()) if p.is_file() and _browser_module(p.name)}


def _from_tgz(tgz: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(tgz, "r:gz") as archive:
            for member in archive.getmembers():
                prefix = "package/dist/"
                if not member.isfile() or not member.name.startswith(prefix):
                    continue
                name = member.name[len(prefix) :]
                if not _browser_module(name) or member.size > _MAX_MODULE_BYTES:
                    continue
                data = archive.extractfile(member)
                if data is not None:
                    out[name] = data.read()
    except (OSError, tarfile.TarError) as e:
        raise WebSdkError(f"api_web_sdk: cannot read {tgz}: {e}") from e
    return out


def find_sdk(configured: str, root: Path = _ROOT) -> tuple[str, dict[str, bytes]]:
    """(where the SDK's browser build was read from, its modules by file name); ("", {}) when
    nothing was configured and no build is found. A configured path that does not hold one is
    an error (a deployment that names a build must get that build)."""
    if configured:
        path = Path(configured)
        if path.is_dir():
            modules = _from_dist(path)
        elif path.is_file():
            modules = _from_tgz(path)
        else:
            raise WebSdkError(f"api_web_sdk: {configured} is neither a tgz nor a folder")
        if "index.js" not in modules:
            raise WebSdkError(f"api_web_sdk: {configured} holds no SDK build (no index.js)")
        return str(path), modules
    dist = root / "sdk-ts" / "dist"
    if (dist / "index.js").is_file():
        return str(dist), _from_dist(dist)
    packed = sorted(
        (root / ".local" / "sdk").glob("session-projector-sdk-*.tgz"), key=lambda p: p.stat().st_mtime
    )
    for tgz in reversed(packed):
        modules = _from_tgz(tgz)
        if "index.js" in modules:
            return str(tgz), modules
    return "", {}


def routes(ctx: ApiContext) -> list[Route]:
    files = _load()
    where, modules = find_sdk(ctx.api.api_web_sdk)
    if modules:
        log.info("web client: the SDK's browser build from %s (%d modules)", where, len(modules))
    else:
        log.warning(
            "web client: no SDK browser build (make sdk, or set PROJECTOR_API_WEB_SDK): "
            "the page at %s cannot load its client",
            APP_PATH,
        )

    def serve(body: bytes, content_type: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type, charset="utf-8", headers=_HEADERS)

        return handler

    out = [
        Route(
            "GET",
            APP_PATH,
            serve(files["index.html"], _FILES["index.html"]),
            _operation("index.html"),
            public=True,
        )
    ]
    out += [
        Route("GET", APP_PATH + name, serve(files[name], _FILES[name]), _operation(name), public=True)
        for name in _FILES
        if name != "index.html"
    ]
    out += [
        Route("GET", SDK_PATH + name, serve(body, "text/javascript"), _operation("sdk/" + name), public=True)
        for name, body in sorted(modules.items())
    ]
    return out


def _operation(name: str) -> dict[str, Any]:
    content_type = _FILES.get(name, "text/javascript")
    op_id = name.replace(".", "_").replace("-", "_").replace("/", "_")
    return {
        "operationId": "webClient_" + op_id,
        "summary": f"The browser client: {name} (no token needed; the page asks for one)",
        "security": [],
        "responses": {"200": {"description": name, "content": {content_type: {}}}},
    }
