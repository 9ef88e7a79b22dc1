"""Scores as native Phoenix annotations: the SDK app -> collector (evaluation on, a
``type: phoenix`` exporter and a file exporter) -> a real Arize Phoenix.

Phoenix's REST API (and, for document annotations, its GraphQL API) must return span,
document and session annotations for the evaluated spans with the scores written on
them; sending the same enriched spans again must update, not duplicate, them; a late
result on a carrier span lands on the evaluated span without the carrier.  Then
headless Chromium renders the span's page: the annotation chip is in the DOM.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.exporters.config import PhoenixExporterConfig
from ragtrace_collector.exporters.phoenix import PhoenixExporter
from ragtrace_collector.otlp.codec import SpanGroup, decode_json_request, iter_spans, split_request
from ragtrace_collector.otlp.spanattrs import attributes_to_dict
from tests.e2e import _app
from tests.e2e._app import KB
from tests.e2e._support import evaluating_collector
from tests.fakes.harness import collector_config
from tests.fakes.phoenix import PhoenixServer

# Phoenix's start (shared, but counted in the first test), the traffic and two
# Chromium renders with a 15 s virtual-time budget each.  tests/conftest.py keeps every
# Phoenix test on one xdist worker: one Phoenix start.
pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(600)]

Q1 = "What is the capital of France?"
Q2 = "Where is the Louvre?"
REFERENCE = {
    "expected_output": "Paris is the capital of France.",
    "reference_context_ids": ["doc_paris", "doc_eiffel"],
    "reference_contexts": [KB["doc_paris"], KB["doc_eiffel"]],
}
SPAN_METRICS = (
    "id_context_recall",
    "id_context_precision",
    "non_llm_context_precision",
    "contextual_precision",
)
DOCUMENT_METRICS = ("id_context_precision", "non_llm_context_precision", "contextual_precision")
SESSION_METRIC = "turn_contextual_precision"


def _metrics() -> dict[str, Any]:
    return {name: {} for name in (*SPAN_METRICS, SESSION_METRIC)}


def _phoenix_exporter(server: PhoenixServer, project: str) -> dict[str, Any]:
    return {
        "type": "phoenix",
        "endpoint": server.url,
        "project": project,
        "annotations": {"max_wait": "30s"},
    }


def _enriched_spans(path: Path) -> list[Any]:
    """Every span the file exporter wrote (the enriched spans, as sent to Phoenix)."""
    spans: list[Any] = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            spans.extend(iter_spans(decode_json_request(line)))
    return spans


def _evaluated(spans: list[Any]) -> dict[str, dict[str, Any]]:
    """span id hex -> attributes, for the spans carrying results."""
    out: dict[str, dict[str, Any]] = {}
    for span in spans:
        attrs = attributes_to_dict(span.attributes)
        if any(
            k.startswith(semconv.EVAL_PREFIX + ".") and k.endswith("." + semconv.EVAL_FIELD_SCORE)
            for k in attrs
        ):
            out[span.span_id.hex()] = attrs
    return out


def _span_annotations(server: PhoenixServer, project: str, span_ids: list[str]) -> list[Any]:
    params = [("span_ids", s) for s in span_ids] + [("limit", "1000")]
    data: list[Any] = server.get(
        f"/v1/projects/{urllib.parse.quote(project)}/span_annotations", params
    )["data"]
    return data


def _session_annotations(server: PhoenixServer, project: str, session: str) -> list[Any]:
    params = [("session_ids", session), ("limit", "1000")]
    data: list[Any] = server.get(
        f"/v1/projects/{urllib.parse.quote(project)}/session_annotations", params
    )["data"]
    return data


def _document_annotations(server: PhoenixServer, span_global_id: str) -> list[Any]:
    query = (
        "query($id: ID!) { node(id: $id) { ... on Span { documentEvaluations {"
        " id name score label explanation annotatorKind documentPosition } } } }"
    )
    answer = server.graphql(query, {"id": span_global_id})
    evaluations: list[Any] = answer["node"]["documentEvaluations"]
    return evaluations


def _run(
    phoenix_server: PhoenixServer, project: str, session: str, tmp_path: Path, **sections: Any
) -> tuple[Path, list[Any]]:
    """Demo-style traffic: a two-turn conversation with ground truth."""
    spans_file = tmp_path / "spans.jsonl"
    config = collector_config(
        exporters={
            "phoenix": _phoenix_exporter(phoenix_server, project),
            "file": {"type": "file", "path": str(spans_file)},
        },
        sampling={"rate": 1.0},
        metrics=_metrics(),
        **sections,
    )
    _app.route(Q1, ["doc_paris", "doc_louvre", "doc_berlin"])
    _app.route(Q2, ["doc_berlin", "doc_louvre"])
    with evaluating_collector(config) as collector:
        ragtrace.configure(service_name="phoenix-bot", endpoint=collector.http_url)
        with ragtrace.session(session, expected_outcome="Learn facts about Paris."):
            _app.answer(Q1, REFERENCE)
            _app.answer(Q2, REFERENCE)
        assert ragtrace.flush(30)
    # Leaving the block stopped the collector gracefully: spans and annotations sent.
    return spans_file, _enriched_spans(spans_file)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run scripts/setup-services.sh")
    return path


def test_results_become_span_document_and_session_annotations(
    phoenix: PhoenixServer,
    tmp_path: Path,
    chromium: str,
) -> None:
    project, session = "ragtrace-annotations", "sess-phoenix-1"
    spans_file, spans = _run(phoenix, project, session, tmp_path)
    evaluated = _evaluated(spans)
    assert len(evaluated) == 2, "both turns were scored"
    stored = phoenix.wait_for_spans(project, [], count=len(spans))
    by_id = {s["context"]["span_id"]: s for s in stored}

    # ---- span annotations: one per metric, with the score written on the span
    annotations = _span_annotations(phoenix, project, list(evaluated))
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for a in annotations:
        assert a["identifier"] == "ragtrace"
        key = (a["span_id"], a["name"])
        assert key not in seen, f"duplicate annotation {key}"
        seen[key] = a
    for span_id, attrs in evaluated.items():
        for metric in (*SPAN_METRICS, SESSION_METRIC):
            a = seen.get((span_id, metric))
            assert a is not None, (metric, attrs)
            score = attrs[semconv.eval_attr(metric, semconv.EVAL_FIELD_SCORE)]
            assert a["result"]["score"] == pytest.approx(score), metric
            passed = attrs[semconv.eval_attr(metric, semconv.EVAL_FIELD_PASSED)]
            assert a["result"]["label"] == ("pass" if passed else "fail")
            assert (
                a["result"]["explanation"]
                == attrs[semconv.eval_attr(metric, semconv.EVAL_FIELD_REASON)]
            )
            assert a["annotator_kind"] == "CODE"  # the offline judge and no-judge metrics
            assert a["metadata"]["threshold"] == 0.5
            assert a["metadata"]["model"] == "offline"
    first = next(s for s, a in evaluated.items() if a[semconv.INPUT_VALUE] == Q1)
    assert seen[(first, "id_context_recall")]["result"]["score"] == 0.5
    assert seen[(first, "id_context_precision")]["result"]["score"] == pytest.approx(1 / 3)

    # ---- document annotations: on the retriever span, at each document's position
    retriever = next(
        s for s in stored if s["span_kind"] == semconv.OI_KIND_RETRIEVER and s["parent_id"] == first
    )
    documents = _document_annotations(phoenix, retriever["id"])
    by_doc = {(d["name"], d["documentPosition"]): d for d in documents}
    assert len(by_doc) == len(documents), "no duplicate document annotation"
    # doc_paris, doc_louvre, doc_berlin against reference ids doc_paris, doc_eiffel
    assert [by_doc[("id_context_precision", i)]["score"] for i in range(3)] == [1.0, 0.0, 0.0]
    assert by_doc[("id_context_precision", 0)]["label"] == "relevant"
    assert by_doc[("id_context_precision", 1)]["label"] == "irrelevant"
    for metric in DOCUMENT_METRICS:
        assert {p for (n, p) in by_doc if n == metric} == {0, 1, 2}, metric
    assert by_doc[("non_llm_context_precision", 0)]["score"] == 1.0  # the same sentence

    # ---- session annotation: the conversation score of the last turn
    last = next(s for s, a in evaluated.items() if a[semconv.INPUT_VALUE] == Q2)
    conversation = evaluated[last][
        semconv.eval_attr(SESSION_METRIC, semconv.EVAL_FIELD_CONVERSATION_SCORE)
    ]
    sessions = _session_annotations(phoenix, project, session)
    assert len(sessions) == 1
    assert sessions[0]["name"] == SESSION_METRIC
    assert sessions[0]["result"]["score"] == pytest.approx(conversation)
    assert sessions[0]["metadata"]["turn_index"] == evaluated[last][semconv.TURN_INDEX]

    # ---- a resend of the same enriched spans updates, never duplicates
    _resend(phoenix, project, spans_file)
    again = _span_annotations(phoenix, project, list(evaluated))
    assert sorted(a["id"] for a in again) == sorted(a["id"] for a in annotations)
    assert len(_document_annotations(phoenix, retriever["id"])) == len(documents)
    assert [a["id"] for a in _session_annotations(phoenix, project, session)] == [sessions[0]["id"]]
    assert len(phoenix.spans(project)) == len(stored)

    # ---- the span's page in Phoenix shows the annotation chips; the retriever's page
    # shows the document annotations under its documents
    assert by_id[first]
    dom = _render(chromium, phoenix, first, tmp_path, "span")
    # The chips carry the annotation name as their title (metric names appear nowhere
    # else on the page: the attribute table is collapsed).
    for metric in (*SPAN_METRICS, SESSION_METRIC):
        assert f'title="{metric}"' in dom, f"no annotation chip for {metric}"
    dom = _render(chromium, phoenix, retriever["context"]["span_id"], tmp_path, "retriever")
    for metric in DOCUMENT_METRICS:
        assert metric in dom, f"no document annotation for {metric}"


def _resend(server: PhoenixServer, project: str, spans_file: Path) -> None:
    """Send the file's enriched spans once more through a fresh Phoenix exporter."""
    config = PhoenixExporterConfig.model_validate(_phoenix_exporter(server, project))
    lines = [line for line in spans_file.read_bytes().splitlines() if line.strip()]

    async def go() -> None:
        exporter = PhoenixExporter("phoenix-resend", config, Telemetry())
        await exporter.start()
        for line in lines:
            for chunk in split_request(decode_json_request(line)).traces.values():
                groups: list[SpanGroup] = chunk.groups
                exporter.enqueue(groups, chunk.span_count)
        loop = asyncio.get_running_loop()
        assert await exporter.close(loop.time() + 60) == 0

    asyncio.run(go())


def _chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            # Phoenix is a React app: give it time to fetch and render before dumping.
            "--virtual-time-budget=15000",
            "--run-all-compositor-stages-before-draw",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _render(binary: str, server: PhoenixServer, span_id: str, tmp_path: Path, name: str) -> str:
    """The rendered DOM of the span's page; a screenshot is saved as ``<name>.png``.

    One Chromium run does both (each run waits out the 15 s virtual-time budget, about
    7 s of real time here)."""
    url = f"{server.url}/redirects/spans/{span_id}"
    shot = tmp_path / f"{name}.png"
    page = _chromium(
        binary,
        tmp_path / f"chromium-{name}",
        "--dump-dom",
        f"--screenshot={shot}",
        "--window-size=1600,1000",
        url,
    )
    assert page.returncode == 0, page.stderr[-2000:]
    (tmp_path / f"{name}.html").write_text(page.stdout)
    assert shot.stat().st_size > 10_000
    return page.stdout


def test_late_results_land_on_the_evaluated_span_without_a_carrier(
    phoenix: PhoenixServer,
    tmp_path: Path,
) -> None:
    project, session = "ragtrace-annotations-carrier", "sess-phoenix-2"
    _, spans = _run(phoenix, project, session, tmp_path, enrichment={"attach": "carrier"})
    carriers = [s for s in spans if s.name == "ragtrace.evaluation"]
    assert carriers, "attach: carrier sends the results on carrier spans"
    targets = {c.links[0].span_id.hex() for c in carriers}
    sent = len(spans) - len(carriers)
    stored = phoenix.wait_for_spans(project, [], count=sent)
    assert len(stored) == sent
    assert not [s for s in stored if s["name"] == "ragtrace.evaluation"], "carrier not sent"
    annotations = _span_annotations(phoenix, project, sorted(targets))
    names = {(a["span_id"], a["name"]) for a in annotations}
    for target in targets:
        for metric in SPAN_METRICS:
            assert (target, metric) in names
    sessions = _session_annotations(phoenix, project, session)
    assert [a["name"] for a in sessions] == [SESSION_METRIC]
