"""Where the checkout is, for tests that read the repository's own files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
