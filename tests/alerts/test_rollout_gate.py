"""The rollout gate of docs/rollouts.md against a real Prometheus.

The query and the conditions come from ``examples/rollouts/analysis-template.yaml``
itself (so the doc's recipe and the test cannot drift); the script for other deploy
tools, ``examples/rollouts/ragtrace_gate.py``, must build the same query text and give
the same answers.

The series are the collector's own: three replicas' ``Telemetry`` (one per
``instance``) with the segment label ``service_version``, scraped every 15 s over half
an hour while a new version rolls out to part of the traffic, then backfilled into
Prometheus with ``promtool tsdb create-blocks-from openmetrics``.  Three services:

* ``healthy``: the candidate scores like the stable version -> Successful / exit 0;
* ``broken``: the candidate's recall is half the stable one's -> Failed / exit 1;
* ``thin``: the candidate has too few scores in the window -> Inconclusive / exit 2;
* ``stable_zero``: the stable side scores exactly 0, the candidate 0.6 -> the ratio is
  +Inf: Successful / exit 0, and the script shows the two means instead of ``inf``;
* ``both_zero``: both sides score exactly 0 -> the ratio is NaN: Inconclusive / exit 2.
"""

from __future__ import annotations

import ast
import math
import random
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from examples.rollouts.ragtrace_gate import FAIL, INCONCLUSIVE, PASS, gate_query
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.segments import prometheus_label as segment_label
from tests.alerts.dashboard import all_panels, interpolate, load_dashboard
from tests.fakes.ports import free_port
from tests.fakes.services import PROMTOOL, ServiceProcess, get_json, prometheus, prometheus_config

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "rollouts" / "analysis-template.yaml"
GATE = ROOT / "examples" / "rollouts" / "ragtrace_gate.py"

METRIC = "contextual_recall"
LABEL = segment_label("service.version")
STEP_S, MINUTES, CANDIDATE_FROM = 15, 30, 12
REPLICAS = ("replica-a:8888", "replica-b:8888", "replica-c:8888")


@dataclass(frozen=True)
class Scenario:
    stable_mean: float
    candidate_mean: float
    #: candidate scores per replica and scrape (stable: 2)
    candidate_rate: float
    #: standard deviation of the scores around their mean (0: every score is the mean)
    spread: float = 0.08


SCENARIOS = {
    "healthy": Scenario(0.85, 0.84, 1.0),
    "broken": Scenario(0.85, 0.42, 1.0),
    "thin": Scenario(0.85, 0.84, 1 / 12),  # ~7 scores in a 10m window: under min-samples
    "stable_zero": Scenario(0.0, 0.6, 1.0, spread=0.0),
    "both_zero": Scenario(0.0, 0.0, 1.0, spread=0.0),
}


# ------------------------------------------------------------------ the template
def template_metric() -> dict[str, Any]:
    doc = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    assert doc["apiVersion"] == "argoproj.io/v1alpha1"
    assert doc["kind"] == "AnalysisTemplate"
    (metric,) = doc["spec"]["metrics"]
    assert isinstance(metric, dict)
    return metric


def template_args(**given: str) -> dict[str, str]:
    doc = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    args = {a["name"]: a["value"] for a in doc["spec"]["args"] if "value" in a}
    args.update(given)
    return args


def resolve(text: str, args: dict[str, str]) -> str:
    """Argo's ``{{args.name}}`` substitution; every placeholder must have a value."""
    out = re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: args[m.group(1)], text)
    assert "{{" not in out, out
    return out


def evaluate(condition: str, result: list[float]) -> bool:
    """An Argo condition (expr-lang: ``len``, indexing, comparisons, ``&&``, ``||``)
    on a Prometheus vector result, by a whitelist over Python's AST."""
    tree = ast.parse(condition.replace("&&", " and ").replace("||", " or "), mode="eval")

    def ev(node: ast.AST) -> Any:
        match node:
            case ast.Expression(body=body):
                return ev(body)
            case ast.BoolOp(op=ast.And(), values=values):
                return all(ev(v) for v in values)
            case ast.BoolOp(op=ast.Or(), values=values):
                return any(ev(v) for v in values)
            case ast.Compare(left=left, ops=[op], comparators=[right]):
                a, b = ev(left), ev(right)
                ops = {ast.GtE: a >= b, ast.Gt: a > b, ast.LtE: a <= b, ast.Lt: a < b}
                return ops[type(op)]
            case ast.Call(func=ast.Name(id="len"), args=[arg]):
                return len(ev(arg))
            case ast.Subscript(value=value, slice=index):
                return ev(value)[ev(index)]
            case ast.Name(id="result"):
                return result
            case ast.Constant(value=int() | float() as number):
                return number
        raise AssertionError(f"unsupported in {condition!r}: {ast.dump(node)}")

    return bool(ev(tree))


def argo_phase(metric: dict[str, Any], result: list[float]) -> str:
    """A measurement's phase from its success and failure conditions, as Argo Rollouts
    assesses it: failure wins, then success; with both set and neither met, Inconclusive."""
    failure = metric.get("failureCondition")
    success = metric.get("successCondition")
    if failure and evaluate(failure, result):
        return "Failed"
    if success and evaluate(success, result):
        return "Successful"
    if success and failure:
        return "Inconclusive"
    return "Failed" if success else "Successful"


# ------------------------------------------------------------------ the series
def _score(rng: random.Random, mean: float, spread: float) -> float:
    """A score in [0, 1] around ``mean``; exactly ``mean`` (and no draw) without spread,
    so that the noise-free scenarios leave the others' random scores as they were."""
    return min(1.0, max(0.0, rng.gauss(mean, spread))) if spread else mean


def _openmetrics(end: float) -> str:
    """Every replica's ragtrace_eval_score _count/_sum, one sample per scrape."""
    rng = random.Random(22)
    telemetries = {}
    for replica in REPLICAS:
        t = Telemetry()
        t.results.set_segment_labels([LABEL])
        telemetries[replica] = t
    series: dict[str, dict[str, list[str]]] = {"_count": {}, "_sum": {}}
    steps = MINUTES * 60 // STEP_S
    credit = dict.fromkeys([(r, s) for r in REPLICAS for s in SCENARIOS], 0.0)
    for step in range(steps + 1):
        ts = end - (steps - step) * STEP_S
        for replica, telemetry in telemetries.items():
            for service, sc in SCENARIOS.items():
                for _ in range(2):
                    score = _score(rng, sc.stable_mean, sc.spread)
                    telemetry.results.record(service, METRIC, "passed", score, ("v1",))
                if step * STEP_S >= CANDIDATE_FROM * 60:
                    credit[replica, service] += sc.candidate_rate
                    while credit[replica, service] >= 1.0:
                        credit[replica, service] -= 1.0
                        score = _score(rng, sc.candidate_mean, sc.spread)
                        telemetry.results.record(service, METRIC, "passed", score, ("v2",))
            text = telemetry.render().decode("utf-8")
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    suffix = sample.name.removeprefix("ragtrace_eval_score")
                    if suffix not in series:
                        continue
                    labels = {**sample.labels, "instance": replica, "job": "ragtrace-collector"}
                    key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    series[suffix].setdefault(key, []).append(
                        f"ragtrace_eval_score{suffix}{{{key}}} {sample.value} {ts:.3f}"
                    )
    lines = []
    for suffix, by_series in series.items():
        lines.append(f"# TYPE ragtrace_eval_score{suffix} gauge")
        for samples in by_series.values():
            lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Backfilled:
    prom: ServiceProcess
    at: float


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    work = tmp_path_factory.mktemp("rollout-gate")
    end = float(int(time.time()) - 60)
    source = work / "scores.om"
    source.write_text(_openmetrics(end), encoding="utf-8")
    assert PROMTOOL is not None, "promtool is not installed (scripts/setup-services.sh)"
    data = work / "prom" / "data"
    data.mkdir(parents=True)
    made = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    with prometheus(work / "prom", prometheus_config(scrape_targets=[])) as prom:
        yield Backfilled(prom, end)


def query(b: Backfilled, expr: str) -> list[float]:
    params = urllib.parse.urlencode({"query": expr, "time": repr(b.at)})
    answer = get_json(f"{b.prom.url}/api/v1/query?{params}")
    assert answer["status"] == "success", answer
    return [float(s["value"][1]) for s in answer["data"]["result"]]


def template_query(service: str) -> str:
    metric = template_metric()
    args = template_args(service=service, **{"candidate-version": "v2"})
    return resolve(metric["provider"]["prometheus"]["query"], args)


def _run_gate(b: Backfilled, service: str) -> subprocess.CompletedProcess[str]:
    """The script, on candidate ``v2`` of ``service``, evaluated at the backfill's end."""
    return subprocess.run(
        [
            sys.executable,
            str(GATE),
            "--prometheus",
            b.prom.url,
            "--service",
            service,
            "--candidate",
            "v2",
            "--time",
            repr(b.at),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# ------------------------------------------------------------------ the tests
def test_the_series_are_there_and_blend_the_versions(backfilled: Backfilled) -> None:
    """Sanity of the fixture: three replicas per version, and per service the blended
    mean that a gate without the version label would see."""
    n = query(backfilled, f'count(ragtrace_eval_score_count{{service="broken", {LABEL}="v2"}})')
    assert n == [3.0]
    (blended,) = query(
        backfilled,
        'sum(rate(ragtrace_eval_score_sum{service="broken"}[10m]))'
        ' / sum(rate(ragtrace_eval_score_count{service="broken"}[10m]))',
    )
    assert 0.65 < blended < 0.75  # one third at 0.42, two thirds at 0.85


def test_a_healthy_candidate_passes(backfilled: Backfilled) -> None:
    result = query(backfilled, template_query("healthy"))
    assert len(result) == 1
    assert 0.95 <= result[0] <= 1.05
    assert argo_phase(template_metric(), result) == "Successful"


def test_a_candidate_with_lower_recall_fails(backfilled: Backfilled) -> None:
    result = query(backfilled, template_query("broken"))
    assert len(result) == 1
    assert 0.4 < result[0] < 0.6  # 0.42 against 0.85
    assert argo_phase(template_metric(), result) == "Failed"


def test_a_thin_candidate_is_inconclusive(backfilled: Backfilled) -> None:
    """Under min-samples the query answers nothing: neither promote nor abort."""
    assert query(backfilled, template_query("thin")) == []
    assert argo_phase(template_metric(), []) == "Inconclusive"
    # with a lower minimum the same series do answer (the emptiness is the guard's)
    args = template_args(service="thin", **{"candidate-version": "v2", "min-samples": "3"})
    lax = resolve(template_metric()["provider"]["prometheus"]["query"], args)
    (ratio,) = query(backfilled, lax)
    assert 0.9 < ratio < 1.1


def test_a_stable_side_scoring_zero_answers_inf_or_nan(backfilled: Backfilled) -> None:
    """Against a stable mean of 0 the ratio is +Inf (candidate above 0: Argo's success
    condition holds) or NaN (candidate at 0 too: neither condition holds)."""
    metric = template_metric()
    above = query(backfilled, template_query("stable_zero"))
    assert above == [math.inf]
    assert argo_phase(metric, above) == "Successful"
    (both,) = query(backfilled, template_query("both_zero"))
    assert math.isnan(both)
    assert argo_phase(metric, [both]) == "Inconclusive"


def test_the_conditions_are_argos() -> None:
    metric = template_metric()
    assert argo_phase(metric, [0.96]) == "Successful"
    assert argo_phase(metric, [0.5]) == "Failed"
    assert argo_phase(metric, []) == "Inconclusive"
    assert evaluate("result[0] >= 0.5 || len(result) > 3", [0.4]) is False
    with pytest.raises(AssertionError, match="unsupported"):
        evaluate("result[0] + 1 >= 0.5", [0.4])


def test_the_script_builds_the_templates_query() -> None:
    def norm(q: str) -> str:
        return " ".join(q.split())

    for service in SCENARIOS:
        assert norm(gate_query(service, METRIC, "v2")) == norm(template_query(service))
    # and its defaults are the template's
    args = template_args()
    assert norm(gate_query("s", args["metric"], "c")) == norm(
        resolve(
            template_metric()["provider"]["prometheus"]["query"],
            {**args, "service": "s", "candidate-version": "c"},
        )
    )
    assert "result[0] >= 0.95" in template_metric()["successCondition"]


@pytest.mark.parametrize(
    ("service", "code", "word"),
    [("healthy", PASS, "PASS"), ("broken", FAIL, "FAIL"), ("thin", INCONCLUSIVE, "INCONCLUSIVE")],
)
def test_the_script_exits_with_the_answer(
    backfilled: Backfilled, service: str, code: int, word: str
) -> None:
    run = _run_gate(backfilled, service)
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stdout.startswith(f"ragtrace gate: {word} {service} {METRIC} {LABEL}=v2"), run.stdout


@pytest.mark.parametrize(
    ("service", "code", "word", "means"),
    [
        ("stable_zero", PASS, "PASS", "candidate mean 0.600, stable mean 0.000"),
        ("both_zero", INCONCLUSIVE, "INCONCLUSIVE", "candidate mean 0.000, stable mean 0.000"),
    ],
)
def test_the_script_shows_both_means_when_stable_scores_zero(
    backfilled: Backfilled, service: str, code: int, word: str, means: str
) -> None:
    """No ``candidate/stable = inf``: the two means, their difference, and why there is
    no ratio; the exit code is the template's phase (+Inf passes, NaN is inconclusive)."""
    run = _run_gate(backfilled, service)
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stdout.startswith(f"ragtrace gate: {word} {service} {METRIC} {LABEL}=v2: ")
    difference = "+0.600" if service == "stable_zero" else "+0.000"
    assert f"{means} (difference {difference})" in run.stdout
    assert "candidate/stable is undefined because stable scores 0" in run.stdout
    assert "inf" not in run.stdout.lower()
    assert "nan" not in run.stdout.lower()


@pytest.mark.parametrize(
    ("service", "code"),
    [("healthy", 0), ("broken", 1), ("thin", 5), ("stable_zero", 0), ("both_zero", 1)],
)
def test_the_curl_and_jq_form(backfilled: Backfilled, service: str, code: int) -> None:
    """docs/rollouts.md's one-liner for tools without Python in their step (jq exits 1
    on false, NaN included, and 5 on an empty answer): evaluated now, the backfill ended
    a minute ago."""
    pipeline = (
        f"curl -fsS {backfilled.prom.url}/api/v1/query --data-urlencode"
        f' "query=$({sys.executable} {GATE} --print-query --service {service} --candidate v2)"'
        " | jq -e '.data.result[0].value[1] | tonumber >= 0.95'"
    )
    run = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pipeline],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == code, run.stdout + run.stderr


def test_the_script_reports_an_unreachable_prometheus() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(
        [sys.executable, str(GATE), "--prometheus", url, "--service", "s", "--candidate", "v2"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 3, run.stdout + run.stderr
    assert "ragtrace gate: ERROR" in run.stderr


def test_the_docs_rollout_uses_the_template() -> None:
    """docs/rollouts.md's Rollout snippet names the template and only its arguments,
    and gives every argument that has no default."""
    text = (ROOT / "docs" / "rollouts.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yml\n(.*?)```", text, flags=re.DOTALL)
    rollout = next(yaml.safe_load(b) for b in blocks if "kind: Rollout" in b)
    (analysis,) = [
        s["analysis"] for s in rollout["spec"]["strategy"]["canary"]["steps"] if "analysis" in s
    ]
    template = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    assert analysis["templates"] == [{"templateName": template["metadata"]["name"]}]
    given = {a["name"] for a in analysis["args"]}
    declared = {a["name"] for a in template["spec"]["args"]}
    required = {a["name"] for a in template["spec"]["args"] if "value" not in a}
    assert required <= given <= declared


def test_the_dashboard_draws_the_gates_ratio(backfilled: Backfilled) -> None:
    """The Grafana panel "each $split against the rest", split by service_version over
    the gate's window, answers what the gate answers for the candidate, and its inverse
    for the stable side (there are two versions)."""
    panel = next(
        p
        for p in all_panels(load_dashboard())
        if p["title"] == "$metric: each $split against the rest"
    )
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", "10m")
    expr = interpolate(expr.replace('metric=~"$metric"', f'metric="{METRIC}"'), {"split": LABEL})
    for service in ("healthy", "broken"):
        (gate,) = query(backfilled, template_query(service))
        answer = get_json(
            f"{backfilled.prom.url}/api/v1/query?"
            + urllib.parse.urlencode({"query": expr, "time": repr(backfilled.at)})
        )["data"]["result"]
        ratios = {
            s["metric"][LABEL]: float(s["value"][1])
            for s in answer
            if s["metric"]["service"] == service
        }
        assert set(ratios) == {"v1", "v2"}
        assert ratios["v2"] == pytest.approx(gate, rel=1e-9)
        assert ratios["v1"] == pytest.approx(1 / gate, rel=1e-9)
