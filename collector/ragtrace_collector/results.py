"""Metric results and judge cost accounting."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Cost", "MetricResult"]


class Cost(BaseModel):
    """What a result cost.  ``usd`` is None when any contributing call had no known price."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = 0.0

    def __add__(self, other: Cost) -> Cost:
        usd = None if self.usd is None or other.usd is None else self.usd + other.usd
        return Cost(
            calls=self.calls + other.calls,
            cached_calls=self.cached_calls + other.cached_calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            usd=usd,
        )


class MetricResult(BaseModel):
    """The outcome of one metric on one case (or one conversation window).

    ``score`` is None exactly when the metric was skipped (``skipped`` set, with the
    reason) or errored (``error`` set).  ``passed`` is None in those cases too: a
    skipped metric must not pull an average down or fire an alert.
    """

    model_config = ConfigDict(extra="forbid")

    metric: str
    score: float | None
    reason: str = ""
    threshold: float = 0.5
    strict: bool = False
    passed: bool | None = None
    skipped: bool = False
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    cost: Cost = Field(default_factory=Cost)
    #: The judge that produced it ("offline", a litellm model string, or "none").
    judge: str = "none"
    heuristic: bool = False

    @property
    def outcome(self) -> str:
        """passed | failed | skipped | error (the ``outcome`` label on /metrics)."""
        if self.error is not None:
            return "error"
        if self.skipped or self.score is None:
            return "skipped"
        return "passed" if self.passed else "failed"
