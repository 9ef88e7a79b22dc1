"""The demo's display, rendered without running the demo: the results table keeps
every metric name whole on an 80-column terminal and through a pipe, and the rollout's
text says which alerts fire and why v2 has no conversation scores."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, RenderableType

from examples.demo.collector import ScoreTotals
from examples.demo.display import LiveView, print_table, results_table
from examples.demo.plan import CANDIDATE_INDEX, QUICK, STABLE_INDEX
from examples.demo.results import MetricPhaseStats, MetricSummary, SpanReport
from examples.demo.traffic import Phase
from examples.support_bot import FaultMode
from ragtrace_collector.metrics import OFFLINE_METRICS

CONVERSATION_METRICS = (
    "turn_contextual_precision",
    "turn_contextual_recall",
    "turn_contextual_relevancy",
)


def _report() -> SpanReport:
    """Every metric of the demo scored before and after, with four-digit counts; in the
    rollout split, v2 has no conversation-metric scores (as in a real run)."""
    metrics = {}
    for name in OFFLINE_METRICS:
        summary = MetricSummary(name, MetricPhaseStats(120, 100.0), MetricPhaseStats(1300, 300.0))
        summary.after_by[STABLE_INDEX] = MetricPhaseStats(900, 850.0)
        if name not in CONVERSATION_METRICS:
            summary.after_by[CANDIDATE_INDEX] = MetricPhaseStats(400, 30.0)
        metrics[name] = summary
    return SpanReport(metrics=metrics)


def _terminal(renderable: RenderableType, width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    console.print(renderable)
    return out.getvalue()


@pytest.mark.parametrize("rollout", [False, True])
@pytest.mark.parametrize("width", [60, 80])
def test_metric_names_are_whole_on_a_narrow_terminal(rollout: bool, width: int) -> None:
    text = _terminal(results_table(_report(), FaultMode.WRONG_INDEX, rollout=rollout), width)
    for name in OFFLINE_METRICS:
        assert f"│ {name} " in text, (name, text)


@pytest.mark.parametrize("rollout", [False, True])
def test_at_80_columns_no_cell_is_cut(rollout: bool) -> None:
    report = _report()
    text = _terminal(results_table(report, FaultMode.WRONG_INDEX, rollout=rollout), 80)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for name, summary in report.metrics.items():
        row = next(line for line in text.splitlines() if f"│ {name} " in line)
        assert f"{summary.before.count} / {summary.after.count}" in row, row


@pytest.mark.parametrize("rollout", [False, True])
def test_through_a_pipe_nothing_is_cut_whatever_the_width(rollout: bool) -> None:
    report = _report()
    out = io.StringIO()
    console = Console(file=out, width=40)  # a pipe with COLUMNS=40
    assert not console.is_terminal
    print_table(console, results_table(report, FaultMode.WRONG_INDEX, rollout=rollout))
    text = out.getvalue()
    assert "…" not in text
    for name, summary in report.metrics.items():
        row = next(line for line in text.splitlines() if f"│ {name} " in line)
        assert f"{summary.before.mean:.3f}" in row, row
        assert f"{summary.before.count} / {summary.after.count}" in row, row
        if rollout and name not in CONVERSATION_METRICS:
            assert f"{summary.after_by[CANDIDATE_INDEX].mean:.3f}" in row, row


def _flat(text: str) -> str:
    """The words of a rendering, without box characters and line breaks."""
    return " ".join(text.replace("│", " ").split())


def test_the_rollout_table_says_why_v2_has_no_conversation_scores() -> None:
    text = _flat(_terminal(results_table(_report(), FaultMode.WRONG_INDEX, rollout=True), 80))
    assert (
        "v2 has no turn_contextual_precision, turn_contextual_recall or "
        "turn_contextual_relevancy scores: these metrics score multi-turn conversations, "
        "and the rollout sends only single golden questions to v2; every conversation "
        "stays on v1." in text
    )
    plain = _flat(_terminal(results_table(_report(), FaultMode.WRONG_INDEX), 80))
    assert "v2" not in plain


def _live(*, rollout: bool) -> str:
    view = LiveView(QUICK, FaultMode.WRONG_INDEX, rollout=rollout)
    view.begin(Phase("healthy", FaultMode.NONE), ScoreTotals())
    degraded = Phase("degraded", FaultMode.WRONG_INDEX, rollout_every=3 if rollout else 0)
    degraded.golden, degraded.candidate_golden = 9, 3
    degraded.conversations, degraded.turns = 2, 7
    view.begin(degraded, ScoreTotals())
    return _flat(_terminal(view.render(), 80))


def test_the_live_panel_names_the_alerts_that_fire() -> None:
    rollout = _live(rollout=True)
    assert "until the canary alerts fire" in rollout
    assert "drop" not in rollout  # the split drop rules hold: v1 keeps its scores
    assert "9 golden questions (3 on v2) · 2 conversations (7 turns, all on v1)" in rollout
    plain = _live(rollout=False)
    assert "until the drop alerts fire" in plain
    assert "canary" not in plain
