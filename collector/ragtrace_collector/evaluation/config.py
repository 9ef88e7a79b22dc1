"""The ``evaluation`` section: how much evaluation work is in flight, where it runs,
its deadlines and the size bounds of a case."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field

from ragtrace_collector.configbase import Duration, StrictModel

__all__ = ["EvaluationConfig"]


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
