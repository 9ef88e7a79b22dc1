"""Configuration of the drop detector: the ``alerts:`` section of ``collector.yaml``.

Example::

    alerts:
      evaluation_interval: 30s
      rules:
        - name: recall-drop
          metric: contextual_recall
          service: shop            # optional; without it every service is watched
          window: 15m              # the current window
          baseline: 24h            # trailing window before the current one, or a number
          drop: 0.1                # absolute; "10%" is relative to the baseline
          min_samples: 30          # scored results needed in the window (and baseline)
          for: 5m                  # how long the drop must hold before firing
          test: sequential         # evidence builds up; or "window" (one test per evaluation)
          false_alarm_interval: 30d  # sequential: at most one false page per 30 days
          hysteresis: 0.05         # window: resolve once the drop is below drop - hysteresis
          confidence: 0.95         # window: one-sided test (Welch's t, or one-sample t)
          test_margin: true        # window: the test asks "is the drop >= drop real?"
      webhook:
        url: https://hooks.example.com/ragtrace
      alertmanager:
        url: http://alertmanager:9093
      log: {enabled: true}

``alerts:`` may also be a bare list of rules.  Durations are numbers of seconds or
strings such as ``"500ms"``, ``"30s"``, ``"15m"``, ``"24h"``, ``"1d"`` or ``"1h30m"``.
Unknown keys are configuration errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from ragtrace_collector.configbase import check_one_auth_source
from ragtrace_collector.units import Duration, format_duration, parse_duration

__all__ = [
    "FEEDBACK_PREFIX",
    "AlertmanagerConfig",
    "AlertsConfig",
    "CanaryRule",
    "Drop",
    "DropRule",
    "Duration",
    "FixedBaseline",
    "LogNotifierConfig",
    "Rule",
    "TrailingBaseline",
    "WebhookConfig",
    "format_duration",
    "parse_duration",
]


class FixedBaseline(BaseModel):
    """A fixed expected score: the window is tested with a one-sample one-sided t-test."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed"] = "fixed"
    value: float = Field(allow_inf_nan=False, description="The expected mean score.")


class TrailingBaseline(BaseModel):
    """The scores of the ``window`` that ends where the current window starts.

    The current window is excluded, so a drop does not drag its own baseline down.
    The two windows are compared with Welch's one-sided t-test.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trailing"] = "trailing"
    window: Duration = Field(
        gt=0, description="Length of the baseline window, ending where the window starts."
    )
    #: Scored results the baseline needs before the rule can fire (default: the
    #: rule's ``min_samples``).
    min_samples: int | None = Field(default=None, ge=2)


class Drop(BaseModel):
    """How far below the baseline the window's mean must be.

    ``absolute``: in score points (``0.1``).  ``relative``: a fraction of the baseline
    (``"10%"`` or ``{relative: 0.1}``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["absolute", "relative"] = Field(
        "absolute",
        description="`absolute`: in score points; `relative`: a fraction of the baseline.",
    )
    value: float = Field(
        ge=0, allow_inf_nan=False, description="The drop (0.1 = 10 points, or 10%)."
    )

    @model_validator(mode="after")
    def _check(self) -> Drop:
        if self.kind == "relative" and self.value >= 1:
            raise ValueError("a relative drop must be below 100%")
        return self

    def amount(self, baseline: float) -> float:
        """The drop in score points for a given baseline value."""
        return self.value if self.kind == "absolute" else self.value * abs(baseline)


def _parse_percent(text: str) -> float | None:
    text = text.strip()
    if text.endswith("%"):
        return float(text[:-1].strip()) / 100.0
    return None


def _drop_input(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"not a drop: {value!r}")
    if isinstance(value, int | float):
        return {"kind": "absolute", "value": value}
    if isinstance(value, str):
        try:
            pct = _parse_percent(value)
            if pct is not None:
                return {"kind": "relative", "value": pct}
            return {"kind": "absolute", "value": float(value)}
        except ValueError:
            raise ValueError(
                f"not a drop: {value!r} (use 0.1 for absolute, '10%' for relative)"
            ) from None
    if isinstance(value, Mapping) and "kind" not in value:
        keys = set(value)
        if keys == {"absolute"}:
            return {"kind": "absolute", "value": value["absolute"]}
        if keys == {"relative"}:
            return {"kind": "relative", "value": value["relative"]}
    return value


def _baseline_input(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"not a baseline: {value!r}")
    if isinstance(value, int | float):
        return {"kind": "fixed", "value": value}
    if isinstance(value, str):
        try:
            return {"kind": "fixed", "value": float(value)}
        except ValueError:
            return {"kind": "trailing", "window": parse_duration(value)}
    if isinstance(value, Mapping) and "kind" not in value:
        if "value" in value:
            return {"kind": "fixed", **value}
        if "window" in value:
            return {"kind": "trailing", **value}
    return value


#: A rule's ``metric`` that starts with this watches user feedback of the name after
#: it (``feedback:user_feedback``): each feedback's value (a thumbs-up 1, a thumbs-down
#: 0), so a rise in negative feedback is a drop in its mean.
FEEDBACK_PREFIX: Final = "feedback:"


def feedback_series(name: str) -> str:
    """The ``metric`` a rule names to watch the feedback called ``name``."""
    return FEEDBACK_PREFIX + name


def feedback_name(metric: str) -> str | None:
    """The feedback name a rule's ``metric`` watches, or None for a metric."""
    return metric[len(FEEDBACK_PREFIX) :] if metric.startswith(FEEDBACK_PREFIX) else None


class _Rule(BaseModel):
    """What every rule kind shares: the metric, the window, the drop and the test."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: Unique rule name (default: ``<metric>_drop`` or ``<metric>_drop_<service>``;
    #: ``<metric>_canary...`` for a canary rule).
    name: str = Field(min_length=1)
    metric: str = Field(
        min_length=1,
        description="The metric watched (a name of docs/metrics.md), or `feedback:NAME` for "
        "the user feedback called NAME (a rise in negative feedback is a drop in its mean).",
    )
    service: str | None = Field(
        None, description="Watch this service only; unset: each service separately."
    )
    window: Duration = Field(
        default=900.0, gt=0, description="The current window whose mean is tested."
    )
    drop: Annotated[Drop, BeforeValidator(_drop_input)] = Field(
        default_factory=lambda: Drop(kind="absolute", value=0.1),
        description='The drop that counts: `0.1` (score points) or `"10%"` (relative), '
        "or a mapping.",
    )
    min_samples: int = Field(
        default=30, ge=2, description="Scored results the window needs before it can fire."
    )
    for_: Duration = Field(
        default=300.0,
        alias="for",
        ge=0,
        description="How long the drop must hold before the alert fires.",
    )
    #: ``test: window``: in the units of ``drop`` (score points, or a fraction of the
    #: baseline for a relative drop); default half the drop.  The sequential test
    #: resolves on its own evidence instead.
    hysteresis: float | None = None
    #: ``test: window``: confidence of the one-sided test (the p-value must be <= 1 -
    #: confidence).  With ``test: sequential`` a notification's p-value is that of the
    #: window's one-sided test against no drop, for information.
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    #: Test H1 "the true drop exceeds ``drop``" (true, the default) rather than only
    #: "the window is below the baseline" (false: faster, but noise fires more often).
    #: Used by ``test: window`` only.
    test_margin: bool = True
    test: Literal["sequential", "window"] = Field(
        "sequential",
        description="`sequential` (the default): evidence that the mean runs `drop` below "
        "the reference builds up step by step (a CUSUM of likelihood ratios) and the rule "
        "fires when it reaches the level `false_alarm_interval` sets; `window`: the one-sided "
        "test of the window at `confidence`, re-run at every evaluation (pages more often "
        "on unchanged traffic, see docs/alerting.md).",
    )
    false_alarm_interval: Duration = Field(
        default=30 * 86400.0,
        gt=0,
        description="`test: sequential`: on unchanged traffic, at most one false page per this "
        "long for the rule in a service, whatever the number of segment values compared "
        "(longer: fewer false pages, slower pages).",
    )
    #: Extra labels for notifications (``severity`` defaults to ``warning``).
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("hysteresis", mode="before")
    @classmethod
    def _hysteresis_input(cls, value: Any) -> Any:
        if isinstance(value, str):
            pct = _parse_percent(value)
            return pct if pct is not None else float(value)
        return value

    @model_validator(mode="after")
    def _check_hysteresis(self) -> _Rule:
        if self.hysteresis is not None:
            if not math.isfinite(self.hysteresis) or self.hysteresis < 0:
                raise ValueError(f"rule {self.name!r}: hysteresis must be >= 0")
            if self.hysteresis > self.drop.value:
                raise ValueError(
                    f"rule {self.name!r}: hysteresis ({self.hysteresis}) cannot exceed the drop"
                    f" ({self.drop.value}); it is in the same units"
                )
        return self

    @model_validator(mode="after")
    def _check_sequential(self) -> _Rule:
        if self.test == "sequential" and self.drop.value == 0:
            raise ValueError(
                f"rule {self.name!r}: `test: sequential` looks for a drop of `drop`, which"
                " cannot be 0 (use `test: window` to test against no drop at all)"
            )
        return self

    @property
    def hysteresis_value(self) -> float:
        """Hysteresis in the units of ``drop`` (default: half the drop)."""
        return self.drop.value / 2 if self.hysteresis is None else self.hysteresis

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "warning")

    @property
    def segment_keys(self) -> tuple[str, ...]:
        """The ``segments:`` keys this rule needs (checked against the config)."""
        return ()


class DropRule(_Rule):
    """One drop rule: a window against its own past (or a fixed value).  The detector
    evaluates it separately for every service it sees (or only for ``service``), and
    within a service for every combination of the ``group_by`` segment values, so a
    drop in one service or one segment is never averaged away."""

    kind: Literal["drop"] = Field("drop", description="`drop` (the default) or `canary`.")
    baseline: Annotated[
        FixedBaseline | TrailingBaseline,
        Field(discriminator="kind"),
        BeforeValidator(_baseline_input),
    ] = Field(
        default_factory=lambda: TrailingBaseline(window=86400.0),
        description="What the window is compared with: a number (a fixed expected score) "
        "or a duration (a trailing window before the current one), or a mapping.",
    )
    group_by: tuple[str, ...] = Field(
        default=(),
        description="Segment keys (of `segments:`) that split the rule's series within each "
        "service, e.g. `[app.index_version]`; the alert names the segment that dropped and "
        "its siblings' means.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("name") and data.get("metric"):
            service = data.get("service")
            name = f"{data['metric']}_drop" + (f"_{service}" if service else "")
            return {**data, "name": name}
        return data

    @model_validator(mode="after")
    def _check(self) -> DropRule:
        if isinstance(self.baseline, TrailingBaseline) and self.baseline.window < self.window:
            raise ValueError(
                f"rule {self.name!r}: the trailing baseline ({self.baseline.window:g}s) must be"
                f" at least as long as the window ({self.window:g}s)"
            )
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"rule {self.name!r}: a group_by key is listed twice")
        return self

    @property
    def baseline_min_samples(self) -> int:
        if isinstance(self.baseline, TrailingBaseline) and self.baseline.min_samples:
            return self.baseline.min_samples
        return self.min_samples

    @property
    def segment_keys(self) -> tuple[str, ...]:
        return self.group_by


class CanaryRule(_Rule):
    """Two segments in the same window: the ``candidate`` value of ``segment`` against
    ``against`` (or every other value).  Fires when the candidate's mean is below the
    other side's by ``drop`` (relative: a fraction of the other side's mean), by Welch's
    one-sided test at ``confidence``; ``min_samples`` applies to each side."""

    kind: Literal["canary"] = Field(description="`canary`: compare two segments.")
    segment: str = Field(min_length=1, description="The segment key (of `segments:`) compared.")
    candidate: str | None = Field(
        None,
        description="The value under test (e.g. `canary`, or the new `service.version`); "
        "unset: every value is tested against all the others.",
    )
    against: str | None = Field(
        None,
        description="The value it is compared with (e.g. `production`); unset: every other "
        "value of the segment together.",
    )
    for_: Duration = Field(
        default=0.0,
        alias="for",
        ge=0,
        description="How long the drop must hold before the alert fires.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("name") and data.get("metric"):
            parts = [str(data["metric"]), "canary"]
            parts += [str(data[k]) for k in ("service", "candidate") if data.get(k)]
            return {**data, "name": "_".join(parts)}
        return data

    @model_validator(mode="after")
    def _check(self) -> CanaryRule:
        if self.against is not None and self.candidate is None:
            raise ValueError(f"rule {self.name!r}: `against` needs a `candidate`")
        if self.against is not None and self.against == self.candidate:
            raise ValueError(f"rule {self.name!r}: `candidate` and `against` are the same")
        return self

    @property
    def segment_keys(self) -> tuple[str, ...]:
        return (self.segment,)


def _rule_input(value: Any) -> Any:
    if isinstance(value, Mapping) and "kind" not in value:
        return {**value, "kind": "drop"}
    return value


#: A rule of either kind (``kind:`` absent means ``drop``).
Rule = Annotated[DropRule | CanaryRule, Field(discriminator="kind"), BeforeValidator(_rule_input)]


class _Retrying(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1, description="http(s) URL to post to.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra request headers (e.g. authorization)."
    )
    #: Per-request timeout.
    timeout: Duration = Field(default=5.0, gt=0)
    #: Attempts per notification (1 = no retry).  Retried: connection errors,
    #: timeouts, 429 and 5xx.  Other answers are final.
    max_attempts: int = Field(default=4, ge=1, le=20)
    #: Backoff before retry k (k = 1, 2, ...): ``backoff * 2**(k-1)``, at most ``max_backoff``.
    backoff: Duration = Field(default=0.5, ge=0)
    max_backoff: Duration = Field(default=10.0, ge=0, description="Longest backoff.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"not an http(s) URL: {value!r}")
        return value

    @model_validator(mode="after")
    def _one_auth_source(self) -> _Retrying:
        check_one_auth_source(self.url, self.headers)
        return self


class WebhookConfig(_Retrying):
    """A generic webhook: one JSON POST per firing and per resolved alert, and the
    current figures of a firing alert every ``repeat_interval``."""

    enabled: bool = Field(True, description="false: keep the settings, send nothing.")
    repeat_interval: Duration | None = Field(
        default=900.0,
        gt=0,
        description="While an alert fires, post its current figures this often (`repeat: "
        "true`); null: transitions only.",
    )


class AlertmanagerConfig(_Retrying):
    """The Alertmanager v2 API (``POST <url>/api/v2/alerts``)."""

    enabled: bool = Field(True, description="false: keep the settings, send nothing.")
    #: While firing, re-send this often so Alertmanager does not auto-resolve; each
    #: firing post sets ``endsAt`` to four intervals ahead, so if the collector goes
    #: away the alert resolves by itself.
    resend_interval: Duration = Field(default=60.0, gt=0)
    #: Static labels added to every alert (e.g. ``team``, or ``replica`` to keep the
    #: alerts of several collector replicas apart).
    labels: dict[str, str] = Field(default_factory=dict)
    #: ``alertname`` label of the collector's alerts.
    alertname: str = "RagtraceScoreDrop"
    #: Link shown in Alertmanager (e.g. the Grafana dashboard).
    generator_url: str | None = None


class LogNotifierConfig(BaseModel):
    """A structured (structlog) log line per firing and resolved alert."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Log firing and resolved alerts.")


class AlertsConfig(BaseModel):
    """The ``alerts:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="false: no rule is evaluated.")
    rules: list[Rule] = Field(
        default_factory=list,
        description="Drop rules (`kind: drop`, the default) and canary rules (`kind: canary`); "
        "none: the detector is off.",
    )
    #: How often the detector evaluates its rules (the ``run`` loop's period).
    evaluation_interval: Duration = Field(default=30.0, gt=0)
    #: Services tracked per rule; results of further services are ignored (and logged
    #: once), which bounds memory whatever the ``service`` label's cardinality.  With
    #: segments, a rule keeps at most ``max_services_per_rule`` x the product over its
    #: ``group_by`` keys (a canary rule: its ``segment``) of ``max_values + 2`` series
    #: (the kept values, ``other`` and ``unset``): bounded whatever the attribute values.
    max_services_per_rule: int = Field(default=200, ge=1)
    #: Example trace ids (the lowest-scoring in the window) sent with an alert.
    example_trace_ids: int = Field(default=5, ge=0, le=50)
    webhook: WebhookConfig | None = Field(
        None, description="POST every firing and resolved alert as JSON to a URL."
    )
    alertmanager: AlertmanagerConfig | None = Field(
        None, description="Send alerts to Alertmanager's v2 API."
    )
    log: LogNotifierConfig = Field(
        default_factory=LogNotifierConfig, description="Log every firing and resolved alert."
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_rule_list(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"rules": data}
        return data

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"duplicate alert rule name {rule.name!r}")
            seen.add(rule.name)
        return self
