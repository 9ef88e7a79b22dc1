"""The Grafana dashboard against a LIVE collector's ``/metrics``.

``tests/alerts/test_dashboard.py`` checks the dashboard against the exposition of a
fresh ``Telemetry``.  Here a real collector evaluates real traffic (the support bot's
golden questions through the SDK, some with broken retrieval), and every series name
the dashboard's queries and variables select must be in what its admin port serves.
"""

from __future__ import annotations

import re

import pytest

from examples.support_bot import SupportBot, run_golden
from ragtrace_collector.config import parse_config
from tests.alerting_e2e._support import (
    METRIC,
    SERVICE,
    EvalCollectorThread,
    alerts_section,
    collector_data,
    configure_sdk,
    scrape,
)
from tests.alerts.dashboard import load_dashboard, metric_names, queries, variable_selectors
from tests.fakes.harness import wait_for
from tests.fakes.otlp_sink import OtlpSink

pytestmark = pytest.mark.timeout(90)

#: Sample suffixes each family type exposes.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}
#: What evaluated traffic must have produced samples for (not only declared): the
#: score panels, the pass-rate and evaluation-rate panels, the pipeline panels, and
#: the alert panel (a configured rule is exported at 0 from the start).
_LIVE = {
    "ragtrace_eval_score_sum",
    "ragtrace_eval_score_count",
    "ragtrace_eval_score_bucket",
    "ragtrace_eval_results_total",
    "ragtrace_eval_traces_total",
    "ragtrace_eval_latency_seconds_bucket",
    "ragtrace_spans_received_total",
    "ragtrace_spans_forwarded_total",
    "ragtrace_traces_buffered",
    "ragtrace_spans_buffered",
    "ragtrace_traces_released_total",
    "ragtrace_export_latency_seconds_bucket",
    "ragtrace_pipeline_latency_seconds_bucket",
    "ragtrace_alert_firing",
}


def _declared(families: dict[str, str]) -> set[str]:
    """Sample names the declared families can carry (a labelled family with no
    child yet is declared, ``# HELP``/``# TYPE``, without samples)."""
    return {name + suffix for name, kind in families.items() for suffix in _SUFFIXES[kind]}


def test_every_dashboard_series_is_on_the_live_collector(sink: OtlpSink) -> None:
    config = parse_config(collector_data(sink, alerts_section()), env={})
    collector = EvalCollectorThread(config).start()
    try:
        configure_sdk(collector.http_base_url)
        bot = SupportBot(fault="none")
        runs = [run_golden(bot, count=30), run_golden(bot, fault="wrong_index", count=10)]
        labels = {"service": SERVICE, "metric": METRIC}
        wait_for(
            lambda: collector.metric("ragtrace_eval_score_count", labels) == 40,
            timeout=60,
            what="40 scored traces",
        )
        live = scrape(collector.admin_url)
    finally:
        collector.stop()

    # the page really is the live collector's: it scored this traffic
    assert live.value("ragtrace_eval_score_count", **labels) == 40
    oracle = sum(r.id_recall for run in runs for r in run.results)  # the bot's own ID recall
    assert live.value("ragtrace_eval_score_sum", **labels) == pytest.approx(oracle)
    assert live.value("ragtrace_alert_firing", rule="id-recall-drop", metric=METRIC) == 0

    sampled, declared = live.sample_names, _declared(live.families)
    assert _LIVE - sampled == set(), "series the traffic should have produced"
    dash = load_dashboard()
    used: set[str] = set()
    for expr in queries(dash) + variable_selectors(dash):
        names = metric_names(expr)
        assert names, f"no series in {expr!r}"
        missing = names - sampled - declared
        assert not missing, f"{expr!r} selects series the live collector does not serve: {missing}"
        used |= names
    # every family the dashboard shows is one the collector declares, and the core
    # panels (scores, results, pipeline, alerts) have data right now
    assert {re.sub(r"_(total|sum|count|bucket)$", "", n) for n in used} <= live.families.keys()
    assert used >= _LIVE
