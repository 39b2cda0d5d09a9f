"""The query API (docs/contract.md §5): session list pages and the badge over HTTP (aiohttp).

``create_app(settings, deps)`` builds the application; ``projector api`` serves it
(app/api_cli.py) and ``projector token`` mints bearer tokens (app/api/token_cli.py).
"""

from app.api.app import RESOURCES, ApiConfigError, create_app
from app.api.http import ApiContext, ApiError, Deps, Route, current_user

__all__ = [
    "RESOURCES",
    "ApiConfigError",
    "ApiContext",
    "ApiError",
    "Deps",
    "Route",
    "create_app",
    "current_user",
]
