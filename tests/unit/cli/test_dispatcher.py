"""The `projector` dispatcher: bad settings are one clear line and exit code 2, for every command."""

from __future__ import annotations

import pytest

from app.cli import main


@pytest.mark.parametrize("argv", [["token", "5"], ["bootstrap"], ["worker"], ["api"], ["simulate"]])
def test_invalid_settings_are_reported_once_with_exit_code_2(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROJECTOR_LANES", "0")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"projector {argv[0]}: invalid settings:")
    assert "PROJECTOR_LANES: 0 must be >= 1" in err and "Traceback" not in err
