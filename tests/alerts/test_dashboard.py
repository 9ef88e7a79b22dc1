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
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from ragtrace_collector.telemetry import Telemetry
from tests.fakes.services import PROMTOOL

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ragtrace.json"

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}
#: Families the dashboard must show: scores, pass/skip/error counts, evaluation rate,
#: judge cost, and collector health.
_REQUIRED_FAMILIES = {
    "ragtrace_eval_score",
    "ragtrace_eval_results",
    "ragtrace_eval_traces",
    "ragtrace_judge_cost_usd",
    "ragtrace_judge_calls",
    "ragtrace_spans_received",
    "ragtrace_spans_forwarded",
    "ragtrace_spans_dropped",
    "ragtrace_traces_buffered",
    "ragtrace_alert_firing",
}
#: Grafana's built-in variables, as a query would see them after interpolation.
_GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return out


def _queries(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]


def _variable_selectors(dash: dict[str, Any]) -> list[str]:
    """The series selectors inside the ``label_values(selector, label)`` variables."""
    out = []
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert match, f"variable {var['name']}: not a label_values() query"
        out.append(match.group(1))
    return out


def _interpolate(expr: str) -> str:
    for name, value in _GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\w+", ".*", expr)  # dashboard variables only appear in =~ matchers


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects (a small PromQL lexer: good enough for
    dashboards, and checked against promtool's parse below)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", s):
        if m.group(0).lower() in _KEYWORDS or s[m.end() :].lstrip().startswith("("):
            continue
        names.add(m.group(0))
    return names


def exported() -> dict[str, str]:
    """Every sample name on the collector's /metrics -> its family's type."""
    telemetry = Telemetry()
    for metric in vars(telemetry).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
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
    dash = _dashboard()
    assert dash["uid"] == "ragtrace-overview"
    assert dash["title"]
    assert isinstance(dash["schemaVersion"], int)
    panels = _panels(dash)
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
    dash = _dashboard()
    panels = [p for p in _panels(dash) if p["type"] != "row"]
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


def test_the_dashboard_names_only_exported_series() -> None:
    dash = _dashboard()
    names = exported()
    assert "ragtrace_eval_score_sum" in names  # the exposition really is the collector's
    used: set[str] = set()
    for expr in _queries(dash) + _variable_selectors(dash):
        found = metric_names(expr)
        assert found, f"no series in {expr!r}"
        unknown = found - names.keys()
        assert not unknown, f"{expr!r} uses series the collector does not export: {unknown}"
        used |= found
        for fn, series in re.findall(r"\b(rate|increase)\(\s*([A-Za-z_:][\w:]*)", expr):
            assert names[series] in {"counter", "histogram"}, f"{fn}() over gauge {series}"
    # and it shows what the issue asks for (histograms via any of their series)
    shown = {re.sub(r"_(total|sum|count|bucket)$", "", n) for n in used}
    assert _REQUIRED_FAMILIES - shown == set()


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    dash = _dashboard()
    exprs = [_interpolate(e) for e in _queries(dash) + _variable_selectors(dash)]
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
