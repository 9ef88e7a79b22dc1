"""The ``exporters`` section: one entry per exporter, its kind set by ``type``
(``otlp_http``, ``otlp_grpc``, ``phoenix``, ``file``), each with its queue and retry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from ragtrace_collector.configbase import (
    ByteSize,
    Duration,
    StrictModel,
    check_file,
    check_one_auth_source,
    split_host_port,
)

__all__ = [
    "ClientTLSConfig",
    "ExporterConfig",
    "FileExporterConfig",
    "OtlpGrpcExporterConfig",
    "OtlpHttpExporterConfig",
    "PhoenixAnnotationsConfig",
    "PhoenixExporterConfig",
    "QueueConfig",
    "RetryConfig",
    "default_exporters",
]


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

    _files = field_validator("ca_file", "cert_file", "key_file")(check_file)

    @model_validator(mode="after")
    def _pair(self) -> ClientTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
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

    def secrets(self) -> list[str]:
        """Values of this exporter's config that must never be logged."""
        return []

    def secret_url(self) -> str | None:
        """The URL whose credentials (user info, query tokens) must never be logged."""
        return None


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

    def secrets(self) -> list[str]:
        return list(self.headers.values())

    def secret_url(self) -> str | None:
        return self.endpoint

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

    def secrets(self) -> list[str]:
        found = super().secrets()
        if self.api_key is not None:
            found.append(self.api_key.get_secret_value())
        return found

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

    def secrets(self) -> list[str]:
        return list(self.headers.values())

    def secret_url(self) -> str | None:
        return self.endpoint

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


def default_exporters() -> dict[str, ExporterConfig]:
    return {"file": FileExporterConfig(type="file", path=Path("ragtrace-spans.jsonl"))}
