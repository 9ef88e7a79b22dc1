"""The ``assembly`` section: when a trace is ready, and how much may be buffered."""

from __future__ import annotations

from pydantic import Field, model_validator

from ragtrace_collector.configbase import Duration, StrictModel

__all__ = ["AssemblyConfig"]


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
