"""configure(): options, environment variables, errors, reconfiguration, disabled mode."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import ragtrace
from ragtrace import _config
from ragtrace._config import RUNTIME, ConfigurationError

from .conftest import Recorder


@ragtrace.rag
def answer(question: str) -> str:
    return question.upper()


def _export(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "service_name": None,
        "endpoint": None,
        "protocol": None,
        "headers": None,
        "sample_rate": None,
        "max_queue_bytes": None,
    }
    args.update(kwargs)
    return _config._resolve_export(**args)


def test_defaults() -> None:
    opts = _export()
    assert opts.protocol == "http/protobuf"
    assert opts.endpoint == "http://localhost:4318/v1/traces"
    assert opts.headers == {}
    assert opts.sample_rate == 1.0
    assert opts.service_name is None
    grpc = _export(protocol="grpc")
    assert grpc.endpoint == "http://localhost:4317"


def test_otel_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%3Dcret, x-team=rag")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    opts = _export()
    assert opts.endpoint == "http://collector:4318/v1/traces"
    assert opts.headers == {"api-key": "s=cret", "x-team": "rag"}
    assert opts.sample_rate == 0.25

    # the signal-specific endpoint is used as is and wins over the generic one
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9999/custom")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "only=traces")
    assert _export().endpoint == "http://other:9999/custom"
    assert _export().headers == {"only": "traces"}

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert _export().protocol == "grpc"
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert _export().sample_rate == 0.0


def test_ragtrace_variables_override_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel:4318/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "a=1")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    monkeypatch.setenv("RAGTRACE_ENDPOINT", "https://rag:4318")
    monkeypatch.setenv("RAGTRACE_HEADERS", "b=2")
    monkeypatch.setenv("RAGTRACE_SAMPLE_RATE", "0.1")
    monkeypatch.setenv("RAGTRACE_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("RAGTRACE_SERVICE_NAME", "rag-svc")
    monkeypatch.setenv("RAGTRACE_ENABLED", "off")
    opts = _export()
    assert opts.endpoint == "https://rag:4318/v1/traces"
    assert opts.headers == {"b": "2"}
    assert opts.sample_rate == 0.1
    assert opts.protocol == "http/protobuf"
    assert opts.service_name == "rag-svc"
    content = _config._resolve_content(
        enabled=None, capture_content=None, max_content_chars=None, redact=None
    )
    assert content.enabled is False
    # and keyword arguments win over both
    opts = _export(endpoint="http://kw:1234", sample_rate=1, service_name="kw-svc")
    assert (opts.endpoint, opts.sample_rate, opts.service_name) == (
        "http://kw:1234/v1/traces",
        1.0,
        "kw-svc",
    )


def test_content_options_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTRACE_CAPTURE_CONTENT", "false")
    monkeypatch.setenv("RAGTRACE_MAX_CONTENT_CHARS", "99")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    content = _config._resolve_content(
        enabled=None, capture_content=None, max_content_chars=None, redact=None
    )
    assert (content.enabled, content.capture_content, content.max_content_chars) == (
        False,
        False,
        99,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_rate": 1.5}, "sample_rate must be between 0 and 1"),
        ({"sample_rate": "0.5"}, "sample_rate must be a number"),
        ({"sample_rate": True}, "sample_rate must be a number"),
        ({"protocol": "http/json"}, "supported protocols are 'http/protobuf' and 'grpc'"),
        ({"endpoint": "localhost:4318"}, "must be an http:// or https:// URL"),
        ({"endpoint": ""}, "endpoint must be a non-empty URL"),
        ({"headers": {"k": 1}}, "headers must map non-empty str to str"),
        ({"headers": "k=v"}, "headers must be a mapping"),
        ({"service_name": " "}, "service_name must be a non-empty string"),
        ({"max_content_chars": -1}, "max_content_chars must be a non-negative integer"),
        ({"max_content_chars": 1.5}, "max_content_chars must be a non-negative integer"),
        ({"capture_content": "yes"}, "capture_content must be True or False"),
        ({"enabled": 1}, "enabled must be True or False"),
        ({"redact": "not callable"}, "redact must be a callable"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ragtrace.configure(**kwargs)
    # nothing changed: still the initial (global provider) settings
    assert RUNTIME.owned_provider is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RAGTRACE_SAMPLE_RATE", "lots", "RAGTRACE_SAMPLE_RATE='lots'"),
        ("OTEL_TRACES_SAMPLER_ARG", "2", "OTEL_TRACES_SAMPLER_ARG must be between 0 and 1"),
        ("RAGTRACE_ENABLED", "maybe", "RAGTRACE_ENABLED='maybe': expected true or false"),
        ("RAGTRACE_MAX_CONTENT_CHARS", "ten", "RAGTRACE_MAX_CONTENT_CHARS='ten'"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "OTEL_EXPORTER_OTLP_HEADERS: header entry"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "OTEL_EXPORTER_OTLP_ENDPOINT="),
    ],
)
def test_bad_environment_raises_at_configure(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=message):
        ragtrace.configure()


def test_tracer_provider_conflicts_with_export_options() -> None:
    with pytest.raises(ConfigurationError, match="endpoint, sample_rate cannot be combined"):
        ragtrace.configure(tracer_provider=TracerProvider(), endpoint="http://x:1", sample_rate=0.5)
    with pytest.raises(ConfigurationError, match="must be an OpenTelemetry TracerProvider"):
        ragtrace.configure(tracer_provider=object())  # type: ignore[arg-type]


def test_grpc_without_the_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'ragtrace-sdk\[grpc\]'"):
        ragtrace.configure(protocol="grpc", endpoint="http://127.0.0.1:1")


def test_configure_twice_switches_provider_and_shuts_down_the_old_one() -> None:
    first, second = Recorder(), Recorder()
    first.configure()
    answer("one")
    second.configure()
    answer("two")
    assert [s.attributes["input.value"] for s in first.named("answer")] == ["one"]  # type: ignore[index]
    assert [s.attributes["input.value"] for s in second.named("answer")] == ["two"]  # type: ignore[index]

    # a provider ragtrace built is shut down when replaced
    ragtrace.configure(endpoint="http://127.0.0.1:9", service_name="a")
    built = RUNTIME.owned_provider
    assert built is not None
    shutdowns: list[bool] = []
    original_shutdown = built.shutdown
    built.shutdown = lambda: (shutdowns.append(True), original_shutdown())
    ragtrace.configure(endpoint="http://127.0.0.1:9", service_name="b")
    assert RUNTIME.owned_provider is not built
    assert shutdowns == [True]
    assert RUNTIME.owned_provider.resource.attributes["service.name"] == "b"
    ragtrace.configure(tracer_provider=first.provider)
    assert RUNTIME.owned_provider is None


def test_sample_rate_zero_records_nothing() -> None:
    ragtrace.configure(endpoint="http://127.0.0.1:9", sample_rate=0.0)
    span = RUNTIME.settings.tracer.start_span("probe")
    assert not span.is_recording()
    span.end()
    assert answer("still works") == "STILL WORKS"


def test_enabled_false_is_a_direct_call(recorder: Recorder) -> None:
    recorder.configure(enabled=False)
    assert answer("off") == "OFF"
    assert recorder.spans() == []
    recorder.configure(enabled=True)
    answer("on")
    assert len(recorder.spans()) == 1


async def test_enabled_false_for_every_kind_of_callable(recorder: Recorder) -> None:
    @ragtrace.retriever
    async def coro(query: str) -> list[str]:
        return [query]

    @ragtrace.generator
    def gen(prompt: str) -> Any:
        received = yield "first"
        yield f"got {received}"
        return "done"

    @ragtrace.rag
    async def agen(question: str) -> Any:
        received = yield "a"
        yield f"got {received}"

    recorder.configure(enabled=False)
    assert await coro("q") == ["q"]
    it = gen("p")
    assert next(it) == "first"
    assert it.send("x") == "got x"
    with pytest.raises(StopIteration) as stop:
        next(it)
    assert stop.value.value == "done"
    ait = agen("q")
    assert await ait.asend(None) == "a"
    assert await ait.asend("y") == "got y"
    await ait.aclose()
    assert recorder.spans() == []


def test_disabled_from_env_without_export(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTRACE_ENABLED", "false")
    ragtrace.configure(service_name="x")
    assert RUNTIME.owned_provider is None
    assert RUNTIME.settings.enabled is False
    assert answer("x") == "X"


def test_flush_and_shutdown(recorder: Recorder) -> None:
    answer("before")
    assert ragtrace.flush() is True
    ragtrace.shutdown()
    assert RUNTIME.settings.enabled is False
    assert answer("after shutdown") == "AFTER SHUTDOWN"
    assert len(recorder.spans()) == 1
    # a provider passed in is the app's: flushed, never shut down
    tracer = recorder.provider.get_tracer("t")
    span = tracer.start_span("still-usable")
    span.end()
    assert recorder.named("still-usable")
    ragtrace.shutdown()  # twice is fine


_BEFORE_CONFIGURE = textwrap.dedent(
    """
    import json, sys
    import ragtrace
    from opentelemetry import trace

    @ragtrace.rag
    def answer(question):
        return question[::-1]

    # 1. no provider anywhere: a cheap pass-through
    assert answer("abc") == "cba"

    if sys.argv[1] == "global":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        # 2. the app's global provider receives ragtrace spans, without configure()
        with ragtrace.session("s"):
            answer("xyz")
        spans = exporter.get_finished_spans()
        print(json.dumps([dict(s.attributes) for s in spans]))
    else:
        print("[]")
    """
)


@pytest.mark.parametrize("mode", ["none", "global"])
def test_decorators_before_configure_use_the_global_provider(mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _BEFORE_CONFIGURE, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    spans = json.loads(proc.stdout)
    if mode == "none":
        assert spans == []
    else:
        (attrs,) = spans
        assert attrs["input.value"] == "xyz"
        assert attrs["output.value"] == "zyx"
        assert attrs["ragtrace.turn.index"] == 0


def test_initial_settings_honour_content_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTRACE_CAPTURE_CONTENT", "0")
    assert _config._initial_settings().capture_content is False
    monkeypatch.setenv("RAGTRACE_CAPTURE_CONTENT", "garbage")
    # invalid before configure(): defaults, no exception at import time
    assert _config._initial_settings().capture_content is True
