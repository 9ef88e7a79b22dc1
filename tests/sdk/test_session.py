"""Sessions (turn numbering across threads and tasks) and set_reference."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import ragtrace
from ragtrace import semconv

from .conftest import Recorder


@ragtrace.retriever
def search(query: str) -> list[str]:
    return [f"about {query}"]


@ragtrace.rag
def answer(question: str) -> str:
    search(question)
    return "ok"


@ragtrace.rag
def outer(question: str) -> str:
    return answer(question)  # a nested @rag call shares the outer turn


def _turns(recorder: Recorder, name: str = "answer") -> list[int]:
    return sorted(int((s.attributes or {})[semconv.TURN_INDEX]) for s in recorder.named(name))


def test_turns_are_zero_based_and_sequential(recorder: Recorder) -> None:
    with ragtrace.session("conv-1", user_id="u-9", expected_outcome="resolve billing") as sess:
        assert isinstance(sess, ragtrace.Session)
        for question in ("a", "b", "c"):
            answer(question)
    spans = sorted(recorder.named("answer"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})[semconv.TURN_INDEX] for s in spans] == [0, 1, 2]
    attrs = dict(spans[0].attributes or {})
    assert attrs[semconv.SESSION_ID] == "conv-1"
    assert attrs[semconv.GEN_AI_CONVERSATION_ID] == "conv-1"
    assert attrs[semconv.USER_ID] == "u-9"
    assert attrs[semconv.EXPECTED_OUTCOME] == "resolve billing"
    # session attributes go on @rag spans only
    for span in recorder.named("search"):
        assert semconv.SESSION_ID not in (span.attributes or {})


def test_outside_a_session_no_conversation_attributes(recorder: Recorder) -> None:
    answer("q")
    attrs = recorder.attrs("answer")
    for key in (semconv.SESSION_ID, semconv.TURN_INDEX, semconv.USER_ID):
        assert key not in attrs


def test_nested_rag_shares_the_turn(recorder: Recorder) -> None:
    with ragtrace.session("nest"):
        outer("one")
        outer("two")
    assert _turns(recorder, "outer") == [0, 1]
    assert _turns(recorder, "answer") == [0, 1]


def test_numbering_continues_across_with_blocks_and_can_be_set(recorder: Recorder) -> None:
    for _ in range(2):  # e.g. two HTTP requests of the same conversation
        with ragtrace.session("web-conv"):
            answer("q")
    with ragtrace.session("other"):
        answer("q")
    with ragtrace.session("restarted", turn_index=7):
        answer("q")
        answer("q")
    by_session: dict[str, list[int]] = {}
    for span in recorder.named("answer"):
        attrs = span.attributes or {}
        by_session.setdefault(str(attrs[semconv.SESSION_ID]), []).append(
            int(attrs[semconv.TURN_INDEX])
        )
    assert sorted(by_session["web-conv"]) == [0, 1]
    assert by_session["other"] == [0]
    assert sorted(by_session["restarted"]) == [7, 8]


def test_inner_session_wins_and_outer_is_restored(recorder: Recorder) -> None:
    with ragtrace.session("outer-s"):
        with ragtrace.session("inner-s"):
            answer("q")
        answer("q")
    sessions = [(s.attributes or {})[semconv.SESSION_ID] for s in recorder.named("answer")]
    assert sorted(sessions) == ["inner-s", "outer-s"]
    answer("after")
    last = max(recorder.named("answer"), key=lambda s: s.start_time or 0)
    assert semconv.SESSION_ID not in (last.attributes or {})


def test_threads_share_the_counter(recorder: Recorder) -> None:
    n = 40
    with ragtrace.session("threads") as sess, ThreadPoolExecutor(max_workers=8) as pool:
        # copy_context carries the session (and trace context) into the worker
        futures = [pool.submit(contextvars.copy_context().run, answer, f"q{i}") for i in range(n)]
        for future in futures:
            assert future.result() == "ok"

        # or re-enter the same session object in a plain thread
        def worker() -> None:
            with sess:
                answer("from thread")

        threads = [threading.Thread(target=worker) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert _turns(recorder) == list(range(n + 10))


async def test_asyncio_tasks_share_the_counter(recorder: Recorder) -> None:
    @ragtrace.rag
    async def aanswer(question: str) -> str:
        await asyncio.sleep(0)
        return question

    async with ragtrace.session("tasks"):
        results = await asyncio.gather(*(aanswer(f"q{i}") for i in range(25)))
        await asyncio.to_thread(answer, "in a worker thread")
    assert len(results) == 25
    assert sorted(_turns(recorder, "aanswer") + _turns(recorder)) == list(range(26))
    assert all(
        (s.attributes or {})[semconv.SESSION_ID] == "tasks" for s in recorder.named("aanswer")
    )


def test_session_bad_arguments_never_raise(recorder: Recorder) -> None:
    with ragtrace.session(123, user_id=456, turn_index=-3):  # type: ignore[arg-type]
        answer("q")
    attrs = recorder.attrs("answer")
    assert attrs[semconv.SESSION_ID] == "123"
    assert attrs[semconv.USER_ID] == "456"
    assert attrs[semconv.TURN_INDEX] == 0


# ------------------------------------------------------------------ set_reference


def test_set_reference_on_current_rag_span(recorder: Recorder) -> None:
    @ragtrace.retriever
    def deep_search(query: str) -> list[str]:
        # called from inside the retriever: still lands on the enclosing @rag span
        ragtrace.set_reference(reference_context_ids=["kb-1", 2])
        return ["x"]

    @ragtrace.rag
    def golden(question: str) -> str:
        ragtrace.set_reference(
            expected_output="Paris",
            reference_contexts=["Paris is the capital of France.", "It has 2M people."],
        )
        deep_search(question)
        return "Paris"

    golden("capital?")
    attrs = recorder.attrs("golden")
    assert attrs[semconv.EXPECTED_OUTPUT] == "Paris"
    assert json.loads(attrs[semconv.REFERENCE_CONTEXTS]) == [
        "Paris is the capital of France.",
        "It has 2M people.",
    ]
    assert json.loads(attrs[semconv.REFERENCE_CONTEXT_IDS]) == ["kb-1", "2"]
    assert semconv.REFERENCE_CONTEXT_IDS not in recorder.attrs("deep_search")


def test_set_reference_single_string_is_a_one_item_list(recorder: Recorder) -> None:
    @ragtrace.rag
    def golden(question: str) -> str:
        ragtrace.set_reference(reference_contexts="only one", reference_context_ids="id-1")  # type: ignore[arg-type]
        return "a"

    golden("q")
    attrs = recorder.attrs("golden")
    assert json.loads(attrs[semconv.REFERENCE_CONTEXTS]) == ["only one"]
    assert json.loads(attrs[semconv.REFERENCE_CONTEXT_IDS]) == ["id-1"]


def test_set_reference_in_streaming_rag(recorder: Recorder) -> None:
    @ragtrace.rag
    def stream(question: str):  # type: ignore[no-untyped-def]
        yield "a"
        ragtrace.set_reference(expected_output="ab")
        yield "b"

    assert list(stream("q")) == ["a", "b"]
    assert recorder.attrs("stream")[semconv.EXPECTED_OUTPUT] == "ab"


def test_set_reference_outside_rag_warns_once(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        ragtrace.set_reference(expected_output="x")
        ragtrace.set_reference(expected_output="y")
        search("not a rag span")
    records = [r for r in caplog.records if r.name == "ragtrace"]
    assert len(records) == 1
    assert "outside a @ragtrace.rag" in records[0].getMessage()
    assert semconv.EXPECTED_OUTPUT not in recorder.attrs("search")
