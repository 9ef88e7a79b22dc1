"""The ``admin`` section: the admin port (``/metrics``, ``/healthz``, ``/readyz``)."""

from __future__ import annotations

from pydantic import Field

from ragtrace_collector.configbase import Duration, ListenEndpoint, StrictModel

__all__ = ["AdminConfig"]


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
