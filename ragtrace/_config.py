"""``ragtrace.configure()``, ``flush()``, ``shutdown()`` and the settings the wrappers read.

Resolution order for every option: the keyword argument, then the ``RAGTRACE_*``
environment variable, then the standard ``OTEL_*`` variable(s), then the default.

=====================  ============================  =====================================
option                 RAGTRACE_*                    OTEL_*
=====================  ============================  =====================================
``service_name``       RAGTRACE_SERVICE_NAME         OTEL_SERVICE_NAME,
                                                     OTEL_RESOURCE_ATTRIBUTES
``endpoint``           RAGTRACE_ENDPOINT             OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
                                                     (as is), OTEL_EXPORTER_OTLP_ENDPOINT
``protocol``           RAGTRACE_PROTOCOL             OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
                                                     OTEL_EXPORTER_OTLP_PROTOCOL
``headers``            RAGTRACE_HEADERS              OTEL_EXPORTER_OTLP_TRACES_HEADERS,
                                                     OTEL_EXPORTER_OTLP_HEADERS
``sample_rate``        RAGTRACE_SAMPLE_RATE          OTEL_TRACES_SAMPLER(+ _ARG)
``capture_content``    RAGTRACE_CAPTURE_CONTENT
``max_content_chars``  RAGTRACE_MAX_CONTENT_CHARS
``max_queue_bytes``    RAGTRACE_MAX_QUEUE_BYTES
``enabled``            RAGTRACE_ENABLED              OTEL_SDK_DISABLED
=====================  ============================  =====================================

Before ``configure()`` is called, the decorators use OpenTelemetry's *global* tracer
provider: an app that already set one up gets ragtrace spans there; otherwise the OTel
API's no-op tracer makes every decorated call a cheap pass-through.  The content options
(``RAGTRACE_CAPTURE_CONTENT``, ``RAGTRACE_MAX_CONTENT_CHARS``, ``RAGTRACE_ENABLED``)
are honoured in that mode too.

``configure()`` builds its own ``TracerProvider`` (it does not replace the global one),
with ragtrace's :class:`~ragtrace._export.ExportQueue` as its span processor: the request
path never waits on the network, the queue is bounded by memory rather than by a span
count, and every span it has to drop is counted (:func:`stats`), reported by
:func:`flush` and logged.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api

from ragtrace import semconv
from ragtrace._safety import logger, report
from ragtrace._version import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from ragtrace._export import ExportStats

__all__ = [
    "DEFAULT_MAX_CONTENT_CHARS",
    "RUNTIME",
    "ConfigurationError",
    "Settings",
    "configure",
    "flush",
    "shutdown",
    "stats",
]

DEFAULT_MAX_CONTENT_CHARS = 10_000
PROTOCOL_HTTP = "http/protobuf"
PROTOCOL_GRPC = "grpc"
_PROTOCOLS = (PROTOCOL_HTTP, PROTOCOL_GRPC)
_DEFAULT_ENDPOINT = {PROTOCOL_HTTP: "http://localhost:4318", PROTOCOL_GRPC: "http://localhost:4317"}
_HTTP_TRACES_PATH = "/v1/traces"
#: Span attribute count for the provider ragtrace builds, unless OTEL_*_COUNT_LIMIT says
#: otherwise.  OTel's default (128) would evict the first attributes of a retriever span
#: that returned more than ~30 documents.
_SPAN_ATTRIBUTE_LIMIT = 1024
_TRACER_NAME = "ragtrace"
#: How long flush() and shutdown() wait by default (also at interpreter exit).
DEFAULT_TIMEOUT_S = 5.0


class ConfigurationError(ValueError):
    """A bad ``configure()`` argument or environment variable (raised at configure time)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What the wrappers read on every call: one immutable snapshot, swapped atomically."""

    enabled: bool
    tracer: trace_api.Tracer
    capture_content: bool
    #: 0 means no limit
    max_content_chars: int
    redact: Callable[[str], str] | None


class _Runtime:
    """The current settings plus the provider ragtrace owns (if it built one)."""

    __slots__ = ("export_queue", "lock", "owned_provider", "settings", "user_provider")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.settings: Settings = _initial_settings()
        #: a TracerProvider that configure() built; ragtrace flushes and shuts it down
        self.owned_provider: Any = None
        #: a provider passed as tracer_provider=; ragtrace flushes it, never shuts it down
        self.user_provider: Any = None
        #: the span processor of owned_provider (for stats())
        self.export_queue: Any = None


# ------------------------------------------------------------------ env parsing


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _first_env(*names: str) -> tuple[str, str] | None:
    for name in names:
        value = _env(name)
        if value is not None:
            return name, value
    return None


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigurationError(f"{name}={text!r}: expected true or false")


def _parse_rate(name: str, text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r}: expected a number between 0 and 1")
    return _check_rate(name, rate)


def _check_rate(name: str, rate: object) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ConfigurationError(f"{name} must be a number between 0 and 1, got {rate!r}")
    value = float(rate)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"{name} must be between 0 and 1, got {rate!r}")
    return value


def _parse_max_chars(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r}: expected a non-negative integer")
    return _check_max_chars(name, value)


def _check_max_chars(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"{name} must be a non-negative integer (0 = no limit), got {value!r}"
        )
    return value


_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
}


def _parse_size(name: str, text: str) -> int:
    """A byte count: ``67108864``, ``64MiB``, ``512 KB``."""
    stripped = text.strip().upper().replace(" ", "")
    digits = stripped.rstrip("KMGIB")
    unit = stripped[len(digits) :]
    try:
        number = float(digits)
    except ValueError:
        number = -1.0
    if unit not in _SIZE_UNITS or number <= 0 or math.isinf(number):
        raise ConfigurationError(
            f"{name}={text!r}: expected a positive size in bytes, e.g. 67108864 or 64MiB"
        )
    return _check_queue_bytes(name, int(number * _SIZE_UNITS[unit]))


def _check_queue_bytes(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        raise ConfigurationError(f"{name} must be a whole number of bytes >= 1024, got {value!r}")
    return value


def _parse_headers(name: str, text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` with URL-encoded values (the OTel spec's header format)."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = urllib.parse.unquote(key).strip()
        if not sep or not key:
            raise ConfigurationError(
                f"{name}: header entry {item!r} is not key=value (expected k1=v1,k2=v2)"
            )
        headers[key] = urllib.parse.unquote(value).strip()
    return headers


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


# ------------------------------------------------------------------ resolution


@dataclass(frozen=True, slots=True)
class _ContentOptions:
    enabled: bool
    capture_content: bool
    max_content_chars: int
    redact: Callable[[str], str] | None


def _resolve_content(
    *,
    enabled: bool | None,
    capture_content: bool | None,
    max_content_chars: int | None,
    redact: Callable[[str], str] | None,
) -> _ContentOptions:
    if enabled is not None:
        resolved_enabled = _check_bool("enabled", enabled)
    elif (value := _env("RAGTRACE_ENABLED")) is not None:
        resolved_enabled = _parse_bool("RAGTRACE_ENABLED", value)
    elif (value := _env("OTEL_SDK_DISABLED")) is not None:
        resolved_enabled = not _parse_bool("OTEL_SDK_DISABLED", value)
    else:
        resolved_enabled = True

    if capture_content is not None:
        resolved_capture = _check_bool("capture_content", capture_content)
    elif (value := _env("RAGTRACE_CAPTURE_CONTENT")) is not None:
        resolved_capture = _parse_bool("RAGTRACE_CAPTURE_CONTENT", value)
    else:
        resolved_capture = True

    if max_content_chars is not None:
        resolved_max = _check_max_chars("max_content_chars", max_content_chars)
    elif (value := _env("RAGTRACE_MAX_CONTENT_CHARS")) is not None:
        resolved_max = _parse_max_chars("RAGTRACE_MAX_CONTENT_CHARS", value)
    else:
        resolved_max = DEFAULT_MAX_CONTENT_CHARS

    if redact is not None and not callable(redact):
        raise ConfigurationError(f"redact must be a callable str -> str, got {redact!r}")

    return _ContentOptions(resolved_enabled, resolved_capture, resolved_max, redact)


@dataclass(frozen=True, slots=True)
class _ExportOptions:
    service_name: str | None  # None: let OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES decide
    endpoint: str
    protocol: str
    headers: dict[str, str]
    sample_rate: float
    max_queue_bytes: int


def _resolve_protocol(protocol: str | None) -> str:
    if protocol is not None:
        source, value = "protocol", protocol
    else:
        found = _first_env(
            "RAGTRACE_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        )
        if found is None:
            return PROTOCOL_HTTP
        source, value = found
    if not isinstance(value, str) or value not in _PROTOCOLS:
        raise ConfigurationError(
            f"{source}={value!r}: supported protocols are 'http/protobuf' and 'grpc'"
        )
    return value


def _http_traces_url(base: str) -> str:
    """A base URL plus ``/v1/traces``, unless it already ends with that path."""
    stripped = base.rstrip("/")
    if stripped.endswith(_HTTP_TRACES_PATH):
        return stripped
    return stripped + _HTTP_TRACES_PATH


def _check_endpoint(source: str, url: str, protocol: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"{source} must be a non-empty URL, got {url!r}")
    url = url.strip()
    parsed = urllib.parse.urlsplit(url)
    if protocol == PROTOCOL_HTTP:
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigurationError(
                f"{source}={url!r}: an OTLP/HTTP endpoint must be an http:// or https:// URL"
            )
    elif parsed.scheme and parsed.scheme not in ("http", "https") and "://" in url:
        raise ConfigurationError(
            f"{source}={url!r}: an OTLP/gRPC endpoint is http://host:port (plaintext), "
            "https://host:port (TLS) or host:port"
        )
    return url


def _resolve_endpoint(endpoint: str | None, protocol: str) -> str:
    if endpoint is not None:
        url = _check_endpoint("endpoint", endpoint, protocol)
        return _http_traces_url(url) if protocol == PROTOCOL_HTTP else url
    if (value := _env("RAGTRACE_ENDPOINT")) is not None:
        url = _check_endpoint("RAGTRACE_ENDPOINT", value, protocol)
        return _http_traces_url(url) if protocol == PROTOCOL_HTTP else url
    if (value := _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) is not None:
        # The signal-specific variable is a full URL, used as is (OTel spec).
        return _check_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", value, protocol)
    if (value := _env("OTEL_EXPORTER_OTLP_ENDPOINT")) is not None:
        url = _check_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", value, protocol)
        return _http_traces_url(url) if protocol == PROTOCOL_HTTP else url
    default = _DEFAULT_ENDPOINT[protocol]
    return _http_traces_url(default) if protocol == PROTOCOL_HTTP else default


def _resolve_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise ConfigurationError(f"headers must be a mapping of str to str, got {headers!r}")
        for key, value in headers.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise ConfigurationError(
                    f"headers must map non-empty str to str, got {key!r}: {value!r}"
                )
        return dict(headers)
    found = _first_env(
        "RAGTRACE_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"
    )
    return {} if found is None else _parse_headers(*found)


_RATIO_SAMPLERS = frozenset({"traceidratio", "parentbased_traceidratio"})
_ON_SAMPLERS = frozenset({"always_on", "parentbased_always_on"})
_OFF_SAMPLERS = frozenset({"always_off", "parentbased_always_off"})


def _resolve_sample_rate(sample_rate: float | None) -> float:
    if sample_rate is not None:
        return _check_rate("sample_rate", sample_rate)
    if (value := _env("RAGTRACE_SAMPLE_RATE")) is not None:
        return _parse_rate("RAGTRACE_SAMPLE_RATE", value)
    sampler = (_env("OTEL_TRACES_SAMPLER") or "").lower()
    if sampler in _OFF_SAMPLERS:
        return 0.0
    if sampler in _ON_SAMPLERS:
        return 1.0
    arg = _env("OTEL_TRACES_SAMPLER_ARG")
    if arg is not None and (not sampler or sampler in _RATIO_SAMPLERS):
        return _parse_rate("OTEL_TRACES_SAMPLER_ARG", arg)
    if sampler and sampler not in _RATIO_SAMPLERS:
        logger.warning(
            "ragtrace: OTEL_TRACES_SAMPLER=%s is not supported by ragtrace.configure(); "
            "sampling every trace (use sample_rate= or RAGTRACE_SAMPLE_RATE)",
            sampler,
        )
    return 1.0


def _resolve_service_name(service_name: str | None) -> str | None:
    if service_name is not None:
        if not isinstance(service_name, str) or not service_name.strip():
            raise ConfigurationError(
                f"service_name must be a non-empty string, got {service_name!r}"
            )
        return service_name.strip()
    return _env("RAGTRACE_SERVICE_NAME")


def _resolve_export(
    *,
    service_name: str | None,
    endpoint: str | None,
    protocol: str | None,
    headers: Mapping[str, str] | None,
    sample_rate: float | None,
    max_queue_bytes: int | None,
) -> _ExportOptions:
    resolved_protocol = _resolve_protocol(protocol)
    return _ExportOptions(
        service_name=_resolve_service_name(service_name),
        endpoint=_resolve_endpoint(endpoint, resolved_protocol),
        protocol=resolved_protocol,
        headers=_resolve_headers(headers),
        sample_rate=_resolve_sample_rate(sample_rate),
        max_queue_bytes=_resolve_queue_bytes(max_queue_bytes),
    )


def _resolve_queue_bytes(max_queue_bytes: int | None) -> int:
    from ragtrace._export import DEFAULT_MAX_QUEUE_BYTES

    if max_queue_bytes is not None:
        return _check_queue_bytes("max_queue_bytes", max_queue_bytes)
    if (value := _env("RAGTRACE_MAX_QUEUE_BYTES")) is not None:
        return _parse_size("RAGTRACE_MAX_QUEUE_BYTES", value)
    return DEFAULT_MAX_QUEUE_BYTES


# --------------------------------------------------------------- construction


def _make_exporter(options: _ExportOptions) -> SpanExporter:
    if options.protocol == PROTOCOL_GRPC:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise ConfigurationError(
                "protocol='grpc' needs the gRPC exporter, which is an optional extra: "
                "pip install 'ragtrace-sdk[grpc]'"
            ) from exc
        # gRPC metadata keys must be lowercase.
        metadata = {key.lower(): value for key, value in options.headers.items()}
        return GrpcExporter(endpoint=options.endpoint, headers=metadata or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=options.endpoint, headers=options.headers or None)


def _make_provider(options: _ExportOptions) -> tuple[Any, Any]:
    """A tracer provider and its export queue."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from ragtrace._export import ExportQueue

    queue = ExportQueue(_make_exporter(options), max_queue_bytes=options.max_queue_bytes)
    resource_attrs: dict[str, str] = {semconv.RAGTRACE_SDK_VERSION: __version__}
    if options.service_name is not None:
        resource_attrs[SERVICE_NAME] = options.service_name
    root = ALWAYS_ON if options.sample_rate >= 1.0 else TraceIdRatioBased(options.sample_rate)
    env_limit = _first_env("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT")
    limits = SpanLimits() if env_limit else SpanLimits(max_span_attributes=_SPAN_ATTRIBUTE_LIMIT)
    provider = TracerProvider(
        sampler=ParentBased(root),
        resource=Resource.create(resource_attrs),
        span_limits=limits,
        shutdown_on_exit=False,  # ragtrace registers one atexit handler for the current one
    )
    provider.add_span_processor(queue)
    return provider, queue


def _settings_from(content: _ContentOptions, tracer: trace_api.Tracer) -> Settings:
    return Settings(
        enabled=content.enabled,
        tracer=tracer,
        capture_content=content.capture_content,
        max_content_chars=content.max_content_chars,
        redact=content.redact,
    )


def _global_tracer() -> trace_api.Tracer:
    # A ProxyTracer: it follows trace.set_tracer_provider() even when called later.
    return trace_api.get_tracer(_TRACER_NAME, __version__)


def _initial_settings() -> Settings:
    """Settings before configure(): the global provider, content options from the env."""
    try:
        content = _resolve_content(
            enabled=None, capture_content=None, max_content_chars=None, redact=None
        )
    except ConfigurationError as exc:
        logger.warning("ragtrace: %s; using defaults until ragtrace.configure() is called", exc)
        content = _ContentOptions(True, True, DEFAULT_MAX_CONTENT_CHARS, None)
    return _settings_from(content, _global_tracer())


RUNTIME = _Runtime()


def configure(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    sample_rate: float | None = None,
    capture_content: bool | None = None,
    max_content_chars: int | None = None,
    redact: Callable[[str], str] | None = None,
    tracer_provider: trace_api.TracerProvider | None = None,
    enabled: bool | None = None,
    max_queue_bytes: int | None = None,
) -> None:
    """Set up ragtrace.  Safe to call again: the new settings replace the old ones.

    Args:
        service_name: ``service.name`` of the spans (default: OTel's resource detection).
        endpoint: OTLP endpoint.  For ``http/protobuf`` a base URL such as
            ``http://collector:4318``; ``/v1/traces`` is appended unless already there.
            For ``grpc``: ``http://host:4317`` (plaintext) or ``https://host:4317`` (TLS).
        protocol: ``"http/protobuf"`` (default) or ``"grpc"`` (needs ``ragtrace-sdk[grpc]``).
        headers: extra export headers, e.g. ``{"authorization": "Bearer …"}``.
        sample_rate: fraction of traces recorded, 0..1 (parent-based, trace-id ratio).
        capture_content: record text (inputs, outputs, document contents and metadata).
            ``False`` keeps only structure: kinds, counts, document ids and scores.
        max_content_chars: longest text kept per value; longer text is cut and marked.
            ``0`` disables truncation.  Default 10 000.
        redact: ``str -> str`` applied to every captured text before it is recorded.
        tracer_provider: use this provider instead of building one; export, sampling and
            resource are then that provider's business (passing ``endpoint``,
            ``protocol``, ``headers``, ``sample_rate`` or ``service_name`` too is an error).
        enabled: ``False`` turns every decorator into a direct call of the function.
        max_queue_bytes: memory the export queue may hold (estimated) before it drops
            spans; default 64 MiB.  Spans are never dropped silently: see :func:`stats`.

    Raises:
        ConfigurationError: a bad argument or environment variable.  This is the only
            place ragtrace raises; decorated functions never see a ragtrace exception.
    """
    content = _resolve_content(
        enabled=enabled,
        capture_content=capture_content,
        max_content_chars=max_content_chars,
        redact=redact,
    )
    new_owned: Any = None
    new_user: Any = None
    new_queue: Any = None
    if tracer_provider is not None:
        given = {
            "service_name": service_name,
            "endpoint": endpoint,
            "protocol": protocol,
            "headers": headers,
            "sample_rate": sample_rate,
            "max_queue_bytes": max_queue_bytes,
        }
        conflicting = sorted(name for name, value in given.items() if value is not None)
        if conflicting:
            raise ConfigurationError(
                f"{', '.join(conflicting)} cannot be combined with tracer_provider: "
                "export, sampling and resource belong to the provider you pass"
            )
        if not callable(getattr(tracer_provider, "get_tracer", None)):
            raise ConfigurationError(
                f"tracer_provider must be an OpenTelemetry TracerProvider, got {tracer_provider!r}"
            )
        tracer = tracer_provider.get_tracer(_TRACER_NAME, __version__)
        new_user = tracer_provider
    elif content.enabled:
        options = _resolve_export(
            service_name=service_name,
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            sample_rate=sample_rate,
            max_queue_bytes=max_queue_bytes,
        )
        new_owned, new_queue = _make_provider(options)
        tracer = new_owned.get_tracer(_TRACER_NAME, __version__)
    else:
        # Validate the export options even when disabled: a typo should fail now,
        # not on the day tracing is switched on.
        _resolve_export(
            service_name=service_name,
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            sample_rate=sample_rate,
            max_queue_bytes=max_queue_bytes,
        )
        tracer = trace_api.NoOpTracer()

    with RUNTIME.lock:
        old_owned = RUNTIME.owned_provider
        old_queue = RUNTIME.export_queue
        RUNTIME.owned_provider = new_owned
        RUNTIME.user_provider = new_user
        RUNTIME.export_queue = new_queue
        RUNTIME.settings = _settings_from(content, tracer)
    if old_owned is not None and old_owned is not new_owned:
        _shutdown_provider(old_owned, old_queue)


def _shutdown_provider(
    provider: Any, queue: Any = None, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Stop ``provider``; its export queue first, within ``timeout`` seconds."""
    try:
        if queue is not None:
            queue.shutdown(int(timeout * 1000))
        provider.shutdown()
    except Exception as exc:
        report("shutting down the tracer provider", exc)


def _flushable_provider() -> Any:
    if RUNTIME.owned_provider is not None:
        return RUNTIME.owned_provider
    if RUNTIME.user_provider is not None:
        return RUNTIME.user_provider
    return trace_api.get_tracer_provider()


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        report("flush/shutdown", ValueError(f"timeout must be seconds >= 0, got {timeout!r}"))
        return DEFAULT_TIMEOUT_S
    return float(timeout)


def flush(timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Export every finished span now.

    Returns True only when everything was exported within ``timeout`` seconds *and* no
    span finished since the previous flush was dropped (a full queue, a collector that
    refused or could not be reached); :func:`stats` says how many and why.  Never raises.
    Blocks up to ``timeout``: call it at the end of a batch job or a test, not on the
    request path.
    """
    try:
        seconds = _check_timeout(timeout)
        provider = _flushable_provider()
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is None:
            return True
        return bool(force_flush(int(seconds * 1000)))
    except Exception as exc:
        report("flush", exc)
        return False


def shutdown(timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Flush and stop, in at most ``timeout`` seconds (default 5): the provider ragtrace
    built is shut down (a ``tracer_provider`` you passed is only flushed), and the
    decorators become direct calls until the next ``configure()``.  Spans still queued
    when the time is up are dropped, counted and logged; a dead collector never delays
    the app's exit by more than ``timeout``.  Never raises."""
    try:
        seconds = _check_timeout(timeout)
        with RUNTIME.lock:
            owned, user = RUNTIME.owned_provider, RUNTIME.user_provider
            queue = RUNTIME.export_queue
            RUNTIME.owned_provider = None
            RUNTIME.user_provider = None
            old = RUNTIME.settings
            RUNTIME.settings = Settings(
                enabled=False,
                tracer=trace_api.NoOpTracer(),
                capture_content=old.capture_content,
                max_content_chars=old.max_content_chars,
                redact=old.redact,
            )
        if owned is not None:
            _shutdown_provider(owned, queue, seconds)
        elif user is not None and callable(getattr(user, "force_flush", None)):
            user.force_flush(int(seconds * 1000))
    except Exception as exc:
        report("shutdown", exc)


def stats() -> ExportStats:
    """What the export queue of the provider ``configure()`` built has done so far.

    ``spans_exported``, ``spans_dropped`` by cause (``queue_full``, ``export_failed``,
    ``shutdown``), and what is queued now.  After ``shutdown()`` it keeps the last
    figures.  With a ``tracer_provider`` of your own, or before ``configure()``, export
    is that provider's business and every count is 0.
    """
    from ragtrace._export import ExportStats

    try:
        queue = RUNTIME.export_queue
        return queue.stats() if queue is not None else ExportStats()
    except Exception as exc:
        report("stats", exc)
        return ExportStats()


def _at_exit() -> None:
    owned = RUNTIME.owned_provider
    if owned is not None:
        _shutdown_provider(owned, RUNTIME.export_queue)


atexit.register(_at_exit)


def _reset_for_tests() -> None:
    """Back to the state before any configure() (tests only)."""
    with RUNTIME.lock:
        owned, queue = RUNTIME.owned_provider, RUNTIME.export_queue
        RUNTIME.owned_provider = None
        RUNTIME.user_provider = None
        RUNTIME.export_queue = None
        RUNTIME.settings = _initial_settings()
    if owned is not None:
        _shutdown_provider(owned, queue)
