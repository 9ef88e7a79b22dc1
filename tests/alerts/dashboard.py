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
    """The series selectors inside the ``label_values(selector, label)`` variables."""
    out = []
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert match, f"variable {var['name']}: not a label_values() query"
        out.append(match.group(1))
    return out


def custom_variables(dash: dict[str, Any]) -> dict[str, str]:
    """Each ``custom`` variable (a choice among labels, e.g. ``split``) -> its current value."""
    return {
        var["name"]: var["current"]["value"]
        for var in dash["templating"]["list"]
        if var["type"] == "custom"
    }


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
