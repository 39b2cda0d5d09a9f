"""The faust application module: `faust -A app.main worker` (`projector worker` builds the same
app through app.runtime.worker.create_app with the Settings it was given).

Everything is built from one `Settings` (the environment) at import.
"""

from __future__ import annotations

from app.runtime.worker import create_app
from app.settings import Settings

settings = Settings.from_env()
app, core = create_app(settings)
