"""Child processes of the demo (the collector, Phoenix): started in their own session,
stopped with SIGTERM and a bounded wait, killed if they do not stop.

On Linux every child is started through a two-line launcher that sets
``PR_SET_PDEATHSIG`` before it ``exec``s the real program, so even if the demo itself
is killed with SIGKILL its children get SIGTERM and shut down: the demo never leaves a
process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ChildProcess", "tail"]

#: argv: [python, -c, _LAUNCHER, <demo pid>, program, args...].  PR_SET_PDEATHSIG is 1.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ('' if it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ChildProcess:
    """One child process in its own session, with its output in ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        program = argv[0]
        if sys.platform.startswith("linux"):
            argv = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *argv]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            try:
                self._popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(env) if env is not None else None,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise RuntimeError(f"cannot start {name} ({program}): {exc}") from exc

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def running(self) -> bool:
        return self._popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child's whole process group (it is the group leader)."""
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group and reap the child (blocks briefly)."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=10)

    async def stop(self, grace: float) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL.  Returns the exit code
        (negative: killed by that signal).  Cancelling the wait kills the child."""
        if self._popen.poll() is not None:
            return self._popen.returncode
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        try:
            # A child exiting has no awaitable event here: poll.
            while self._popen.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            if self._popen.poll() is None:
                self.kill()
        return self._popen.returncode

    def stop_now(self, timeout: float = 10.0) -> None:
        """Synchronous :meth:`stop`, for the last-resort cleanup outside the event loop."""
        if self._popen.poll() is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            self._popen.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            self.kill()
