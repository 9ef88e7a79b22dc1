"""Reading the Grafana dashboard shipped in ``docker/grafana``: its panels, queries,
variables, and the series names a PromQL expression selects.  Shared by the dashboard
tests (``test_dashboard.py``) and the live-collector check in ``tests/alerting_e2e``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ragtrace.json"

KEYWORDS = {
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
REQUIRED_FAMILIES = {
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
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def all_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return out


def queries(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in all_panels(dash) for t in p.get("targets", [])]


def variable_selectors(dash: dict[str, Any]) -> list[str]:
    """The series selectors inside the query variables: ``label_values(selector,
    label)`` (a filter's values) and ``label_names(selector)`` (a choice of label)."""
    out = []
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)|label_names\((.+)\)", query)
        assert match, f"variable {var['name']}: not a label_values() or label_names() query"
        out.append(match.group(1) or match.group(3))
    return out


def label_variables(dash: dict[str, Any]) -> dict[str, str]:
    """Each variable whose value is a label name (``split``: a ``custom`` list or a
    ``label_names()`` query) -> its current value."""
    return {
        var["name"]: var["current"]["value"]
        for var in dash["templating"]["list"]
        if var["type"] == "custom"
        or (var["type"] == "query" and var["query"]["query"].startswith("label_names("))
    }


def offered_labels(var: dict[str, Any], label_names: set[str]) -> list[str]:
    """The labels Grafana offers for a variable whose value is a label name, when
    Prometheus answers ``label_names`` (the label names of the selected series): a
    ``custom`` variable offers its fixed list whatever the answer; a
    ``label_names(selector)`` query those its ``regex`` (a JavaScript ``/.../``
    literal; lookaheads read the same in Python) keeps, sorted as its ``sort`` says
    (1: alphabetical)."""
    if var["type"] == "custom":
        return [x.strip() for x in var["query"].split(",") if x.strip()]
    literal = var.get("regex") or ""
    body = literal[1 : literal.rindex("/")] if literal.startswith("/") else literal
    kept = [n for n in label_names if not body or re.search(body, n)]
    return sorted(kept) if var.get("sort") == 1 else kept


def interpolate(expr: str, custom: dict[str, str] | None = None) -> str:
    """``expr`` as Prometheus receives it: Grafana's built-ins, the ``custom`` variables
    (label names, used in ``by (...)``) by their value, query variables by ``.*``."""
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    for name, value in (custom or {}).items():
        expr = re.sub(rf"\$\{{{name}\}}|\${name}\b", value, expr)
    return re.sub(r"\$\w+", ".*", expr)  # query variables only appear in =~ matchers


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects (a small PromQL lexer: good enough for
    dashboards, and checked against promtool's parse below)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", s):
        if m.group(0).lower() in KEYWORDS or s[m.end() :].lstrip().startswith("("):
            continue
        names.add(m.group(0))
    return names
