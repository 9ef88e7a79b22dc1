"""A real Arize Phoenix server on loopback, for tests (the session fixture ``phoenix`` of
``tests/conftest.py``: one server per test session, i.e. per pytest-xdist worker).

Phoenix lives in its own venv (``RAGTRACE_PHOENIX_PYTHON``, default
``<repo>/.venv-phoenix/bin/python``).  The server runs as
``python -m phoenix.server.main serve`` with free ports and a temporary working dir
(SQLite inside); its environment is the demo's (:func:`examples.demo.phoenix.phoenix_env`):
telemetry and every outbound feature off, bound to 127.0.0.1.

Any test can ask for it (and must be marked ``services``)::

    def test_x(phoenix: PhoenixServer) -> None:
        ... export OTLP to phoenix.otlp_http_url or phoenix.otlp_grpc_endpoint ...
        spans = phoenix.wait_for_spans("default", trace_ids, count=3)

Spans are read back through Phoenix's REST API (``GET /v1/projects/{project}/spans``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.demo.phoenix import PhoenixError, phoenix_env
from examples.demo.phoenix import phoenix_python as _phoenix_python
from tests.fakes.markers import require_services_marker
from tests.fakes.ports import free_port

__all__ = ["PhoenixServer", "phoenix_python", "running_phoenix", "start_phoenix"]

_ROOT = Path(__file__).resolve().parents[2]
_STARTUP_TIMEOUT = 180.0


def phoenix_python() -> str:
    try:
        return str(_phoenix_python(_ROOT))
    except PhoenixError as exc:
        raise RuntimeError(f"{exc} (or set RAGTRACE_PHOENIX_PYTHON)") from None


@dataclass
class PhoenixServer:
    port: int
    grpc_port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_http_url(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as resp:
            return json.loads(resp.read())

    def graphql(self, query: str, variables: dict[str, Any]) -> Any:
        """The ``data`` of a GraphQL query (what the REST API does not expose, such as
        document annotations); AssertionError on GraphQL errors."""
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer = json.loads(resp.read())
        assert not answer.get("errors"), answer["errors"]
        return answer["data"]

    def spans(self, project: str, trace_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Every span of ``project`` (optionally only these trace ids), all pages."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params = [("limit", "1000")]
            params += [("trace_id", t) for t in trace_ids or []]
            if cursor:
                params.append(("cursor", cursor))
            try:
                page = self.get(f"/v1/projects/{urllib.parse.quote(project)}/spans", params)
            except urllib.error.HTTPError as err:
                if err.code == 404:  # the project does not exist (yet)
                    return []
                raise
            out += page.get("data", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def wait_for_spans(
        self, project: str, trace_ids: list[str], count: int, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Poll until ``count`` spans of ``trace_ids`` are stored; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        spans: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            spans = self.spans(project, trace_ids)
            if len(spans) >= count:
                return spans
            time.sleep(0.25)
        raise AssertionError(f"Phoenix has {len(spans)} of {count} spans after {timeout}s")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


_START_ATTEMPTS = 3


def start_phoenix(working_dir: Path) -> PhoenixServer:
    """Start Phoenix and wait until it answers; the caller must stop ``process``.

    A Phoenix that exits during start-up (a port taken before it bound it) is started
    again on other ports."""
    require_services_marker("Arize Phoenix")
    python = phoenix_python()
    errors: list[str] = []
    for attempt in range(_START_ATTEMPTS):
        try:
            return _start_once(python, working_dir / f"attempt-{attempt}")
        except _ExitedEarly as exc:
            errors.append(str(exc))
    raise RuntimeError("\n---\n".join(errors))


class _ExitedEarly(RuntimeError):
    pass


def _start_once(python: str, working_dir: Path) -> PhoenixServer:
    working_dir.mkdir(parents=True, exist_ok=True)
    port, grpc_port = free_port(), free_port()
    env = phoenix_env(working_dir, port, grpc_port)
    log_path = working_dir / "phoenix.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [python, "-m", "phoenix.server.main", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=working_dir,
            start_new_session=True,
        )
    server = PhoenixServer(port, grpc_port, process, log_path)
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise _ExitedEarly(f"Phoenix exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/healthz", timeout=2) as resp:
                if resp.status == 200 and _grpc_listening(grpc_port):
                    return server
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            stop_phoenix(server)
            raise RuntimeError(f"Phoenix not ready in {_STARTUP_TIMEOUT}s:\n{server.log_tail()}")
        time.sleep(0.25)


def _grpc_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop_phoenix(server: PhoenixServer) -> None:
    if server.process.poll() is None:
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
            server.process.wait(timeout=20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(server.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.process.wait(timeout=10)


@contextlib.contextmanager
def running_phoenix() -> Iterator[PhoenixServer]:
    """A Phoenix server in a temporary working directory, stopped on exit (the
    session fixture ``phoenix`` of ``tests/conftest.py``)."""
    with tempfile.TemporaryDirectory(prefix="ragtrace-phoenix-") as directory:
        server = start_phoenix(Path(directory))
        try:
            yield server
        finally:
            stop_phoenix(server)
