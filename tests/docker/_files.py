"""Reading the docker/ files: compose services, Dockerfile instructions, .dockerignore."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
SCALE_OUT = DOCKER / "scale-out"
SCALE_OUT_COMPOSE = SCALE_OUT / "docker-compose.yml"
COMPOSE_FILES = (COMPOSE, SCALE_OUT_COMPOSE)
DOCKERFILES = (DOCKER / "collector.Dockerfile", DOCKER / "app.Dockerfile")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def services(compose: Path) -> dict[str, dict[str, Any]]:
    data = load_yaml(compose)
    assert isinstance(data, dict), f"{compose}: not a mapping"
    found = data.get("services")
    assert isinstance(found, dict), f"{compose}: no services"
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*)|:?\?[^}]*)?\}")


def compose_default(value: str) -> str:
    """``${VAR:-default}`` -> ``default`` (what compose substitutes with VAR unset);
    ``${VAR:?message}`` (required) -> ``""``."""
    return _COMPOSE_VAR.sub(lambda m: m.group(2) or "", value)


@dataclass(frozen=True)
class Mount:
    host: Path
    container: str
    read_only: bool


def bind_mounts(compose: Path, service: dict[str, Any]) -> list[Mount]:
    mounts: list[Mount] = []
    for volume in service.get("volumes") or []:
        assert isinstance(volume, str), f"{compose}: use the short volume syntax"
        host, container, *mode = volume.split(":")
        if host.startswith((".", "/")):
            mounts.append(Mount((compose.parent / host).resolve(), container, mode == ["ro"]))
    return mounts


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port (``[ip:]host:container`` or ``container``)."""
    return {container: host for _, host, container in port_bindings(service)}


def port_bindings(service: dict[str, Any]) -> list[tuple[str | None, int, int]]:
    """``(host ip or None for every interface, host port, container port)`` per entry."""
    out: list[tuple[str | None, int, int]] = []
    for entry in service.get("ports") or []:
        rest, _, container = str(entry).rpartition(":")
        ip, _, host = rest.rpartition(":")
        out.append((ip or None, int(host or container), int(container)))
    return out


def host_port(address: str) -> tuple[str, int]:
    """``http://collector:4318`` or ``collector:4318`` -> ``("collector", 4318)``."""
    address = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile_instructions(path: Path) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, f"{path}: dangling line continuation"
    out = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def copy_sources(instruction: Instruction) -> list[str]:
    """Host sources of a COPY (none for ``COPY --from=``)."""
    words = shlex.split(instruction.args)
    if any(w.startswith("--from") for w in words):
        return []
    words = [w for w in words if not w.startswith("--")]
    return words[:-1]


def dockerignore_allows(ignore_file: Path, path: str) -> bool:
    """Whether ``path`` (relative to the context) survives the ignore file.

    Docker semantics: patterns are matched in order, the last match wins, a ``!``
    pattern re-includes, and a pattern matching a parent directory matches its files.
    """
    allowed = True
    for raw in ignore_file.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        parts = path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(_match(pattern, c) for c in candidates):
            allowed = negate
    return allowed


def _match(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(
            fnmatch.fnmatchcase("/".join(path.split("/")[i:]), tail)
            for i in range(len(path.split("/")))
        )
    if pattern.count("/") != path.count("/"):
        return False
    return fnmatch.fnmatchcase(path, pattern)
