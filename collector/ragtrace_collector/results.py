"""Metric results and judge cost accounting."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Cost", "MetricResult", "trusted"]

M = TypeVar("M", bound=BaseModel)

_new = object.__new__
_set = object.__setattr__


def trusted(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of ``cls`` from ``values`` that are already valid, without validation.

    For values this package computed itself (a metric's result, an item's list of
    results): pydantic's validation of them costs several µs per object, which a batch
    of 10k cases pays for nothing.  ``values`` must give every field of ``cls``, with
    values of the declared types (the tests compare with a validated instance).
    ``cls`` must have no private attributes and no extra fields.
    """
    obj = _new(cls)
    _set(obj, "__dict__", values)
    # Every field is set, so one shared set serves all instances: pydantic only ever
    # adds a field name to it (on assignment), which changes nothing here.
    _set(obj, "__pydantic_fields_set__", _FIELD_SETS.get(cls) or _all_fields(cls))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


_FIELD_SETS: dict[type[BaseModel], set[str]] = {}


def _all_fields(cls: type[BaseModel]) -> set[str]:
    fields = _FIELD_SETS.get(cls)
    if fields is None:
        fields = _FIELD_SETS[cls] = set(cls.model_fields)
    return fields


class Cost(BaseModel):
    """What a result cost.  ``usd`` is None when any contributing call had no known price.

    Immutable: costs add up into new values (``a + b``), so results can share one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = 0.0

    @classmethod
    def none(cls) -> Cost:
        """The zero cost (of a result that called no judge), one shared instance."""
        return _NO_COST

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


_NO_COST = Cost()
