"""What the detector tells its notifiers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["AlertEvent", "SegmentMean", "iso8601", "segment_text"]


def iso8601(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as Alertmanager and most webhooks expect."""
    return (
        datetime.fromtimestamp(epoch, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def segment_text(segments: Mapping[str, str]) -> str:
    """``app.index_version=v2`` (several: comma-separated, in the rule's key order)."""
    return ", ".join(f"{key}={value}" for key, value in segments.items())


@dataclass(frozen=True, slots=True)
class SegmentMean:
    """A sibling segment's figures at the same evaluation: same rule and service, other
    segment values.  ``baseline`` is None without one (a canary rule, or too few
    samples); ``dropped`` says whether it is itself below its baseline by the drop."""

    segments: Mapping[str, str]
    window_mean: float
    sample_count: int
    baseline: float | None = None
    dropped: bool = False

    def describe(self) -> str:
        where = segment_text(self.segments)
        if self.dropped and self.baseline is not None:
            return f"{where} is at {self.window_mean:.2f} against its {self.baseline:.2f} baseline"
        return f"{where} holds at {self.window_mean:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "segments": dict(self.segments),
            "window_mean": self.window_mean,
            "sample_count": self.sample_count,
            "baseline": self.baseline,
            "dropped": self.dropped,
        }


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One notification: a rule started firing for a service, is still firing (a
    ``repeat``), or resolved.

    Scores are in score points.  ``drop`` is the observed ``baseline - window_mean``;
    ``drop_threshold`` is the rule's drop in score points (a relative drop already
    multiplied by the baseline).  Times are Unix epoch seconds.

    ``segments`` are the segment values of the series that dropped (a rule's
    ``group_by``; a canary rule's candidate), ``siblings`` the other series of the same
    rule and service at the same evaluation.  For a canary rule (``kind="canary"``,
    ``baseline_kind="segment"``) the baseline is the ``against`` side's window mean
    and ``baseline_sample_count`` its count.
    """

    status: Literal["firing", "resolved"]
    rule: str
    metric: str
    service: str
    window_seconds: float
    window_mean: float
    sample_count: int
    baseline: float
    baseline_kind: Literal["fixed", "trailing", "segment"]
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
    kind: Literal["drop", "canary"] = "drop"
    segments: Mapping[str, str] = field(default_factory=dict)
    siblings: tuple[SegmentMean, ...] = ()
    #: Canary rules: the side compared with (``deployment.environment=production``, or
    #: ``service.version!=2.4.0`` for every other value).
    against: str | None = None
    #: Resolved events: why (``no results in the last 900s``, ``the drop 0.031 is below
    #: 0.050``).
    reason: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of the alert: (rule, service, segments)."""
        return (self.rule, self.service, segment_text(self.segments))

    def siblings_text(self) -> str:
        """``app.index_version=v1 holds at 0.82; ...`` ("" without siblings)."""
        return "; ".join(s.describe() for s in self.siblings)

    def _vs_threshold(self, drop: str = "drop") -> str:
        """``drop >= 0.100`` while a firing drop is at least the threshold, ``drop <
        0.100`` below it.  A resolved alert never claims the threshold is met: when its
        last figures still show the drop (it resolved because its results stopped, or on
        the sequential test's evidence), ``drop threshold 0.100`` (``drop 0.420,
        threshold 0.100`` when ``drop`` carries the figure)."""
        met = self.drop >= self.drop_threshold - 1e-12
        if met and self.status == "resolved":
            sep = " " if drop == "drop" else ", "
            return f"{drop}{sep}threshold {self.drop_threshold:.3f}"
        return f"{drop} {'>=' if met else '<'} {self.drop_threshold:.3f}"

    def describe(self) -> str:
        """One human sentence, for logs and annotations."""
        if self.kind == "canary":
            text = self._describe_canary()
        elif self.segments:
            text = self._describe_segment()
        else:
            text = self._describe_plain()
        if self.status == "resolved" and self.reason:
            text += f"; resolved: {self.reason}"
        return text

    def _describe_plain(self) -> str:
        if self.baseline_kind == "trailing" and self.baseline_window_seconds is not None:
            against = f"its trailing {self.baseline_window_seconds:g}s baseline"
        else:
            against = "its fixed baseline"
        verb = "is" if self.status == "firing" else "was"
        return (
            f"{self.metric} for service {self.service} {verb} {self.window_mean:.3f} over the"
            f" last {self.window_seconds:g}s ({self.sample_count} scored results), {self.drop:.3f}"
            f" below {against} {self.baseline:.3f} (rule {self.rule}:"
            f" {self._vs_threshold()}, p={self.p_value:.2g})"
        )

    def _describe_segment(self) -> str:
        verb = "is" if self.status == "firing" else "was"
        head = (
            f"{self.metric} for service {self.service}, {segment_text(self.segments)} {verb}"
            f" {self.window_mean:.2f} against its {self.baseline:.2f} baseline"
        )
        siblings = self.siblings_text()
        return (
            head
            + (f"; {siblings}" if siblings else "")
            + f" (rule {self.rule}: {self.sample_count} scored results over the last"
            f" {self.window_seconds:g}s, {self._vs_threshold(f'drop {self.drop:.3f}')},"
            f" p={self.p_value:.2g})"
        )

    def _describe_canary(self) -> str:
        verb = "is" if self.status == "firing" else "was"
        return (
            f"{self.metric} for service {self.service}: {segment_text(self.segments)} {verb}"
            f" {self.window_mean:.2f} ({self.sample_count} scored results) against"
            f" {self.against} at {self.baseline:.2f} ({self.baseline_sample_count} scored"
            f" results) over the last {self.window_seconds:g}s, {self.drop:.3f} lower (rule"
            f" {self.rule}: {self._vs_threshold()}, p={self.p_value:.2g})"
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
            "kind": self.kind,
            "segments": dict(self.segments),
            "siblings": [s.to_dict() for s in self.siblings],
            "against": self.against,
            "reason": self.reason,
            "summary": self.describe(),
        }
