"""The Dockerfiles: pinned base, non-root, health check, COPY sources that exist and pass
the .dockerignore, and uv commands that resolve against the real lock file."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker._files import (
    DOCKER,
    DOCKERFILES,
    ROOT,
    Instruction,
    copy_sources,
    dockerfile_instructions,
    dockerignore_allows,
)


def _name(path: Path) -> str:
    return path.name


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    out = {}
    for i in instructions:
        if i.keyword == "ARG" and "=" in i.args:
            name, _, value = i.args.partition("=")
            out[name] = value
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_name)
def test_base_image_is_pinned_slim_bookworm(dockerfile: Path) -> None:
    instructions = dockerfile_instructions(dockerfile)
    args = _arg_defaults(instructions)
    froms = [i.args.split()[0] for i in instructions if i.keyword == "FROM"]
    assert len(froms) == 2, "a build stage and a runtime stage"
    for image in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", resolved)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_name)
def test_copy_sources_exist_and_survive_the_dockerignore(dockerfile: Path) -> None:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.is_file(), f"{ignore.name} keeps .venv and caches out of the build context"
    sources = [s for i in dockerfile_instructions(dockerfile) if i.keyword == "COPY"
               for s in copy_sources(i)]  # fmt: skip
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert dockerignore_allows(ignore, source), f"COPY {source}: excluded by {ignore.name}"
    for excluded in (".venv", ".git", "tests", ".tools/bin/uv", "ragtrace/__pycache__/x.pyc"):
        assert not dockerignore_allows(ignore, excluded), f"{excluded} is sent to the daemon"


@pytest.mark.parametrize(
    ("dockerfile", "port"),
    [(DOCKER / "collector.Dockerfile", 8888), (DOCKER / "app.Dockerfile", 8000)],
    ids=["collector", "app"],
)
def test_runs_as_non_root_with_a_healthcheck(dockerfile: Path, port: int) -> None:
    instructions = dockerfile_instructions(dockerfile)
    users = [i.args for i in instructions if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root")
    [health] = [i for i in instructions if i.keyword == "HEALTHCHECK"]
    assert f"http://127.0.0.1:{port}/healthz" in health.args
    exposed = {int(p) for i in instructions if i.keyword == "EXPOSE" for p in i.args.split()}
    assert port in exposed


def test_collector_image_ports_and_config() -> None:
    instructions = dockerfile_instructions(DOCKER / "collector.Dockerfile")
    exposed = {int(p) for i in instructions if i.keyword == "EXPOSE" for p in i.args.split()}
    assert exposed == {4317, 4318, 8888}
    [cmd] = [i.args for i in instructions if i.keyword == "CMD"]
    assert '"/etc/ragtrace/collector.yaml"' in cmd
    assert any(
        i.keyword == "COPY"
        and i.args.split() == ["docker/collector.yaml", "/etc/ragtrace/collector.yaml"]
        for i in instructions
    )


def _uv() -> str:
    local = ROOT / ".tools" / "bin" / "uv"
    found = str(local) if local.is_file() else shutil.which("uv")
    assert found, "uv is required (scripts/_env.sh bootstraps it into .tools/)"
    return found


def _uv_syncs(dockerfile: Path) -> list[list[str]]:
    commands = []
    for instruction in dockerfile_instructions(dockerfile):
        if instruction.keyword != "RUN" or "uv sync" not in instruction.args:
            continue
        words = shlex.split(instruction.args)
        if "--python" in words:
            at = words.index("--python")
            del words[at : at + 2]
        commands.append(words)
    return commands


_COLLECTOR_PLAN = (
    DOCKER / "collector.Dockerfile",
    ["ragtrace-collector", "ragtrace-sdk", "litellm", "grpcio"],
    ["pytest", "rank-bm25"],
)
_APP_PLAN = (
    DOCKER / "app.Dockerfile",
    ["ragtrace-sdk", "rank-bm25", "litellm"],
    ["pytest", "ragtrace-collector"],
)


@pytest.mark.parametrize(
    ("dockerfile", "present", "absent"), [_COLLECTOR_PLAN, _APP_PLAN], ids=["collector", "app"]
)
def test_uv_sync_commands_resolve_against_the_lock(
    dockerfile: Path, present: list[str], absent: list[str], tmp_path: Path
) -> None:
    commands = _uv_syncs(dockerfile)
    assert len(commands) == 2, "dependencies first, then the project (layer caching)"
    for words in commands:
        assert words[:2] == ["uv", "sync"]
        assert "--frozen" in words, "install exactly what uv.lock pins (hashes verified)"
        assert "--no-dev" in words
    env = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(
        [_uv(), *commands[-1][1:], "--dry-run", "--offline", "--python", sys.executable],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    planned = set(re.findall(r"^ \+ ([A-Za-z0-9_.-]+)(?:==| @ )", output, re.MULTILINE))
    for name in present:
        assert name in planned, f"{dockerfile.name} would not install {name}"
    for name in absent:
        assert name not in planned, f"{dockerfile.name} would install {name}"
    assert not (tmp_path / "venv").exists(), "a dry run must not create the environment"


def test_uv_itself_is_installed_with_hashes() -> None:
    for dockerfile in DOCKERFILES:
        runs = [i.args for i in dockerfile_instructions(dockerfile) if i.keyword == "RUN"]
        assert any("--require-hashes" in r and "/tmp/uv.lock.txt" in r for r in runs)
