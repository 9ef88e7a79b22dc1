"""The sections of the process itself: the ``admin`` port, ``logging`` and the
``shutdown`` deadlines."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from ragtrace_collector.configbase import Duration, ListenEndpoint, StrictModel

__all__ = ["AdminConfig", "LoggingConfig", "ShutdownConfig"]


class AdminConfig(StrictModel):
    """The admin HTTP port: /metrics, /healthz, /readyz."""

    enabled: bool = Field(True, description="Serve the admin port.")
    endpoint: ListenEndpoint = Field(
        "127.0.0.1:8888", description="host:port to listen on (`0.0.0.0:8888` in a container)."
    )
    unhealthy_after: Duration = Field(
        300.0,
        description="`/healthz` answers 503 once a component has been in "
        "`recoverable_error` this long (a backend or Redis down); `permanent_error` "
        "answers 503 at once.",
    )


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
