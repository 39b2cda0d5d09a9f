"""PROJECTOR_LOG_FORMAT=text|json and PROJECTOR_API_ACCESS_LOG (issue 15): one JSON format for
every process, faust's own records included (through the dictConfig faust's worker applies)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest
from mode.utils.logging import setup_logging

from app.logs import (
    ACCESS_LOGGER,
    JsonFormatter,
    access_logger,
    announce,
    configure_logging,
    faust_worker_options,
    logging_config,
)
from app.settings import Settings, SettingsError

JSON = Settings.build(log_format="json")


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def _lines(text: str) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in text.splitlines() if line]


def test_a_record_is_one_json_object_with_the_common_fields() -> None:
    record = logging.LogRecord(
        "projector.worker", logging.WARNING, "f.py", 1, "lag %d on %s", (5, "p0"), None
    )
    record.partition = 3  # an `extra=` field
    out = orjson.loads(JsonFormatter("worker").format(record))
    assert out["level"] == "WARNING" and out["logger"] == "projector.worker"
    assert out["message"] == "lag 5 on p0" and out["service"] == "worker" and out["partition"] == 3
    assert out["ts"].endswith("Z") and isinstance(out["pid"], int)


def test_exceptions_and_odd_values_stay_inside_the_object() -> None:
    try:
        raise ValueError("bad\nvalue ünicode")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, "f.py", 1, "failed", None, sys.exc_info())
    record.thing = object()  # not JSON: rendered as text, never a crash
    line = JsonFormatter().format(record)
    assert "\n" not in line
    out = orjson.loads(line)
    assert "ValueError: bad\nvalue ünicode" in str(out["exception"]) and str(out["thing"]).startswith(
        "<object"
    )


def test_configure_logging_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(JSON.log, "api")
    logging.getLogger("app.api").info("listening")
    logging.getLogger("deep.debug").debug("hidden at INFO")
    import warnings

    warnings.warn("a python warning", UserWarning, stacklevel=1)
    lines = _lines(capsys.readouterr().err)
    assert lines[0]["message"] == "listening"
    assert any("a python warning" in str(line["message"]) for line in lines)  # captured warnings too
    assert all(line["service"] == "api" for line in lines) and len(lines) == 2


def test_faust_workers_set_up_the_same_format(capsys: pytest.CaptureFixture[str]) -> None:
    """mode.utils.logging.setup_logging is what faust's Worker calls when it starts: with our
    options, its records (and those of loggers made before it ran) come out as our JSON."""
    early = logging.getLogger("projector.early")  # made before the set-up: must not be disabled
    options = faust_worker_options(JSON.log)
    assert options["quiet"] is True  # no text banner on stdout
    setup_logging(loglevel="INFO", logging_config=options["logging_config"])
    logging.getLogger("faust.worker").info("[^Worker]: Ready")
    early.warning("still here")
    lines = _lines(capsys.readouterr().err)
    assert [(line["logger"], line["message"]) for line in lines] == [
        ("faust.worker", "[^Worker]: Ready"),
        ("projector.early", "still here"),
    ]
    assert all(line["service"] == "worker" for line in lines)


def test_text_is_one_readable_line_for_faust_too(capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings()
    assert faust_worker_options(settings.log)["quiet"] is False
    setup_logging(loglevel="INFO", logging_config=logging_config(settings.log, "worker"))
    logging.getLogger("faust.worker").info("ready")
    err = capsys.readouterr().err
    assert err.rstrip().endswith("INFO faust.worker: ready") and not err.startswith("{")


def test_the_access_log_switch() -> None:
    assert access_logger(Settings().api.api_access_log) is None
    logger = access_logger(Settings.build(api_access_log=True).api.api_access_log)
    assert logger is not None and logger.name == ACCESS_LOGGER
    assert Settings.from_env({"PROJECTOR_API_ACCESS_LOG": "on"}).api.api_access_log is True


def test_announce_follows_the_format(capsys: pytest.CaptureFixture[str]) -> None:
    announce(Settings().log, "api", "projector api: listening on http://127.0.0.1:8080")
    assert capsys.readouterr().out == "projector api: listening on http://127.0.0.1:8080\n"
    announce(JSON.log, "api", "projector api: listening on http://127.0.0.1:8080")
    line = orjson.loads(capsys.readouterr().out)
    assert line["message"] == "projector api: listening on http://127.0.0.1:8080" and line["service"] == "api"


def test_the_log_format_is_validated() -> None:
    assert Settings().log.log_format == "text"
    assert Settings.from_env({"PROJECTOR_LOG_FORMAT": "json"}).log.log_format == "json"
    with pytest.raises(SettingsError, match="PROJECTOR_LOG_FORMAT: 'xml' is not one of json, text"):
        Settings.from_env({"PROJECTOR_LOG_FORMAT": "xml"})
