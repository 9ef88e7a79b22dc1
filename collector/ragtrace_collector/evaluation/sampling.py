"""Which ready traces the collector evaluates: consistent sampling, rules and budgets.

Three steps decide, in this order:

1. **Rule.**  The rules are tried in order and the first whose ``match`` holds gives
   the rate; when none matches, the default ``rate`` applies.  The default rule list
   has one rule, ``ground_truth``: a trace whose spans carry any ground-truth
   attribute (``semconv.GROUND_TRUTH_ATTRIBUTES``) is always evaluated, because
   golden and canary traffic is the only traffic on which recall can be measured.
   A configured ``rules:`` list replaces the default list; add
   ``{name: ground_truth, match: {ground_truth: true}, rate: 1.0}`` to keep it.
2. **Consistent hash.**  A 64-bit hash of the trace id, or of ``session.id`` when
   the trace is a turn of a session, is compared with a threshold derived from the
   rate (see :func:`sampling_hash` for the exact function).  Every replica computes
   the same value, so replicas behind a trace-id load balancer need no coordination;
   all turns of a session get the same answer at the same rate, so a sampled
   conversation is evaluated whole; and since the threshold grows with the rate, the
   traces sampled at a lower rate are a subset of those sampled at a higher one.
3. **Budgets.**  A trace the hash selected is still refused (``budget``) when
   ``max_evaluations_per_minute`` evaluations were admitted in the trailing 60 s,
   or when the judge spend reported through :meth:`Sampler.record_cost` in the
   trailing hour has reached ``max_cost_usd_per_hour``.  Cost is known only after an
   evaluation ran, so in-flight evaluations can overshoot the cost budget by what
   they spend.  Budgets apply to every rule, ground truth included: they are the
   hard guard on spend.

The decision is a :class:`SamplingDecision`; the caller records
``ragtrace.eval.sample_rate`` (:meth:`SamplingDecision.attributes`).

The sampler takes plain data (a trace id, a session id and the trace's attributes),
not the pipeline's span types.  ``decide`` costs a few microseconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragtrace import semconv

if TYPE_CHECKING:
    from ragtrace_collector.component.telemetry import Telemetry

__all__ = [
    "AttributeSource",
    "RuleMatch",
    "Sampler",
    "SamplingConfig",
    "SamplingDecision",
    "SamplingRule",
    "rate_threshold",
    "sampling_hash",
    "trace_attribute_lookup",
]

AttrScalar: TypeAlias = str | bool | int | float

#: What the rules read: either one merged mapping (resource and span attributes of
#: the trace, one value per key), or a callable that returns every value a key takes
#: across the trace's spans (empty when absent).  See :func:`trace_attribute_lookup`.
AttributeSource: TypeAlias = Mapping[str, object] | Callable[[str], Collection[object]]

Outcome: TypeAlias = Literal["sampled", "unsampled", "budget"]

DEFAULT_RULE_NAME: Final = "default"
GROUND_TRUTH_RULE_NAME: Final = "ground_truth"
BUDGET_EVALUATIONS: Final = "max_evaluations_per_minute"
BUDGET_COST: Final = "max_cost_usd_per_hour"

_TWO_64: Final = 1 << 64
_MINUTE: Final = 60.0
_HOUR: Final = 3600.0


# ------------------------------------------------------------------ the hash


def sampling_hash(trace_id: bytes | str, session_id: str | None = None, *, seed: str = "") -> int:
    """The 64-bit value that consistent sampling compares with a threshold.

    Exactly::

        key  = UTF-8 bytes of session_id            if session_id is a non-empty string
               else the 16 raw bytes of the trace id (a hex string is hex-decoded first)
        h    = BLAKE2b(key, digest_size=8, key=UTF-8 bytes of seed)   # RFC 7693; an
               # 8-byte digest is a parameter of BLAKE2b, not a truncation of BLAKE2b-512;
               # an empty seed means unkeyed
        h    = the 8 digest bytes read as a big-endian unsigned integer

    A trace is sampled at ``rate`` when ``h < rate_threshold(rate)``.

    The SDK's head sampler (OTel ``TraceIdRatioBased``) compares the trace id's own
    low bits; hashing them again keeps the two decisions independent.

    Test vectors (unkeyed): trace id ``000102030405060708090a0b0c0d0e0f`` gives
    ``0xf49644867b0897ea``; session id ``chat-42`` gives ``0xdb01020124a05e8c``.
    """
    if session_id:
        key = session_id.encode()
    elif isinstance(trace_id, str):
        key = bytes.fromhex(trace_id)
    else:
        key = trace_id
    digest = blake2b(key, digest_size=8, key=seed.encode()).digest()
    return int.from_bytes(digest, "big")


def rate_threshold(rate: float) -> int:
    """``floor(rate * 2**64)``, clamped to ``[0, 2**64]``.

    ``rate * 2**64`` is exact in IEEE-754 double arithmetic (a power-of-two scale),
    so other implementations compute the same integer.  Rate 1 gives ``2**64``,
    which every 64-bit value is below; rate 0 gives 0, which none is.
    """
    if not 0.0 <= rate <= 1.0 or math.isnan(rate):
        raise ValueError(f"sampling rate must be within [0, 1], got {rate!r}")
    return min(_TWO_64, int(rate * _TWO_64))


# -------------------------------------------------------------------- config


class RuleMatch(BaseModel):
    """Conditions on a trace's attributes (resource and span); all listed must hold.

    A key matches when *any* span of the trace satisfies it.  An empty match matches
    every trace.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: attribute == value, e.g. ``{service.name: checkout}``
    equals: dict[str, AttrScalar] = Field(default_factory=dict)
    #: attribute is one of the values, e.g. ``{deployment.environment: [staging, dev]}``
    one_of: dict[str, list[AttrScalar]] = Field(default_factory=dict)
    #: every listed attribute is present
    exists: list[str] = Field(default_factory=list)
    #: at least one listed attribute is present
    exists_any: list[str] = Field(default_factory=list)
    #: shorthand for ``exists_any: semconv.GROUND_TRUTH_ATTRIBUTES`` (true), or for
    #: none of them present (false)
    ground_truth: bool | None = None


class SamplingRule(BaseModel):
    """``match`` -> ``rate``; the first matching rule wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Unique rule name (shown in decisions).")
    match: RuleMatch = Field(
        default_factory=RuleMatch,
        description="Conditions on the trace's attributes, all of which must hold; "
        "empty: every trace.",
    )
    rate: float = Field(ge=0.0, le=1.0, description="Share of the matching traces evaluated.")


def _default_rules() -> list[SamplingRule]:
    return [
        SamplingRule(
            name=GROUND_TRUTH_RULE_NAME,
            match=RuleMatch(ground_truth=True),
            rate=1.0,
        )
    ]


class SamplingConfig(BaseModel):
    """The ``sampling:`` section of the collector config.

    ``rate`` defaults to 0.1.  With an LLM judge each evaluated case costs a judge
    call per metric, so evaluating everything is seldom affordable.  A tenth of the
    traffic still gives a dashboard enough samples quickly: at 1 request/s, 360 scored
    traces an hour, enough to see a drop of a few points in a mean score within the
    hour.  Ground-truth traffic is evaluated at rate 1 by the default rule.
    Lower the rate for high traffic, or cap spend with the budgets; ``rate: 1``
    evaluates everything.  For example::

        sampling:
          rate: 0.1
          max_evaluations_per_minute: 600
          max_cost_usd_per_hour: 5.0
          rules:                        # replaces the default list: keep ground truth
            - {name: ground_truth, match: {ground_truth: true}, rate: 1.0}
            - {name: checkout, match: {equals: {service.name: checkout}}, rate: 0.05}
            - name: staging
              match: {one_of: {deployment.environment: [staging, dev]}}
              rate: 0.0
    """

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Share of traces evaluated when no rule matches (`1`: all of them).",
    )
    rules: list[SamplingRule] = Field(
        default_factory=_default_rules,
        description="Tried in order; the first rule that matches sets the rate.  Giving a "
        "list replaces the default one: keep the ground_truth rule.",
    )
    #: None: unlimited.  Admissions counted over a sliding 60 s window.
    max_evaluations_per_minute: int | None = Field(default=None, ge=0)
    #: None: unlimited.  Spend reported by ``record_cost`` over a sliding hour.
    max_cost_usd_per_hour: float | None = Field(default=None, ge=0.0)
    #: Keys the hash; change it to draw a different, independent sample.  Every
    #: replica must use the same seed.
    hash_seed: str = ""

    @model_validator(mode="after")
    def _unique_rule_names(self) -> SamplingConfig:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen or rule.name == DEFAULT_RULE_NAME:
                raise ValueError(
                    f"sampling rule name {rule.name!r} is used twice or is reserved"
                    f" ({DEFAULT_RULE_NAME!r} names the fallback rate)"
                )
            seen.add(rule.name)
        return self


# ------------------------------------------------------------------ decision


@dataclass(frozen=True, slots=True)
class SamplingDecision:
    """The sampler's answer for one trace."""

    outcome: Outcome
    #: The rate that was applied (of the matching rule, or the default rate).
    rate: float
    #: The name of the matching rule, or ``"default"``.
    rule: str
    #: What was hashed: ``"session"`` (session id) or ``"trace"`` (trace id).
    hashed_on: Literal["session", "trace"]
    #: Which budget refused it, when ``outcome == "budget"``.
    budget: str | None = None

    @property
    def sampled(self) -> bool:
        return self.outcome == "sampled"

    @property
    def reason(self) -> str:
        where = f"rule {self.rule!r} rate {self.rate:g}, {self.hashed_on} hash"
        if self.outcome == "sampled":
            return f"sampled: {where}"
        if self.outcome == "unsampled":
            return f"not sampled: {where}"
        return f"budget {self.budget} exhausted ({where} selected it)"

    def attributes(self) -> dict[str, float | bool]:
        """The span attributes that record this decision."""
        return {semconv.EVAL_SAMPLE_RATE: self.rate, semconv.EVAL_SAMPLED: self.sampled}


# ------------------------------------------------------------- rule matching

_Values = Callable[[str], Collection[object]]
_Predicate = Callable[[_Values], bool]


def _same(a: object, b: object) -> bool:
    # True == 1 in Python; an attribute's type is part of its value here.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _equals(key: str, options: tuple[object, ...]) -> _Predicate:
    def check(values: _Values) -> bool:
        return any(_same(v, w) for v in values(key) for w in options)

    return check


def _present(keys: tuple[str, ...], *, all_of: bool) -> _Predicate:
    def check_all(values: _Values) -> bool:
        return all(values(k) for k in keys)

    def check_any(values: _Values) -> bool:
        return any(values(k) for k in keys)

    return check_all if all_of else check_any


def _negate(predicate: _Predicate) -> _Predicate:
    def check(values: _Values) -> bool:
        return not predicate(values)

    return check


def _compile(match: RuleMatch) -> _Predicate:
    checks: list[_Predicate] = []
    for key, want in match.equals.items():
        checks.append(_equals(key, (want,)))
    for key, options in match.one_of.items():
        checks.append(_equals(key, tuple(options)))
    if match.exists:
        checks.append(_present(tuple(match.exists), all_of=True))
    if match.exists_any:
        checks.append(_present(tuple(match.exists_any), all_of=False))
    if match.ground_truth is not None:
        has_gt = _present(semconv.GROUND_TRUTH_ATTRIBUTES, all_of=False)
        checks.append(has_gt if match.ground_truth else _negate(has_gt))
    if len(checks) == 1:
        return checks[0]
    every = tuple(checks)  # empty: matches every trace

    def check(values: _Values) -> bool:
        return all(c(values) for c in every)

    return check


def _no_values(key: str) -> Collection[object]:
    return ()


def _values_of(source: AttributeSource | None) -> _Values:
    if source is None:
        return _no_values
    if isinstance(source, Mapping):
        mapping = source

        def from_mapping(key: str) -> Collection[object]:
            value = mapping.get(key, _MISSING)
            return () if value is _MISSING or value is None else (value,)

        return from_mapping
    return source


_MISSING: Final = object()


def trace_attribute_lookup(
    attribute_maps: Iterable[Mapping[str, object]],
) -> Callable[[str], tuple[object, ...]]:
    """An :data:`AttributeSource` over the attributes of a trace's spans.

    Pass one mapping per span (its resource attributes and its own attributes, e.g.
    ``{**resource_attrs, **span_attrs}``, or both maps separately).  A key is looked
    up lazily, on demand of a rule, and cached: rules that need no attribute cost
    nothing.  Returns the distinct values the key takes, in span order.
    """
    maps = tuple(attribute_maps)
    cache: dict[str, tuple[object, ...]] = {}

    def lookup(key: str) -> tuple[object, ...]:
        found = cache.get(key)
        if found is None:
            values: list[object] = []
            for attrs in maps:
                value = attrs.get(key, _MISSING)
                if value is _MISSING or value is None:
                    continue
                if not any(_same(value, seen) for seen in values):
                    values.append(value)
            found = cache[key] = tuple(values)
        return found

    return lookup


# ------------------------------------------------------------------- sampler


class Sampler:
    """Decides, per ready trace, whether to evaluate it.  Thread-safe.

    ``clock`` returns seconds (monotonic); tests inject a fake one.  ``telemetry``,
    when given, counts every decision in ``ragtrace_eval_traces{decision}``.
    """

    def __init__(
        self,
        config: SamplingConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.config = config = config if config is not None else SamplingConfig()
        self._clock = clock
        self._seed = config.hash_seed.encode()
        self._rules: tuple[tuple[str, float, int, _Predicate], ...] = tuple(
            (rule.name, rule.rate, rate_threshold(rule.rate), _compile(rule.match))
            for rule in config.rules
        )
        self._default = (DEFAULT_RULE_NAME, config.rate, rate_threshold(config.rate))
        self._max_evals = config.max_evaluations_per_minute
        self._max_cost = config.max_cost_usd_per_hour
        self._has_budget = self._max_evals is not None or self._max_cost is not None
        self._lock = threading.Lock()
        # admission times within the trailing minute (at most max_evals entries)
        self._admitted: deque[float] = deque()
        # spend in 1-second buckets: [bucket start, usd]; at most 3600 entries
        self._spend: deque[list[float]] = deque()
        self._spend_total = 0.0
        self._counters = (
            {
                outcome: telemetry.eval_traces.labels(decision=outcome)
                for outcome in ("sampled", "unsampled", "budget")
            }
            if telemetry is not None
            else None
        )

    # ---------------------------------------------------------------- decide

    def decide(
        self,
        trace_id: bytes | str,
        session_id: str | None = None,
        attributes: AttributeSource | None = None,
    ) -> SamplingDecision:
        """Decide for one trace.

        ``trace_id``: the 16 raw bytes or 32 hex digits.  ``session_id``: the
        trace's ``session.id`` (None or empty when it is not a turn of a session).
        ``attributes``: what the rules read (see :data:`AttributeSource`).
        """
        name, rate, threshold = self._select(attributes)
        if session_id:
            key = session_id.encode()
            hashed_on: Literal["session", "trace"] = "session"
        else:
            key = bytes.fromhex(trace_id) if isinstance(trace_id, str) else trace_id
            hashed_on = "trace"
        h = int.from_bytes(blake2b(key, digest_size=8, key=self._seed).digest(), "big")
        if h >= threshold:
            decision = SamplingDecision("unsampled", rate, name, hashed_on)
        elif self._has_budget and (refused := self._admit()) is not None:
            decision = SamplingDecision("budget", rate, name, hashed_on, refused)
        else:
            decision = SamplingDecision("sampled", rate, name, hashed_on)
        if self._counters is not None:
            self._counters[decision.outcome].inc()
        return decision

    def _select(self, attributes: AttributeSource | None) -> tuple[str, float, int]:
        if self._rules:
            values = _values_of(attributes)
            for name, rate, threshold, predicate in self._rules:
                if predicate(values):
                    return name, rate, threshold
        return self._default

    # --------------------------------------------------------------- budgets

    def _admit(self) -> str | None:
        """Take one evaluation from the budgets, or name the budget that refuses."""
        with self._lock:
            now = self._clock()
            if self._max_cost is not None:
                self._expire_spend(now)
                if self._spend_total >= self._max_cost:
                    return BUDGET_COST
            if self._max_evals is not None:
                admitted = self._admitted
                while admitted and now - admitted[0] >= _MINUTE:
                    admitted.popleft()
                if len(admitted) >= self._max_evals:
                    return BUDGET_EVALUATIONS
                admitted.append(now)
            return None

    def record_cost(self, usd: float) -> None:
        """Report what an admitted evaluation spent (judge cost in USD)."""
        if not usd >= 0.0 or math.isinf(usd):
            raise ValueError(f"cost must be a finite, non-negative number of USD, got {usd!r}")
        if usd == 0.0:
            return
        with self._lock:
            now = self._clock()
            bucket = math.floor(now)
            if self._spend and self._spend[-1][0] == bucket:
                self._spend[-1][1] += usd
            else:
                self._spend.append([bucket, usd])
            self._spend_total += usd
            self._expire_spend(now)

    def _expire_spend(self, now: float) -> None:
        # A bucket [s, s+1) leaves the window once all of it is older than an hour:
        # spend is forgotten up to one second late, never early.
        spend = self._spend
        while spend and now - (spend[0][0] + 1.0) >= _HOUR:
            self._spend_total -= spend.popleft()[1]
        if not spend:
            self._spend_total = 0.0  # no float residue once the window is empty

    def spend_last_hour(self) -> float:
        """USD reported in the trailing hour."""
        with self._lock:
            self._expire_spend(self._clock())
            return max(0.0, self._spend_total)

    def evaluations_last_minute(self) -> int:
        """Evaluations admitted in the trailing 60 s (counted only with that budget set)."""
        with self._lock:
            now = self._clock()
            while self._admitted and now - self._admitted[0] >= _MINUTE:
                self._admitted.popleft()
            return len(self._admitted)
