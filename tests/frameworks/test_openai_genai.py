"""Supported matrix: a plain OpenAI app with the OTel GenAI instrumentation
(``opentelemetry-instrumentation-openai-v2``, latest GenAI conventions, content on the
spans) against the loopback OpenAI-compatible server, exported to a real collector with
no config.

The instrumentor traces the chat calls only.  The app's own retrieval and the request
around it are recorded with the same family's ``opentelemetry-util-genai`` (the
``invoke_agent`` and ``retrieval`` spans of the GenAI conventions); the app retrieves
with the corpus's keyword rule: top 2 of "What is the capital of France?" is kb_paris,
kb_berlin, so id_context_recall = 1/1 = 1.0 and id_context_precision = 1/2 = 0.5.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv
from tests.e2e._support import JudgeServer
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.frameworks._matrix import (
    KB,
    QUESTIONS,
    TURN_METRICS,
    Retrieved,
    assert_conversation_scored,
    assert_ids_scored,
    assert_text_metrics_scored,
    converse,
    matrix_collector,
    provider,
    rank,
    scored,
    tops,
    wait_scored,
)

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUESTION = QUESTIONS[0]


@pytest.fixture
def openai_v2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The instrumentor on the latest GenAI conventions, message content on the spans."""
    from opentelemetry.instrumentation._semconv import (
        _OpenTelemetrySemanticConventionStability as Stability,
    )
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    # The opt-in is read once per process: read it again, and again after the test.
    monkeypatch.setattr(Stability, "_initialized", False)
    instrumentor = OpenAIInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


class _App:
    """The app: an agent request around the app's retrieval and one chat call."""

    def __init__(self, tp: Any, server: JudgeServer) -> None:
        from openai import OpenAI
        from opentelemetry.util.genai.handler import TelemetryHandler

        self.client = OpenAI(base_url=server.base_url, api_key="sk-loopback")
        self.handler = TelemetryHandler(tracer_provider=tp)

    def ask(self, question: str, conversation: str | None = None) -> Retrieved:
        from opentelemetry.util.genai.types import InputMessage, OutputMessage, Text

        ids = rank(question)
        with self.handler.invoke_local_agent(agent_name="kb-agent") as agent:
            agent.conversation_id = conversation
            agent.input_messages = [InputMessage(role="user", parts=[Text(content=question)])]
            with self.handler.retrieval(data_source_id="kb") as retrieval:
                retrieval.query_text = question
                retrieval.documents = [
                    {"id": i, "score": 1.0 - n / 10, "content": KB[i]} for n, i in enumerate(ids)
                ]
            context = "\n".join(KB[i] for i in ids)
            completion = self.client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": f"Context:\n{context}\n\n{question}"}],
            )
            answer = completion.choices[0].message.content or ""
            agent.output_messages = [
                OutputMessage(role="assistant", parts=[Text(content=answer)], finish_reason="stop")
            ]
        return Retrieved(ids, [KB[i] for i in ids], answer)


def test_genai_agent_with_retrieval(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openai_v2: Any
) -> None:
    """The ``invoke_agent`` span is the case: question and answer from its GenAI
    messages, documents (id, score, content) from the retrieval span."""
    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, "openai-genai")
        openai_v2.instrument(tracer_provider=tp)
        got = _App(tp, llm_server).ask(QUESTION)
        tp.shutdown()
        spans = wait_scored(sink, 1)
    [root] = tops(spans)
    assert root.span.name == "invoke_agent kb-agent"
    chat = [s for s in spans if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == "chat"]
    assert len(chat) == 1  # the instrumentor's span, under the agent
    assert scored(spans) == [root]
    assert_ids_scored(root)
    assert_text_metrics_scored(root, QUESTION, got)


def test_chat_calls_alone_are_not_a_case(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openai_v2: Any
) -> None:
    """The instrumentor alone records chat calls, no retrieval: nothing to score, the
    trace is forwarded as it came, unscored."""
    with matrix_collector(sink, tmp_path) as serve:
        tp = provider(serve, "openai-chat-only")
        openai_v2.instrument(tracer_provider=tp)
        app = _App(tp, llm_server)
        app.client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}]
        )
        tp.shutdown()
        sink.wait_until(lambda: len(sink.spans) >= 1, 60)
        spans: list[ReceivedSpan] = sink.spans
    [chat] = spans
    assert chat.span.name == "chat gpt-4o-mini"
    assert chat.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert semconv.GEN_AI_OUTPUT_MESSAGES in chat.attributes
    assert scored(spans) == []


def test_genai_conversation(
    sink: OtlpSink, tmp_path: Path, llm_server: JudgeServer, openai_v2: Any
) -> None:
    """``gen_ai.conversation.id`` on the agent span, no turn index: three turns."""
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    metrics: dict[str, dict[str, Any]] = {name: {} for name in (*TURN_METRICS, "id_context_recall")}
    with matrix_collector(sink, tmp_path, metrics) as serve:
        tp = provider(serve, "openai-genai-chat")
        openai_v2.instrument(tracer_provider=tp)
        app = _App(tp, llm_server)
        turns = converse(sink, lambda q: app.ask(q, conversation), tp.force_flush)
        tp.shutdown()
        roots = tops(sink.spans)
    assert [r.attributes[semconv.GEN_AI_CONVERSATION_ID] for r in roots] == [conversation] * 3
    assert_conversation_scored(roots, turns)
