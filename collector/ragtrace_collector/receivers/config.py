"""The ``receivers`` section: the OTLP/gRPC and OTLP/HTTP listeners, their TLS and
bearer-token authentication."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from ragtrace_collector.configbase import (
    ByteSize,
    Duration,
    ListenEndpoint,
    StrictModel,
    check_file,
)

__all__ = [
    "AuthConfig",
    "GrpcReceiverConfig",
    "HttpReceiverConfig",
    "ReceiversConfig",
    "ServerTLSConfig",
]


class ServerTLSConfig(StrictModel):
    """TLS for a receiver: a certificate chain and its private key (PEM files)."""

    cert_file: Path = Field(description="PEM file of the server certificate (chain).")
    key_file: Path = Field(description="PEM file of the certificate's private key.")
    #: When set, clients must present a certificate signed by this CA (mTLS).
    client_ca_file: Path | None = None

    _files = field_validator("cert_file", "key_file", "client_ca_file")(check_file)


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
    endpoint: ListenEndpoint = Field(
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


class HttpReceiverConfig(StrictModel):
    enabled: bool = Field(True, description="Serve OTLP/HTTP (`POST /v1/traces`).")
    endpoint: ListenEndpoint = Field(
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
