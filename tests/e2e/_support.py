"""Helpers for the end-to-end tests of online evaluation.

* :class:`EvalCollector`: the real :class:`CollectorService` with its evaluation stage
  (the collector harness runs a pass-through by default), on its own event loop;
* :func:`eval_config`: a collector config on loopback ports, exporting to a sink,
  evaluating every trace unless told otherwise;
* :class:`JudgeServer`: the scriptable OpenAI-compatible server on its own loop, so
  synchronous tests can block on the sink while litellm talks to it;
* :class:`Serve`: ``ragtrace-collector serve`` as a subprocess, evaluation on;
* readers for what the sink received: ``@rag`` spans, their flat eval attributes,
  their OpenInference evaluations and GenAI events;
* :func:`scrape`: the collector's ``/metrics`` parsed with prometheus-client.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ragtrace import semconv
from ragtrace_collector.config import CollectorConfig
from ragtrace_collector.service.server import CollectorService
from tests.fakes.harness import (
    CollectorThread,
    ServeProcess,
    collector_config,
    http_get,
)
from tests.fakes.openai_server import FakeOpenAIServer, Handler
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan, attributes_of

#: Name of the environment variable holding the (dummy) judge key.
JUDGE_KEY_ENV = "RAGTRACE_E2E_JUDGE_KEY"
JUDGE_MODEL = "openai/gpt-4o-mini"


# ------------------------------------------------------------------ collector
def eval_config(sink: OtlpSink, **sections: Any) -> CollectorConfig:
    """Loopback ports, one gRPC exporter to ``sink``, every trace sampled (override
    with ``sampling=...``), the offline judge (override with ``judge=...``)."""
    base: dict[str, Any] = {"sampling": {"rate": 1.0}}
    for key, value in sections.items():
        if key == "sampling":
            base["sampling"] = value
        else:
            base[key] = value
    return collector_config(sink=sink, **base)


def llm_judge(server: JudgeServer, **extra: Any) -> dict[str, Any]:
    """A ``judge:`` section pointing litellm at the loopback server."""
    return {
        "model": JUDGE_MODEL,
        "api_base": server.base_url,
        "api_key_env": JUDGE_KEY_ENV,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        **extra,
    }


class EvalCollector(CollectorThread):
    """:class:`CollectorThread` running the evaluation stage the config describes."""

    def start(self) -> EvalCollector:
        self._thread.start()

        async def _start() -> CollectorService:
            service = CollectorService(self.config)
            assert service.stage is not None, "evaluation must be enabled for these tests"
            await service.start()
            return service

        self.service = self.run(_start)
        return self

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return scrape(f"{self.admin_url}/metrics")

    def stop(self) -> None:
        """Stop the service, then end what is left on its loop as ``asyncio.run``
        would (judge calls abandoned after a timeout, litellm's logging worker),
        so nothing is finalised later on a closed loop."""
        if self._stopped:
            return
        service, self.service = self.service, None
        if service is not None:
            self.run(service.stop, timeout=120)
        self.run(_cancel_leftovers, timeout=30)
        super().stop()


async def _cancel_leftovers() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


@contextmanager
def evaluating_collector(config: CollectorConfig) -> Iterator[EvalCollector]:
    collector = EvalCollector(config).start()
    try:
        yield collector
    finally:
        collector.stop()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    status, body = http_get(url)
    assert status == 200, body
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbls), v in samples.items() if n == name and want <= set(lbls))


# --------------------------------------------------------------- judge server
class JudgeServer:
    """:class:`FakeOpenAIServer` served from a background event loop."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.server = FakeOpenAIServer(handler)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> JudgeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def handler(self) -> Handler | None:
        return self.server.handler

    @handler.setter
    def handler(self, handler: Handler | None) -> None:
        self.server.handler = handler

    @property
    def request_count(self) -> int:
        return self.server.request_count


def judge_task(request_body: dict[str, Any]) -> str:
    """The ragtrace judge task a request asks (from its system message)."""
    for message in request_body.get("messages", []):
        if message.get("role") == "system":
            text = str(message.get("content", ""))
            marker = "Judge task: "
            if marker in text:
                return text.split(marker, 1)[1].split(".", 1)[0]
    return ""


# ------------------------------------------------------------ sink read-back
def rag_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_RAG]


def rag_span_for(spans: list[ReceivedSpan], question: str) -> ReceivedSpan:
    found = [s for s in rag_spans(spans) if s.attributes.get(semconv.INPUT_VALUE) == question]
    assert len(found) == 1, f"{len(found)} @rag spans for {question!r}"
    return found[0]


def flat(span: ReceivedSpan, metric: str, fld: str) -> Any:
    return span.attributes.get(semconv.eval_attr(metric, fld))


def oi_evaluations(span: ReceivedSpan) -> dict[str, dict[str, Any]]:
    """The ``evaluations.N.evaluation.*`` records of a span, by evaluation name."""
    by_index: dict[int, dict[str, Any]] = {}
    lead = semconv.EVALUATIONS + "."
    for key, value in span.attributes.items():
        if key.startswith(lead):
            index, _, fld = key[len(lead) :].partition(".")
            by_index.setdefault(int(index), {})[fld] = value
    out: dict[str, dict[str, Any]] = {}
    for record in by_index.values():
        name = record[semconv.EVALUATION_NAME]
        assert name not in out, f"evaluation {name} written twice"
        out[name] = record
    return out


def eval_events(span: ReceivedSpan) -> dict[str, dict[str, Any]]:
    """The ``gen_ai.evaluation.result`` events of a span, by evaluation name."""
    out: dict[str, dict[str, Any]] = {}
    for event in span.span.events:
        if event.name == semconv.GEN_AI_EVALUATION_RESULT_EVENT:
            attrs = attributes_of(event)
            name = attrs[semconv.GEN_AI_EVALUATION_NAME]
            assert name not in out, f"event for {name} written twice"
            out[name] = attrs
    return out


def assert_scored(span: ReceivedSpan, metric: str, score: float, *, threshold: float = 0.5) -> None:
    """``metric`` scored ``score`` on ``span``, consistently in all three forms, with a
    reason in each."""
    got = flat(span, metric, semconv.EVAL_FIELD_SCORE)
    assert got is not None, f"{metric}: no score on the span (error: {flat(span, metric, 'error')})"
    assert abs(got - score) < 1e-4, f"{metric}: score {got}, expected {score}"
    passed = score >= threshold
    assert flat(span, metric, semconv.EVAL_FIELD_PASSED) is passed
    assert flat(span, metric, semconv.EVAL_FIELD_THRESHOLD) == threshold
    reason = flat(span, metric, semconv.EVAL_FIELD_REASON)
    assert isinstance(reason, str), f"{metric}: no reason"
    assert reason.strip(), f"{metric}: empty reason"
    assert flat(span, metric, semconv.EVAL_FIELD_ERROR) is None
    label = semconv.LABEL_PASS if passed else semconv.LABEL_FAIL
    oi = oi_evaluations(span)[metric]
    assert abs(oi[semconv.EVALUATION_SCORE] - score) < 1e-4
    assert oi[semconv.EVALUATION_LABEL] == label
    assert oi[semconv.EVALUATION_EXPLANATION] == reason
    event = eval_events(span)[metric]
    assert abs(event[semconv.GEN_AI_EVALUATION_SCORE_VALUE] - score) < 1e-4
    assert event[semconv.GEN_AI_EVALUATION_SCORE_LABEL] == label
    assert event[semconv.GEN_AI_EVALUATION_EXPLANATION] == reason


def assert_errored(span: ReceivedSpan, metric: str) -> str:
    """``metric`` failed on ``span``: ``.error`` set in every form, no score; returns it."""
    error = flat(span, metric, semconv.EVAL_FIELD_ERROR)
    assert isinstance(error, str), f"{metric}: no .error on the span"
    assert error, f"{metric}: empty .error"
    assert flat(span, metric, semconv.EVAL_FIELD_SCORE) is None
    oi = oi_evaluations(span)[metric]
    assert oi[semconv.EVALUATION_LABEL] == "error"
    assert semconv.EVALUATION_SCORE not in oi
    event = eval_events(span)[metric]
    assert semconv.GEN_AI_EVALUATION_SCORE_VALUE not in event
    assert error in event[semconv.GEN_AI_EVALUATION_EXPLANATION]
    return error


# ----------------------------------------------------------- serve subprocess
class Serve(ServeProcess):
    """``ragtrace-collector serve`` as a subprocess running the config as given
    (evaluation included), ports read from its JSON logs."""

    def __init__(
        self, config: dict[str, Any], directory: Path, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(config, directory, env=env, passthrough=False, timeout=60)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return scrape(f"http://{self.endpoints['admin']}/metrics")


def serve_config(sink: OtlpSink, **sections: Any) -> dict[str, Any]:
    """A plain-data config for :class:`Serve`: loopback ports, export to ``sink``."""
    config: dict[str, Any] = {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": "50ms", "max_trace_wait": "5s"},
        "exporters": {
            "backend": {
                "type": "otlp_grpc",
                "endpoint": sink.grpc_endpoint,
                "retry": {"initial_interval": "50ms", "max_interval": "300ms"},
            }
        },
        "sampling": {"rate": 1.0},
    }
    config.update(sections)
    return config
