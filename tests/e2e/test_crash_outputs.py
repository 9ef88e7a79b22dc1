"""kill -9 with outputs in flight: what the collector computed or still owes from an
acknowledged request survives (the ledger of outputs, docs/delivery.md).

Each test runs ``ragtrace-collector serve`` with ``storage.directory`` set, sends ten
traces, lets the loopback judge answer for half of them and hold the other half, kills
the collector with SIGKILL, restarts it on the same log with the judge answering, and
checks: every trace delivered, every score delivered, no judge call made again for a
result computed before the crash.  Each prints its figures.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import ragtrace
from ragtrace import semconv
from ragtrace_collector.exporters.phoenix import PhoenixAnnotations, read_annotations
from ragtrace_collector.otlp.codec import decode_protobuf_request, iter_spans
from tests.e2e import _app
from tests.e2e._support import (
    JUDGE_KEY_ENV,
    JudgeServer,
    Serve,
    flat,
    llm_judge,
    rag_spans,
    serve_config,
)
from tests.e2e.test_reliability import _questions, _send
from tests.fakes.harness import wait_for
from tests.fakes.openai_server import RecordedRequest, Reply, auto_reply
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.fakes.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRACES = 10
#: Traces 0..ANSWERED-1 get their judge answers before the crash; the rest are held.
ANSWERED = 5
LLM_METRIC = "contextual_recall"
_CASE = re.compile(r"crash (\d+):")


class ScriptedJudge:
    """Answers every judge request (``auto_reply``) except those of held cases, which
    stay in flight until released; records the case of every request."""

    def __init__(self, held: set[int], delay: float = 0.0) -> None:
        self.held = frozenset(held)
        self.delay = delay
        self.released = threading.Event()
        self.seen: list[int] = []

    async def __call__(self, request: RecordedRequest) -> Reply:
        match = _CASE.search(request.prompt_text)
        case = int(match.group(1)) if match else -1
        self.seen.append(case)
        if case in self.held:
            await asyncio.to_thread(self.released.wait, 300)
        return Reply(content=auto_reply(request).content, delay_s=self.delay)


def _let_checkpoint_pass() -> None:
    """Wait several checkpoint intervals (0.5 s) before the kill: an entry released too
    early would then be past the checkpoint and not replayed, so each test fails if the
    ledger lets go of an entry before its outputs are delivered."""
    time.sleep(2.0)


def _case_of(span: ReceivedSpan) -> int:
    match = _CASE.search(str(span.attributes.get(semconv.INPUT_VALUE, "")))
    assert match is not None
    return int(match.group(1))


def _carriers(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.attributes.get(semconv.OPENINFERENCE_SPAN_KIND) == semconv.OI_KIND_EVALUATOR
    ]


def _scores(spans: list[ReceivedSpan], metric: str) -> dict[str, int]:
    """Evaluated span id (hex) -> how many times a score of ``metric`` for it arrived
    (on the span itself or on a carrier linked to it)."""
    got: Counter[str] = Counter()
    for span in spans:
        if flat(span, metric, semconv.EVAL_FIELD_SCORE) is None:
            continue
        target = span.span.links[0].span_id if span.span.links else span.span.span_id
        got[target.hex()] += 1
    return dict(got)


def _run(
    tmp_path: Path,
    sink: OtlpSink,
    judge_server: JudgeServer,
    sections: dict[str, Any],
    *,
    crash_when: Any,
    delay: float = 0.0,
    answered: int = ANSWERED,
    restart_sections: dict[str, Any] | None = None,
) -> tuple[list[str], ScriptedJudge, ScriptedJudge]:
    """Send the traces, crash once ``crash_when(judge)`` holds, restart (with
    ``restart_sections`` instead of ``sections`` if given), and return (questions, first
    run's judge, second run's judge)."""
    questions = _questions(TRACES, "crash")
    wal = tmp_path / "wal"
    config = serve_config(
        sink,
        judge=llm_judge(judge_server),
        storage={"directory": str(wal)},
        **sections,
    )
    env = {JUDGE_KEY_ENV: "sk-e2e-dummy", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    first = ScriptedJudge(held=set(range(answered, TRACES)), delay=delay)
    judge_server.handler = first
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    serve = Serve(config, tmp_path / "run1", env=env)
    try:
        _send(serve.http_url, questions)  # one trace per question, named in its prompts
        wait_for(lambda: crash_when(first), timeout=60, what="the state to crash in")
        _let_checkpoint_pass()
        serve.proc.send_signal(signal.SIGKILL)
        serve.kill()
    finally:
        serve.kill()
    second = ScriptedJudge(held=set())
    judge_server.handler = second
    if restart_sections is not None:
        config = serve_config(
            sink,
            judge=llm_judge(judge_server),
            storage={"directory": str(wal)},
            **restart_sections,
        )
    restarted = Serve(config, tmp_path / "run2", env=env)
    try:
        wait_for(
            lambda: len(_scores(sink.spans, LLM_METRIC)) >= TRACES,
            timeout=90,
            what="a score for every trace",
        )
        restarted.proc.send_signal(signal.SIGTERM)
        assert restarted.wait(60) == 0
    finally:
        first.released.set()
        restarted.kill()
    return questions, first, second


def _figures(
    name: str, questions: list[str], sink: OtlpSink, first: ScriptedJudge, second: ScriptedJudge
) -> dict[str, Any]:
    spans = sink.spans
    keys = Counter(s.key for s in spans)
    evaluated = {s.span.span_id.hex(): _case_of(s) for s in rag_spans(spans)}
    scores = _scores(spans, LLM_METRIC)
    answered_before = {c for c in first.seen if c not in first.held and c >= 0}
    repeated = [c for c in second.seen if c in answered_before]
    figure = {
        "acknowledged_traces": len(questions),
        "delivered_traces": len(set(evaluated.values())),
        "duplicated_spans": sum(n - 1 for n in keys.values()),
        "scores_expected": len(questions),
        "scores_delivered": len(scores),
        "score_duplicates": sum(n - 1 for n in scores.values()),
        "judge_calls_first_run": len(first.seen),
        "judge_calls_after_restart": len(second.seen),
        "judge_calls_repeated": len(repeated),
    }
    print(f"\n{name} kill -9 figure:", json.dumps(figure))
    return figure


def test_kill_9_with_carriers_owed_delivers_every_score_once_computed(
    sink: OtlpSink, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """``attach: carrier``: the traces go out first; the crash comes with half the
    carriers delivered and the other half's judge calls in flight."""
    sections = {
        "metrics": {LLM_METRIC: {}},
        "enrichment": {"attach": "carrier"},
        "evaluation": {"workers": TRACES, "metric_timeout": 120, "trace_timeout": 120},
    }

    def crash_when(judge: ScriptedJudge) -> bool:
        held = {c for c in judge.seen if c in judge.held}
        return len(held) == TRACES - ANSWERED and len(_carriers(sink.spans)) >= ANSWERED

    questions, first, second = _run(tmp_path, sink, judge_server, sections, crash_when=crash_when)
    figure = _figures("carrier", questions, sink, first, second)
    assert figure["delivered_traces"] == TRACES
    assert figure["scores_delivered"] == TRACES
    # Only the cases the judge had not answered were judged again.
    assert figure["judge_calls_repeated"] == 0
    assert set(second.seen) == set(range(ANSWERED, TRACES))
    # Every carrier is linked to its evaluated span, whichever run made it.
    evaluated = {s.span.span_id for s in rag_spans(sink.spans)}
    assert all(c.span.links[0].span_id in evaluated for c in _carriers(sink.spans))


def test_kill_9_with_late_results_owed_delivers_every_score_once_computed(
    sink: OtlpSink, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """``late_results: carrier``: each trace goes out at ``trace_timeout`` with its fast
    metric; the LLM metric follows on a carrier.  The crash comes with half the late
    results delivered and the other half in flight."""
    sections = {
        "metrics": {LLM_METRIC: {}, "id_context_recall": {}},
        "evaluation": {
            "workers": TRACES,
            "metric_timeout": 120,
            "trace_timeout": 0.5,
            "late_results": "carrier",
        },
    }

    def crash_when(judge: ScriptedJudge) -> bool:
        held = {c for c in judge.seen if c in judge.held}
        traces_out = len(rag_spans(sink.spans)) >= TRACES
        return (
            traces_out and len(held) == TRACES - ANSWERED and len(_carriers(sink.spans)) >= ANSWERED
        )

    # The answered cases are answered after trace_timeout: late results, on carriers.
    questions, first, second = _run(
        tmp_path, sink, judge_server, sections, crash_when=crash_when, delay=1.5
    )
    figure = _figures("late_results", questions, sink, first, second)
    assert figure["delivered_traces"] == TRACES
    assert figure["scores_delivered"] == TRACES
    assert figure["judge_calls_repeated"] == 0
    assert set(second.seen) == set(range(ANSWERED, TRACES))
    # The fast metric was on every trace from the first run and is never lost.
    for span in rag_spans(sink.spans):
        assert flat(span, "id_context_recall", semconv.EVAL_FIELD_SCORE) is not None


def test_kill_9_after_the_traces_went_out_delivers_late_results_computed_at_replay(
    sink: OtlpSink, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """``late_results: carrier`` with every judge call held: the traces go out at
    ``trace_timeout`` and the crash comes before any late result.  At the restart the
    judge answers within ``trace_timeout`` (made long), but the backend already has
    the replayed traces (delivery marks): the results must follow on carriers, not on
    the spans it will not get again (issue 27, defect 2).  Only the LLM metric: no
    result of these traces is in the log before the crash."""
    evaluation = {"workers": TRACES, "metric_timeout": 120, "late_results": "carrier"}
    sections: dict[str, Any] = {
        "metrics": {LLM_METRIC: {}},
        "evaluation": {**evaluation, "trace_timeout": 0.5},
    }
    restart = {**sections, "evaluation": {**evaluation, "trace_timeout": 60}}

    def crash_when(judge: ScriptedJudge) -> bool:
        # Every judge call is held (at most judge.concurrency of them in flight).
        return len(rag_spans(sink.spans)) >= TRACES and bool(judge.seen)

    questions, first, second = _run(
        tmp_path,
        sink,
        judge_server,
        sections,
        crash_when=crash_when,
        answered=0,
        restart_sections=restart,
    )
    figure = _figures("late_results_all_held", questions, sink, first, second)
    assert figure["delivered_traces"] == TRACES
    assert figure["scores_delivered"] == TRACES
    assert set(second.seen) == set(range(TRACES))
    assert len(_carriers(sink.spans)) >= TRACES


# ------------------------------------------------------------------ Phoenix
class RestPhoenix:
    """A fake Phoenix on loopback (its own thread): takes OTLP/HTTP spans, answers the
    annotation endpoints with ``annotation_status`` (404 = "span not stored yet", which
    the exporter retries), and records every annotation it accepted."""

    def __init__(self) -> None:
        self.annotation_status = 200
        self.spans: list[Any] = []
        self.posted: dict[str, list[dict[str, Any]]] = {"span": [], "document": [], "session": []}
        self.attempts = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.path == "/v1/traces":  # (compression: none)
            self.spans.extend(iter_spans(decode_protobuf_request(raw)))
            return web.Response(status=200)
        kind = request.path.removeprefix("/v1/").removesuffix("_annotations")
        self.attempts += 1
        if self.annotation_status != 200:
            return web.json_response({"detail": "not found"}, status=self.annotation_status)
        self.posted[kind].extend(json.loads(raw)["data"])
        return web.json_response({"data": []})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> RestPhoenix:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _annotation_keys(kind: str, items: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    if kind == "span":
        return {(i["span_id"], i["name"]) for i in items}
    if kind == "document":
        return {(i["span_id"], i["document_position"], i["name"]) for i in items}
    return {(i["session_id"], i["name"]) for i in items}


def _expected_annotations(spans: list[Any]) -> dict[str, set[tuple[Any, ...]]]:
    """The annotations the results written on ``spans`` call for."""
    found = PhoenixAnnotations()
    for span in spans:
        read_annotations(span, into=found)
    return {
        "span": _annotation_keys("span", found.spans),
        "document": _annotation_keys("document", found.documents),
        "session": _annotation_keys("session", [item for *_, item in found.sessions]),
    }


@pytest.mark.timeout(300)
def test_kill_9_with_phoenix_annotations_in_flight_posts_every_annotation(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Spans delivered to Phoenix, their annotations waiting for it (404, retried), then
    kill -9: after the restart every span, document and session annotation is posted,
    and no result is computed again."""
    sessions = {"crash-sess-a": [0, 1], "crash-sess-b": [2, 3]}
    questions = {i: f"crash {i}: how do I reset my password?" for i in range(4)}
    for q in questions.values():
        _app.route(q, ["kb_reset", "kb_invoice", "kb_expiry"])
    first = ScriptedJudge(held=set())
    second = ScriptedJudge(held=set())
    env = {JUDGE_KEY_ENV: "sk-e2e-dummy", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with RestPhoenix() as phoenix, OtlpSink() as unused:
        config = serve_config(
            unused,
            judge=llm_judge(judge_server),
            storage={"directory": str(tmp_path / "wal")},
            metrics={
                LLM_METRIC: {},
                "id_context_recall": {},
                "id_context_precision": {},
                "turn_contextual_precision": {},
            },
            exporters={
                "phoenix": {
                    "type": "phoenix",
                    "endpoint": phoenix.url,
                    "compression": "none",
                    "annotations": {"max_wait": "120s"},
                }
            },
        )
        phoenix.annotation_status = 404
        judge_server.handler = first
        (tmp_path / "run1").mkdir()
        (tmp_path / "run2").mkdir()
        serve = Serve(config, tmp_path / "run1", env=env)
        try:
            ragtrace.configure(service_name="crash-bot", endpoint=serve.http_url)
            for session, cases in sessions.items():
                with ragtrace.session(session, expected_outcome="Reset the password."):
                    for i in cases:
                        _app.answer(
                            questions[i],
                            {
                                "expected_output": f"Open Settings. {questions[i]}",
                                "reference_context_ids": ["kb_reset", "kb_expiry"],
                            },
                        )
            assert ragtrace.flush(30)
            # Every evaluated span reached Phoenix; their annotations wait for it.
            wait_for(
                lambda: (
                    len(_expected_annotations(phoenix.spans)["span"]) >= 4 * 3
                    and phoenix.attempts >= 2
                ),
                timeout=60,
                what="spans delivered, annotations in flight",
            )
            expected = _expected_annotations(phoenix.spans)
            _let_checkpoint_pass()
            serve.proc.send_signal(signal.SIGKILL)
            serve.kill()
        finally:
            serve.kill()
        acknowledged = {(s.trace_id, s.span_id) for s in phoenix.spans}
        first_run_spans = len(phoenix.spans)
        assert not any(phoenix.posted.values())

        phoenix.annotation_status = 200
        judge_server.handler = second
        restarted = Serve(config, tmp_path / "run2", env=env)
        try:

            def all_posted() -> bool:
                return all(
                    expected[kind] <= _annotation_keys(kind, phoenix.posted[kind])
                    for kind in expected
                )

            wait_for(all_posted, timeout=90, what="every annotation posted")
            restarted.proc.send_signal(signal.SIGTERM)
            assert restarted.wait(60) == 0
        finally:
            restarted.kill()
    delivered = Counter((s.trace_id, s.span_id) for s in phoenix.spans)
    figure = {
        "spans_acknowledged": len(acknowledged),
        "spans_delivered": len(delivered),
        "spans_duplicated": sum(n - 1 for n in delivered.values()),
        "spans_first_run": first_run_spans,
        **{
            f"{kind}_annotations_expected": len(expected[kind])
            for kind in ("span", "document", "session")
        },
        **{
            f"{kind}_annotations_delivered": len(
                expected[kind] & _annotation_keys(kind, phoenix.posted[kind])
            )
            for kind in ("span", "document", "session")
        },
        "judge_calls_first_run": len(first.seen),
        "judge_calls_repeated": len(second.seen),
    }
    print("\nphoenix kill -9 figure:", json.dumps(figure))
    assert set(delivered) == acknowledged
    assert expected["document"]
    assert len(expected["session"]) == len(sessions)
    # The replayed spans came back with the results computed before the crash.
    assert figure["judge_calls_repeated"] == 0
