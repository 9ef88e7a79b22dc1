"""serve for people: a port in use names its key and the fix; endpoint flags and
--set; console logs on a terminal, JSON otherwise; help texts."""

from __future__ import annotations

import errno
import io
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import structlog

from ragtrace_collector.cli import main
from ragtrace_collector.component.logs import configure_logging, get_logger
from ragtrace_collector.service.ports import Endpoint, bind_problem
from tests.fakes.harness import serve_until_exit
from tests.fakes.ports import free_port

COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")

KEYS = {
    "admin": ("admin.endpoint", "--admin-endpoint"),
    "grpc": ("receivers.grpc.endpoint", "--grpc-endpoint"),
    "http": ("receivers.http.endpoint", "--http-endpoint"),
}


@pytest.mark.parametrize("taken", ["admin", "grpc", "http"])
def test_a_port_in_use_names_the_key_and_the_fix(tmp_path: Path, taken: str) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        endpoints = {name: "127.0.0.1:0" for name in KEYS}
        endpoints[taken] = f"127.0.0.1:{port}"
        path = tmp_path / "c.yaml"
        path.write_text(
            f"receivers:\n  grpc: {{endpoint: '{endpoints['grpc']}'}}\n"
            f"  http: {{endpoint: '{endpoints['http']}'}}\n"
            f"admin: {{endpoint: '{endpoints['admin']}'}}\n"
        )
        done = serve_until_exit(path, tmp_path)
    key, flag = KEYS[taken]
    assert done.returncode == 1, done.stderr
    assert (
        f"ragtrace-collector: cannot start:\n  - {key}: port {port} (127.0.0.1:{port}) is "
        "already in use by another process" in done.stderr
    )
    assert f"set {key} in the config" in done.stderr
    assert f"pass {flag} HOST:PORT" in done.stderr
    assert "OSError" not in done.stderr
    assert "add_port" not in done.stderr  # gRPC's C++ log line never shows
    assert "Errno" not in done.stderr
    assert "listening" not in done.stderr  # nothing was bound before the check


def test_bind_failures_are_worded_for_people() -> None:
    where = Endpoint("receivers.http.endpoint", "--http-endpoint", "10.9.8.7:80")
    in_use = bind_problem(where, OSError(errno.EADDRINUSE, "Address already in use"))
    assert in_use.startswith("receivers.http.endpoint: port 80 (10.9.8.7:80) is already in use")
    denied = bind_problem(where, PermissionError(errno.EACCES, "Permission denied"))
    assert "ports below 1024 need privileges" in denied
    foreign = bind_problem(where, OSError(errno.EADDRNOTAVAIL, "Cannot assign"))
    assert "'10.9.8.7' is not an address of this machine" in foreign
    for text in (in_use, denied, foreign):
        assert "--http-endpoint HOST:PORT" in text


def test_endpoint_flags_and_set_override_the_file(tmp_path: Path) -> None:
    # The file asks for ports that are in use; the flags move every listener.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        path = tmp_path / "c.yaml"
        path.write_text(
            f"receivers:\n  grpc: {{endpoint: '127.0.0.1:{busy}'}}\n"
            f"  http: {{endpoint: '127.0.0.1:{busy}'}}\n"
            f"admin: {{endpoint: '127.0.0.1:{busy}'}}\n"
        )
        ports = {name: free_port() for name in KEYS}
        argv = [str(COLLECTOR), "serve", "--config", str(path)]
        for name, (_key, flag) in KEYS.items():
            argv += [flag, f"127.0.0.1:{ports[name]}"]
        argv += ["--set", "sampling.rate=1", "--set", "logging.format=json"]
        proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if '"collector_ready"' in line or '"startup_failed"' in line:
                    break
            events = [json.loads(line) for line in seen if line.startswith("{")]
            assert events[-1]["event"] == "collector_ready", "".join(seen)
            listening = {
                e.get("receiver", "admin"): e["endpoint"] for e in events if "endpoint" in e
            }
            assert listening == {
                "admin": f"127.0.0.1:{ports['admin']}",
                "otlp_grpc": f"127.0.0.1:{ports['grpc']}",
                "otlp_http": f"127.0.0.1:{ports['http']}",
            }
            configured = next(e for e in events if e["event"] == "evaluation_configured")
            assert configured["sample_rate"] == 1.0
            ready = urllib.request.urlopen(f"http://127.0.0.1:{ports['admin']}/readyz", timeout=10)
            assert ready.status == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_set_rejects_a_bad_key_or_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--set", "sampling.rte=1"]) == 2
    assert "sampling.rte: unknown key (did you mean 'rate'?)" in capsys.readouterr().err
    path = tmp_path / "c.yaml"
    path.write_text("logging: {level: info}\n")
    assert main(["serve", "--config", str(path), "--set", "logging.level.x=1"]) == 2
    assert "logging.level is not a section" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--set", "no-equals-sign"])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("fmt", "tty", "json_lines"),
    [("auto", True, False), ("auto", False, True), ("json", True, True), ("console", False, False)],
)
def test_console_logs_on_a_terminal_json_otherwise(fmt: str, tty: bool, json_lines: bool) -> None:
    out: io.StringIO = _Terminal() if tty else io.StringIO()
    try:
        configure_logging("info", fmt, stream=out)
        get_logger("service").info("collector_ready", endpoint="127.0.0.1:4318")
    finally:
        structlog.reset_defaults()
    line = out.getvalue().strip()
    assert "collector_ready" in line
    if json_lines:
        assert json.loads(line)["event"] == "collector_ready"
    else:
        assert not line.startswith("{")
        assert "endpoint=127.0.0.1:4318" in line


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["serve", "--help"], ["Run the collector", "--http-endpoint HOST:PORT", "exit codes"]),
        (["check-config", "--help"], ["Validate a collector.yaml", "exit codes: 0 valid"]),
    ],
)
def test_help_describes_the_command(
    argv: list[str], wanted: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in wanted:
        assert text in out
