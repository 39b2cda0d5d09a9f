"""Replay mode: mailbox entries from a file through the worker's processing object (driver), and
the `projector replay` command (cli)."""

from app.replay.driver import Frame, Replayer, ReplayOptions, ReplayResult, ReplayStats, run_replay

__all__ = ["Frame", "ReplayOptions", "ReplayResult", "ReplayStats", "Replayer", "run_replay"]
