"""docker/Dockerfile's node stage builds the TypeScript SDK as `make sdk` does (issue 34): the
lockfile's `npm ci`, the package's own strict tsc build, `npm pack`; it copies sources that exist
in the repository and everything the package ships is made from them; the image carries the
packed tgz where PROJECTOR_API_WEB_SDK points. Docker does not run here: this reads the file."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.settings import Settings
from tests.support.paths import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
SDK = ROOT / "sdk-ts"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        out.append((word.upper(), " ".join(args.split())))
        pending = ""
    return out


def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """The instructions of each stage, by its name (`AS name`, else its image)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, args in _instructions(text):
        if word == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else parts[0]
            current = stages.setdefault(name, [("FROM", args)])
        else:
            current.append((word, args))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, list[tuple[str, str]]]:
    return _stages(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def package() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SDK / "package.json").read_text())
    return data


def _runs(stage: list[tuple[str, str]]) -> list[str]:
    return [args for word, args in stage if word == "RUN"]


def test_the_node_stage_installs_from_the_lockfile_builds_with_the_packages_tsc_and_packs(
    stages: dict[str, list[tuple[str, str]]], package: dict[str, Any]
) -> None:
    sdk = stages["sdk"]
    image = sdk[0][1].split()[0]
    assert image.startswith("node:")
    major = int(re.match(r"node:(\d+)", image).group(1))  # type: ignore[union-attr]
    assert major >= int(package["engines"]["node"].removeprefix(">="))
    runs = _runs(sdk)
    steps = [
        next(i for i, r in enumerate(runs) if word in r) for word in ("npm ci", "npm run build", "npm pack")
    ]
    assert steps == sorted(steps), runs  # install, then build, then pack
    assert package["scripts"]["build"] == "tsc -p tsconfig.json"  # what `npm run build` runs (make sdk too)
    assert package["scripts"]["prepack"] == "npm run build"  # the local `npm pack` builds the same way


def test_the_node_stage_copies_sources_that_exist_and_everything_the_package_ships_is_built_from_them(
    stages: dict[str, list[tuple[str, str]]], package: dict[str, Any]
) -> None:
    copied: set[str] = set()
    for word, args in stages["sdk"]:
        if word == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert source.startswith("sdk-ts/"), source
                assert (ROOT / source).exists(), f"{source} is not in the repository"
                copied.add(source.removeprefix("sdk-ts/").rstrip("/"))
    # Never the build context's dist/ or node_modules/ (a stale build would end up in the tgz).
    assert "" not in copied and not any(c.startswith(("dist", "node_modules")) for c in copied)
    assert {"package.json", "package-lock.json", "tsconfig.json", "src"} <= copied
    tsconfig = json.loads((SDK / "tsconfig.json").read_text())["compilerOptions"]
    assert (tsconfig["rootDir"], tsconfig["outDir"]) == ("src", "dist")
    for shipped in package["files"]:
        top = shipped.split("/")[0]
        assert top == "dist" or top in copied, f"the package ships {shipped}, which the stage never has"
    assert (SDK / "src" / "index.ts").is_file()  # dist/index.js, the page's entry point


def test_the_image_carries_the_packed_tgz_where_the_api_looks_for_the_pages_sdk(
    stages: dict[str, list[tuple[str, str]]],
) -> None:
    packed = re.search(r"mv /out/\*\.tgz (\S+)", " ".join(_runs(stages["sdk"])))
    assert packed is not None
    final = next(stage for name, stage in stages.items() if name.startswith("python:"))
    copies = [args.split() for word, args in final if word == "COPY" and args.startswith("--from=sdk ")]
    assert len(copies) == 1 and copies[0][1] == packed.group(1), copies
    dest = copies[0][2]
    workdir = next(args for word, args in final if word == "WORKDIR")
    in_image = dest if dest.startswith("/") else f"{workdir}/{dest.removeprefix('./')}"
    env = dict(
        part.split("=", 1) for word, args in final if word == "ENV" for part in args.split() if "=" in part
    )
    assert env["PROJECTOR_API_WEB_SDK"] == in_image
    assert "PROJECTOR_API_WEB_SDK" in Settings.env_names()
    assert Settings.from_env({"PROJECTOR_API_WEB_SDK": in_image}).api.api_web_sdk == in_image
