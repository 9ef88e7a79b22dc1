"""Capture gaps found with real ecosystem objects: returned streams (the OpenAI
``stream=True`` pattern), partial output of a failing stream, and documents from
LangChain and LlamaIndex whose id or score sits in their metadata.

LangChain and LlamaIndex are imported in the tests that use them (seconds of imports,
not to be paid when the suite is collected).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

import ragtrace
from ragtrace import semconv
from tests.sdk.conftest import Recorder

# ----------------------------------------------------- an OpenAI-style stream


@dataclass
class _Delta:
    content: str | None = None
    role: str | None = None


@dataclass
class _Choice:
    delta: _Delta
    index: int = 0
    finish_reason: str | None = None


@dataclass
class _Chunk:
    """Shaped like openai's ``ChatCompletionChunk``."""

    choices: list[_Choice]
    id: str = "chatcmpl-1"


def _chunks(*texts: str) -> list[_Chunk]:
    out = [_Chunk([_Choice(_Delta(role="assistant"))])]  # the role chunk: no text
    out += [_Chunk([_Choice(_Delta(content=t))]) for t in texts]
    out.append(_Chunk([_Choice(_Delta(), finish_reason="stop")]))
    out.append(_Chunk([]))  # a usage-only chunk
    return out


@dataclass
class _Stream:
    """Shaped like openai's ``Stream``: an iterator with a response and close()."""

    items: list[Any]
    fail_after: int | None = None
    response: str = "http-response"
    closed: bool = False
    _at: int = field(default=0)

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        if self.fail_after is not None and self._at == self.fail_after:
            raise ConnectionError("stream cut")
        if self._at >= len(self.items):
            raise StopIteration
        self._at += 1
        return self.items[self._at - 1]

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _AsyncStream:
    """Shaped like openai's ``AsyncStream``."""

    items: list[Any]
    closed: bool = False
    _at: int = 0

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        if self._at >= len(self.items):
            raise StopAsyncIteration
        self._at += 1
        return self.items[self._at - 1]

    async def close(self) -> None:
        self.closed = True


def test_returned_openai_stream_records_the_joined_text(recorder: Recorder) -> None:
    inner = _Stream(_chunks("Refunds ", "take ", "5 days."))

    @ragtrace.generator
    def complete(prompt: str, model: str = "gpt-x") -> _Stream:
        return inner

    stream = complete("How long do refunds take?")
    assert recorder.spans() == []  # the span stays open while the stream is read
    assert stream.response == "http-response"  # attributes reach the real stream
    pieces = [c.choices[0].delta.content for c in stream if c.choices]
    assert "".join(p for p in pieces if p) == "Refunds take 5 days."
    attrs = recorder.attrs("complete")
    assert attrs[semconv.OUTPUT_VALUE] == "Refunds take 5 days."
    assert attrs[semconv.INPUT_VALUE] == "How long do refunds take?"
    assert recorder.one("complete").status.status_code is StatusCode.UNSET


def test_returned_stream_inside_rag_keeps_the_parent(recorder: Recorder) -> None:
    @ragtrace.generator
    def complete(prompt: str) -> _Stream:
        return _Stream(_chunks("a", "b"))

    @ragtrace.rag
    def answer(question: str) -> str:
        with complete(question) as stream:
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert answer("q") == "ab"
    gen, rag = recorder.one("complete"), recorder.one("answer")
    assert gen.parent is not None
    assert gen.parent.span_id == rag.context.span_id
    assert recorder.attrs("complete")[semconv.OUTPUT_VALUE] == "ab"


def test_a_stream_that_raises_keeps_its_partial_output(recorder: Recorder) -> None:
    @ragtrace.generator
    def complete(prompt: str) -> _Stream:
        return _Stream(_chunks("Hel", "lo", " there"), fail_after=3)

    with pytest.raises(ConnectionError, match="stream cut"):
        for _ in complete("q"):
            pass
    span = recorder.one("complete")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})[semconv.OUTPUT_VALUE] == "Hello"


def test_a_generator_function_that_raises_keeps_its_partial_output(recorder: Recorder) -> None:
    @ragtrace.generator
    def tokens(prompt: str) -> Iterator[str]:
        yield "par"
        yield "tial"
        raise TimeoutError("model timed out")

    with pytest.raises(TimeoutError):
        list(tokens("q"))
    span = recorder.one("tokens")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})[semconv.OUTPUT_VALUE] == "partial"


def test_closing_a_returned_stream_early_ends_the_span(recorder: Recorder) -> None:
    inner = _Stream(_chunks("one ", "two ", "three"))

    @ragtrace.generator
    def complete(prompt: str) -> _Stream:
        return inner

    stream = complete("q")
    next(stream)
    next(stream)
    stream.close()
    assert inner.closed
    span = recorder.one("complete")
    assert dict(span.attributes or {})[semconv.OUTPUT_VALUE] == "one "
    assert span.status.status_code is StatusCode.UNSET


def test_an_abandoned_stream_still_ends_its_span(recorder: Recorder) -> None:
    @ragtrace.generator
    def complete(prompt: str) -> _Stream:
        return _Stream(_chunks("x", "y"))

    stream = complete("q")
    next(stream)
    del stream
    gc.collect()
    assert len(recorder.named("complete")) == 1


async def test_returned_async_stream(recorder: Recorder) -> None:
    streams = [_AsyncStream(_chunks("async ", "text")), _AsyncStream(_chunks("a", "b"))]

    @ragtrace.generator
    async def complete(prompt: str) -> _AsyncStream:
        return streams.pop(0)

    stream = await complete("q")
    texts = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(t for t in texts if t) == "async text"
    assert recorder.attrs("complete")[semconv.OUTPUT_VALUE] == "async text"
    second = streams[0]
    early = await complete("q2")
    await early.__anext__()
    await early.close()  # openai's AsyncStream.close() is a coroutine
    assert second.closed
    assert len(recorder.named("complete")) == 2


def test_langchain_chat_model_stream(recorder: Recorder) -> None:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    model = FakeListChatModel(responses=["Five business days."])

    @ragtrace.generator
    def complete(prompt: str) -> Iterator[Any]:
        return model.stream(prompt)

    chunks = list(complete("How long do refunds take?"))
    assert "".join(str(c.content) for c in chunks) == "Five business days."
    assert recorder.attrs("complete")[semconv.OUTPUT_VALUE] == "Five business days."


async def test_dict_chunks_from_an_async_generator(recorder: Recorder) -> None:
    @ragtrace.generator
    async def complete(prompt: str) -> AsyncIterator[dict[str, Any]]:
        for text in ("di", "ct"):
            yield {"choices": [{"delta": {"content": text}}]}

    assert len([c async for c in complete("q")]) == 2
    assert recorder.attrs("complete")[semconv.OUTPUT_VALUE] == "dict"


# ------------------------------------------------------- documents' metadata


def test_langchain_documents_empty_id_and_reranker_score(recorder: Recorder) -> None:
    from langchain_core.documents import Document

    @ragtrace.reranker
    def rerank(query: str, documents: list[Document]) -> list[Document]:
        return [
            # Cohere / FlashRank rerankers put their score in metadata
            Document(
                page_content="Refunds take 5 days.",
                id="",
                metadata={"id": "kb-7", "relevance_score": 0.93},
            ),
            Document(
                page_content="Shipping is free.",
                id="kb-2",
                metadata={"id": "ignored", "score": 0.41},
            ),
            Document(page_content="No id, no score."),
        ]

    rerank("refunds?", [Document(page_content="x")])
    attrs = recorder.attrs("rerank")
    out = semconv.RERANKER_OUTPUT_DOCUMENTS
    assert attrs[f"{out}.0.document.id"] == "kb-7"
    assert attrs[f"{out}.0.document.score"] == pytest.approx(0.93)
    assert attrs[f"{out}.1.document.id"] == "kb-2"
    assert attrs[f"{out}.1.document.score"] == pytest.approx(0.41)
    assert f"{out}.2.document.id" not in attrs
    assert f"{out}.2.document.score" not in attrs


def test_explicit_scores_win_over_metadata(recorder: Recorder) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    @ragtrace.retriever
    def search(query: str) -> list[Any]:
        return [
            (Document(page_content="pair", metadata={"relevance_score": 0.1}), 0.8),
            NodeWithScore(
                node=TextNode(text="node", id_="n-1", metadata={"relevance_score": 0.2}),
                score=0.7,
            ),
            NodeWithScore(node=TextNode(text="bare", id_="n-2", metadata={"similarity": 0.55})),
        ]

    search("q")
    attrs = recorder.attrs("search")
    docs = semconv.RETRIEVAL_DOCUMENTS
    assert attrs[f"{docs}.0.document.score"] == pytest.approx(0.8)
    assert attrs[f"{docs}.1.document.score"] == pytest.approx(0.7)
    assert attrs[f"{docs}.1.document.id"] == "n-1"
    assert attrs[f"{docs}.2.document.score"] == pytest.approx(0.55)
    assert attrs[f"{docs}.2.document.id"] == "n-2"
