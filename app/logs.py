"""One log format for every process: ``PROJECTOR_LOG_FORMAT=text|json``.

``text`` is one readable line per record; ``json`` is one JSON object per line with the same
fields in the worker (faust's and mode's own records included) and the API (its access log
included)::

    {"ts": "2026-05-01T12:00:00.123Z", "level": "INFO", "logger": "projector.worker",
     "message": "...", "service": "worker", "pid": 4242}

plus ``exception`` (the formatted traceback) when there is one, and any ``extra`` fields of the
record (aiohttp's access log gives ``remote_address``, ``response_status``, ``request_time``, ...).

faust configures logging itself when its worker starts (``mode.Worker._setup_logging`` clears the
root handlers and applies a ``logging.config.dictConfig``): :func:`faust_worker_options` gives it
our dictConfig, so its records go through the same formatter, and ``quiet`` keeps its start-up
banner (plain text on stdout) out of a JSON stream.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from app.settings import LogSettings

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER: Final = "aiohttp.access"

# The attributes every LogRecord has: anything else on a record came in through `extra=`.
_STANDARD: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (orjson: a log line must never cost more than the work)."""

    def __init__(self, service: str = "") -> None:
        super().__init__()
        self.service = service
        self.pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        millis = int((record.created - seconds) * 1000)
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.service:
            out["service"] = self.service
        out["pid"] = self.pid
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def formatter(log: LogSettings, service: str) -> logging.Formatter:
    if log.log_format == "json":
        return JsonFormatter(service)
    return logging.Formatter(TEXT_FORMAT)


def configure_logging(log: LogSettings, service: str) -> None:
    """The root logger of this process: one handler on stderr in the chosen format and level.
    Python warnings and uncaught exceptions go through it too (a traceback printed around the
    formatter would be the one non-JSON line of a JSON stream)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log, service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(log.log_level)
    logging.captureWarnings(True)
    if log.log_format == "json":
        sys.excepthook = _log_uncaught


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("projector").critical("uncaught exception", exc_info=(kind, exc, tb))


def logging_config(log: LogSettings, service: str) -> dict[str, Any]:
    """The same set-up as :func:`configure_logging`, as a ``logging.config.dictConfig`` (what
    faust's worker applies when it starts)."""
    if log.log_format == "json":
        fmt: dict[str, Any] = {"()": f"{__name__}.JsonFormatter", "service": service}
    else:
        fmt = {"format": TEXT_FORMAT}
    return {
        "version": 1,
        # Loggers made at import (ours, aiokafka's, the Cassandra driver's) must keep logging.
        "disable_existing_loggers": False,
        "formatters": {"projector": fmt},
        "handlers": {
            "projector": {
                "class": "logging.StreamHandler",
                "formatter": "projector",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": log.log_level, "handlers": ["projector"]},
    }


def faust_worker_options(log: LogSettings) -> dict[str, Any]:
    """Keyword arguments for ``faust.Worker``: our logging set-up instead of faust's, and in JSON
    mode no start-up banner (faust prints it to stdout as text, outside logging)."""
    return {
        "logging_config": logging_config(log, "worker"),
        "quiet": log.log_format == "json",
    }


def access_logger(enabled: bool) -> logging.Logger | None:
    """aiohttp's access logger when ``PROJECTOR_API_ACCESS_LOG`` is on (None = no access log)."""
    return logging.getLogger(ACCESS_LOGGER) if enabled else None


def announce(log: LogSettings, service: str, message: str) -> None:
    """A line for whoever started the process (e.g. the API's address) on stdout: as it reads in
    text mode, a JSON record (level INFO, logger ``projector``) in JSON mode."""
    if log.log_format == "json":
        record = logging.LogRecord("projector", logging.INFO, __file__, 0, message, None, None)
        print(JsonFormatter(service).format(record), flush=True)
    else:
        print(message, flush=True)
