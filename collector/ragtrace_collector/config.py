"""The collector's configuration: one YAML file, validated by pydantic.

``load_config(path)`` reads YAML, replaces ``${VAR}`` and ``${VAR:-default}`` in every
string value with the environment (``$${`` escapes a literal ``${``), and validates the
result against :class:`CollectorConfig`.  Every model forbids unknown keys; a typo gets
a "did you mean" hint.  Any problem raises :class:`ConfigError`, whose ``problems`` each
name the key (dotted path) and what is wrong with it.

Durations accept a number of seconds or a string with a unit (``250ms``, ``2s``,
``5m``, ``1h``); sizes accept a number of bytes or a string (``512KiB``, ``16MiB``,
``1GB``).  With no file at all, the defaults give a working collector: OTLP receivers
on 127.0.0.1:4317/4318, admin on 127.0.0.1:8888, spans written to
``ragtrace-spans.jsonl``.

To add a section (sampling, evaluation, ...), add a model and a field to
:class:`CollectorConfig`; keep ``extra="forbid"`` by deriving from :class:`StrictModel`.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ragtrace_collector.alerts.config import AlertsConfig, check_one_auth_source
from ragtrace_collector.case_builder import CasesConfig
from ragtrace_collector.enrichment import EnrichmentConfig
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.metrics import METRIC_NAMES, OFFLINE_METRICS, MetricOptions
from ragtrace_collector.redaction import redact, url_secrets
from ragtrace_collector.reference_store import ReferenceStoreConfig
from ragtrace_collector.sampling import SamplingConfig
from ragtrace_collector.session_store import SessionStoreConfig
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.units import parse_duration, parse_size

__all__ = [
    "AdminConfig",
    "AssemblyConfig",
    "AuthConfig",
    "ByteSize",
    "ClientTLSConfig",
    "CollectorConfig",
    "ConfigError",
    "Duration",
    "EvaluationConfig",
    "ExporterConfig",
    "FileExporterConfig",
    "GrpcReceiverConfig",
    "HttpReceiverConfig",
    "LoggingConfig",
    "OtlpGrpcExporterConfig",
    "OtlpHttpExporterConfig",
    "PhoenixAnnotationsConfig",
    "PhoenixExporterConfig",
    "QueueConfig",
    "ReceiversConfig",
    "RetryConfig",
    "ServerTLSConfig",
    "ShutdownConfig",
    "StrictModel",
    "expand_include_defaults",
    "load_config",
    "parse_config",
    "split_host_port",
]


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` has one line per problem.

    ``partial`` is the configuration built from the top-level sections that are valid
    (the others at their defaults) and ``failed_sections`` names the others, so that
    ``check-config`` can run the checks of :mod:`ragtrace_collector.preflight` on what
    is valid and report everything in one pass.  ``partial`` is None when no such
    configuration could be built."""

    def __init__(
        self,
        problems: Sequence[str],
        source: str = "config",
        *,
        partial: CollectorConfig | None = None,
        failed_sections: frozenset[str] = frozenset(),
    ) -> None:
        self.problems = list(problems)
        self.source = source
        self.partial = partial
        self.failed_sections = failed_sections
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source}: invalid configuration"]
        # A problem may quote a URL with credentials: redacted like the logs.
        lines += [f"  - {redact(p)}" for p in self.problems]
        return "\n".join(lines)


# ----------------------------------------------------------------- value types
#: Seconds, from a number or a string such as ``"250ms"``, ``"2s"`` or ``"1h30m"``.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
#: Bytes, from a number or a string such as ``"16MiB"``.
ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


def split_host_port(endpoint: str) -> tuple[str, int]:
    """``"127.0.0.1:4317"`` -> ``("127.0.0.1", 4317)``; ``"[::1]:4317"`` works too."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{endpoint!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{endpoint!r}: port {port} is out of range 0-65535")
    return host, port


def _check_listen_endpoint(value: str) -> str:
    split_host_port(value)
    return value


def _check_file(path: Path | None) -> Path | None:
    if path is not None and not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path


def _check_metric_name(name: str) -> str:
    if name not in METRIC_NAMES:
        close = difflib.get_close_matches(name, METRIC_NAMES, n=2, cutoff=0.6)
        hint = " or ".join(repr(c) for c in close)
        raise ValueError(
            f"unknown metric {name!r} (did you mean {hint}?)"
            if close
            else f"unknown metric {name!r} (known metrics: {', '.join(METRIC_NAMES)})"
        )
    return name


#: A metric name of docs/metrics.md; each unknown name is its own error.
MetricName = Annotated[str, AfterValidator(_check_metric_name)]


def expand_include_defaults(value: Any) -> Any:
    """``metrics: {include_defaults: true, faithfulness: {}}``: the default set plus
    faithfulness (a metric listed again keeps its own options)."""
    if not isinstance(value, Mapping) or "include_defaults" not in value:
        return value
    data = dict(value)
    flag = data.pop("include_defaults")
    if not isinstance(flag, bool):
        raise ValueError(f"include_defaults: expected true or false, got {flag!r}")
    if not flag:
        return data
    return {**{name: data.pop(name, {}) for name in OFFLINE_METRICS}, **data}


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


# -------------------------------------------------------------------- sections
class ServerTLSConfig(StrictModel):
    """TLS for a receiver: a certificate chain and its private key (PEM files)."""

    cert_file: Path = Field(description="PEM file of the server certificate (chain).")
    key_file: Path = Field(description="PEM file of the certificate's private key.")
    #: When set, clients must present a certificate signed by this CA (mTLS).
    client_ca_file: Path | None = None

    _files = field_validator("cert_file", "key_file", "client_ca_file")(_check_file)


class ClientTLSConfig(StrictModel):
    """TLS for an exporter.  https endpoints use TLS; these options tune it."""

    #: CA bundle to verify the backend (default: the system's).
    ca_file: Path | None = None
    #: Client certificate and key, for backends that want mTLS.
    cert_file: Path | None = None
    key_file: Path | None = Field(
        None, description="Private key of the client certificate (set with cert_file)."
    )
    #: Skip certificate verification (HTTP exporter only; for tests, never production).
    insecure_skip_verify: bool = False

    _files = field_validator("ca_file", "cert_file", "key_file")(_check_file)

    @model_validator(mode="after")
    def _pair(self) -> ClientTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        return self


class AuthConfig(StrictModel):
    """Bearer-token authentication of incoming exports (both receivers)."""

    #: Accepted tokens; clients send ``Authorization: Bearer <token>``.  Empty: no auth.
    bearer_tokens: list[SecretStr] = Field(default_factory=list)

    @field_validator("bearer_tokens")
    @classmethod
    def _non_empty(cls, tokens: list[SecretStr]) -> list[SecretStr]:
        for token in tokens:
            if not token.get_secret_value().strip():
                raise ValueError("a bearer token must not be empty")
        return tokens


class GrpcReceiverConfig(StrictModel):
    enabled: bool = Field(True, description="Serve OTLP/gRPC.")
    endpoint: Annotated[str, BeforeValidator(str)] = Field(
        "127.0.0.1:4317", description="host:port to listen on (`0.0.0.0:4317` in a container)."
    )
    tls: ServerTLSConfig | None = Field(
        None, description="Serve TLS with this certificate; unset: plaintext."
    )
    #: Largest accepted request message (after decompression).
    max_request_bytes: ByteSize = 16 * 1024 * 1024
    #: Calls in progress at once on one connection (HTTP/2 streams).
    max_concurrent_streams: int = Field(100, ge=1)
    #: A connection with no call in progress is closed after this.
    keepalive_timeout: Duration = Field(300.0, gt=0)

    _endpoint = field_validator("endpoint")(_check_listen_endpoint)


class HttpReceiverConfig(StrictModel):
    enabled: bool = Field(True, description="Serve OTLP/HTTP (`POST /v1/traces`).")
    endpoint: Annotated[str, BeforeValidator(str)] = Field(
        "127.0.0.1:4318", description="host:port to listen on (`0.0.0.0:4318` in a container)."
    )
    tls: ServerTLSConfig | None = Field(
        None, description="Serve TLS with this certificate; unset: plaintext."
    )
    #: Largest accepted body, both as sent and after gzip decompression (else 413).
    max_request_bytes: ByteSize = 16 * 1024 * 1024
    #: Most gzip members one body may hold (else 413); clients send one.
    max_gzip_members: int = Field(16, ge=1)
    #: A connection that has not sent a complete request head within this is closed.
    read_header_timeout: Duration = Field(10.0, gt=0)
    #: The body of a request must arrive within this (else 408).
    read_timeout: Duration = Field(60.0, gt=0)
    #: An idle keep-alive connection is closed after this.
    keepalive_timeout: Duration = Field(30.0, gt=0)
    #: Connections open at once; past it, a new connection gets 503 and is closed.
    max_connections: int = Field(512, ge=1)

    _endpoint = field_validator("endpoint")(_check_listen_endpoint)


class ReceiversConfig(StrictModel):
    grpc: GrpcReceiverConfig = Field(
        default_factory=GrpcReceiverConfig, description="The OTLP/gRPC receiver."
    )
    http: HttpReceiverConfig = Field(
        default_factory=HttpReceiverConfig,
        description="The OTLP/HTTP receiver: protobuf or JSON bodies, optionally gzip.",
    )
    auth: AuthConfig = Field(
        default_factory=AuthConfig, description="Bearer-token authentication (both receivers)."
    )
    #: Delay suggested to throttled clients (HTTP Retry-After, gRPC RetryInfo).
    retry_after: Duration = 1.0


class AssemblyConfig(StrictModel):
    #: A trace whose root has arrived is ready after this long without a new span.
    decision_wait: Duration = 2.0
    #: A trace is released this long after its first span, root or not.
    max_trace_wait: Duration = 30.0
    #: Over this many buffered spans, the oldest traces are released early.
    max_buffered_spans: int = Field(default=100_000, ge=1)
    #: How many released trace ids to remember, to recognise late spans.
    late_trace_ids: int = Field(default=100_000, ge=0)
    #: How long a released trace id is remembered.
    late_trace_ttl: Duration = 600.0

    @model_validator(mode="after")
    def _order(self) -> AssemblyConfig:
        if self.decision_wait > self.max_trace_wait:
            raise ValueError(
                f"decision_wait ({self.decision_wait}s) must not exceed "
                f"max_trace_wait ({self.max_trace_wait}s)"
            )
        return self


class RetryConfig(StrictModel):
    """Exponential backoff with jitter, for retryable export failures."""

    initial_interval: Duration = Field(0.5, description="Delay before the first retry.")
    max_interval: Duration = Field(10.0, description="Longest delay between two attempts.")
    multiplier: float = Field(
        default=2.0, ge=1.0, description="Each delay is the previous one times this."
    )
    #: Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter].
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    #: Give up on a batch after this long (counted as dropped).  None: retry until
    #: it is delivered or the shutdown deadline passes.
    max_elapsed_time: Duration | None = None


class QueueConfig(StrictModel):
    """An exporter's bounded queue (spans waiting plus spans in flight)."""

    max_spans: int = Field(default=50_000, ge=1, description="Spans queued or in flight.")
    #: backpressure: receivers refuse new spans while the queue is full (nothing is
    #: lost; clients retry).  drop_oldest: the oldest queued spans are dropped, counted.
    on_full: Literal["backpressure", "drop_oldest"] = "backpressure"


class _ExporterBase(StrictModel):
    queue: QueueConfig = Field(
        default_factory=QueueConfig, description="The bounded queue in front of the exporter."
    )
    retry: RetryConfig = Field(
        default_factory=RetryConfig,
        description="Backoff for retryable failures (unreachable backend, 429, 5xx).",
    )
    #: Most spans in one export request.  Traces are packed whole up to it; a trace
    #: with more spans is cut into several requests of at most this many, in order.
    max_batch_spans: int = Field(default=2048, ge=1)
    #: Export requests in flight at once.
    concurrency: int = Field(default=2, ge=1, le=64)
    #: Timeout of one export call.
    timeout: Duration = 10.0


class _HttpExporterBase(_ExporterBase):
    """What every exporter that POSTs OTLP/HTTP shares."""

    type: str
    endpoint: str
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Headers sent with every export (e.g. an API key); never logged.",
    )
    compression: Literal["gzip", "none"] = Field(
        "gzip", description="Compression of the request bodies."
    )
    tls: ClientTLSConfig = Field(
        default_factory=ClientTLSConfig, description="TLS options for an https:// endpoint."
    )

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_auth_source(self) -> _HttpExporterBase:
        check_one_auth_source(self.endpoint, self.headers)
        return self

    def traces_url(self) -> str:
        parts = urlsplit(self.endpoint)
        if parts.path in ("", "/"):
            return self.endpoint.rstrip("/") + "/v1/traces"
        return self.endpoint


class OtlpHttpExporterConfig(_HttpExporterBase):
    type: Literal["otlp_http"]
    #: Base URL (``/v1/traces`` is appended) or the full URL of the traces endpoint.
    endpoint: str


class PhoenixAnnotationsConfig(StrictModel):
    """Which results the Phoenix exporter posts as annotations, and how long it waits
    for Phoenix to store a span before it gives up on that span's annotations."""

    spans: bool = Field(True, description="Each metric result as a span annotation.")
    documents: bool = Field(
        True,
        description="Per-document verdicts as document annotations on the retriever span.",
    )
    sessions: bool = Field(True, description="Conversation scores as session annotations.")
    max_wait: Duration = Field(
        30.0,
        gt=0,
        description="Phoenix stores spans asynchronously: annotations for a span it does not "
        "have yet are retried with backoff for this long, then counted as given up (the "
        "export worker waits meanwhile, so a stuck Phoenix slows the queue, never loses it).",
    )


class PhoenixExporterConfig(_HttpExporterBase):
    """Arize Phoenix: spans over OTLP/HTTP, results as native Phoenix annotations."""

    type: Literal["phoenix"]
    #: Phoenix's base URL, e.g. ``http://localhost:6006`` (``/v1/traces`` and the
    #: annotation endpoints are below it).
    endpoint: str
    project: str | None = Field(
        None,
        description="Phoenix project for every span (the openinference.project.name resource "
        "attribute); unset: the app's own, else Phoenix's default project.",
    )
    api_key: SecretStr | None = Field(
        None, description="Sent as `Authorization: Bearer ...` (e.g. `${PHOENIX_API_KEY}`)."
    )
    annotations: PhoenixAnnotationsConfig = Field(
        default_factory=PhoenixAnnotationsConfig,
        description="Span, document and session annotations.",
    )
    carrier_spans: bool = Field(
        False,
        description="Also send the EVALUATOR carrier spans of late results; their results "
        "become annotations on the evaluated span either way.",
    )

    def base_url(self) -> str:
        return self.endpoint.rstrip("/")

    def traces_url(self) -> str:
        return self.base_url() + "/v1/traces"


class OtlpGrpcExporterConfig(_ExporterBase):
    type: Literal["otlp_grpc"]
    #: ``host:port``, ``http://host:port`` (plaintext) or ``https://host:port`` (TLS).
    endpoint: str
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="gRPC metadata sent with every export (keys lower-cased); never logged.",
    )
    compression: Literal["gzip", "none"] = Field(
        "gzip", description="Compression of the export messages."
    )
    tls: ClientTLSConfig = Field(
        default_factory=ClientTLSConfig,
        description="TLS options; a bare host:port uses TLS when a CA or client "
        "certificate is set.",
    )
    #: Force plaintext even for a bare host:port (the default) — or TLS with false.
    insecure: bool | None = None

    @field_validator("endpoint")
    @classmethod
    def _target(cls, value: str) -> str:
        cls._split(value)
        return value

    @field_validator("headers")
    @classmethod
    def _lower_keys(cls, headers: dict[str, str]) -> dict[str, str]:
        return {k.lower(): v for k, v in headers.items()}

    @staticmethod
    def _split(value: str) -> tuple[str, bool | None]:
        if "://" in value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
                raise ValueError(
                    f"{value!r} is not host:port, http://host:port or https://host:port"
                )
            # gRPC has no userinfo: credentials go in headers, never into the target.
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"{host}:{parts.port}", parts.scheme == "https"
        split_host_port(value)
        return value, None

    def target(self) -> str:
        return self._split(self.endpoint)[0]

    def use_tls(self) -> bool:
        if self.insecure is not None:
            return not self.insecure
        scheme_tls = self._split(self.endpoint)[1]
        if scheme_tls is not None:
            return scheme_tls
        return self.tls.ca_file is not None or self.tls.cert_file is not None


class FileExporterConfig(_ExporterBase):
    """OTLP/JSON lines, one ExportTraceServiceRequest per line, size-based rotation."""

    type: Literal["file"]
    path: Path = Field(description="File the OTLP/JSON lines are appended to.")
    #: Rotate when the file would grow past this size.
    max_bytes: ByteSize = 100 * 1024 * 1024
    #: Rotated files kept (path.1 ... path.N); older ones are deleted.
    keep: int = Field(default=5, ge=0)
    concurrency: int = Field(default=1, ge=1, le=1)


ExporterConfig = Annotated[
    OtlpHttpExporterConfig | OtlpGrpcExporterConfig | FileExporterConfig | PhoenixExporterConfig,
    Field(discriminator="type"),
]


def _default_exporters() -> dict[str, ExporterConfig]:
    return {"file": FileExporterConfig(type="file", path=Path("ragtrace-spans.jsonl"))}


class AdminConfig(StrictModel):
    """The admin HTTP port: /metrics, /healthz, /readyz."""

    enabled: bool = Field(True, description="Serve the admin port.")
    endpoint: Annotated[str, BeforeValidator(str)] = Field(
        "127.0.0.1:8888", description="host:port to listen on (`0.0.0.0:8888` in a container)."
    )
    unhealthy_after: Duration = Field(
        300.0,
        description="`/healthz` answers 503 once a component has been in "
        "`recoverable_error` this long (a backend or Redis down); `permanent_error` "
        "answers 503 at once.",
    )

    _endpoint = field_validator("endpoint")(_check_listen_endpoint)


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Lowest level written."
    )
    format: Literal["auto", "json", "console"] = Field(
        "auto",
        description="`json`: one JSON object per line; `console`: for humans; `auto`: "
        "`console` when stderr is a terminal, else `json`.",
    )
    third_party_debug: bool = Field(
        False,
        description="Let `openai`, `httpx`, `httpcore` and `litellm` log below WARNING "
        "(and litellm's verbose mode).  A privacy risk: at debug level they write whole "
        "judge requests, i.e. user questions and retrieved documents.",
    )


class ShutdownConfig(StrictModel):
    """Deadlines of the graceful shutdown (SIGTERM, SIGINT)."""

    #: In-flight requests may finish within this after the receivers stop.
    receiver_grace: Duration = 5.0
    #: The trace processor may finish held traces within this; then they go out as is.
    processor_timeout: Duration = 10.0
    #: Exporters may deliver their queues within this; what remains is counted dropped.
    flush_timeout: Duration = 20.0
    #: Without a write-ahead log (``storage.directory``): spans undelivered at the
    #: deadline are appended here as OTLP/JSON lines (the file exporter's format);
    #: ``ragtrace-collector replay FILE --endpoint URL`` sends them again.
    spill_path: Path | None = None


class EvaluationConfig(StrictModel):
    """How much evaluation work is in flight, and its deadlines."""

    #: false: forward every trace unevaluated (a plain OTLP pass-through).
    enabled: bool = True
    #: Options applied to every metric under ``metrics:`` (e.g. ``threshold: 0.7``).
    metric_defaults: dict[str, Any] = Field(default_factory=dict)
    #: Traces evaluated concurrently (judge calls are limited by ``judge.concurrency``).
    workers: int = Field(32, ge=1, le=4096)
    #: Sampled traces waiting for a worker; beyond it they pass unevaluated (overload).
    queue_size: int = Field(1000, ge=1)
    #: One metric on one case.
    metric_timeout: Duration = Field(30.0, gt=0)
    #: All metrics of one trace; then the trace is forwarded with what is done.
    trace_timeout: Duration = Field(60.0, gt=0)
    #: A metric still running at ``trace_timeout``: ``drop`` records
    #: ``error="timeout"``; ``carrier`` lets it finish and sends its result on a
    #: carrier span.
    late_results: Literal["drop", "carrier"] = "drop"
    #: Worker processes that run the CPU part of evaluation (the metrics that need no
    #: judge or use the offline judge), so that it uses every core and never blocks
    #: the event loop; a metric running past ``metric_timeout`` has its worker killed
    #: and replaced.  Unset: the CPU count, at most 4.  ``0``: no worker processes;
    #: those metrics run in the collector process, on its event loop, where
    #: ``metric_timeout`` cannot interrupt them (for embedding and debugging only).
    processes: int | None = Field(None, ge=0, le=64)
    #: A case whose CPU metrics all need no judge (``id_*``, ``non_llm_*``) and whose
    #: texts total at most this many characters is scored in the collector process:
    #: shipping it to a worker would cost more than scoring it.  Otherwise all its CPU
    #: metrics go to one worker together.  ``0``: they always go to the workers.
    inline_max_chars: int = Field(8192, ge=0)
    #: Bound on the total characters of a case's retrieval context (and, separately,
    #: of its reference contexts).  See ``oversize``.
    max_context_chars: int = Field(100_000, ge=1)
    #: Bound on the characters of a case's expected output.
    max_expected_output_chars: int = Field(20_000, ge=1)
    #: Bound on the characters of a case's input, and of its actual output.
    max_output_chars: int = Field(20_000, ge=1)
    #: A case over a bound: ``skip`` its metrics (each result is skipped with the
    #: reason on the span), or ``truncate`` the inputs to the bounds and score them,
    #: the reason of every result saying what was cut.
    oversize: Literal["skip", "truncate"] = "skip"

    @property
    def worker_processes(self) -> int:
        """``processes``, with unset resolved to the CPU count (at most 4)."""
        return self.processes if self.processes is not None else _default_processes()


def _default_processes() -> int:
    """The CPU count this process may use, capped at 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class CollectorConfig(StrictModel):
    """The root of ``collector.yaml``."""

    receivers: ReceiversConfig = Field(
        default_factory=ReceiversConfig,
        description="Where spans come in: OTLP/gRPC and OTLP/HTTP, optional auth and TLS.",
    )
    assembly: AssemblyConfig = Field(
        default_factory=AssemblyConfig,
        description="Grouping spans into traces: when a trace is ready, memory bounds.",
    )
    exporters: dict[str, ExporterConfig] = Field(
        default_factory=_default_exporters,
        description="Where spans go, evaluated or not: exporters under names you choose, "
        "each of the kind set by its `type`.  At least one.",
    )
    #: The judge answering the LLM metrics: ``offline`` or a litellm model string.
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    metrics: Annotated[
        dict[MetricName, MetricOptions] | None, BeforeValidator(expand_include_defaults)
    ] = Field(
        None,
        description="Metric name (docs/metrics.md) -> options.  Unset: the default set "
        f"({', '.join(OFFLINE_METRICS)}).  Listing metrics replaces the default set; "
        "add `include_defaults: true` to add yours to it.",
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig,
        description="Evaluation workers, queue and deadlines; `enabled: false` makes the "
        "collector a plain OTLP pass-through.",
    )
    cases: CasesConfig = Field(
        default_factory=CasesConfig,
        description="Which spans become evaluation cases: ragtrace `@rag` spans, else the "
        "outermost CHAIN/AGENT/workflow span with a retriever below it (OpenInference, OTel "
        "GenAI, OpenLLMetry); matchers and attributes to override that.",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="Which traces are evaluated: a consistent hash of the trace id (the "
        "session id for conversations) against a rate, rules and budgets.",
    )
    #: Ground truth from a JSONL or YAML file, matched on the request input.
    reference_store: ReferenceStoreConfig | None = None
    session_store: SessionStoreConfig = Field(
        default_factory=SessionStoreConfig,
        description="Earlier turns of each conversation, for the turn metrics: in memory "
        "(one process) or in Redis (several replicas).",
    )
    enrichment: EnrichmentConfig = Field(
        default_factory=EnrichmentConfig,
        description="How results are written onto spans (flat keys, OpenInference, "
        "GenAI events) and on which span.",
    )
    alerts: AlertsConfig = Field(
        default_factory=AlertsConfig,
        description="The built-in drop detector: rules and notifiers.  May also be a "
        "bare list of rules.",
    )
    admin: AdminConfig = Field(
        default_factory=AdminConfig,
        description="The admin HTTP port: `/metrics` (Prometheus), `/healthz`, `/readyz`.",
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig, description="The collector's structlog output."
    )
    shutdown: ShutdownConfig = Field(
        default_factory=ShutdownConfig,
        description="Deadlines of the graceful shutdown on SIGTERM or SIGINT.",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description="The write-ahead log: with `directory` set, every accepted request is "
        "on disk before it is acknowledged, and replayed after a crash.",
    )

    @field_validator("exporters")
    @classmethod
    def _some_exporter(cls, value: dict[str, ExporterConfig]) -> dict[str, ExporterConfig]:
        if not value:
            raise ValueError("at least one exporter is required (spans must go somewhere)")
        return value

    @model_validator(mode="after")
    def _phoenix_needs_flat_keys(self) -> CollectorConfig:
        for name, exporter in self.exporters.items():
            if isinstance(exporter, PhoenixExporterConfig) and not self.enrichment.flat:
                raise ValueError(
                    f"exporters.{name}: the phoenix exporter reads the results from the "
                    "ragtrace.eval.* attributes, which enrichment.flat: false turns off"
                )
        return self

    def secrets(self) -> list[str]:
        """Values that must never appear in logs: tokens, header values, the judge's API
        key, and the credentials inside every URL the config holds."""
        found = [t.get_secret_value() for t in self.receivers.auth.bearer_tokens]
        urls: list[str | None] = [self.session_store.url, self.judge.api_base]
        for exporter in self.exporters.values():
            if isinstance(exporter, _HttpExporterBase | OtlpGrpcExporterConfig):
                found += list(exporter.headers.values())
                urls.append(exporter.endpoint)
            if isinstance(exporter, PhoenixExporterConfig) and exporter.api_key is not None:
                found.append(exporter.api_key.get_secret_value())
        for notifier in (self.alerts.webhook, self.alerts.alertmanager):
            if notifier is not None:
                found += list(notifier.headers.values())
                urls += [notifier.url, getattr(notifier, "generator_url", None)]
        try:
            found.append(self.judge.api_key() or "")
        except ValueError:
            pass  # an unset key variable is reported when the judge is built
        for url in urls:
            found += url_secrets(url)
        return [s for s in found if s]


# ------------------------------------------------------------ env interpolation
_ENV_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


_Loc = tuple[str | int, ...]


def _interpolate(
    value: Any, env: Mapping[str, str], path: _Loc, problems: list[tuple[_Loc, str]]
) -> Any:
    """``value`` with every ``${...}`` replaced; each bad reference (every one, not
    only the first) is added to ``problems`` and left as written."""
    if isinstance(value, str):
        return _interpolate_str(value, env, path, problems)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, (*path, str(k)), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*path, i), problems) for i, v in enumerate(value)]
    return value


def _interpolate_str(
    text: str, env: Mapping[str, str], path: _Loc, problems: list[tuple[_Loc, str]]
) -> str:
    if "${" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name is None:
            problems.append(
                (
                    path,
                    f"{_dotted(path)}: malformed ${{...}} reference in {text!r} "
                    "(use ${NAME} or ${NAME:-default}; write $${ for a literal ${)",
                )
            )
            return m.group(0)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                problems.append(
                    (
                        path,
                        f"{_dotted(path)}: environment variable {name} is not set "
                        f"(write ${{{name}:-default}} to give a default)",
                    )
                )
                return m.group(0)
            return default
        return value

    return _ENV_RE.sub(sub, text)


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


# ------------------------------------------------------------------ validation
def parse_config(
    data: Any, *, env: Mapping[str, str] | None = None, source: str = "config"
) -> CollectorConfig:
    """Validate already-parsed YAML data (``None`` means defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"(top level): expected a mapping of sections, got {type(data).__name__}"], source
        )
    env_problems: list[tuple[_Loc, str]] = []
    data = _interpolate(data, os.environ if env is None else env, (), env_problems)
    problems = [text for _loc, text in env_problems]
    # A key whose ${VAR} is unset is not validated as well: its error would be noise.
    unset = [loc for loc, _text in env_problems]
    try:
        config = CollectorConfig.model_validate(data)
    except ValidationError as exc:
        described = _describe(exc, data)
        problems += [text for loc, text in described if not any(_under(loc, u) for u in unset)]
        failed = {str(loc[0]) for loc, _text in described if loc}
    else:
        if not problems:
            return config
        failed = set()
    failed |= {str(loc[0]) for loc in unset if loc}
    raise ConfigError(
        problems,
        source,
        partial=_partial_config(data, failed),
        failed_sections=frozenset(failed),
    ) from None


def _under(loc: Sequence[str | int], prefix: Sequence[str | int]) -> bool:
    return tuple(loc[: len(prefix)]) == tuple(prefix)


def _partial_config(data: dict[str, Any], failed: set[str]) -> CollectorConfig | None:
    """The config of the valid top-level sections (the failed ones at their defaults)."""
    valid = {k: v for k, v in data.items() if k not in failed and k in CollectorConfig.model_fields}
    evaluation = data.get("evaluation")
    if "evaluation" in failed and isinstance(evaluation, dict):
        enabled = evaluation.get("enabled")
        if isinstance(enabled, bool):  # whether serve would build the evaluation stage
            valid["evaluation"] = {"enabled": enabled}
    try:
        return CollectorConfig.model_validate(valid)
    except ValidationError:
        return None


def load_config(
    path: Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CollectorConfig:
    """Read, interpolate and validate ``path``; ``None`` gives the defaults.

    ``overrides`` maps dotted keys (``receivers.http.endpoint``) to values that
    replace the file's (``serve --set``, ``--http-endpoint``...)."""
    if path is None:
        return parse_config(_override({}, overrides), env=env, source="(defaults)")
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(["file not found"], source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read the file: {exc}"], source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"YAML syntax error at {where}{problem}"], source) from None
    if overrides and (data is None or isinstance(data, dict)):
        data = _override(data or {}, overrides)
    return parse_config(data, env=env, source=source)


def _override(data: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``data`` with each dotted key of ``overrides`` set (sections made as needed)."""
    for dotted, value in (overrides or {}).items():
        *parents, last = dotted.split(".")
        node = data
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError([f"{dotted}: cannot set it, {where} is not a section"])
            node = child
        node[last] = value
    return data


def _describe(exc: ValidationError, data: Any) -> list[tuple[list[str | int], str]]:
    described: list[tuple[list[str | int], str]] = []
    for error in exc.errors(include_url=False):
        loc = _clean_loc(error["loc"], data)
        problems: list[str] = []
        _describe_one(error, loc, data, problems)
        described += [(loc, p) for p in problems]
    return described


#: Pydantic error types, in plain words: what the key expects.
_EXPECTED: dict[str, str] = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text (a string)",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "list_type": "a list",
    "path_type": "a file path (text)",
}
#: Keys whose values are never echoed in an error (they may hold credentials).
_SECRET_KEY = re.compile(r"token|key|secret|password|header|auth", re.IGNORECASE)


def _shown(value: Any, loc: Sequence[str | int]) -> str:
    """The offending value, for an error line: short, and never a secret."""
    kind = {dict: "a mapping", list: "a list", type(None): "nothing (null)"}.get(type(value))
    if kind is not None:
        return kind
    if any(isinstance(p, str) and _SECRET_KEY.search(p) for p in loc):
        return f"a value of type {type(value).__name__} (not shown: it may be a secret)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_one(error: Any, loc: list[str | int], data: Any, problems: list[str]) -> None:
    key = _dotted(loc)
    if error["type"] == "extra_forbidden":
        problems.append(f"{key}: unknown key{_hint(loc, data)}")
    elif error["type"] == "missing":
        problems.append(f"{key}: required key is missing")
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        ctx = error.get("ctx", {})
        tags = _tags_at(loc)
        expected = ", ".join(repr(t) for t in tags)
        field = str(ctx.get("discriminator", "type")).strip("'")
        if error["type"] == "union_tag_not_found":
            problems.append(f"{key}.{field}: required key is missing (one of: {expected})")
        else:
            tag = str(ctx.get("tag", ""))
            close = difflib.get_close_matches(tag, tags, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"one of: {expected}"
            problems.append(f"{key}.{field}: unknown value {tag!r} ({hint})")
    elif error["type"] in _EXPECTED:
        expected = _EXPECTED[error["type"]]
        problems.append(f"{key}: expected {expected}, got {_shown(error['input'], loc)}")
    elif error["type"] == "literal_error":
        choices = error.get("ctx", {}).get("expected", "")
        problems.append(f"{key}: expected {choices}, got {_shown(error['input'], loc)}")
    else:
        msg = error["msg"].removeprefix("Value error, ")
        if error["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            msg += f", got {_shown(error['input'], loc)}"
        problems.append(f"{key}: {msg}")


def _clean_loc(loc: tuple[str | int, ...], data: Any) -> list[str | int]:
    """Drop the union-tag elements pydantic inserts for discriminated unions."""
    out: list[str | int] = []
    node = data
    model: Any = CollectorConfig
    for part in loc:
        if part == "[key]":  # a dict key failed its own validation (a metric name)
            continue
        choices = _union_members(model)
        if choices and isinstance(part, str) and part in {_tag_of(c) for c in choices}:
            model = next(c for c in choices if _tag_of(c) == part)
            continue
        out.append(part)
        model = _child_type(model, part)
        node = node.get(part) if isinstance(node, dict) else None
    return out


def _tags_at(loc: list[str | int]) -> list[str]:
    model: Any = CollectorConfig
    for part in loc:
        model = _child_type(model, part)
    return [t for t in (_tag_of(m) for m in _union_members(model)) if t]


def _hint(loc: list[str | int], data: Any) -> str:
    """ ", did you mean 'x'?" for a misspelt key, from the fields of its model."""
    *parent, bad = loc
    if not isinstance(bad, str):
        return ""
    model: Any = CollectorConfig
    node = data
    for part in parent:
        model = _child_type(model, part)
        node = node.get(part) if isinstance(node, dict) else None
        choices = _union_members(model)
        if choices:
            tag = node.get("type") if isinstance(node, dict) else None
            picked = [c for c in choices if _tag_of(c) == tag] or choices
            model = picked[0] if len(picked) == 1 else picked
    names: set[str] = set()
    for m in model if isinstance(model, list) else [model]:
        if isinstance(m, type) and issubclass(m, BaseModel):
            names |= set(m.model_fields)
    close = difflib.get_close_matches(bad, sorted(names), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    if names:
        return f" (expected one of: {', '.join(sorted(names))})"
    return ""


def _unwrap(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _child_type(model: Any, part: str | int) -> Any:
    tp = _unwrap(model)
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
        info = tp.model_fields.get(part)
        if info is None:
            return None
        hints = typing.get_type_hints(tp, include_extras=True)
        return _unwrap(hints.get(part, info.annotation))
    origin = get_origin(tp)
    if origin in (dict, Mapping):
        return _unwrap(get_args(tp)[1])
    if origin in (list, Sequence):
        return _unwrap(get_args(tp)[0])
    return tp if _union_members(tp) else None


def _union_members(tp: Any) -> list[type[BaseModel]]:
    tp = _unwrap(tp)
    if get_origin(tp) in (Union, types.UnionType):
        members = [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
        if members and all(_tag_of(m) for m in members):
            return members
    return []


def _tag_of(model: type[BaseModel]) -> str | None:
    info = model.model_fields.get("type")
    if info is None:
        return None
    args = get_args(info.annotation)
    return str(args[0]) if args else None
