"""The support bot: retrieve, rerank, generate, every step recorded by ragtrace.

``SupportBot.answer`` is the request entry (``@ragtrace.rag``); its steps are
``retrieve`` (``@ragtrace.retriever``), ``rerank`` (``@ragtrace.reranker``) and
``generate`` (``@ragtrace.generator``).  A :class:`Conversation` groups turns into one
ragtrace session.  Nothing here configures tracing: the caller does (the CLI calls
``ragtrace.configure``; tests pass their own tracer provider).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import ragtrace
from examples.support_bot.data import Article, GoldenItem, load_corpus
from examples.support_bot.generation import Generator, generator_from_env
from examples.support_bot.retrieval import (
    FaultMode,
    Hit,
    KnowledgeBase,
    LexicalReranker,
    fault_from_env,
    parse_fault,
)
from examples.support_bot.text import terms

__all__ = ["Answer", "Conversation", "SupportBot"]

_FOLLOW_UP_WORDS = frozenset({"it", "its", "that", "this", "they", "them", "those", "there"})
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Answer:
    """What one request produced."""

    question: str
    text: str
    query: str
    contexts: tuple[Hit, ...]
    candidates: tuple[Hit, ...]
    fault: FaultMode
    generator: str

    @property
    def context_ids(self) -> list[str]:
        """Ids of the contexts the answer was generated from, best first."""
        return [hit["id"] for hit in self.contexts]


def _answer_text(answer: Answer) -> str:
    return answer.text


def condense_query(question: str, history: Sequence[str]) -> str:
    """The retrieval query for a turn: a follow-up ("does that matter?") borrows the last turn."""
    if not history:
        return question
    words = set(_WORD.findall(question.lower()))
    if words & _FOLLOW_UP_WORDS or len(terms(question)) < 3:
        return f"{history[-1]} {question}"
    return question


class SupportBot:
    """A small, real RAG pipeline over the Orla support knowledge base.

    ``fault`` (a :class:`FaultMode` or its name) degrades retrieval; it defaults to
    ``RAGTRACE_EXAMPLE_FAULT`` and can be changed at any time (``bot.fault = "shuffle"``).
    ``model`` selects an LLM through litellm; default: ``RAGTRACE_EXAMPLE_MODEL``, else
    the extractive generator.
    """

    def __init__(
        self,
        articles: Sequence[Article] | None = None,
        *,
        fault: FaultMode | str | None = None,
        candidates: int = 8,
        top_k: int = 3,
        rerank: bool = True,
        model: str | None = None,
        generator: Generator | None = None,
    ) -> None:
        if candidates < 1 or top_k < 1:
            raise ValueError("candidates and top_k must be at least 1")
        self.kb = KnowledgeBase(articles if articles is not None else load_corpus())
        self._reranker = LexicalReranker(self.kb)
        self.generator: Generator = generator or generator_from_env(self.kb, model)
        self.candidates = candidates
        self.top_k = top_k
        self.use_reranker = rerank
        self._fault = fault_from_env() if fault is None else parse_fault(fault)

    @property
    def fault(self) -> FaultMode:
        return self._fault

    @fault.setter
    def fault(self, value: FaultMode | str | None) -> None:
        self._fault = parse_fault(value)

    # ------------------------------------------------------------- the request
    @ragtrace.rag(name="support_bot.answer", input="question", output=_answer_text)
    def answer(
        self,
        question: str,
        *,
        reference: GoldenItem | None = None,
        history: Sequence[str] = (),
    ) -> Answer:
        """Answer one question.  ``reference`` marks it as golden (canary) traffic."""
        if not question.strip():
            raise ValueError("the question is empty")
        if reference is not None:
            ragtrace.set_reference(
                expected_output=reference.expected_output,
                reference_contexts=list(reference.reference_contexts),
                reference_context_ids=list(reference.reference_context_ids),
            )
        fault = self._fault
        query = condense_query(question, history)
        candidates = self.retrieve(query)
        if self.use_reranker:
            contexts = self.rerank(query, candidates, self.top_k)
        else:
            contexts = candidates[: self.top_k]
        # The standalone query (a follow-up carries its previous turn) drives generation too.
        text = self.generate(query, contexts, model=self.generator.name)
        return Answer(
            question=question,
            text=text,
            query=query,
            contexts=tuple(contexts),
            candidates=tuple(candidates),
            fault=fault,
            generator=self.generator.name,
        )

    # ------------------------------------------------------------------- steps
    @ragtrace.retriever(name="support_bot.retrieve", input="query")
    def retrieve(self, query: str) -> list[Hit]:
        """BM25 candidates for the query (degraded when a fault is on)."""
        return self.kb.search(query, self.candidates, self._fault)

    @ragtrace.reranker(name="support_bot.rerank", input="query")
    def rerank(self, query: str, documents: Sequence[Hit], top_k: int) -> list[Hit]:
        """The ``top_k`` best candidates after lexical re-scoring."""
        return self._reranker.rerank(query, documents, top_k)

    @ragtrace.generator(name="support_bot.generate", input="question")
    def generate(self, question: str, contexts: Sequence[Hit], model: str) -> str:
        """The answer text, from the ranked contexts (``model`` names the generator)."""
        return self.generator.generate(question, contexts)


@dataclass
class Conversation:
    """The turns of one user's conversation, recorded as one ragtrace session.

    Use as a context manager::

        with Conversation(bot, "session-42", user_id="u-1") as chat:
            chat.ask("My camera is offline.")
            chat.ask("Does the router matter?")
    """

    bot: SupportBot
    session_id: str
    user_id: str | None = None
    expected_outcome: str | None = None
    history: list[str] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    _stack: contextlib.ExitStack | None = field(default=None, init=False, repr=False)

    def __enter__(self) -> Conversation:
        stack = contextlib.ExitStack()
        stack.enter_context(
            ragtrace.session(
                self.session_id, user_id=self.user_id, expected_outcome=self.expected_outcome
            )
        )
        self._stack = stack
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def ask(self, question: str) -> Answer:
        """One turn.  Must be called inside the ``with`` block."""
        if self._stack is None:
            raise RuntimeError("use the Conversation as a context manager before asking")
        answer = self.bot.answer(question, history=tuple(self.history))
        self.history.append(question)
        self.answers.append(answer)
        return answer
