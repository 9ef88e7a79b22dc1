"""Conversation metrics: ``turn_contextual_precision``, ``turn_contextual_recall``,
``turn_contextual_relevancy`` (METRICS.md, "Conversations").

**Units.** Walk the turns; a new unit starts when a user turn follows an assistant
turn and the current unit already has a user turn.  The last unit is kept only if it
has a user turn, ends with an assistant turn and has more than one turn (a trailing
unanswered user message is dropped).

**Windows.** Window *i* is units ``[max(0, i-w+1) .. i]`` flattened: its user text is
the window's user turns joined, its retrieval context the concatenated contexts of
its assistant turns (assistant content is not used).  A window without retrieval
context scores 1 with no judge call, provided the conversation retrieved something
elsewhere.

**Conversation score** = mean of the window scores (windows that were skipped, e.g.
no statements, are left out).  With no windows, or when no window has any retrieval
context, the metric is skipped with a reason: a conversation that retrieved nothing
has no retrieval quality, and must not read as a perfect 1 (DeepEval scores it 1).

**Online form.** The collector sees one turn at a time.  When a turn completes it
calls :meth:`measure_window` with the conversation so far and the index of the unit
that turn ends (``-1`` for the last one): one window evaluation per completed turn.
A window without context, in a conversation whose turns so far retrieved nothing, is
reported skipped, with ``details["window_score"] == 1`` and
``details[NOTHING_RETRIEVED_YET]`` set: the evaluator adds it to the running sums but
writes no conversation score until some window has retrieval context.
The window's unstrict score is ``details["window_score"]``; feeding every window
score so far into :meth:`conversation_result` gives the running conversation score,
and over the whole conversation that equals :meth:`measure_conversation`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragtrace_collector.cases import Conversation, RAGCase, Turn
from ragtrace_collector.judges.base import (
    AttributionRequest,
    Judge,
    JudgeError,
    RelevanceRequest,
    UsefulnessRequest,
)
from ragtrace_collector.metrics.base import MetricBase, Outcome, Run, blank, mean
from ragtrace_collector.metrics.precision import usefulness_outcome
from ragtrace_collector.metrics.recall import attribution_outcome
from ragtrace_collector.metrics.relevancy import relevance_outcome
from ragtrace_collector.results import Cost, MetricResult

__all__ = [
    "NOTHING_RETRIEVED_YET",
    "TurnContextualPrecision",
    "TurnContextualRecall",
    "TurnContextualRelevancy",
    "Window",
    "conversation_windows",
    "split_unit_ranges",
    "split_units",
    "unit_index_of_turn",
    "window_at",
]


# ------------------------------------------------------------------ units
def split_unit_ranges(turns: Sequence[Turn]) -> list[range]:
    """The units of a conversation, as ranges of turn indices."""
    ranges: list[range] = []
    start = 0
    has_user = False
    previous: str | None = None
    for i, turn in enumerate(turns):
        if turn.role == "user" and previous == "assistant" and has_user:
            ranges.append(range(start, i))
            start, has_user = i, False
        has_user = has_user or turn.role == "user"
        previous = turn.role
    end = len(turns)
    if end - start > 1 and has_user and turns[end - 1].role == "assistant":
        ranges.append(range(start, end))
    return ranges


def split_units(turns: Sequence[Turn]) -> list[list[Turn]]:
    """The units of a conversation (lists of turns)."""
    return [[turns[i] for i in r] for r in split_unit_ranges(turns)]


def unit_index_of_turn(turns: Sequence[Turn], turn_index: int) -> int | None:
    """The unit that turn ``turn_index`` belongs to, or None (e.g. an unanswered message)."""
    for u, r in enumerate(split_unit_ranges(turns)):
        if turn_index in r:
            return u
    return None


@dataclass(frozen=True)
class Window:
    """Window ``unit_index``: units ``first_unit .. unit_index``."""

    unit_index: int
    first_unit: int
    user_text: str
    contexts: tuple[str, ...]


def window_at(units: Sequence[Sequence[Turn]], unit_index: int, window_size: int) -> Window:
    if not 0 <= unit_index < len(units):
        raise IndexError(f"unit {unit_index} out of range ({len(units)} units)")
    if window_size < 1:
        raise ValueError("window_size must be >= 1")
    first = max(0, unit_index - window_size + 1)
    users: list[str] = []
    contexts: list[str] = []
    for unit in units[first : unit_index + 1]:
        for turn in unit:
            if turn.role == "user":
                users.append(turn.content)
            elif turn.retrieval_context:
                contexts.extend(c.content for c in turn.retrieval_context)
    return Window(unit_index, first, "\n".join(users), tuple(contexts))


def conversation_windows(turns: Sequence[Turn], window_size: int) -> list[Window]:
    units = split_units(turns)
    return [window_at(units, i, window_size) for i in range(len(units))]


# ---------------------------------------------------------------- metrics
#: Detail key of a window result: skipped because nothing was retrieved so far.
NOTHING_RETRIEVED_YET = "nothing_retrieved_yet"
_NO_UNITS = "no complete units to score (a user turn answered by the assistant)"
_NOTHING_RETRIEVED = "no retrieval context in any window of the conversation"


def _retrieved_anything(turns: Sequence[Turn]) -> bool:
    return any(t.role == "assistant" and t.retrieval_context for t in turns)


class _TurnMetric(MetricBase):
    kind = "conversation"
    needs_expected_outcome = True

    def missing_inputs(self, case: RAGCase) -> str | None:
        return f"{self.name} scores conversations, not single cases"

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        # Reached only if missing_inputs stopped skipping single cases.
        return Outcome.skip(f"{self.name} scores conversations, not single cases")

    def missing_conversation_inputs(self, conv: Conversation) -> str | None:
        if self.needs_expected_outcome and blank(conv.expected_outcome):
            return "no expected_outcome"
        return None

    @abc.abstractmethod
    async def _score_window(self, conv: Conversation, window: Window, run: Run) -> Outcome:
        """Score one window that has retrieval context."""

    async def _window(self, conv: Conversation, window: Window, run: Run) -> Outcome:
        if not window.contexts:
            outcome = Outcome(1.0, "no retrieval context in this window")
        else:
            outcome = await self._score_window(conv, window, run)
        outcome.details.update(
            unit_index=window.unit_index,
            window=[window.first_unit, window.unit_index],
            window_score=outcome.score,
        )
        return outcome

    async def measure_window(
        self, conv: Conversation, unit_index: int, judge: Judge | None
    ) -> MetricResult:
        """Score only the window ending at unit ``unit_index`` (negative counts from
        the end) of ``conv`` (the conversation's turns up to that unit suffice)."""
        run = Run(judge)
        missing = self.missing_conversation_inputs(conv)
        if missing is not None:
            return self.result(Outcome.skip(missing), run)
        units = split_units(conv.turns)
        index = unit_index + len(units) if unit_index < 0 else unit_index
        if not units:
            return self.result(Outcome.skip(_NO_UNITS + " yet"), run)
        if not 0 <= index < len(units):
            return self.result(
                Outcome.skip(
                    f"no complete unit {unit_index} (the conversation has {len(units)}, "
                    f"0 to {len(units) - 1})"
                ),
                run,
            )
        window = window_at(units, index, self.options.window_size)
        try:
            outcome = await self._window(conv, window, run)
        except JudgeError as exc:
            return self.error_result(f"{exc.kind}: {exc}", run, {"unit_index": index})
        except Exception as exc:
            return self.error_result(f"internal: {type(exc).__name__}: {exc}", run)
        if not window.contexts and not _retrieved_anything(conv.turns):
            # Nothing retrieved yet: no score to show, but the window still counts as 1
            # in the running mean once the conversation retrieves something, exactly
            # as in measure_conversation.  The evaluator reads NOTHING_RETRIEVED_YET.
            outcome = Outcome.skip(
                _NOTHING_RETRIEVED + " so far", **outcome.details, **{NOTHING_RETRIEVED_YET: True}
            )
        return self.result(outcome, run)

    async def measure_conversation(self, conv: Conversation, judge: Judge | None) -> MetricResult:
        """The offline metric: every window, scored concurrently, then their mean."""
        run = Run(judge)
        missing = self.missing_conversation_inputs(conv)
        if missing is not None:
            return self.result(Outcome.skip(missing), run)
        windows = conversation_windows(conv.turns, self.options.window_size)
        if not windows:
            return self.result(Outcome.skip(_NO_UNITS, window_size=self.options.window_size), run)
        if not any(w.contexts for w in windows):
            return self.result(
                Outcome.skip(_NOTHING_RETRIEVED, window_size=self.options.window_size), run
            )
        done = await asyncio.gather(
            *(self._window(conv, w, run) for w in windows), return_exceptions=True
        )
        outcomes: list[Outcome] = []
        for item in done:
            if isinstance(item, JudgeError):
                return self.error_result(f"{item.kind}: {item}", run)
            if isinstance(item, Exception):
                return self.error_result(f"internal: {type(item).__name__}: {item}", run)
            if isinstance(item, BaseException):
                raise item
            outcomes.append(item)
        return self._combine([o.score for o in outcomes], run, outcomes)

    def conversation_result(
        self,
        window_scores: Sequence[float | None],
        cost: Cost | None = None,
        judge: Judge | None = None,
    ) -> MetricResult:
        """The conversation result from its (unstrict) window scores so far."""
        run = Run(judge)
        if cost is not None:
            run.cost = cost
        run.used_judge = judge is not None
        return self._combine(list(window_scores), run, None)

    def _combine(
        self, scores: list[float | None], run: Run, outcomes: list[Outcome] | None
    ) -> MetricResult:
        details: dict[str, Any] = {"window_scores": scores, "window_size": self.options.window_size}
        if outcomes is not None:
            details["windows"] = [
                {k: v for k, v in o.details.items() if k != "window_score"} | {"reason": o.reason}
                for o in outcomes
            ]
        if not scores:
            return self.result(Outcome.skip(_NO_UNITS, **details), run)
        scored = [s for s in scores if s is not None]
        if not scored:
            return self.result(Outcome.skip("no window had anything to score", **details), run)
        value = mean(scored)
        reason = f"mean over {len(scored)} window{'s' if len(scored) != 1 else ''}: {value:.3f}"
        if len(scored) < len(scores):
            reason += f" ({len(scores) - len(scored)} skipped)"
        return self.result(Outcome(value, reason, details), run)


class TurnContextualPrecision(_TurnMetric):
    """Window score: AP of the per-node verdicts (useful toward the expected outcome,
    given the window's user text)."""

    name = "turn_contextual_precision"

    async def _score_window(self, conv: Conversation, window: Window, run: Run) -> Outcome:
        assert conv.expected_outcome is not None
        response = await run.ask(
            UsefulnessRequest(
                input=window.user_text,
                reference=conv.expected_outcome,
                contexts=window.contexts,
                prompt_template=self.options.prompt_template,
            )
        )
        return usefulness_outcome(response, len(window.contexts))


class TurnContextualRecall(_TurnMetric):
    """Window score: the share of the expected outcome's sentences attributable to the
    window's context."""

    name = "turn_contextual_recall"

    async def _score_window(self, conv: Conversation, window: Window, run: Run) -> Outcome:
        assert conv.expected_outcome is not None
        response = await run.ask(
            AttributionRequest(
                reference=conv.expected_outcome,
                contexts=window.contexts,
                prompt_template=self.options.prompt_template,
            )
        )
        return attribution_outcome(response, what="expected outcome")


class TurnContextualRelevancy(_TurnMetric):
    """Window score: the share of the window's retrieved statements relevant to the
    window's user text."""

    name = "turn_contextual_relevancy"
    needs_expected_outcome = False

    async def _score_window(self, conv: Conversation, window: Window, run: Run) -> Outcome:
        response = await run.ask(
            RelevanceRequest(
                input=window.user_text,
                contexts=window.contexts,
                prompt_template=self.options.prompt_template,
            )
        )
        return relevance_outcome(response, len(window.contexts))
