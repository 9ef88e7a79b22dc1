"""collector.yaml: validation that names the key, env interpolation, CLI exit codes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from ragtrace_collector.cli import main
from ragtrace_collector.config import ConfigError, load_config, parse_config
from ragtrace_collector.exporters.config import (
    FileExporterConfig,
    OtlpGrpcExporterConfig,
    OtlpHttpExporterConfig,
)
from ragtrace_collector.otlp.codec import decode_json_request, iter_spans
from tests.fakes.harness import emit_rag_request, make_app, span_key
from tests.fakes.ports import free_port, port_is_free

COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")
ROOT = Path(__file__).resolve().parents[2]


def _problems(data: object, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data, env=env or {})
    return err.value.problems


def test_defaults_need_no_file() -> None:
    config = load_config(None)
    assert config.receivers.grpc.endpoint == "127.0.0.1:4317"
    assert config.receivers.http.endpoint == "127.0.0.1:4318"
    assert config.admin.endpoint == "127.0.0.1:8888"
    assert config.assembly.decision_wait == 2.0
    (exporter,) = config.exporters.values()
    assert isinstance(exporter, FileExporterConfig)
    assert exporter.path == Path("ragtrace-spans.jsonl")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"recievers": {}}, "recievers: unknown key (did you mean 'receivers'?)"),
        (
            {"assembly": {"decision_wiat": 1}},
            "assembly.decision_wiat: unknown key (did you mean 'decision_wait'?)",
        ),
        (
            {
                "exporters": {
                    "b": {"type": "otlp_http", "endpoint": "http://x:1", "compresion": "gzip"}
                }
            },
            "exporters.b.compresion: unknown key (did you mean 'compression'?)",
        ),
        (
            {"exporters": {"b": {"type": "file", "path": "x", "queue": {"on_ful": "x"}}}},
            "exporters.b.queue.on_ful: unknown key (did you mean 'on_full'?)",
        ),
        (
            {"exporters": {"b": {"type": "otlp_htp"}}},
            "exporters.b.type: unknown value 'otlp_htp' (did you mean 'otlp_http'?)",
        ),
        ({"exporters": {"b": {"endpoint": "x"}}}, "exporters.b.type: required key is missing"),
        (
            {"exporters": {"b": {"type": "otlp_grpc"}}},
            "exporters.b.endpoint: required key is missing",
        ),
        (
            {"exporters": {"b": {"type": "otlp_http", "endpoint": "ftp://x"}}},
            "exporters.b.endpoint: 'ftp://x' is not an http:// or https:// URL",
        ),
        ({"exporters": {}}, "exporters: at least one exporter is required"),
        (
            {"receivers": {"grpc": {"endpoint": "localhost"}}},
            "receivers.grpc.endpoint: 'localhost' is not host:port",
        ),
        (
            {"receivers": {"http": {"endpoint": "h:70000"}}},
            "receivers.http.endpoint: 'h:70000': port 70000 is out of range",
        ),
        (
            {"assembly": {"decision_wait": "soon"}},
            "assembly.decision_wait: 'soon' is not a duration",
        ),
        (
            {"assembly": {"decision_wait": "5s", "max_trace_wait": "1s"}},
            "assembly: decision_wait (5.0s) must not exceed max_trace_wait (1.0s)",
        ),
        (
            {"assembly": {"max_buffered_spans": 0}},
            "assembly.max_buffered_spans: Input should be greater than or equal to 1",
        ),
        (
            {"receivers": {"http": {"max_request_bytes": "lots"}}},
            "receivers.http.max_request_bytes: 'lots' is not a size",
        ),
        (
            {"receivers": {"http": {"tls": {"cert_file": "/nope.pem", "key_file": "/nope.key"}}}},
            "receivers.http.tls.cert_file: file not found: /nope.pem",
        ),
        (
            {"receivers": {"auth": {"bearer_tokens": [""]}}},
            "receivers.auth.bearer_tokens: a bearer token must not be empty",
        ),
        ([1, 2], "(top level): expected a mapping of sections, got list"),
    ],
)
def test_errors_name_the_key_and_the_problem(data: object, expected: str) -> None:
    problems = _problems(data)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems({"assembly": {"decision_wait": "x", "nope": 1}, "admin": {"endpoint": 5}})
    assert len(problems) == 3


def test_values_and_units() -> None:
    config = parse_config(
        {
            "assembly": {"decision_wait": "250ms", "max_trace_wait": "2m"},
            "receivers": {
                "http": {"max_request_bytes": "4MiB"},
                "grpc": {"max_request_bytes": "1MB"},
            },
            "exporters": {
                "g": {"type": "otlp_grpc", "endpoint": "https://backend:4317"},
                "h": {"type": "otlp_http", "endpoint": "http://phoenix:6006"},
                "p": {"type": "otlp_http", "endpoint": "http://x:1/custom/path"},
            },
        }
    )
    assert config.assembly.decision_wait == 0.25
    assert config.assembly.max_trace_wait == 120
    assert config.receivers.http.max_request_bytes == 4 * 1024 * 1024
    assert config.receivers.grpc.max_request_bytes == 1_000_000
    g, h, p = config.exporters["g"], config.exporters["h"], config.exporters["p"]
    assert isinstance(g, OtlpGrpcExporterConfig)
    assert g.use_tls()
    assert g.target() == "backend:4317"
    assert isinstance(h, OtlpHttpExporterConfig)
    assert h.traces_url() == "http://phoenix:6006/v1/traces"
    assert isinstance(p, OtlpHttpExporterConfig)
    assert p.traces_url() == "http://x:1/custom/path"


def test_env_interpolation() -> None:
    env = {"BACKEND": "collector.internal:4317", "TOKEN": "abc123456", "EMPTY": ""}
    config = parse_config(
        {
            "receivers": {"auth": {"bearer_tokens": ["${TOKEN}", "x-${TOKEN}-y"]}},
            "assembly": {"decision_wait": "${WAIT:-1500ms}", "max_buffered_spans": "${BUF:-5000}"},
            "exporters": {
                "b": {
                    "type": "otlp_grpc",
                    "endpoint": "${BACKEND}",
                    "headers": {"x-note": "$${NOT_A_VAR} ${EMPTY:-fallback}"},
                }
            },
        },
        env=env,
    )
    tokens = [t.get_secret_value() for t in config.receivers.auth.bearer_tokens]
    assert tokens == ["abc123456", "x-abc123456-y"]
    assert config.assembly.decision_wait == 1.5
    assert config.assembly.max_buffered_spans == 5000
    exporter = config.exporters["b"]
    assert isinstance(exporter, OtlpGrpcExporterConfig)
    assert exporter.endpoint == "collector.internal:4317"
    assert exporter.headers == {"x-note": "${NOT_A_VAR} fallback"}
    assert "abc123456" in config.secrets()


def test_env_errors_name_the_key() -> None:
    problems = _problems({"exporters": {"b": {"type": "otlp_grpc", "endpoint": "${BACKEND_ADDR}"}}})
    assert problems == [
        "exporters.b.endpoint: environment variable BACKEND_ADDR is not set "
        "(write ${BACKEND_ADDR:-default} to give a default)"
    ]
    problems = _problems({"receivers": {"auth": {"bearer_tokens": ["${1BAD}"]}}})
    assert problems[0].startswith("receivers.auth.bearer_tokens[0]: malformed ${...} reference")


def test_yaml_syntax_error_has_a_position(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("assembly:\n  decision_wait: [1,\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "YAML syntax error at line" in err.value.problems[0]
    assert str(path) in err.value.render()


def test_check_config_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("exporters:\n  b:\n    type: otlp_http\n    endpoint: http://127.0.0.1:6006\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("exporters:\n  b:\n    type: otlp_http\n    endpont: http://127.0.0.1:6006\n")
    assert main(["check-config", str(good)]) == 0
    assert f"{good}: ok" in capsys.readouterr().out
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "exporters.b.endpont: unknown key (did you mean 'endpoint'?)" in err
    assert "exporters.b.endpoint: required key is missing" in err
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_check_config_command_line_and_the_shipped_docker_config(tmp_path: Path) -> None:
    docker = ROOT / "docker" / "collector.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGTRACE_")}
    # The reference file check-config reads (docker-compose mounts it in the container).
    golden = ROOT / "examples" / "support_bot" / "data" / "golden.jsonl"
    env["RAGTRACE_REFERENCE_FILE"] = str(golden)
    env["RAGTRACE_BEARER_TOKEN"] = "token-the-compose-file-requires"
    done = subprocess.run(
        [str(COLLECTOR), "check-config", str(docker)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_serve_with_a_bad_config_exits_non_zero_before_listening(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "c.yaml"
    path.write_text(
        f"receivers:\n  http:\n    endpoint: 127.0.0.1:{port}\nassembly:\n  decision_wiat: 2s\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [str(COLLECTOR), "serve", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "assembly.decision_wiat: unknown key (did you mean 'decision_wait'?)" in done.stderr
    assert "listening" not in done.stderr
    assert time.monotonic() - started < 30
    assert port_is_free(port)


def test_serve_with_no_config_at_all_works_with_default_otel_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default ports, default exporter (a file), the OTel exporter's default endpoint."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    proc = subprocess.Popen(
        [str(COLLECTOR), "serve"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if '"collector_ready"' in line:
                break
        assert any('"collector_ready"' in line for line in seen), "".join(seen)  # port in use?
        app = make_app(HttpSpanExporter())  # endpoint from OTel defaults: localhost:4318
        for n in range(5):
            emit_rag_request(app.provider, n)
        app.shutdown()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = (tmp_path / "ragtrace-spans.jsonl").read_bytes().splitlines()
    emitted = sorted(span_key(s) for s in app.emitted())
    wanted = set(emitted)
    written = [
        (s.trace_id.hex(), s.span_id.hex())
        for line in lines
        for s in iter_spans(decode_json_request(line))
    ]
    # Every span exactly once (a default stage may add spans of its own, e.g. carriers).
    assert sorted(k for k in written if k in wanted) == emitted


@pytest.mark.parametrize("taken", ["grpc", "http"])
def test_serve_exits_1_when_a_port_is_taken(tmp_path: Path, taken: str) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        receivers = {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"}
        receivers[taken] = f"127.0.0.1:{port}"
        path = tmp_path / "c.yaml"
        path.write_text(
            f"receivers:\n  grpc: {{endpoint: '{receivers['grpc']}'}}\n"
            f"  http: {{endpoint: '{receivers['http']}'}}\n"
            "admin: {endpoint: '127.0.0.1:0'}\n"
        )
        done = subprocess.run(
            [str(COLLECTOR), "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 1
    assert '"startup_failed"' in done.stderr
    assert str(port) in done.stderr


# ------------------------------------------------- "did you mean" at every depth
_RULE = {"name": "r", "metric": "contextual_recall", "window": "5m", "baseline": 0.8, "drop": 0.1}

#: (a config with one misspelt key, the exact line that names it).
MISSPELT_KEYS = [
    pytest.param({"assembyl": {}}, "assembyl: unknown key (did you mean 'assembly'?)", id="top"),
    pytest.param(
        {"exporters": {"out": {"typ": "file", "path": "x.jsonl"}}},
        "exporters.out.typ: unknown key (did you mean 'type'?)",
        id="exporter-type",
    ),
    pytest.param(
        {"exporters": {"out": {"type": "file", "pth": "x.jsonl"}}},
        "exporters.out.pth: unknown key (did you mean 'path'?)",
        id="exporter-key",
    ),
    pytest.param(
        {"exporters": {"out": {"type": "fiel", "pth": "x.jsonl"}}},
        "exporters.out.pth: unknown key (did you mean 'path'?)",
        id="exporter-key-unknown-type",
    ),
    pytest.param(
        {"exporters": {"o": {"type": "otlp_http", "endpoint": "http://a", "retry": {"jiter": 1}}}},
        "exporters.o.retry.jiter: unknown key (did you mean 'jitter'?)",
        id="exporter-retry",
    ),
    pytest.param(
        {"receivers": {"http": {"tls": {"cert_fil": "x"}}}},
        "receivers.http.tls.cert_fil: unknown key (did you mean 'cert_file'?)",
        id="receiver-tls",
    ),
    pytest.param(
        {"alerts": {"rules": [{**_RULE, "windw": "5m"}]}},
        "alerts.rules[0].windw: unknown key (did you mean 'window'?)",
        id="alert-rule",
    ),
    pytest.param(
        {"alerts": [{**_RULE, "windw": "5m"}]},
        "alerts.rules[0].windw: unknown key (did you mean 'window'?)",
        id="alert-rule-bare-list",
    ),
    pytest.param(
        {"alerts": {"rules": [{**_RULE, "fro": "1m"}]}},
        "alerts.rules[0].fro: unknown key (did you mean 'for'?)",
        id="alert-rule-alias",
    ),
    pytest.param(
        {"alerts": {"rules": [{**_RULE, "baseline": {"kind": "fixed", "valeu": 0.8}}]}},
        "alerts.rules[0].baseline.valeu: unknown key (did you mean 'value'?)",
        id="alert-rule-baseline",
    ),
    pytest.param(
        {"alerts": {"rules": [{"metric": "m", "kind": "canary", "segment": "s", "candidat": "c"}]}},
        "alerts.rules[0].candidat: unknown key (did you mean 'candidate'?)",
        id="canary-rule",
    ),
    pytest.param(
        {"alerts": {"alertmanager": {"url": "http://x", "timout": 1}}},
        "alerts.alertmanager.timout: unknown key (did you mean 'timeout'?)",
        id="notifier",
    ),
    pytest.param(
        {"judge": {"modle": "offline"}},
        "judge.modle: unknown key (did you mean 'model'?)",
        id="judge",
    ),
    pytest.param(
        {"storage": {"directry": "wal"}},
        "storage.directry: unknown key (did you mean 'directory'?)",
        id="storage",
    ),
    pytest.param(
        {"cases": {"retrievers": [{"match": {"span_nme": "kb"}, "documents": "a"}]}},
        "cases.retrievers[0].match.span_nme: unknown key (did you mean 'span_name'?)",
        id="cases",
    ),
    pytest.param(
        {"metrics": {"faithfulness": {"treshold": 0.7}}},
        "metrics.faithfulness.treshold: unknown key (did you mean 'threshold'?)",
        id="metric-options",
    ),
]


@pytest.mark.parametrize(("data", "line"), MISSPELT_KEYS)
def test_a_misspelt_key_gets_did_you_mean_at_any_depth(data: object, line: str) -> None:
    assert line in _problems(data)


def test_a_missing_key_explained_by_a_typo_is_not_the_only_problem() -> None:
    problems = _problems({"exporters": {"out": {"typ": "file", "path": "x.jsonl"}}})
    assert problems == [
        "exporters.out.type: required key is missing "
        "(one of: 'otlp_http', 'otlp_grpc', 'file', 'phoenix')",
        "exporters.out.typ: unknown key (did you mean 'type'?)",
    ]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        *MISSPELT_KEYS,
        pytest.param(
            {"evaluation": {"metric_defaults": {"treshold": 0.7}}},
            "evaluation.metric_defaults.treshold: unknown key (did you mean 'threshold'?)",
            id="metric-defaults",
        ),
    ],
)
def test_check_config_prints_the_same_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, object], line: str
) -> None:
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["check-config", str(path)]) != 0
    assert f"  - {line}" in capsys.readouterr().err.splitlines()
