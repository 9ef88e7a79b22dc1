"""The four decorators on every kind of callable: spans, nesting, input/output, errors."""

from __future__ import annotations

import asyncio
import inspect
import json
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import ragtrace
from ragtrace import semconv

from .conftest import Recorder

# ------------------------------------------------------------------ basic spans


@ragtrace.retriever
def search(query: str, k: int = 2) -> list[dict[str, Any]]:
    return [{"id": f"d{i}", "content": f"text {i}", "score": 1.0 - i / 10} for i in range(k)]


@ragtrace.rag
def answer(question: str) -> str:
    docs = search(question)
    return f"{len(docs)} docs"


def test_nested_spans_kinds_and_parentage(recorder: Recorder) -> None:
    assert answer("what?") == "2 docs"
    rag_span = recorder.one("answer")
    retr_span = recorder.one("search")
    assert retr_span.parent is not None
    assert retr_span.parent.span_id == rag_span.context.span_id
    assert retr_span.context.trace_id == rag_span.context.trace_id

    rag_attrs = recorder.attrs("answer")
    assert rag_attrs[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert rag_attrs[semconv.RAGTRACE_SPAN_KIND] == "rag"
    assert rag_attrs[semconv.INPUT_VALUE] == "what?"
    assert rag_attrs[semconv.INPUT_MIME_TYPE] == semconv.MIME_TEXT
    assert rag_attrs[semconv.OUTPUT_VALUE] == "2 docs"
    assert rag_attrs[semconv.OUTPUT_MIME_TYPE] == semconv.MIME_TEXT

    attrs = recorder.attrs("search")
    assert attrs[semconv.OPENINFERENCE_SPAN_KIND] == "RETRIEVER"
    assert attrs[semconv.RAGTRACE_SPAN_KIND] == "retriever"
    assert attrs[semconv.GEN_AI_OPERATION_NAME] == "retrieval"
    assert attrs[semconv.GEN_AI_RETRIEVAL_QUERY_TEXT] == "what?"
    assert attrs["retrieval.documents.0.document.id"] == "d0"
    assert attrs["retrieval.documents.1.document.content"] == "text 1"
    assert attrs["retrieval.documents.1.document.score"] == pytest.approx(0.9)
    assert attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] == 2
    # documents are the retriever's output: no duplicate output.value
    assert semconv.OUTPUT_VALUE not in attrs


def test_decorator_arguments_name_input_output(recorder: Recorder) -> None:
    @ragtrace.rag(name="pipeline", input="user_text", output=lambda r: r["answer"])
    def run(context: str, user_text: str, flag: bool = False) -> dict[str, Any]:
        return {"answer": user_text.upper(), "debug": context}

    assert run("ctx", "hello") == {"answer": "HELLO", "debug": "ctx"}
    assert run("ctx", user_text="kw") == {"answer": "KW", "debug": "ctx"}
    first, second = recorder.named("pipeline")
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes[semconv.INPUT_VALUE] == "hello"
    assert first.attributes[semconv.OUTPUT_VALUE] == "HELLO"
    assert second.attributes[semconv.INPUT_VALUE] == "kw"


def test_input_detection_order(recorder: Recorder) -> None:
    @ragtrace.rag
    def by_name(history: str, question: str) -> str:
        return "a"

    @ragtrace.rag
    def first_str(n: int, text: str, other: str) -> str:
        return "b"

    @ragtrace.rag
    def keyword_only(n: int, *, payload: str) -> str:
        return "c"

    @ragtrace.rag
    def default_value(prompt: str = "default prompt") -> str:
        return "d"

    @ragtrace.rag
    def no_text(n: int) -> int:
        return n * 2

    by_name("earlier turns", "the question")
    first_str(1, "first", "second")
    keyword_only(1, payload="kw text")
    default_value()
    no_text(21)
    assert recorder.attrs("by_name")[semconv.INPUT_VALUE] == "the question"
    assert recorder.attrs("first_str")[semconv.INPUT_VALUE] == "first"
    assert recorder.attrs("keyword_only")[semconv.INPUT_VALUE] == "kw text"
    assert recorder.attrs("default_value")[semconv.INPUT_VALUE] == "default prompt"
    no_text_attrs = recorder.attrs("no_text")
    assert semconv.INPUT_VALUE not in no_text_attrs
    assert no_text_attrs[semconv.OUTPUT_VALUE] == "42"
    assert no_text_attrs[semconv.OUTPUT_MIME_TYPE] == semconv.MIME_JSON


def test_non_text_input_and_output_are_json(recorder: Recorder) -> None:
    @ragtrace.rag(input="request")
    def handle(request: dict[str, Any]) -> list[int]:
        return [1, 2]

    handle({"q": "hi", "k": 3})
    attrs = recorder.attrs("handle")
    assert attrs[semconv.INPUT_VALUE] == '{"q": "hi", "k": 3}'
    assert attrs[semconv.INPUT_MIME_TYPE] == semconv.MIME_JSON
    assert attrs[semconv.OUTPUT_VALUE] == "[1, 2]"


class _Text(str):
    """A str subclass, to check that ``self`` is skipped when looking for the input."""


class Pipeline(_Text):
    @ragtrace.rag
    def ask(self, n: int, text: str) -> str:
        return f"{self}:{text}"

    @ragtrace.retriever
    def find(self, query: str) -> list[str]:
        return [query]

    @classmethod
    @ragtrace.rag
    def build(cls, text: str) -> str:
        return f"{cls.__name__}:{text}"

    @ragtrace.rag
    @classmethod
    def build_outer(cls, text: str) -> str:
        return f"{cls.__name__}/{text}"

    @ragtrace.generator
    @staticmethod
    def static(prompt: str) -> str:
        return prompt[::-1]


def test_methods_skip_self_and_cls(recorder: Recorder) -> None:
    pipe = Pipeline("SELF")
    assert pipe.ask(1, "the input") == "SELF:the input"
    assert pipe.find("q") == ["q"]
    assert Pipeline.build("x") == "Pipeline:x"
    assert Pipeline.build_outer("y") == "Pipeline/y"
    assert pipe.build_outer("z") == "Pipeline/z"
    assert Pipeline.static("abc") == "cba"
    assert recorder.attrs("Pipeline.ask")[semconv.INPUT_VALUE] == "the input"
    assert recorder.attrs("Pipeline.find")[semconv.INPUT_VALUE] == "q"
    assert recorder.attrs("Pipeline.build")[semconv.INPUT_VALUE] == "x"
    assert [s.attributes[semconv.INPUT_VALUE] for s in recorder.named("Pipeline.build_outer")] == [
        "y",
        "z",
    ]
    assert recorder.attrs("Pipeline.static")[semconv.OUTPUT_VALUE] == "cba"


def test_wraps_and_signature_kept() -> None:
    def original(question: str, *, top_k: int = 3) -> str:
        """Docstring."""
        return question

    async def coro(question: str) -> str:
        return question

    def gen(question: str) -> Iterator[str]:
        yield question

    async def agen(question: str) -> AsyncIterator[str]:
        yield question

    for decorator in (ragtrace.rag, ragtrace.retriever, ragtrace.reranker, ragtrace.generator):
        wrapped = decorator(original)
        assert wrapped.__name__ == "original"
        assert wrapped.__doc__ == "Docstring."
        assert wrapped.__wrapped__ is original
        assert inspect.signature(wrapped) == inspect.signature(original)
        assert inspect.iscoroutinefunction(decorator(coro))
        assert inspect.isgeneratorfunction(decorator(gen))
        assert inspect.isasyncgenfunction(decorator(agen))
        assert not inspect.iscoroutinefunction(wrapped)
        assert decorator(name="n")(original).__wrapped__ is original


def test_bad_decorator_arguments_fail_at_decoration() -> None:
    def f(question: str) -> str:
        return question

    with pytest.raises(TypeError, match="input='nope' is not a parameter"):
        ragtrace.rag(input="nope")(f)
    with pytest.raises(TypeError, match="output= must be a callable"):
        ragtrace.rag(output="answer")(f)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name= must be a non-empty str"):
        ragtrace.retriever(name="")(f)

    def with_kwargs(**kwargs: Any) -> None:
        return None

    # an input name that can only arrive through **kwargs is accepted
    ragtrace.rag(input="question")(with_kwargs)


# ------------------------------------------------------------------ errors


class PipelineError(Exception):
    pass


@ragtrace.rag
def failing(question: str) -> str:
    raise PipelineError("boom " + question)  # the innermost frame of the traceback


def test_user_exception_propagates_unchanged(recorder: Recorder) -> None:
    with pytest.raises(PipelineError) as info:
        failing("now")
    error = info.value
    assert str(error) == "boom now"
    frames = traceback.extract_tb(error.__traceback__)
    assert frames[-1].name == "failing"
    assert "raise PipelineError" in (frames[-1].line or "")

    span = recorder.one("failing")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "PipelineError: boom now"
    (event,) = [e for e in span.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"].endswith("PipelineError")
    assert event.attributes["exception.message"] == "boom now"
    assert span.attributes is not None
    assert span.attributes[semconv.INPUT_VALUE] == "now"
    assert semconv.OUTPUT_VALUE not in span.attributes


def test_exception_object_identity_async(recorder: Recorder) -> None:
    sentinel = PipelineError("same object")

    @ragtrace.retriever
    async def broken(query: str) -> list[str]:
        raise sentinel

    with pytest.raises(PipelineError) as info:
        asyncio.run(broken("q"))
    assert info.value is sentinel
    assert recorder.one("broken").status.status_code is StatusCode.ERROR


def test_context_restored_after_calls(recorder: Recorder) -> None:
    before = trace.get_current_span()
    answer("x")
    with pytest.raises(PipelineError):
        failing("y")
    assert trace.get_current_span() is before


# ------------------------------------------------------------------ async


async def test_async_rag_and_retriever(recorder: Recorder) -> None:
    @ragtrace.retriever(name="aretrieve")
    async def aretrieve(query: str) -> list[str]:
        await asyncio.sleep(0)
        return ["alpha", "beta"]

    @ragtrace.rag
    async def aanswer(question: str) -> str:
        docs = await aretrieve(question)
        return " ".join(docs)

    results = await asyncio.gather(aanswer("one"), aanswer("two"))
    assert results == ["alpha beta", "alpha beta"]
    rag_spans = {s.attributes[semconv.INPUT_VALUE]: s for s in recorder.named("aanswer")}
    for span in recorder.named("aretrieve"):
        assert span.parent is not None
        parent = rag_spans[span.attributes[semconv.INPUT_VALUE]]
        assert span.parent.span_id == parent.context.span_id
        assert span.attributes["retrieval.documents.1.document.content"] == "beta"


# ------------------------------------------------------------------ generators


def test_sync_generator_joined_and_span_ends_at_exhaustion(recorder: Recorder) -> None:
    @ragtrace.generator
    def stream(prompt: str, model: str = "local-model") -> Iterator[str]:
        yield "Hel"
        yield "lo"
        yield ", world"

    it = stream("greet")
    assert recorder.spans() == []  # nothing runs before the first next()
    assert next(it) == "Hel"
    assert recorder.spans() == []  # span still open while streaming
    assert list(it) == ["lo", ", world"]
    attrs = recorder.attrs("stream")
    assert attrs[semconv.OUTPUT_VALUE] == "Hello, world"
    assert attrs[semconv.OPENINFERENCE_SPAN_KIND] == "LLM"
    assert attrs[semconv.LLM_MODEL_NAME] == "local-model"
    assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "local-model"


def test_sync_generator_close_early_and_error(recorder: Recorder) -> None:
    @ragtrace.rag
    def stream(question: str) -> Iterator[str]:
        yield "a"
        yield "b"
        raise PipelineError("mid-stream")

    it = stream("q")
    assert next(it) == "a"
    it.close()
    closed = recorder.one("stream")
    assert closed.status.status_code is StatusCode.UNSET
    assert closed.attributes is not None
    assert closed.attributes[semconv.OUTPUT_VALUE] == "a"

    recorder.clear()
    with pytest.raises(PipelineError):
        list(stream("q"))
    failed = recorder.one("stream")
    assert failed.status.status_code is StatusCode.ERROR


def test_sync_generator_send_throw_and_return_value(recorder: Recorder) -> None:
    @ragtrace.generator
    def echo(prompt: str) -> Any:
        total = []
        while True:
            try:
                received = yield len(total)
            except KeyError:
                received = "recovered"
            if received is None:
                return total
            total.append(received)

    def consume() -> Any:
        return (yield from echo("p"))

    driver = echo("p")
    assert next(driver) == 0
    assert driver.send("x") == 1
    assert driver.throw(KeyError("k")) == 2
    with pytest.raises(StopIteration) as stop:
        driver.send(None)
    assert stop.value.value == ["x", "recovered"]

    outer = consume()
    assert next(outer) == 0
    with pytest.raises(StopIteration) as stop2:
        outer.send(None)
    assert stop2.value.value == []
    assert len(recorder.named("echo")) == 2


def test_generator_span_current_only_inside_generator(recorder: Recorder) -> None:
    @ragtrace.retriever
    def inner_search(query: str) -> list[str]:
        return ["doc"]

    @ragtrace.rag
    def stream(question: str) -> Iterator[str]:
        yield inner_search(question)[0]
        yield "!"

    seen_by_consumer = []
    for _ in stream("q"):
        seen_by_consumer.append(trace.get_current_span())
    rag_span = recorder.one("stream")
    child = recorder.one("inner_search")
    assert child.parent is not None
    assert child.parent.span_id == rag_span.context.span_id
    for span in seen_by_consumer:
        assert span.get_span_context().span_id != rag_span.context.span_id


def test_generator_output_callable_applied_per_item(recorder: Recorder) -> None:
    @ragtrace.generator(output=lambda chunk: chunk["delta"])
    def stream(prompt: str) -> Iterator[dict[str, str]]:
        yield {"delta": "foo"}
        yield {"delta": "bar"}

    assert list(stream("p")) == [{"delta": "foo"}, {"delta": "bar"}]
    assert recorder.attrs("stream")[semconv.OUTPUT_VALUE] == "foobar"


def test_generator_non_text_items_recorded_as_json_list(recorder: Recorder) -> None:
    @ragtrace.rag
    def stream(question: str) -> Iterator[Any]:
        yield {"token": 1}
        yield "two"

    list(stream("q"))
    attrs = recorder.attrs("stream")
    assert attrs[semconv.OUTPUT_VALUE] == '[{"token": 1}, "two"]'
    assert attrs[semconv.OUTPUT_MIME_TYPE] == semconv.MIME_JSON


def test_retriever_generator_yields_documents(recorder: Recorder) -> None:
    @ragtrace.retriever
    def stream_docs(query: str) -> Iterator[dict[str, Any]]:
        for i in range(3):
            yield {"doc_id": i, "text": f"t{i}"}

    assert len(list(stream_docs("q"))) == 3
    attrs = recorder.attrs("stream_docs")
    assert attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] == 3
    assert attrs["retrieval.documents.2.document.id"] == "2"
    assert attrs["retrieval.documents.2.document.content"] == "t2"


async def test_async_generator_stream_and_aclose(recorder: Recorder) -> None:
    @ragtrace.retriever
    async def helper(query: str) -> list[str]:
        return ["x"]

    @ragtrace.rag
    async def astream(question: str) -> AsyncIterator[str]:
        docs = await helper(question)
        for piece in ("to", "ken", docs[0]):
            await asyncio.sleep(0)
            yield piece

    pieces = [p async for p in astream("q")]
    assert pieces == ["to", "ken", "x"]
    rag_span = recorder.one("astream")
    assert rag_span.attributes is not None
    assert rag_span.attributes[semconv.OUTPUT_VALUE] == "tokenx"
    child = recorder.one("helper")
    assert child.parent is not None
    assert child.parent.span_id == rag_span.context.span_id

    recorder.clear()
    agen = astream("again")
    assert await agen.__anext__() == "to"
    await agen.aclose()
    closed = recorder.one("astream")
    assert closed.status.status_code is StatusCode.UNSET
    assert closed.attributes is not None
    assert closed.attributes[semconv.OUTPUT_VALUE] == "to"


async def test_async_generator_asend_athrow_and_error(recorder: Recorder) -> None:
    @ragtrace.generator
    async def talk(prompt: str) -> AsyncIterator[str]:
        received = yield "ready"
        try:
            yield f"got {received}"
        except ValueError:
            yield "handled"
        raise PipelineError("after")

    agen = talk("p")
    assert await agen.asend(None) == "ready"
    assert await agen.asend("hi") == "got hi"
    assert await agen.athrow(ValueError("v")) == "handled"
    with pytest.raises(PipelineError):
        await agen.__anext__()
    span = recorder.one("talk")
    assert span.status.status_code is StatusCode.ERROR


def test_plain_function_returning_iterator_is_recorded_as_the_caller_reads_it(
    recorder: Recorder,
) -> None:
    @ragtrace.rag
    def lazy(question: str) -> Iterator[int]:
        return iter([1, 2, 3])

    @ragtrace.retriever
    def lazy_docs(query: str) -> Iterator[str]:
        return iter(["a", "b"])

    stream = lazy("q")
    assert recorder.exporter.get_finished_spans() == ()  # open until the stream is read
    assert list(stream) == [1, 2, 3]  # ragtrace takes nothing from the caller
    assert list(lazy_docs("q")) == ["a", "b"]
    assert json.loads(recorder.attrs("lazy")[semconv.OUTPUT_VALUE]) == [1, 2, 3]
    docs = recorder.attrs("lazy_docs")
    assert docs[semconv.RETRIEVAL_DOCUMENT_COUNT] == 2
    assert docs["retrieval.documents.1.document.content"] == "b"


# ------------------------------------------------------------------ reranker


def test_reranker_input_and_output_documents(recorder: Recorder) -> None:
    @ragtrace.reranker
    def rerank(query: str, documents: list[dict[str, Any]], top_k: int = 2) -> list[Any]:
        ranked = sorted(documents, key=lambda d: -len(d["content"]))[:top_k]
        return [(doc, 1.0 / (rank + 1)) for rank, doc in enumerate(ranked)]

    docs = [
        {"id": "a", "content": "x"},
        {"id": "b", "content": "xxx"},
        {"id": "c", "content": "xx"},
    ]
    out = rerank("which?", docs)
    assert [d["id"] for d, _ in out] == ["b", "c"]
    attrs = recorder.attrs("rerank")
    assert attrs[semconv.OPENINFERENCE_SPAN_KIND] == "RERANKER"
    assert attrs[semconv.RERANKER_QUERY] == "which?"
    assert attrs[semconv.RERANKER_TOP_K] == 2
    assert attrs[semconv.RERANKER_INPUT_DOCUMENT_COUNT] == 3
    assert attrs["reranker.input_documents.0.document.id"] == "a"
    assert attrs[semconv.RERANKER_OUTPUT_DOCUMENT_COUNT] == 2
    assert attrs["reranker.output_documents.0.document.id"] == "b"
    assert attrs["reranker.output_documents.0.document.score"] == 1.0
    assert attrs["reranker.output_documents.1.document.content"] == "xx"


def test_reranker_documents_found_as_first_list_argument(recorder: Recorder) -> None:
    @ragtrace.reranker
    def rerank(q: str, pool: list[str]) -> list[str]:
        return pool[::-1]

    rerank("q", ["one", "two"])
    attrs = recorder.attrs("rerank")
    assert attrs["reranker.input_documents.0.document.content"] == "one"
    assert attrs["reranker.output_documents.0.document.content"] == "two"
