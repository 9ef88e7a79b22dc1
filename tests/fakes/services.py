"""Real Prometheus and Alertmanager processes on loopback, for tests.

Not fakes in behaviour: these start the Debian ``prometheus`` and
``prometheus-alertmanager`` binaries (``scripts/setup-services.sh`` installs them) on
free ``127.0.0.1`` ports with their own temporary storage, wait until they are
ready, and stop them on exit.  Use the context managers::

    with alertmanager(tmp_path / "am", alertmanager_config(webhook_url=...)) as am:
        ...am.url...

    async with async_prometheus(tmp_path / "prom", scrape_targets=[...],
                                rule_files=[rules], alertmanager_url=am.url) as prom:
        ...

The async variants wait for readiness in a worker thread, so an in-test HTTP server
on the same event loop keeps answering scrapes meanwhile.  Processes are started
from the calling thread and, on Linux, are killed when that thread goes away
(``PR_SET_PDEATHSIG``), so a crashed test run leaves none behind.  Ports come from
:func:`tests.fakes.ports.free_port` (a range of this xdist worker's own); a start that
still loses its port is retried on another one.  Every start needs the running test to
be marked ``services``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.fakes.markers import require_services_marker
from tests.fakes.ports import free_port

__all__ = [
    "ALERTMANAGER",
    "AMTOOL",
    "PROMETHEUS",
    "PROMTOOL",
    "ServiceProcess",
    "alertmanager",
    "alertmanager_config",
    "async_alertmanager",
    "async_prometheus",
    "await_condition",
    "free_port",
    "get_json",
    "prometheus",
    "prometheus_config",
    "wait_condition",
]

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")

T = TypeVar("T")

_START_ATTEMPTS = 3


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET a loopback URL and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def wait_condition(
    probe: Callable[[], T | None], *, within: float, interval: float = 0.2, what: str = ""
) -> T:
    """Poll ``probe`` until it returns something other than None, for at most ``within``
    seconds (then TimeoutError)."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {within:g}s waiting for {what or probe!r}")
        time.sleep(interval)


async def await_condition(
    probe: Callable[[], T | None], *, within: float, interval: float = 0.2, what: str = ""
) -> T:
    """Like :func:`wait_condition`, on the event loop (``probe`` runs in a thread)."""
    deadline = time.monotonic() + within
    while True:
        value = await asyncio.to_thread(probe)
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {within:g}s waiting for {what or probe!r}")
        await asyncio.sleep(interval)


@dataclass
class ServiceProcess:
    """A running service binary."""

    name: str
    port: int
    workdir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_path: str
    _log_file: Any = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def wait_ready(self, timeout: float) -> bool:
        """True once ready; False if the process died or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.is_ready():
                return True
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _spawn(name: str, workdir: Path, argv: list[str], port: int, ready_path: str) -> ServiceProcess:
    require_services_marker(name)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )
    return ServiceProcess(name, port, workdir, process, log_path, ready_path, log_file)


def _failure(svc: ServiceProcess, startup_s: float) -> str:
    state = "exited" if svc.process.poll() is not None else f"not ready after {startup_s:g}s"
    return f"{svc.name} {state}; log tail:\n{svc.log_tail()}"


Launcher = Callable[[int], tuple[list[str], str]]


def _start(name: str, workdir: Path, launcher: Launcher, startup_s: float) -> ServiceProcess:
    errors: list[str] = []
    for _ in range(_START_ATTEMPTS):  # a free port can be taken before the child binds it
        port = free_port()
        argv, ready_path = launcher(port)
        svc = _spawn(name, workdir, argv, port, ready_path)
        if svc.wait_ready(startup_s):
            return svc
        errors.append(_failure(svc, startup_s))
        svc.stop()
    raise RuntimeError("\n---\n".join(errors))


async def _astart(name: str, workdir: Path, launcher: Launcher, startup_s: float) -> ServiceProcess:
    errors: list[str] = []
    for _ in range(_START_ATTEMPTS):
        port = free_port()
        argv, ready_path = launcher(port)
        svc = _spawn(name, workdir, argv, port, ready_path)
        if await asyncio.to_thread(svc.wait_ready, startup_s):
            return svc
        errors.append(_failure(svc, startup_s))
        await asyncio.to_thread(svc.stop)
    raise RuntimeError("\n---\n".join(errors))


# ---------------------------------------------------------------- Alertmanager
def alertmanager_config(
    webhook_url: str | None = None,
    *,
    group_wait: str = "0s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
) -> str:
    """A minimal Alertmanager config; with ``webhook_url``, every notification
    (firing and resolved) is posted there, grouped by alertname, rule, service, metric."""
    receiver: dict[str, Any] = {"name": "test"}
    if webhook_url is not None:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {
            "receiver": "test",
            "group_by": ["alertname", "rule", "service", "metric"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [receiver],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _alertmanager_launcher(workdir: Path, config: str) -> Launcher:
    if ALERTMANAGER is None:
        raise RuntimeError("prometheus-alertmanager is not installed (scripts/setup-services.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(config, encoding="utf-8")
    binary = ALERTMANAGER

    def launch(port: int) -> tuple[list[str], str]:
        return [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no HA gossip port
            "--log.level=debug",
        ], "/-/ready"

    return launch


@contextlib.contextmanager
def alertmanager(
    workdir: Path, config: str | None = None, *, startup_s: float = 30.0
) -> Iterator[ServiceProcess]:
    launcher = _alertmanager_launcher(workdir, config or alertmanager_config())
    svc = _start("alertmanager", workdir, launcher, startup_s)
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.asynccontextmanager
async def async_alertmanager(
    workdir: Path, config: str | None = None, *, startup_s: float = 30.0
) -> AsyncIterator[ServiceProcess]:
    launcher = _alertmanager_launcher(workdir, config or alertmanager_config())
    svc = await _astart("alertmanager", workdir, launcher, startup_s)
    try:
        yield svc
    finally:
        await asyncio.to_thread(svc.stop)


# ------------------------------------------------------------------ Prometheus
def prometheus_config(
    *,
    scrape_targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    alertmanager_address: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    job: str = "ragtrace-collector",
) -> str:
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(scrape_targets)}]}
        ],
    }
    if alertmanager_address is not None:
        config["alerting"] = {
            "alertmanagers": [
                {"api_version": "v2", "static_configs": [{"targets": [alertmanager_address]}]}
            ]
        }
    return yaml.safe_dump(config, sort_keys=False)


def _prometheus_launcher(workdir: Path, config: str) -> Launcher:
    if PROMETHEUS is None:
        raise RuntimeError("prometheus is not installed (scripts/setup-services.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config, encoding="utf-8")
    binary = PROMETHEUS

    def launch(port: int) -> tuple[list[str], str]:
        return [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            # Resend firing alerts to Alertmanager every second (default 1m).
            "--rules.alert.resend-delay=1s",
            "--log.level=debug",
        ], "/-/ready"

    return launch


@contextlib.contextmanager
def prometheus(workdir: Path, config: str, *, startup_s: float = 30.0) -> Iterator[ServiceProcess]:
    svc = _start("prometheus", workdir, _prometheus_launcher(workdir, config), startup_s)
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.asynccontextmanager
async def async_prometheus(
    workdir: Path, config: str, *, startup_s: float = 30.0
) -> AsyncIterator[ServiceProcess]:
    svc = await _astart("prometheus", workdir, _prometheus_launcher(workdir, config), startup_s)
    try:
        yield svc
    finally:
        await asyncio.to_thread(svc.stop)
