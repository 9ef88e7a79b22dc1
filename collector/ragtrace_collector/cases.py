"""Evaluation inputs: single-turn RAG cases and conversations (pydantic v2).

These are the shapes every metric reads.  Loaders (``loaders.py``) build them from
DeepEval- or Ragas-style datasets; the online evaluator builds them from spans.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ContextItem", "Conversation", "RAGCase", "Turn", "id_text"]


def id_text(value: object) -> str:
    """A document id as the text ids are compared by: ``str(value)``, except that an
    integral float is written as the integer it is (``3.0`` -> ``"3"``), as Ragas
    coerces it, so that a JSON or Parquet column of numbers read as floats still
    matches ``3`` and ``"3"``.  The string ``"3.0"`` stays ``"3.0"``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class ContextItem(BaseModel):
    """One retrieved (or reference) context node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str
    id: str | None = None
    score: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_str(cls, v: object) -> object:
        # Ids are compared as text (docs/metrics.md): 1, 1.0 and "1" are the same document.
        return None if v is None else id_text(v)


class RAGCase(BaseModel):
    """One RAG request with what it retrieved, what it answered and its ground truth."""

    model_config = ConfigDict(extra="forbid")

    input: str | None = None
    actual_output: str | None = None
    expected_output: str | None = None
    retrieval_context: list[ContextItem] | None = None
    reference_contexts: list[str] | None = None
    reference_context_ids: list[str] | None = None
    #: Retrieved ids in rank order; defaults to the ids of ``retrieval_context``.
    retrieved_context_ids: list[str] | None = None
    #: Free-form identification (dataset line, trace/span id) carried into results.
    case_id: str | None = None
    #: Why the retrieved ids are of another kind than the reference ids (set online,
    #: e.g. framework-generated UUIDs against document names): the ID metrics are
    #: skipped with this reason instead of scoring a 0 that is not true.
    retrieved_ids_mismatch: str | None = None
    #: What the recorded question was when it could not be read as text (set online,
    #: e.g. "a JSON object with keys a, b"): the metrics that need the input are skipped
    #: with it, never judged on the raw value.
    input_unreadable: str | None = None
    #: The same for the answer (``actual_output``).
    output_unreadable: str | None = None

    @field_validator("reference_context_ids", "retrieved_context_ids", mode="before")
    @classmethod
    def _ids_as_str(cls, v: object) -> object:
        if isinstance(v, list):
            return [id_text(x) for x in v]
        return v

    def retrieved_ids(self) -> list[str] | None:
        """Retrieved ids: explicit ones, else the ids carried by the retrieval context."""
        if self.retrieved_context_ids is not None:
            return self.retrieved_context_ids
        if self.retrieval_context is None:
            return None
        ids = [c.id for c in self.retrieval_context if c.id is not None]
        return ids if ids or not self.retrieval_context else None

    def context_texts(self) -> list[str]:
        return [c.content for c in self.retrieval_context or []]


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str = ""
    retrieval_context: list[ContextItem] | None = None


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turns: list[Turn]
    expected_outcome: str | None = None
    case_id: str | None = None
