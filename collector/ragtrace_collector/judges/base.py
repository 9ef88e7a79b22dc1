"""The judge contract: structured questions, structured answers.

A metric never talks to a model directly.  It builds a *task* (a pydantic request
model naming its response model and prompt template) and asks a :class:`Judge`.
Two judges implement the contract:

* ``LLMJudge`` (``judges/llm.py``) renders the task's prompt template, fences the
  untrusted text, calls ``litellm.acompletion``, and validates the JSON answer
  against the task's response model;
* ``OfflineJudge`` (``judges/offline.py``) answers the same tasks with deterministic
  lexical rules, no network.

Verdict strings are kept raw in the responses (``"yes"``, ``"No."``, ``"maybe"``);
the metrics read them (the leading ``[a-z]+`` run, lower-cased) as docs/metrics.md
specifies, so that an odd verdict is dropped by the formula and not silently coerced by
the parser.

A judge raises :class:`JudgeError` when it cannot produce a valid answer; metrics
turn that into an error result (never a guessed score).
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragtrace_collector.results import Cost

__all__ = [
    "AnswerRelevanceRequest",
    "AnswerRelevanceResponse",
    "AttributionRequest",
    "AttributionResponse",
    "AttributionVerdict",
    "ClaimVerdict",
    "EntityExtractionRequest",
    "EntityExtractionResponse",
    "FaithfulnessRequest",
    "FaithfulnessResponse",
    "Judge",
    "JudgeAnswer",
    "JudgeCallRecord",
    "JudgeError",
    "JudgeErrorKind",
    "JudgeTask",
    "NodeRelevance",
    "RelevanceRequest",
    "RelevanceResponse",
    "RubricRequest",
    "RubricResponse",
    "StatementVerdict",
    "UsefulnessRequest",
    "UsefulnessResponse",
    "UsefulnessVerdict",
]

R = TypeVar("R", bound=BaseModel)
R_co = TypeVar("R_co", bound=BaseModel, covariant=True)


class _Response(BaseModel):
    # Answers must be exactly the schema; unknown keys are a wrong answer.
    model_config = ConfigDict(extra="forbid")


class JudgeTask(BaseModel, Generic[R]):
    """A structured question.

    Subclasses set ``task_name`` (also the default prompt template's name) and
    ``response_model``.  ``prompt_template`` overrides the default template for this
    one request (per-metric user override).  ``check`` validates an answer against
    the request beyond the schema (e.g. one verdict per node); a non-None return is
    the problem, and the LLM judge asks once more before raising.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_name: ClassVar[str]
    response_model: ClassVar[type[BaseModel]]

    prompt_template: str | None = None

    def check(self, response: R) -> str | None:
        return None


# ----------------------------------------------------------------- attribution
class AttributionVerdict(_Response):
    statement: str
    verdict: str
    #: 1-based index of the supporting node, when the verdict is yes.
    node: int | None = None


class AttributionResponse(_Response):
    verdicts: list[AttributionVerdict]
    reason: str = ""


class AttributionRequest(JudgeTask[AttributionResponse]):
    """contextual_recall, turn_contextual_recall: split ``reference`` into statements;
    for each, can it be attributed to some node of ``contexts``?"""

    task_name: ClassVar[str] = "attribution"
    response_model: ClassVar[type[BaseModel]] = AttributionResponse

    reference: str
    contexts: tuple[str, ...]


# ------------------------------------------------------------------ usefulness
class UsefulnessVerdict(_Response):
    node: int
    verdict: str
    reason: str = ""


class UsefulnessResponse(_Response):
    verdicts: list[UsefulnessVerdict]
    reason: str = ""


class UsefulnessRequest(JudgeTask[UsefulnessResponse]):
    """contextual_precision, turn_contextual_precision: for each node in rank order,
    was it useful in arriving at ``reference`` given ``input``?  Exactly one verdict
    per node."""

    task_name: ClassVar[str] = "usefulness"
    response_model: ClassVar[type[BaseModel]] = UsefulnessResponse

    input: str
    reference: str
    contexts: tuple[str, ...]

    def check(self, response: UsefulnessResponse) -> str | None:
        if len(response.verdicts) != len(self.contexts):
            return (
                f"expected exactly {len(self.contexts)} verdicts, one per node, "
                f"got {len(response.verdicts)}"
            )
        return None


# ------------------------------------------------------------------- relevance
class StatementVerdict(_Response):
    statement: str
    verdict: str


class NodeRelevance(_Response):
    node: int
    statements: list[StatementVerdict]


class RelevanceResponse(_Response):
    nodes: list[NodeRelevance]
    reason: str = ""


class RelevanceRequest(JudgeTask[RelevanceResponse]):
    """contextual_relevancy, turn_contextual_relevancy: the statements of each node,
    each relevant to ``input`` or not."""

    task_name: ClassVar[str] = "relevance"
    response_model: ClassVar[type[BaseModel]] = RelevanceResponse

    input: str
    contexts: tuple[str, ...]

    def check(self, response: RelevanceResponse) -> str | None:
        if len(response.nodes) != len(self.contexts):
            return f"expected {len(self.contexts)} nodes, got {len(response.nodes)}"
        return None


# -------------------------------------------------------------------- entities
class EntityExtractionResponse(_Response):
    #: One list per input text, in order.
    entities: list[list[str]]


class EntityExtractionRequest(JudgeTask[EntityExtractionResponse]):
    """context_entity_recall: the unique named entities of each text (batched)."""

    task_name: ClassVar[str] = "entities"
    response_model: ClassVar[type[BaseModel]] = EntityExtractionResponse

    texts: tuple[str, ...]

    def check(self, response: EntityExtractionResponse) -> str | None:
        if len(response.entities) != len(self.texts):
            return f"expected {len(self.texts)} entity lists, got {len(response.entities)}"
        return None


# ---------------------------------------------------------------------- rubric
class RubricResponse(_Response):
    score: float
    reason: str

    @field_validator("score", mode="before")
    @classmethod
    def _score(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("score must be a number in [0, 1], not a boolean")
        if isinstance(v, str):
            v = float(v.strip())
        return v

    @field_validator("score")
    @classmethod
    def _in_range(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"score {v} is outside [0, 1]")
        return v


class RubricRequest(JudgeTask[RubricResponse]):
    """context_precision_rubric / context_recall_rubric: one 0.0-1.0 score."""

    task_name: ClassVar[str] = "rubric"
    response_model: ClassVar[type[BaseModel]] = RubricResponse

    kind: Literal["precision", "recall"]
    input: str
    contexts: tuple[str, ...]
    expected_output: str | None = None
    actual_output: str | None = None


# ---------------------------------------------------------------- faithfulness
class ClaimVerdict(_Response):
    claim: str
    #: yes (supported), no (contradicted), idk (neither)
    verdict: str


class FaithfulnessResponse(_Response):
    claims: list[ClaimVerdict]
    reason: str = ""


class FaithfulnessRequest(JudgeTask[FaithfulnessResponse]):
    """faithfulness: the claims of ``output``, each contradicted by ``contexts`` or not."""

    task_name: ClassVar[str] = "faithfulness"
    response_model: ClassVar[type[BaseModel]] = FaithfulnessResponse

    output: str
    contexts: tuple[str, ...]


# ------------------------------------------------------------ answer relevance
class AnswerRelevanceResponse(_Response):
    statements: list[StatementVerdict]
    reason: str = ""


class AnswerRelevanceRequest(JudgeTask[AnswerRelevanceResponse]):
    """answer_relevancy: the statements of ``output``, each relevant to ``input`` or not."""

    task_name: ClassVar[str] = "answer_relevance"
    response_model: ClassVar[type[BaseModel]] = AnswerRelevanceResponse

    input: str
    output: str


# ------------------------------------------------------------------ the judge
JudgeErrorKind = Literal["timeout", "invalid_response", "rate_limited", "api_error", "config"]


class JudgeError(Exception):
    """A judge could not produce a valid answer.  ``kind`` is a stable short label
    (written to ``ragtrace.eval.<metric>.error``); the message says what happened."""

    def __init__(self, kind: JudgeErrorKind, message: str, *, cost: Cost | None = None) -> None:
        super().__init__(message)
        self.kind: JudgeErrorKind = kind
        self.cost = cost or Cost()


class JudgeAnswer(BaseModel, Generic[R]):
    """A validated answer plus what it cost (a cache hit costs a cached call, 0 USD)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    value: R
    cost: Cost = Field(default_factory=Cost)
    cached: bool = False


class JudgeCallRecord(BaseModel):
    """One judge call, for telemetry listeners (``on_call`` hooks).

    ``outcome`` is ``cancelled`` for a call cut off because no caller waits for it
    any more (e.g. every metric asking it hit its timeout): not a model failure.
    """

    model: str
    task: str
    outcome: Literal["ok", "cached", "error", "timeout", "cancelled"]
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None


@runtime_checkable
class Judge(Protocol):
    """Anything that answers judge tasks."""

    #: "offline" or a litellm model string; written to ``ragtrace.eval.model``.
    @property
    def model(self) -> str: ...

    #: True for rule-based judges; their results are labelled heuristic.
    @property
    def heuristic(self) -> bool: ...

    async def ask(self, task: JudgeTask[R]) -> JudgeAnswer[R]:
        """Answer ``task`` or raise :class:`JudgeError`."""
        ...
