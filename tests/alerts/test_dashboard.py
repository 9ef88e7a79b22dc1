"""The Grafana dashboard shipped in ``docker/grafana``: well-formed, complete, every
query parses (``promtool check rules`` on the expressions as recording rules) and
names only series the collector really exports.

The exported names come from ``Telemetry().render()`` with every labelled metric
touched once: the exposition the collector serves on ``/metrics``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from ragtrace_collector.alerts.promrules import SHIPPED_SEGMENTS
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.segments import prometheus_label as segment_label
from tests.alerts.dashboard import (
    GRAFANA,
    REQUIRED_FAMILIES,
    all_panels,
    interpolate,
    label_variables,
    load_dashboard,
    metric_names,
    offered_labels,
    queries,
    variable_selectors,
)
from tests.fakes.services import PROMTOOL


def exported() -> dict[str, str]:
    """Every sample name on the collector's /metrics -> its family's type."""
    telemetry = Telemetry()
    for metric in vars(telemetry).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
    telemetry.results.record("x", "x", "passed", 0.5)  # not a wrapper: kept in plain lists
    text = telemetry.render().decode("utf-8")
    return {
        sample.name: family.type
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metric_names_lexer() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{x=~"$v|b c"}[5m] offset 1h)))'
        " / on (model) group_left (k) b_total and c:rec"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:rec"}


def test_the_dashboard_is_well_formed() -> None:
    dash = load_dashboard()
    assert dash["uid"] == "ragtrace-overview"
    assert dash["title"]
    assert isinstance(dash["schemaVersion"], int)
    panels = all_panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "service", "metric"} <= names
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cover = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cover & cells, f"panel {panel['title']!r} overlaps another"
        cells |= cover
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert target["expr"].strip()


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    dash = load_dashboard()
    panels = [p for p in all_panels(dash) if p["type"] != "row"]
    by_title = {p["title"]: p for p in panels}
    score = by_title["$metric by service"]
    assert score["repeat"] == "metric"  # one panel per metric
    assert "sum by (service)" in score["targets"][0]["expr"]
    assert "ragtrace_eval_score_sum" in score["targets"][0]["expr"]
    text = json.dumps(panels)
    assert 'outcome=\\"passed\\"' in json.dumps(by_title["Pass rate by service and metric"])
    assert "Evaluations per minute" in by_title
    assert "ragtrace_judge_cost_usd_total" in json.dumps(by_title["Judge cost (USD per hour)"])
    assert 'outcome=~\\"skipped|error\\"' in json.dumps(by_title["Skipped and errored results"])
    for health in ("spans_received", "spans_dropped", "traces_buffered", "queue_depth"):
        assert f"ragtrace_{health}" in text


SEGMENT_LABELS = [segment_label(k) for k in SHIPPED_SEGMENTS]
_SCORE_SELECTOR = re.compile(r"ragtrace_eval_(?:score_\w+|results_total)\{([^}]*)\}")


def test_the_dashboard_filters_and_splits_by_the_segment_labels() -> None:
    """The segment labels the shipped rules group by are the dashboard's: one filter
    variable each, a "split by" choice among them, and a score panel per segment value."""
    dash = load_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for label in SEGMENT_LABELS:
        var = variables[label]
        assert var["type"] == "query"
        assert var["query"]["query"].endswith(f", {label})")
        assert var["includeAll"]
        assert var["allValue"] == ".*"  # also matches a series without the label
    assert variables["split"]["current"]["value"] in SEGMENT_LABELS
    # every score and result selector of every panel honours every segment filter,
    # except the whole-service totals the "against the rest" panel compares with
    rest = 'service=~"$service", metric=~"$metric"'
    selectors = [m for e in queries(dash) for m in _SCORE_SELECTOR.findall(e)]
    assert len(selectors) >= 10
    assert sum(sel == rest for sel in selectors) == 4
    for sel in selectors:
        for label in SEGMENT_LABELS:
            assert sel == rest or f'{label}=~"${label}"' in sel, sel
    by_title = {p["title"]: p for p in all_panels(dash)}
    panel = by_title["$metric by $split"]
    assert panel["repeat"] == "metric"
    for target in panel["targets"]:
        assert target["expr"].count("sum by (service, $split)") == 2
    assert interpolate(panel["targets"][0]["expr"], {"split": "app_index_version"}).startswith(
        "sum by (service, app_index_version) (rate(ragtrace_eval_score_sum{"
    )
    ratio = by_title["$metric: each $split against the rest"]
    assert ratio["repeat"] == "metric"
    assert "/ on (service, $split)" in ratio["targets"][0]["expr"]


def _stored_label_names(segments: list[str]) -> set[str]:
    """The label names Prometheus answers for ``ragtrace_eval_score_count`` scraped from
    a collector with these ``segments:``: the collector's labels on that series, plus
    the name and the scrape's ``job`` and ``instance``."""
    telemetry = Telemetry()
    telemetry.results.set_segment_labels([segment_label(k) for k in segments])
    telemetry.results.record("shop", "contextual_recall", "passed", 0.5, ("v",) * len(segments))
    text = telemetry.render().decode("utf-8")
    on_series = {
        label
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ragtrace_eval_score_count"
        for label in sample.labels
    }
    assert {"service", "metric"} <= on_series
    return on_series | {"__name__", "job", "instance"}


@pytest.mark.parametrize(
    "segments",
    [list(SHIPPED_SEGMENTS), ["tenant.tier", "service.version"], []],
    ids=["shipped", "custom", "none"],
)
def test_the_split_choice_offers_only_the_segment_labels_the_collector_exports(
    segments: list[str],
) -> None:
    """ "Split scores by" lists the segment labels on the collector's score series, under
    their Prometheus names, and nothing else: not a shipped label the collector does not
    export (the old fixed list offered app_index_version to every collector), nor
    service, metric or the scrape's labels (a split by service has no rest to compare
    with)."""
    split = {v["name"]: v for v in load_dashboard()["templating"]["list"]}["split"]
    offered = offered_labels(split, _stored_label_names(segments))
    assert offered == sorted(segment_label(k) for k in segments)
    if segments == list(SHIPPED_SEGMENTS):
        assert split["current"]["value"] in offered
    assert variable_selectors({"templating": {"list": [split]}}) == ["ragtrace_eval_score_count"]


def test_the_dashboard_names_only_exported_series() -> None:
    dash = load_dashboard()
    names = exported()
    assert "ragtrace_eval_score_sum" in names  # the exposition really is the collector's
    used: set[str] = set()
    for expr in queries(dash) + variable_selectors(dash):
        found = metric_names(expr)
        assert found, f"no series in {expr!r}"
        unknown = found - names.keys()
        assert not unknown, f"{expr!r} uses series the collector does not export: {unknown}"
        used |= found
        for fn, series in re.findall(r"\b(rate|increase)\(\s*([A-Za-z_:][\w:]*)", expr):
            assert names[series] in {"counter", "histogram"}, f"{fn}() over gauge {series}"
    # and it shows what the issue asks for (histograms via any of their series)
    shown = {re.sub(r"_(total|sum|count|bucket)$", "", n) for n in used}
    assert REQUIRED_FAMILIES - shown == set()


@pytest.mark.services  # promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    dash = load_dashboard()
    custom = label_variables(dash)
    exprs = [interpolate(e, custom) for e in queries(dash) + variable_selectors(dash)]
    records = [{"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(exprs)]
    rules = {"groups": [{"name": "dashboard", "rules": records}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    assert PROMTOOL is not None, "promtool is not installed (scripts/setup-services.sh)"
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout

    # the check is real: a broken query fails it
    records.append({"record": "dashboard:broken", "expr": "sum by (le (x)"})
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0


def test_provisioning_points_at_the_dashboard_and_datasource() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["isDefault"] is True
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "ragtrace.yaml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/var/lib/grafana/dashboards")


@pytest.mark.parametrize("expr", ["rate(ragtrace_not_a_metric_total[5m])"])
def test_an_unknown_series_is_caught(expr: str) -> None:
    assert metric_names(expr) - exported().keys() == {"ragtrace_not_a_metric_total"}


_AGGREGATIONS = ("sum", "count", "max", "min", "avg", "topk", "bottomk", "quantile")


def _top_level_operands(expr: str) -> list[str]:
    """Split ``expr`` on binary operators outside parentheses, braces and brackets."""
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif depth == 0:
            for op in (" / ", " * ", " + ", " - ", " and ", " or ", " unless "):
                if expr.startswith(op, i):
                    parts.append(expr[start:i])
                    start = i + len(op)
                    i = start - 1
                    break
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


_MATCHING = re.compile(r"^(?:(?:on|ignoring|group_left|group_right)\s*\([^)]*\)\s*)+")


def _enclosed(expr: str) -> bool:
    """``expr`` is one parenthesised group: ``(a) / (b)`` is not."""
    if not (expr.startswith("(") and expr.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(expr):
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth == 0 and i < len(expr) - 1:
            return False
    return True


def _leaf_operands(expr: str) -> list[str]:
    """The operands of the binary operators, through parentheses and vector matching
    (``on (...)``, ``group_right ()``)."""
    leaves = []
    for operand in _top_level_operands(expr):
        operand = _MATCHING.sub("", operand).strip()
        if _enclosed(operand):
            leaves.extend(_leaf_operands(operand[1:-1]))
        else:
            leaves.append(operand)
    return leaves


def _aggregates_over_replicas(operand: str) -> bool:
    inner = re.sub(r"^histogram_quantile\(\s*[\d.]+\s*,", "", operand.strip()).strip()
    if re.fullmatch(r"[\d.]+", inner):  # a constant factor such as "* 60"
        return True
    if not re.match(rf"({'|'.join(_AGGREGATIONS)})\b", inner):
        return False
    by = re.match(r"\w+\s+by\s*\(([^)]*)\)", inner)
    return by is None or "instance" not in by.group(1) or "replica" in operand


def test_every_dashboard_query_sums_over_replicas() -> None:
    """N collector replicas are one service: every panel aggregates away ``instance``
    (only the per-replica buffer panels keep it, on purpose), so adding a replica never
    splits or multiplies a line."""
    dash = load_dashboard()
    per_replica = []
    for expr in queries(dash):
        for operand in _leaf_operands(interpolate(expr, label_variables(dash))):
            if "by (instance)" in operand:
                per_replica.append(operand)
                continue
            assert _aggregates_over_replicas(operand), f"not summed over replicas: {operand!r}"
    assert sorted(per_replica) == [
        "sum by (instance) (ragtrace_spans_buffered)",
        "sum by (instance) (ragtrace_traces_buffered)",
    ]
    assert not _aggregates_over_replicas("rate(ragtrace_spans_received_total[5m])")
    assert not _aggregates_over_replicas("sum by (instance, metric) (x)")
    # parentheses and vector matching are looked through, not taken as aggregation
    assert _leaf_operands("(sum(a) / sum(b)) / on (s) group_right () (rate(c[5m]))") == [
        "sum(a)",
        "sum(b)",
        "rate(c[5m])",
    ]


@pytest.mark.services  # promtool
def test_each_split_against_the_rest_compares_with_the_whole_service_whatever_the_filter(
    tmp_path: Path,
) -> None:
    """The ratio panel with the Version filter set to v2 and split by version, run by
    promtool on two versions (v1 at 0.8, v2 at 0.6): v2 is 0.75 of the rest.  Before
    issue 28 the rest was computed after the filter (nothing but v2), and the panel
    drew nothing (NaN)."""
    (panel,) = [
        p
        for p in all_panels(load_dashboard())
        if p["title"].endswith("each $split against the rest")
    ]
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", "5m")
    expr = re.sub(r"\$\{split\}|\$split\b", "service_version", expr)
    expr = expr.replace('service_version=~"$service_version"', 'service_version=~"v2"')
    expr = "round(" + re.sub(r"\$\w+", ".*", expr) + ", 0.0001)"
    labels = 'service="shop", metric="contextual_recall", deployment_environment="prod"'

    def series(version: str, name: str, per_minute: int) -> dict[str, str]:
        return {
            "series": f'{name}{{{labels}, service_version="{version}", app_index_version="i1"}}',
            "values": f"0+{per_minute}x30",
        }

    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("v1", "ragtrace_eval_score_sum", 48),
                    series("v1", "ragtrace_eval_score_count", 60),
                    series("v2", "ragtrace_eval_score_sum", 36),
                    series("v2", "ragtrace_eval_score_count", 60),
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "20m",
                        "exp_samples": [
                            {"labels": '{service="shop", service_version="v2"}', "value": 0.75}
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "ratio.test.yml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    assert PROMTOOL is not None, "promtool is not installed (scripts/setup-services.sh)"
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
