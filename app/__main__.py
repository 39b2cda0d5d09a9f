"""``python -m app``: the ``projector`` command (app/cli/__init__.py), for environments without the script."""

import sys

from app.cli import main

sys.exit(main())
