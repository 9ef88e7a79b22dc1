"""A real ``redis-server`` on a free loopback port, for tests.

Use the ``redis_server`` fixture of ``tests/conftest.py`` (session scope: one server for
the test session, i.e. one per pytest-xdist worker; give each test its own key prefix or
flush it), or :class:`RedisServer` directly.

The server runs from a temporary directory with persistence off
(``--save '' --appendonly no``), listens on 127.0.0.1 only, and is killed at teardown.
``redis-server`` comes from Debian (``scripts/setup-services.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fakes.markers import require_services_marker
from tests.fakes.ports import free_port

__all__ = ["RedisServer"]

_START_TIMEOUT = 20.0
_STOP_TIMEOUT = 10.0
_ATTEMPTS = 3


def _die_with_parent() -> None:
    """In the child before exec: on Linux, get SIGTERM when the test process dies, so a
    crashed test run leaves no server behind."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _ping(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process; ``url`` is ``redis://127.0.0.1:<port>/0``."""

    def __init__(self, executable: str | None = None) -> None:
        found = executable or shutil.which("redis-server")
        if found is None:
            raise RuntimeError(
                "redis-server not found on PATH; run scripts/setup-services.sh to install it"
            )
        self.executable = found
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "redis.log"

    def start(self) -> None:
        require_services_marker("redis-server")
        self._dir = tempfile.TemporaryDirectory(prefix="ragtrace-redis-")
        errors: list[str] = []
        # The port is free when probed but may be taken before redis binds it: retry.
        for _ in range(_ATTEMPTS):
            self.port = free_port()
            if self._launch():
                return
            errors.append(self._read_log())
            self._kill()
        self.stop()
        raise RuntimeError(
            f"redis-server did not start after {_ATTEMPTS} attempts:\n" + "\n".join(errors)
        )

    def _launch(self) -> bool:
        """Start redis-server on ``self.port``; True once it answers PING."""
        self._proc = proc = self._spawn()
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if _ping(self.port, timeout=1.0):
                return True
            time.sleep(0.02)
        return False

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self._dir is not None
        args = [self.executable, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir.name]
        args += ["--logfile", str(self.log_path), "--daemonize", "no"]
        args += ["--protected-mode", "yes"]
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def _read_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return "(no log)"

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(_STOP_TIMEOUT)

    def crash(self) -> None:
        """SIGKILL the server (its data is gone: it never saves); the port stays ours
        for :meth:`restart`."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(_STOP_TIMEOUT)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (hung)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same port after :meth:`crash`."""
        assert self._dir is not None, "never started"
        if self._launch():
            return
        raise RuntimeError(f"redis-server did not restart:\n{self._read_log()}")

    def stop(self) -> None:
        self._kill()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
