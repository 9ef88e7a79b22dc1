"""A pytest plugin: assert ragtrace metric scores in your own test suite.

Installed with the collector, it registers itself (the ``pytest11`` entry point); in a
project that does not install the package, put
``pytest_plugins = ["ragtrace_collector.offline.pytest_plugin"]`` in the top ``conftest.py``.

.. code-block:: python

    def test_retriever_finds_the_manual(ragtrace_eval):
        hits = my_retriever("How do I reset the router?")
        ragtrace_eval.assert_passes(
            {"input": "How do I reset the router?",
             "retrieved_context_ids": [h.id for h in hits],
             "reference_context_ids": ["manual-7"]},
            metrics="id_context_recall,id_context_precision",
            threshold=0.5,
        )

    def test_golden_set(ragtrace_eval):
        ragtrace_eval.assert_file("evals/golden.jsonl", fail_under=0.7)

The judge is the offline one unless ``pytest --ragtrace-model MODEL`` names a litellm
model.  A failed assertion lists each failing metric with its score, threshold and
reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The metric code is imported when a test first uses the fixture, not when pytest
# loads the plugin: a suite that never asks for it pays nothing.
if TYPE_CHECKING:
    from ragtrace_collector.cases import Conversation, RAGCase
    from ragtrace_collector.metrics import Metric
    from ragtrace_collector.offline.runner import EvalReport
    from ragtrace_collector.results import MetricResult

__all__ = ["RagtraceEval", "pytest_addoption", "ragtrace_eval"]


class RagtraceEval:
    """What the ``ragtrace_eval`` fixture gives a test."""

    def __init__(self, model: str = "offline") -> None:
        self.model = model

    def measure(
        self,
        case: RAGCase | Conversation | Mapping[str, Any],
        metrics: Sequence[Metric | str] | str | None = None,
        *,
        threshold: float | None = None,
    ) -> list[MetricResult]:
        """The results of one case (a ``RAGCase``, a ``Conversation`` or a dataset row
        with the field names of ``ragtrace-collector eval``)."""
        from ragtrace_collector.offline.runner import evaluate_rows

        row = case.model_dump(exclude_none=True) if not isinstance(case, Mapping) else case
        report = evaluate_rows([row], metrics, self.model, threshold=threshold)
        if report.row_errors:
            raise AssertionError(f"bad case: {report.row_errors[0]}")
        return report.items[0].results

    def assert_passes(
        self,
        case: RAGCase | Conversation | Mapping[str, Any],
        metrics: Sequence[Metric | str] | str | None = None,
        *,
        threshold: float | None = None,
    ) -> list[MetricResult]:
        """Every metric must score at or above its threshold; a skip (missing inputs)
        or an error fails too."""
        results = self.measure(case, metrics, threshold=threshold)
        if not results:
            raise AssertionError("no metric applies to this case")
        bad = [r for r in results if r.outcome != "passed"]
        if bad:
            raise AssertionError(
                "ragtrace metrics failed:\n" + "\n".join(_describe(r) for r in bad)
            )
        return results

    def assert_file(
        self,
        path: str | Path,
        metrics: Sequence[Metric | str] | str | None = None,
        *,
        fail_under: float | None = None,
        per_metric: Mapping[str, float] | None = None,
        fail_on_case_failure: bool = False,
        threshold: float | None = None,
        allow_unscored: bool = False,
    ) -> EvalReport:
        """Evaluate a dataset file and apply the quality gate of ``eval --fail-under``;
        bad rows and error results fail as well, and so does a gated metric that scored
        no row (unless ``allow_unscored``, as ``eval --allow-unscored``)."""
        from ragtrace_collector.offline.gate import QualityGate
        from ragtrace_collector.offline.runner import evaluate_file

        report = evaluate_file(path, metrics, self.model, threshold=threshold)
        gate = QualityGate(fail_under, dict(per_metric or {}), fail_on_case_failure, allow_unscored)
        problems = [f"bad row: {e}" for e in report.row_errors]
        problems += [f"{n}: {s.errors} error result(s)" for n, s in report.summary.items()
                     if s.errors]  # fmt: skip
        problems += gate.check(report)
        if problems:
            raise AssertionError(f"ragtrace eval of {path} failed:\n" + "\n".join(problems))
        return report


def _describe(result: MetricResult) -> str:
    if result.error is not None:
        return f"  {result.metric}: error: {result.error}"
    if result.score is None:
        return f"  {result.metric}: skipped: {result.reason}"
    return (
        f"  {result.metric}: score {result.score:.4f} < threshold {result.threshold:g}: "
        f"{result.reason}"
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--ragtrace-model",
        default="offline",
        help="the judge of the ragtrace_eval fixture: 'offline' (default) or a litellm model",
    )


@pytest.fixture
def ragtrace_eval(request: pytest.FixtureRequest) -> RagtraceEval:
    """Assert ragtrace metric scores: ``ragtrace_eval.assert_passes(case, metrics)``."""
    return RagtraceEval(str(request.config.getoption("ragtrace_model")))
