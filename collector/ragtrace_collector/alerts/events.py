"""What the detector tells its notifiers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["AlertEvent", "iso8601"]


def iso8601(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as Alertmanager and most webhooks expect."""
    return (
        datetime.fromtimestamp(epoch, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One notification: a rule started firing for a service, is still firing (a
    ``repeat``), or resolved.

    Scores are in score points.  ``drop`` is the observed ``baseline - window_mean``;
    ``drop_threshold`` is the rule's drop in score points (a relative drop already
    multiplied by the baseline).  Times are Unix epoch seconds.
    """

    status: Literal["firing", "resolved"]
    rule: str
    metric: str
    service: str
    window_seconds: float
    window_mean: float
    sample_count: int
    baseline: float
    baseline_kind: Literal["fixed", "trailing"]
    baseline_window_seconds: float | None
    baseline_sample_count: int | None
    drop: float
    drop_threshold: float
    p_value: float
    confidence: float
    example_trace_ids: tuple[str, ...]
    started_at: float
    evaluated_at: float
    ended_at: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    repeat: bool = False

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the alert: (rule, service)."""
        return (self.rule, self.service)

    def describe(self) -> str:
        """One human sentence, for logs and annotations."""
        if self.baseline_kind == "trailing" and self.baseline_window_seconds is not None:
            against = f"its trailing {self.baseline_window_seconds:g}s baseline"
        else:
            against = "its fixed baseline"
        verb = "is" if self.status == "firing" else "was"
        return (
            f"{self.metric} for service {self.service} {verb} {self.window_mean:.3f} over the"
            f" last {self.window_seconds:g}s ({self.sample_count} scored results), {self.drop:.3f}"
            f" below {against} {self.baseline:.3f} (rule {self.rule}: drop >= "
            f"{self.drop_threshold:.3f}, p={self.p_value:.2g})"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the webhook payload's body fields)."""
        return {
            "status": self.status,
            "repeat": self.repeat,
            "rule": self.rule,
            "metric": self.metric,
            "service": self.service,
            "window_seconds": self.window_seconds,
            "window_mean": self.window_mean,
            "sample_count": self.sample_count,
            "baseline": self.baseline,
            "baseline_kind": self.baseline_kind,
            "baseline_window_seconds": self.baseline_window_seconds,
            "baseline_sample_count": self.baseline_sample_count,
            "drop": self.drop,
            "drop_threshold": self.drop_threshold,
            "p_value": self.p_value,
            "confidence": self.confidence,
            "example_trace_ids": list(self.example_trace_ids),
            "labels": dict(self.labels),
            "started_at": iso8601(self.started_at),
            "ended_at": iso8601(self.ended_at) if self.ended_at is not None else None,
            "evaluated_at": iso8601(self.evaluated_at),
            "summary": self.describe(),
        }
