"""Structured JSON logs never carry tokens or API keys."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from ragtrace_collector.component.logs import (
    REDACTED,
    THIRD_PARTY_LOGGERS,
    Redactor,
    configure_logging,
    get_logger,
    url_secrets,
)
from tests.fakes.harness import passthrough_sections
from tests.fakes.otlp_data import make_request, rag_trace

TOKEN = "tok-9f8e7d6c5b4a"
API_KEY = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"


def test_redactor_removes_secret_fields_bearer_values_and_known_secrets() -> None:
    redact = Redactor([TOKEN, "hdr-secret-value"])
    event: dict[str, Any] = {
        "event": f"export failed for {TOKEN}",
        "authorization": "Bearer abc",
        "Api-Key": "whatever",
        "x_api_key": "whatever",
        "password": "hunter2",
        "headers": {
            "Authorization": f"Bearer {TOKEN}",
            "X-Tenant": "acme",
            "X-Custom": "hdr-secret-value",
        },
        "detail": "server said: Bearer eyJhbGciOi.payload.sig rejected",
        "basic": "Basic dXNlcjpwYXNz",
        "listed": [f"token={TOKEN}", API_KEY, ("Bearer zzz",)],
        "error": ValueError(f"bad key {API_KEY}"),
        "count": 3,
        "tokens_used": 12,
        "prompt_tokens": 120,
    }
    out = redact(None, "info", event)
    text = json.dumps(out, default=str)
    for secret in (
        TOKEN,
        API_KEY,
        "abc",
        "hunter2",
        "eyJhbGciOi",
        "dXNlcjpwYXNz",
        "zzz",
        "hdr-secret-value",
    ):
        assert secret not in text, secret
    assert out["authorization"] == REDACTED
    assert out["password"] == REDACTED
    assert out["Api-Key"] == REDACTED
    assert out["x_api_key"] == REDACTED
    assert out["headers"]["Authorization"] == REDACTED
    assert out["headers"]["X-Tenant"] == "acme"
    assert out["detail"] == f"server said: Bearer {REDACTED} rejected"
    assert out["count"] == 3
    assert out["tokens_used"] == 12  # a number of tokens is not a token
    assert out["prompt_tokens"] == 120


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    root = logging.getLogger()
    level = root.level
    stream = io.StringIO()
    try:
        yield stream
    finally:
        structlog.configure(**saved)
        for handler in [h for h in root.handlers if getattr(h, "_ragtrace", False)]:
            root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "cannot reach https://ingest:Pa55word@otlp.example.com/v1/traces: refused",
            f"cannot reach https://{REDACTED}@otlp.example.com/v1/traces: refused",
        ),
        ("redis://:s3cr3t@redis:6379/0 down", f"redis://{REDACTED}@redis:6379/0 down"),
        ("rediss://tok3n12@cache/1", f"rediss://{REDACTED}@cache/1"),
        (
            "POST http://h/hook?api_key=K1&x=1&Token=T2;sig=S3#frag",
            f"POST http://h/hook?api_key={REDACTED}&x=1&Token={REDACTED};sig={REDACTED}#frag",
        ),
        (
            "GET /x?X-Amz-Signature=abc&password=p&client_secret=c&page=2",
            f"GET /x?X-Amz-Signature={REDACTED}&password={REDACTED}"
            f"&client_secret={REDACTED}&page=2",
        ),
        ("plain text, a=b and key words", "plain text, a=b and key words"),
        ("https://example.com/path?q=1", "https://example.com/path?q=1"),
    ],
)
def test_urls_in_any_string_lose_their_credentials(text: str, expected: str) -> None:
    assert Redactor().scrub(text) == expected
    # In an exception and nested in a structure too.
    assert Redactor().scrub(RuntimeError(text)) == f"RuntimeError: {expected}"
    assert Redactor().scrub({"errors": [text]}) == {"errors": [expected]}


def test_url_secrets_registers_passwords_raw_and_decoded() -> None:
    found = url_secrets("https://user:p%40ss-word@h/v1?apikey=KEY123456&q=1")
    assert {"p%40ss-word", "p@ss-word", "KEY123456"} <= set(found)
    assert "user" not in found  # with a password, the user name is not the secret
    assert url_secrets("https://tokenonly123@h/") == ["tokenonly123", "tokenonly123"]
    assert url_secrets(None) == []


@pytest.mark.parametrize("opt_in", [False, True])
def test_request_body_loggers_held_at_warning_unless_opted_in(
    captured_logs: io.StringIO, opt_in: bool
) -> None:
    names = (*THIRD_PARTY_LOGGERS, "LiteLLM Router")
    saved = {n: logging.getLogger(n).level for n in names}
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.NOTSET)
        configure_logging("debug", "json", stream=captured_logs, third_party_debug=opt_in)
        logging.getLogger("httpx").debug("request body: user question")
        logging.getLogger("openai._base_client").debug("Request options: {'messages': ...}")
        logging.getLogger("LiteLLM").info("POST Request Sent from LiteLLM: messages")
        logging.getLogger("httpx").warning("a warning always passes")
        events = [json.loads(line)["event"] for line in captured_logs.getvalue().splitlines()]
        bodies = [e for e in events if "request" in e.lower() or "messages" in e]
        assert "a warning always passes" in events
        assert bool(bodies) is opt_in
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        configure_logging("info", "json", stream=captured_logs)


def test_configured_logging_is_json_and_redacted(captured_logs: io.StringIO) -> None:
    configure_logging("info", "json", secrets=[TOKEN], stream=captured_logs)
    log = get_logger("test")
    log.info("request", headers={"authorization": f"Bearer {TOKEN}"}, note=f"used {TOKEN}")
    try:
        raise RuntimeError(f"backend refused key {API_KEY}")
    except RuntimeError:
        log.exception("export_failed")
    logging.getLogger("aiohttp.client").warning("retrying with Authorization: Bearer %s", TOKEN)
    log.debug("hidden at info level")
    lines = [json.loads(line) for line in captured_logs.getvalue().splitlines()]
    assert [line["event"] for line in lines] == [
        "request",
        "export_failed",
        f"retrying with Authorization: Bearer {REDACTED}",
    ]
    assert lines[0]["component"] == "test"
    assert lines[0]["level"] == "info"
    assert "timestamp" in lines[0]
    assert "RuntimeError" in lines[1]["exception"]
    text = captured_logs.getvalue()
    assert TOKEN not in text
    assert API_KEY not in text


def test_the_running_service_never_logs_its_secrets(tmp_path: Path) -> None:
    """serve with a token and an exporter API key; bad requests and a dead backend."""
    config = {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0"},
            "http": {"endpoint": "127.0.0.1:0"},
            "auth": {"bearer_tokens": ["${COLLECTOR_TOKEN}"]},
        },
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": 0},
        "logging": {"level": "debug"},
        "exporters": {
            "b": {
                "type": "otlp_http",
                # Nothing listens here: the exporter logs retries with its error.
                "endpoint": "http://127.0.0.1:9/v1/traces",
                "headers": {"Authorization": f"Bearer {API_KEY}", "x-api-key": API_KEY},
                "retry": {"initial_interval": "20ms", "max_interval": "50ms"},
            }
        },
        "shutdown": {"flush_timeout": "500ms"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**config, **passthrough_sections()}))
    exe = Path(sys.executable).with_name("ragtrace-collector")
    proc = subprocess.Popen(
        [str(exe), "serve", "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
        env={"COLLECTOR_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
    )
    lines: list[str] = []
    ready = threading.Event()
    endpoints: dict[str, str] = {}

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            event = json.loads(line)
            if event["event"] == "receiver_listening":
                endpoints[event["receiver"]] = event["endpoint"]
            if event["event"] == "collector_ready":
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(30)
        url = f"http://{endpoints['otlp_http']}/v1/traces"
        body = make_request(rag_trace()).SerializeToString()
        for auth in (f"Bearer {TOKEN}x", f"Bearer {TOKEN}", f"Bearer {TOKEN}"):
            req = urllib.request.Request(
                url,
                data=body,
                headers={"Content-Type": "application/x-protobuf", "Authorization": auth},
            )
            if auth.endswith("x"):
                with pytest.raises(urllib.error.HTTPError) as err:
                    urllib.request.urlopen(req, timeout=10)
                assert err.value.code == 401
            else:
                urllib.request.urlopen(req, timeout=10).read()
        proc.terminate()
        assert proc.wait(timeout=30) == 3  # exit 3: the dead backend never got the spans
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    text = "".join(lines)
    events = [json.loads(line)["event"] for line in lines]
    assert "request_rejected" in events
    assert "export_retrying" in events
    assert TOKEN not in text
    assert API_KEY not in text
