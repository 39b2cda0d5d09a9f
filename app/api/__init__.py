"""The query API (docs/contract.md §5): session list pages and the badge over HTTP (aiohttp).

``create_app(settings, deps)`` builds the application; ``projector api`` serves it
(app/cli/api.py) and ``projector token`` mints bearer tokens (app/cli/token.py).
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
