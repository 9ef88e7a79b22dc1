"""SDK-decorated app -> collector (evaluation on) -> OTLP sink, over real sockets.

Ground truth arrives both ways (``set_reference`` on the span, and the reference store
file); the scores on the forwarded ``@rag`` spans are checked exactly, in all three
forms, and the LLM metrics go through litellm to a loopback OpenAI-compatible server
whose verdicts the test scripts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ragtrace
from ragtrace import semconv
from tests.e2e import _app
from tests.e2e._app import KB
from tests.e2e._support import (
    JUDGE_MODEL,
    JudgeServer,
    assert_scored,
    eval_config,
    eval_events,
    evaluating_collector,
    flat,
    judge_task,
    llm_judge,
    oi_evaluations,
    rag_span_for,
    rag_spans,
    sample,
)
from tests.fakes.openai_server import RecordedRequest, Reply, fenced_blocks
from tests.fakes.otlp_sink import OtlpSink

NON_LLM = ("id_context_recall", "id_context_precision")
STRING = ("non_llm_context_recall", "non_llm_context_precision")

GOLDEN_Q = "What is the capital of France?"
STORE_Q = "How do I reset my password?"
PLAIN_Q = "How do I export my data?"


def _send(endpoint: str, requests: list[tuple[str, dict[str, Any] | None]]) -> None:
    ragtrace.configure(service_name="e2e-bot", endpoint=endpoint)
    for question, reference in requests:
        _app.answer(question, reference)
    assert ragtrace.flush(30)


def test_id_and_string_metrics_exact_on_the_rag_span(sink: OtlpSink, tmp_path: Path) -> None:
    store = tmp_path / "references.jsonl"
    store.write_text(
        json.dumps(
            {
                # Matched on normalised text: case and trailing punctuation differ.
                "input": "how do I reset my password",
                "reference_context_ids": ["kb_reset", "kb_expiry", "kb_2fa"],
                "reference_contexts": [KB["kb_reset"]],
            }
        )
        + "\n"
    )
    _app.route(GOLDEN_Q, ["doc_paris", "doc_louvre", "doc_berlin"])
    _app.route(STORE_Q, ["kb_reset", "kb_invoice"])
    _app.route(PLAIN_Q, ["kb_export"])
    golden = {
        "reference_context_ids": ["doc_paris", "doc_eiffel"],
        "reference_contexts": [KB["doc_paris"], KB["doc_eiffel"]],
    }
    config = eval_config(
        sink,
        metrics={name: {} for name in NON_LLM + STRING},
        reference_store={"path": str(store), "reload_interval": 0},
    )
    with evaluating_collector(config) as collector:
        _send(collector.http_url, [(GOLDEN_Q, golden), (STORE_Q, None), (PLAIN_Q, None)])
        spans = sink.wait_for_spans(9)
        samples = collector.scrape()

    # Ground truth from set_reference.  Retrieved [paris, louvre, berlin]:
    #   ids: recall |{paris}|/|{paris, eiffel}| = 0.5; precision 1/3.
    #   strings (Levenshtein similarity): paris->paris 1.0, eiffel's best is louvre
    #   0.387 -> recall 1/2; nodes paris 1.0, louvre 0.387, berlin~paris 0.727 ->
    #   relevance [1, 0, 1] -> AP (1/1 + 2/3) / 2.
    span = rag_span_for(spans, GOLDEN_Q)
    assert_scored(span, "id_context_recall", 0.5)
    assert_scored(span, "id_context_precision", 1 / 3)
    assert_scored(span, "non_llm_context_recall", 0.5)
    assert_scored(span, "non_llm_context_precision", (1 + 2 / 3) / 2)
    # Ground truth from the reference store.  Retrieved [reset, invoice]:
    #   ids: recall 1/3, precision 1/2; strings: reset->reset 1.0 -> recall 1;
    #   relevance [1, 0] -> AP 1.
    span = rag_span_for(spans, STORE_Q)
    assert semconv.REFERENCE_CONTEXT_IDS not in span.attributes  # the store's, not the app's
    assert_scored(span, "id_context_recall", 1 / 3)
    assert_scored(span, "id_context_precision", 0.5)
    assert_scored(span, "non_llm_context_recall", 1.0)
    assert_scored(span, "non_llm_context_precision", 1.0)
    # No ground truth anywhere: skipped with a reason, never a 0.
    span = rag_span_for(spans, PLAIN_Q)
    for metric in NON_LLM + STRING:
        assert flat(span, metric, semconv.EVAL_FIELD_SCORE) is None
        assert flat(span, metric, semconv.EVAL_FIELD_SKIPPED) is True
        assert flat(span, metric, semconv.EVAL_FIELD_REASON)
        assert oi_evaluations(span)[metric][semconv.EVALUATION_LABEL] == "skipped"
        assert semconv.GEN_AI_EVALUATION_SCORE_VALUE not in eval_events(span)[metric]

    for span in rag_spans(spans):
        attrs = span.attributes
        assert attrs[semconv.EVAL_MODEL] == "offline"
        assert attrs[semconv.EVAL_SAMPLE_RATE] == 1.0
        assert attrs[semconv.EVAL_SAMPLED] is True
        assert attrs[semconv.EVAL_LATENCY_MS] >= 0.0
        assert len(oi_evaluations(span)) == 4
        assert len(eval_events(span)) == 4
    # Only the @rag spans are evaluated; the others pass untouched.
    for span in spans:
        if span not in rag_spans(spans):
            assert not any(k.startswith(semconv.EVAL_PREFIX) for k in span.attributes)
            assert not span.span.events
    assert sample(samples, "ragtrace_eval_results_total", metric="id_context_recall") == 3
    assert (
        sample(
            samples, "ragtrace_eval_results_total", metric="id_context_recall", outcome="skipped"
        )
        == 1
    )
    assert sample(samples, "ragtrace_eval_score_count", metric="id_context_precision") == 2
    assert (
        abs(
            sample(samples, "ragtrace_eval_score_sum", metric="id_context_precision")
            - (1 / 3 + 0.5)
        )
        < 1e-9
    )


# ------------------------------------------------------------------ LLM judge
#: Question -> the expected answer (reference) and the scripted verdicts.
_LLM_CASES: dict[str, dict[str, Any]] = {
    "What is the capital of France?": {
        "docs": ["doc_paris", "doc_louvre", "doc_berlin"],
        "expected": "Paris is the capital. It is in France. It has the Louvre. It is big.",
        "attribution": ["yes", "yes", "no", "no"],  # recall 0.5
        "usefulness": ["yes", "no", "yes"],  # AP 0.8333
    },
    "Where is the Eiffel Tower?": {
        "docs": ["doc_louvre", "doc_eiffel"],
        "expected": "The Eiffel Tower is in Paris. It is famous. It is tall.",
        "attribution": ["yes", "maybe", "no"],  # 'maybe' is dropped: 1/2
        "usefulness": ["no", "yes"],  # AP 0.5
    },
    "How do I reset my password?": {
        "docs": ["kb_reset", "kb_invoice", "kb_expiry"],
        "expected": "Open Settings. Choose Security. Links expire after a day.",
        "attribution": ["yes", "yes", "yes"],  # 1.0
        "usefulness": ["no", "yes", "yes"],  # AP (1/2 + 2/3) / 2
    },
}
_EXPECTED = {
    "What is the capital of France?": (0.5, (1 + 2 / 3) / 2),
    "Where is the Eiffel Tower?": (0.5, 0.5),
    "How do I reset my password?": (1.0, (1 / 2 + 2 / 3) / 2),
}
_PROMPT_TOKENS = 120
_COMPLETION_TOKENS = 30


def _scripted_judge(request: RecordedRequest) -> Reply:
    """Answer by the case the prompt is about: the fenced reference names it."""
    task = judge_task(request.body)
    text = request.prompt_text
    blocks = fenced_blocks(text)
    case = next(c for c in _LLM_CASES.values() if c["expected"] in text)
    tokens = {"prompt_tokens": _PROMPT_TOKENS, "completion_tokens": _COMPLETION_TOKENS}
    if task == "attribution":
        verdicts = [
            {"statement": f"statement {i}", "verdict": v, "node": 1 if v == "yes" else None}
            for i, v in enumerate(case["attribution"])
        ]
        return Reply.json({"verdicts": verdicts, "reason": "scripted recall"}, **tokens)
    if task == "usefulness":
        assert len(blocks["NODE"]) == len(case["docs"]), "one node per retrieved document"
        verdicts = [
            {"node": i + 1, "verdict": v, "reason": "scripted"}
            for i, v in enumerate(case["usefulness"])
        ]
        return Reply.json({"verdicts": verdicts, "reason": "scripted precision"}, **tokens)
    return Reply.error(400, f"unexpected judge task {task!r}")


def test_llm_metrics_through_litellm_to_the_loopback_server(
    sink: OtlpSink, judge_server: JudgeServer
) -> None:
    # Imported here, not when the suite is collected: litellm takes seconds to import.
    # (ragtrace_collector, imported above, set LITELLM_LOCAL_MODEL_COST_MAP=True.)
    import litellm

    judge_server.handler = _scripted_judge
    for question, case in _LLM_CASES.items():
        _app.route(question, case["docs"])
    config = eval_config(
        sink,
        judge=llm_judge(judge_server),
        metrics={"contextual_recall": {}, "contextual_precision": {}, "id_context_recall": {}},
    )
    with evaluating_collector(config) as collector:
        _send(
            collector.http_url,
            [
                (q, {"expected_output": c["expected"], "reference_context_ids": c["docs"][:1]})
                for q, c in _LLM_CASES.items()
            ],
        )
        spans = sink.wait_for_spans(3 * len(_LLM_CASES))
        samples = collector.scrape()

    # One judge call per LLM metric per case, each sent to the loopback server.
    requests = judge_server.server.requests
    assert len(requests) == 2 * len(_LLM_CASES)
    assert {r.model for r in requests} == {JUDGE_MODEL.split("/", 1)[1]}
    assert all(r.headers.get("Authorization") == "Bearer sk-e2e-dummy" for r in requests)
    total_cost = 0.0
    for question, (recall, precision) in _EXPECTED.items():
        span = rag_span_for(spans, question)
        assert_scored(span, "contextual_recall", recall)
        assert_scored(span, "contextual_precision", precision)
        # The judge's own reason is carried through.
        assert flat(span, "contextual_recall", semconv.EVAL_FIELD_REASON).endswith(
            "scripted recall"
        )
        assert flat(span, "contextual_precision", semconv.EVAL_FIELD_REFERENCE) == "expected_output"
        assert_scored(span, "id_context_recall", 1.0)
        assert span.attributes[semconv.EVAL_MODEL] == JUDGE_MODEL
        oi = oi_evaluations(span)
        assert oi["contextual_recall"][semconv.EVALUATION_ANNOTATOR_KIND] == "LLM"
        assert oi["id_context_recall"][semconv.EVALUATION_ANNOTATOR_KIND] == "CODE"
        cost = span.attributes[semconv.EVAL_COST_USD]
        assert cost > 0.0
        total_cost += cost

    # Tokens and cost of the judge calls on /metrics.
    calls = len(requests)
    model = JUDGE_MODEL
    assert sample(samples, "ragtrace_judge_calls_total", model=model, outcome="ok") == calls
    assert sample(samples, "ragtrace_judge_tokens_total", model=model, kind="prompt") == (
        calls * _PROMPT_TOKENS
    )
    assert sample(samples, "ragtrace_judge_tokens_total", model=model, kind="completion") == (
        calls * _COMPLETION_TOKENS
    )
    prompt_usd, completion_usd = litellm.cost_per_token(
        model="gpt-4o-mini",
        prompt_tokens=_PROMPT_TOKENS,
        completion_tokens=_COMPLETION_TOKENS,
    )
    per_call = prompt_usd + completion_usd
    assert abs(sample(samples, "ragtrace_judge_cost_usd_total", model=model) - calls * per_call) < (
        1e-9
    )
    assert abs(total_cost - calls * per_call) < 1e-9
    assert sample(samples, "ragtrace_judge_latency_seconds_count", model=model) == calls
