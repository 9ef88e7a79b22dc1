"""Arize Phoenix for ``--phoenix``: a real tracing UI on loopback that shows the scores.

Phoenix lives in its own venv (``.venv-phoenix``, installed by ``scripts/_env.sh``
``ensure_phoenix`` from ``tools/phoenix.lock.txt``); the demo finds its python in
``RAGTRACE_PHOENIX_PYTHON``.  It runs as ``python -m phoenix.server.main serve`` bound
to 127.0.0.1 on free ports, with its SQLite database in the demo's output directory,
telemetry and every outbound feature off.  The collector's ``type: phoenix`` exporter
sends the spans to it and posts the scores as Phoenix annotations; the demo reads the
spans and annotations back through Phoenix's REST API.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp

from examples.demo.processes import ChildProcess, tail
from ragtrace import semconv

__all__ = [
    "PHOENIX_PYTHON_ENV",
    "PhoenixError",
    "PhoenixProcess",
    "phoenix_env",
    "phoenix_python",
]

PHOENIX_PYTHON_ENV = "RAGTRACE_PHOENIX_PYTHON"
_STARTUP_TIMEOUT = 240.0
_EVAL_PREFIX = semconv.EVAL_PREFIX + "."
#: Span ids per annotation query (Phoenix caps the list).
_IDS_PER_QUERY = 100


class PhoenixError(RuntimeError):
    """Phoenix is not installed, or did not start."""


def phoenix_python(root: Path) -> Path:
    """Phoenix's python: ``RAGTRACE_PHOENIX_PYTHON``, else ``<root>/.venv-phoenix``."""
    configured = os.environ.get(PHOENIX_PYTHON_ENV, "").strip()
    python = Path(configured) if configured else root / ".venv-phoenix" / "bin" / "python"
    if not python.exists():
        raise PhoenixError(
            f"Phoenix is not installed ({python} not found); "
            "`bash scripts/demo.sh --phoenix` installs it into .venv-phoenix"
        )
    return python


def phoenix_env(working_dir: Path, port: int, grpc_port: int) -> dict[str, str]:
    """The environment of a Phoenix server on loopback: our ports and working dir,
    telemetry and every outbound feature off, no inherited ``PHOENIX_*``/``OTEL_*``."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))},
        "PHOENIX_WORKING_DIR": str(working_dir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "PHOENIX_ENABLE_MCP_SERVER": "false",
        "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true",
        "PHOENIX_AGENTS_DISABLE_BASH": "true",
        "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PhoenixProcess:
    """A Phoenix server; :meth:`start` waits until it answers."""

    def __init__(self, python: Path, working_dir: Path, project: str) -> None:
        self.python = python
        self.working_dir = working_dir
        self.project = project
        self.port = _free_port()
        self.grpc_port = _free_port()
        self.log_path = working_dir / "phoenix.log"
        self._process: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_http_url(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def project_url(self) -> str:
        return f"{self.url}/projects"

    def span_url(self, span_id: str) -> str:
        """The span's page in Phoenix's UI (Phoenix redirects to its trace view)."""
        return f"{self.url}/redirects/spans/{span_id}"

    async def count_annotations(self, span_ids: list[str]) -> int:
        """How many ragtrace span annotations Phoenix holds for ``span_ids``."""
        project = urllib.parse.quote(self.project)
        total = 0
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for start in range(0, len(span_ids), _IDS_PER_QUERY):
                params = [("span_ids", s) for s in span_ids[start : start + _IDS_PER_QUERY]]
                params += [("identifier", "ragtrace"), ("limit", "10000")]
                try:
                    async with session.get(
                        f"{self.url}/v1/projects/{project}/span_annotations", params=params
                    ) as resp:
                        if resp.status != 200:
                            continue
                        page = await resp.json()
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    continue
                data = page.get("data") if isinstance(page, dict) else None
                total += len(data) if isinstance(data, list) else 0
        return total

    @property
    def process(self) -> ChildProcess | None:
        return self._process

    def launch(self) -> None:
        """Start the server process (returns at once; see :meth:`wait_ready`)."""
        self.working_dir.mkdir(parents=True, exist_ok=True)
        env = phoenix_env(self.working_dir, self.port, self.grpc_port)
        self._process = ChildProcess(
            "phoenix",
            [str(self.python), "-m", "phoenix.server.main", "serve"],
            log_path=self.log_path,
            env=env,
            cwd=self.working_dir,
        )

    async def wait_ready(self) -> None:
        """Poll ``/healthz`` until Phoenix answers (it takes 10-30 s to start)."""
        if self._process is None:
            raise PhoenixError("Phoenix was not launched")
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                code = self._process.returncode
                if code is not None:
                    raise PhoenixError(f"Phoenix exited with {code}:\n{tail(self.log_path)}")
                try:
                    async with session.get(f"{self.url}/healthz") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise PhoenixError(
                        f"Phoenix was not ready after {_STARTUP_TIMEOUT:g}s:\n{tail(self.log_path)}"
                    )
                await asyncio.sleep(0.25)

    async def _spans(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        project = urllib.parse.quote(self.project)
        while True:
            params = [("limit", "1000")] + ([("cursor", cursor)] if cursor else [])
            async with session.get(
                f"{self.url}/v1/projects/{project}/spans", params=params
            ) as resp:
                if resp.status == 404:  # the project does not exist (yet)
                    return out
                resp.raise_for_status()
                page = await resp.json()
            out += page.get("data", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    async def wait_for_spans(self, expected: int, within: float = 60.0) -> tuple[int, int]:
        """Poll until Phoenix holds ``expected`` spans of the project (at most ``within`` s);
        returns (spans stored, spans carrying ``ragtrace.eval.*`` scores)."""
        deadline = time.monotonic() + within
        spans: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while True:
                try:
                    spans = await self._spans(session)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    spans = []
                if len(spans) >= expected or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
        scored = sum(
            1
            for span in spans
            if any(str(k).startswith(_EVAL_PREFIX) for k in (span.get("attributes") or {}))
        )
        return len(spans), scored

    async def stop(self, grace: float = 30.0) -> int | None:
        if self._process is None:
            return None
        return await self._process.stop(grace)
