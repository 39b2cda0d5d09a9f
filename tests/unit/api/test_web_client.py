"""Where the page's SDK modules come from (app/api/web_client.py, issue 34 item 3): a packed tgz
or a built dist/ folder; only the browser build (dist/*.js, not dist/host/); a configured path
that holds no build is refused; nothing found is an empty set (the page is still served)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from app.api.web_client import WebSdkError, find_sdk


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


PACKAGE = {
    "package/package.json": b"{}",
    "package/dist/index.js": b'export * from "./store.js";',
    "package/dist/store.js": b"export const x = 1;",
    "package/dist/index.d.ts": b"export {};",
    "package/dist/host/index.js": b'import "node:crypto";',
    "package/README.md": b"#",
}


def test_the_browser_build_is_read_from_a_packed_tgz(tmp_path: Path) -> None:
    tgz = _tgz(tmp_path / "session-projector-sdk-0.1.0.tgz", PACKAGE)
    where, modules = find_sdk(str(tgz), root=tmp_path / "nowhere")
    assert where == str(tgz)
    assert sorted(modules) == ["index.js", "store.js"]  # no typings, no Node-only host entry
    assert modules["store.js"] == b"export const x = 1;"


def test_unset_the_checkouts_dist_then_the_newest_packed_tgz(tmp_path: Path) -> None:
    assert find_sdk("", root=tmp_path) == ("", {})
    packed = tmp_path / ".local" / "sdk"
    packed.mkdir(parents=True)
    tgz = _tgz(packed / "session-projector-sdk-0.1.0.tgz", PACKAGE)
    assert find_sdk("", root=tmp_path)[0] == str(tgz)
    dist = tmp_path / "sdk-ts" / "dist"
    (dist / "host").mkdir(parents=True)
    (dist / "index.js").write_text("export {};")
    (dist / "host" / "index.js").write_text('import "node:crypto";')
    where, modules = find_sdk("", root=tmp_path)
    assert where == str(dist) and sorted(modules) == ["index.js"]


def test_a_configured_path_without_a_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WebSdkError, match="neither"):
        find_sdk(str(tmp_path / "missing.tgz"))
    empty = _tgz(tmp_path / "empty.tgz", {"package/package.json": b"{}"})
    with pytest.raises(WebSdkError, match="no SDK build"):
        find_sdk(str(empty))
    (tmp_path / "not-a-tgz.tgz").write_bytes(b"nope")
    with pytest.raises(WebSdkError, match="cannot read"):
        find_sdk(str(tmp_path / "not-a-tgz.tgz"))


def test_the_api_refuses_to_start_on_a_named_build_that_is_not_there(tmp_path: Path) -> None:
    from app.api.app import ApiConfigError, check_config
    from app.settings import ApiSettings, Settings

    settings = Settings.build(api_secret="s" * 32, api_web_sdk=str(tmp_path / "missing.tgz"))
    with pytest.raises(ApiConfigError, match="api_web_sdk"):
        check_config(settings.api)
    check_config(ApiSettings(api_secret="s" * 32, api_web_sdk=str(_tgz(tmp_path / "sdk.tgz", PACKAGE))))
