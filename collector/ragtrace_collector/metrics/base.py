"""What every metric shares: options, the metric protocols, result building, the
verdict rule and average precision.

A metric measures one case (or one conversation) and returns a
:class:`~ragtrace_collector.results.MetricResult`.  It never raises for bad input or a
failing judge:

* missing inputs, or nothing to score  -> a *skipped* result with the reason;
* a :class:`JudgeError`                 -> an *error* result (``"<kind>: <message>"``),
  score None, the cost of the failed calls kept;
* anything else unexpected              -> an error result ``"internal: ..."``.

Cancellation (a per-metric timeout in the collector) propagates untouched.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ragtrace_collector.cases import Conversation, RAGCase
from ragtrace_collector.judges.base import Judge, JudgeError, JudgeTask
from ragtrace_collector.results import Cost, MetricResult, trusted

__all__ = [
    "HEURISTIC_PREFIX",
    "ConversationMetric",
    "JudgeFreeMetric",
    "Metric",
    "MetricBase",
    "MetricOptions",
    "Outcome",
    "Run",
    "ScoreColumn",
    "average_precision",
    "normalise_verdict",
    "order_by_node",
    "share_outcome",
    "with_judge_reason",
]

R = TypeVar("R", bound=BaseModel)

#: Prefix of the reason of every result a heuristic (offline) judge produced.
HEURISTIC_PREFIX = "[heuristic] "

Distance = Literal["levenshtein", "jaro", "jaro_winkler", "hamming", "indel"]
ReferenceChoice = Literal["expected_output", "actual_output", "auto"]


class MetricOptions(BaseModel):
    """Per-metric options (the ``metrics.<name>`` section of the config).

    Options that a metric does not use are accepted and ignored, so one mapping can
    configure several metrics; unknown keys are an error.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="false: this metric is not run.")
    #: ``passed = score >= threshold``.  For the non_llm_* metrics it is also the
    #: similarity cut-off unless ``similarity_threshold`` is set.
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    #: Threshold 1, and any score below 1 becomes 0.
    strict: bool = False
    #: contextual_precision: which text the nodes must be useful toward.
    reference: ReferenceChoice = "expected_output"
    #: Conversation metrics: units per window.
    window_size: int = Field(10, ge=1)
    #: non_llm_*: the string similarity (1 - normalised distance, rapidfuzz).
    distance: Distance = "levenshtein"
    #: non_llm_*: similarity cut-off, when it must differ from ``threshold``.
    similarity_threshold: float | None = Field(None, ge=0.0, le=1.0)
    #: Overrides the judge prompt template of this metric's task.
    prompt_template: str | None = None


@runtime_checkable
class Metric(Protocol):
    """A metric of one case."""

    @property
    def name(self) -> str: ...

    @property
    def uses_judge(self) -> bool: ...

    @property
    def kind(self) -> Literal["case", "conversation"]: ...

    @property
    def options(self) -> MetricOptions: ...

    @property
    def threshold(self) -> float:
        """A score passes at or above it (1.0 when ``strict``)."""
        ...

    def missing_inputs(self, case: RAGCase) -> str | None:
        """Why ``case`` cannot be scored (the skip reason), or None."""
        ...

    async def measure(self, case: RAGCase, judge: Judge | None) -> MetricResult: ...


@runtime_checkable
class ConversationMetric(Metric, Protocol):
    """A metric of a whole conversation, scored window by window (METRICS.md)."""

    def missing_conversation_inputs(self, conv: Conversation) -> str | None: ...

    async def measure_conversation(
        self, conv: Conversation, judge: Judge | None
    ) -> MetricResult: ...

    async def measure_window(
        self, conv: Conversation, unit_index: int, judge: Judge | None
    ) -> MetricResult: ...

    def conversation_result(
        self,
        window_scores: Sequence[float | None],
        cost: Cost | None = None,
        judge: Judge | None = None,
    ) -> MetricResult:
        """The conversation result from the (unstrict) window scores so far."""
        ...


# ----------------------------------------------------------------------- rules
_VERDICT_WORD = re.compile(r"[a-z]+")


def normalise_verdict(verdict: str) -> str:
    """The leading ``[a-z]+`` run of the stripped, lower-cased verdict, as DeepEval
    reads it: ``" Yes."`` -> ``"yes"``, ``"yes2"`` -> ``"yes"``; ``".no"`` and
    ``"**yes**"`` give ``""`` (dropped by the metrics)."""
    m = _VERDICT_WORD.match(verdict.strip().lower())
    return m.group(0) if m else ""


def average_precision(relevant: Sequence[int | bool]) -> float:
    """AP over the relevant nodes in rank order; 0 when none is relevant (no epsilon)."""
    hits = 0
    total = 0.0
    for k, r in enumerate(relevant, start=1):
        if r:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


def order_by_node(nodes: Sequence[int | None], count: int) -> list[int]:
    """Positions of judge verdicts in rank order.

    When the judge numbered the verdicts as a permutation of the nodes (1-based, or
    0-based), that numbering decides; otherwise the answer's own order does.
    """
    if len(nodes) == count and all(n is not None for n in nodes):
        ints = [int(n) for n in nodes if n is not None]
        for base in (1, 0):
            if sorted(ints) == list(range(base, base + count)):
                return sorted(range(count), key=lambda i: ints[i])
    return list(range(len(nodes)))


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


# -------------------------------------------------------------------- running
class Run:
    """One measurement: asks the judge and adds up what the calls cost."""

    __slots__ = ("cost", "judge", "used_judge")

    def __init__(self, judge: Judge | None) -> None:
        self.judge = judge
        self.cost = Cost.none()
        self.used_judge = False

    async def ask(self, task: JudgeTask[R]) -> R:
        if self.judge is None:
            raise JudgeError("config", "this metric needs a judge and none is configured")
        self.used_judge = True
        try:
            answer = await self.judge.ask(task)
        except JudgeError as exc:
            self.cost = self.cost + exc.cost
            raise
        self.cost = self.cost + answer.cost
        return answer.value


@dataclass
class Outcome:
    """What a metric's scoring step found: a score, or a skip (``score`` None)."""

    score: float | None
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def skip(cls, reason: str, **details: Any) -> Outcome:
        return cls(None, reason, dict(details))


def with_judge_reason(reason: str, judge_reason: str) -> str:
    """``reason``, then ``": <the judge's own reason>"`` when the judge gave one."""
    judge_reason = judge_reason.strip()
    return f"{reason}: {judge_reason}" if judge_reason else reason


def share_outcome(
    good: int,
    total: int,
    *,
    details: dict[str, Any],
    dropped: int,
    skip_reason: str,
    reason: str,
    judge_reason: str,
) -> Outcome:
    """The outcome of a verdict-counting metric: ``good / total``.

    ``dropped`` (verdicts that counted neither way) goes into ``details`` as
    ``dropped_verdicts`` when non-zero.  ``total`` 0 -> skipped with ``skip_reason``;
    otherwise the reason is ``reason`` followed by the judge's own reason.
    """
    if dropped:
        details["dropped_verdicts"] = dropped
    if total == 0:
        return Outcome.skip(skip_reason, **details)
    return Outcome(good / total, with_judge_reason(reason, judge_reason), details)


class MetricBase(abc.ABC):
    """Shared machinery of the built-in metrics.  Subclasses set the class
    attributes and implement :meth:`missing_inputs` and :meth:`_score`."""

    name: ClassVar[str]
    uses_judge: ClassVar[bool] = True
    kind: ClassVar[Literal["case", "conversation"]] = "case"

    def __init__(self, options: MetricOptions | None = None) -> None:
        self.options = options if options is not None else MetricOptions()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"

    # -- to implement ---------------------------------------------------------
    @abc.abstractmethod
    def missing_inputs(self, case: RAGCase) -> str | None:
        """Why ``case`` cannot be scored (the skip reason), or None."""

    @abc.abstractmethod
    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        """Score a case whose inputs are present."""

    # -- the contract ---------------------------------------------------------
    async def measure(self, case: RAGCase, judge: Judge | None) -> MetricResult:
        run = Run(judge)
        missing = self.missing_inputs(case)
        if missing is not None:
            return self.result(Outcome.skip(missing), run)
        try:
            outcome = await self._score(case, run)
        except JudgeError as exc:
            return self.error_result(f"{exc.kind}: {exc}", run)
        except Exception as exc:  # a bug must not stop the other metrics
            return self.error_result(f"internal: {type(exc).__name__}: {exc}", run)
        return self.result(outcome, run)

    # -- result building ------------------------------------------------------
    @property
    def threshold(self) -> float:
        return 1.0 if self.options.strict else self.options.threshold

    def _judge_fields(self, run: Run) -> tuple[str, bool]:
        if not self.uses_judge or run.judge is None:
            return "none", False
        return run.judge.model, bool(run.judge.heuristic)

    def result(self, outcome: Outcome, run: Run) -> MetricResult:
        judge_name, heuristic = self._judge_fields(run)
        return self._build(outcome, run.cost, judge_name, heuristic)

    def _build(
        self, outcome: Outcome, cost: Cost, judge_name: str, heuristic: bool
    ) -> MetricResult:
        return self._builder(cost, judge_name, heuristic)(
            outcome.score, outcome.reason, outcome.details
        )

    def _builder(
        self, cost: Cost, judge_name: str, heuristic: bool
    ) -> Callable[[float | None, str, dict[str, Any]], MetricResult]:
        """A function from (score, reason, details) to this metric's result, with the
        per-metric values looked up once (batches build thousands of results)."""
        name = self.name
        threshold = self.threshold
        strict = self.options.strict

        def build(score: float | None, reason: str, details: dict[str, Any]) -> MetricResult:
            if heuristic and not reason.startswith(HEURISTIC_PREFIX):
                reason = HEURISTIC_PREFIX + reason
            passed: bool | None = None
            if score is not None:
                score = min(1.0, max(0.0, float(score)))  # _clamp(), inlined
                if strict and score < 1.0:
                    details = {**details, "unstrict_score": score}
                    score = 0.0
                passed = score >= threshold
            # Every value has its declared type: no validation needed (results.trusted).
            return trusted(
                MetricResult,
                {
                    "metric": name,
                    "score": score,
                    "reason": reason,
                    "threshold": threshold,
                    "strict": strict,
                    "passed": passed,
                    "skipped": score is None,
                    "error": None,
                    "details": details,
                    "cost": cost,
                    "judge": judge_name,
                    "heuristic": heuristic,
                },
            )

        return build

    def error_result(
        self, error: str, run: Run, details: dict[str, Any] | None = None
    ) -> MetricResult:
        judge_name, heuristic = self._judge_fields(run)
        return MetricResult(
            metric=self.name,
            score=None,
            reason="",
            threshold=self.threshold,
            strict=self.options.strict,
            error=error,
            details=details or {},
            cost=run.cost,
            judge=judge_name,
            heuristic=heuristic,
        )


def _clamp(score: float) -> float:
    """A raw score as the result holds it: a float in [0, 1]."""
    return min(1.0, max(0.0, float(score)))


class ScoreColumn:
    """One judge-free metric's results over a batch of cases, by position: the final
    scores now, the full :class:`MetricResult` objects only when asked for.

    ``scores[i]`` is exactly ``results[i].score`` (None: skipped or errored).
    ``built`` holds the results that exist already (all of them when the metric has no
    fast scorer, or a case made the fast scorer raise); :meth:`results` builds the
    others with :meth:`JudgeFreeMetric.measure_many`, from the ``memos`` the fast
    scorer kept when it kept some (what it computed that the results need too).
    """

    __slots__ = ("built", "memos", "metric", "scores")

    def __init__(
        self,
        metric: JudgeFreeMetric,
        scores: list[float | None],
        built: dict[int, MetricResult] | None = None,
        memos: list[Any] | None = None,
    ) -> None:
        self.metric = metric
        self.scores = scores
        self.built: dict[int, MetricResult] = built if built is not None else {}
        self.memos = memos

    def extend(self, other: ScoreColumn) -> None:
        """Append the column of the next cases of the batch."""
        offset = len(self.scores)
        if other.memos is not None or self.memos is not None:
            # Only built results can lack a memo, and they need none.
            if self.memos is None:
                self.memos = [None] * offset
            self.memos.extend(
                other.memos if other.memos is not None else [None] * len(other.scores)
            )
        self.scores.extend(other.scores)
        for index, result in other.built.items():
            self.built[offset + index] = result

    def results(self, cases: Sequence[RAGCase]) -> list[MetricResult]:
        """The full results of ``cases`` (the cases this column was scored from)."""
        built = self.built
        if len(built) == len(cases):
            return [built[i] for i in range(len(cases))]
        todo = [i for i in range(len(cases)) if i not in built]
        memos = None if self.memos is None else [self.memos[i] for i in todo]
        fresh = self.metric.measure_many([cases[i] for i in todo], memos)
        if not built:
            return fresh
        by_index = dict(zip(todo, fresh, strict=True))
        return [built[i] if i in built else by_index[i] for i in range(len(cases))]


class JudgeFreeMetric(MetricBase):
    """A case metric that never calls a judge, scored synchronously.

    Subclasses implement :meth:`missing_inputs` and :meth:`_score_now`.
    :meth:`measure_now` is the synchronous form of :meth:`measure`: batch callers
    (``evaluate()``) score many cases with it without a coroutine, a task or an
    event-loop turn per case.
    """

    uses_judge: ClassVar[bool] = False

    @abc.abstractmethod
    def _score_now(self, case: RAGCase) -> Outcome:
        """Score a case whose inputs are present."""

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        return self._score_now(case)

    async def measure(self, case: RAGCase, judge: Judge | None) -> MetricResult:
        return self.measure_now(case)

    def measure_now(self, case: RAGCase) -> MetricResult:
        """The result for ``case`` (never raises: a bug becomes an error result)."""
        return self.measure_many((case,))[0]

    def _fast_scores(self, cases: Sequence[RAGCase], memos: list[Any]) -> list[float | None] | None:
        """The raw scores of ``cases`` (None: skipped), computed without building a
        result, or None when this metric has no such fast path (the default).

        A metric implements it only when :meth:`_score_now` is a pure function of the
        case and the options, so that :meth:`ScoreColumn.results` can build the
        results later; each score must equal ``_score_now(case).score``, and a case is
        None exactly when :meth:`missing_inputs` gives a reason.  It may append one
        value per case to ``memos`` (or none at all), which :meth:`_score_memo` gets
        back.  It may raise: the batch then falls back to :meth:`measure_many`.
        """
        return None

    def _score_memo(self, case: RAGCase, memo: Any) -> Outcome:
        """:meth:`_score_now`, given what :meth:`_fast_scores` kept for ``case``."""
        return self._score_now(case)

    def score_column(self, cases: Sequence[RAGCase]) -> ScoreColumn:
        """The results of ``cases`` as a :class:`ScoreColumn`: for a metric with a fast
        scorer, only the final scores (clamped to [0, 1]; 0 under ``strict`` unless
        1), the results themselves built when asked for."""
        memos: list[Any] = []
        try:
            raw = self._fast_scores(cases, memos)
        except Exception:  # the slow path records the error result of the case
            raw = None
        if raw is None:
            results = self.measure_many(cases)
            return ScoreColumn(self, [r.score for r in results], dict(enumerate(results)))
        if self.options.strict:
            scores = [None if s is None else (1.0 if _clamp(s) >= 1.0 else 0.0) for s in raw]
        else:
            scores = [None if s is None else _clamp(s) for s in raw]
        return ScoreColumn(self, scores, memos=memos if len(memos) == len(cases) else None)

    def measure_many(
        self, cases: Iterable[RAGCase], memos: Sequence[Any] | None = None
    ) -> list[MetricResult]:
        """The results of ``cases``, in order; what is the same for every case is
        looked up once.  ``memos``: what :meth:`_fast_scores` kept, one per case."""
        build = self._builder(Cost.none(), "none", False)
        missing_inputs = self.missing_inputs
        score_now = self._score_now
        score_memo = self._score_memo
        out: list[MetricResult] = []
        for index, case in enumerate(cases):
            missing = missing_inputs(case)
            if missing is not None:
                out.append(build(None, missing, {}))
                continue
            try:
                outcome = score_now(case) if memos is None else score_memo(case, memos[index])
            except Exception as exc:  # a bug must not stop the other metrics
                error = f"internal: {type(exc).__name__}: {exc}"
                out.append(self.error_result(error, Run(None)))
                continue
            out.append(build(outcome.score, outcome.reason, outcome.details))
        return out


# ------------------------------------------------------------------- helpers
def blank(text: str | None) -> bool:
    return text is None or not text.strip()


def no_input(case: RAGCase) -> str | None:
    """Why ``case`` has no input to judge (the skip reason), or None when it has one:
    what was recorded instead when the collector could not read it as text."""
    if not blank(case.input):
        return None
    return f"no input: {case.input_unreadable}" if case.input_unreadable else "no input"


def no_output(case: RAGCase) -> str | None:
    """As :func:`no_input`, for the answer (``actual_output``)."""
    if not blank(case.actual_output):
        return None
    if case.output_unreadable:
        return f"no actual_output: {case.output_unreadable}"
    return "no actual_output"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
