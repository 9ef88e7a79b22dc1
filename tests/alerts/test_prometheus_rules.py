"""The Prometheus rules and Alertmanager config shipped in ``docker/``, checked with
the real ``promtool`` and ``amtool``."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ragtrace_collector.alerts.promrules import (
    SHIPPED_ALERTS,
    _main,
    render_rules,
    with_durations,
)
from ragtrace_collector.segments import prometheus_label as segment_label
from tests.fakes.services import AMTOOL, PROMTOOL

pytestmark = [pytest.mark.services, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docker" / "prometheus" / "rules" / "ragtrace.rules.yml"
RULE_TESTS = ROOT / "docker" / "prometheus" / "tests" / "ragtrace.rules.test.yml"
ALERTMANAGER_YML = ROOT / "docker" / "alertmanager" / "alertmanager.yml"


def _tool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = PROMTOOL if args[0] == "promtool" else AMTOOL
    assert binary is not None, f"{args[0]} is not installed (scripts/setup-services.sh)"
    return subprocess.run(
        [binary, *map(str, args[1:])], capture_output=True, text=True, timeout=180, check=False
    )


def test_the_shipped_rules_are_the_generated_ones() -> None:
    assert RULES.read_text(encoding="utf-8") == render_rules(SHIPPED_ALERTS), (
        f"{RULES} is out of date: regenerate it with "
        f"python -m ragtrace_collector.alerts.promrules -o {RULES}"
    )


def test_the_shipped_rules_pass_promtool_check() -> None:
    result = _tool("promtool", "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


@pytest.mark.slow
def test_the_shipped_rules_pass_their_unit_tests() -> None:
    result = _tool("promtool", "test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.slow
def test_the_unit_tests_catch_a_changed_rule(tmp_path: Path) -> None:
    """The promtool tests are not vacuous: rules with a drop threshold of 0.5 (the
    recall drop in the fixture is 0.3) fail them."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    lax = [replace(a, drop=0.5) for a in SHIPPED_ALERTS]
    (tmp_path / "rules" / RULES.name).write_text(render_rules(lax), encoding="utf-8")
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    result = _tool("promtool", "test", "rules", tmp_path / "tests" / RULE_TESTS.name)
    assert result.returncode != 0
    assert "RagtraceRecallDrop" in result.stdout + result.stderr


def test_broken_rules_fail_promtool_check(tmp_path: Path) -> None:
    doc = yaml.safe_load(render_rules(SHIPPED_ALERTS))
    alert = doc["groups"][0]["rules"][-1]
    alert["expr"] = alert["expr"].replace(">= 0.1", ">= ")  # a syntax error
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = _tool("promtool", "check", "rules", broken)
    assert result.returncode != 0
    assert "parse error" in (result.stdout + result.stderr)


def test_other_parameters_render_valid_rules(tmp_path: Path) -> None:
    out = tmp_path / "custom.rules.yml"
    assert _main(["--window", "30m", "--baseline", "7d", "--drop", "10%", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "rate(ragtrace_eval_score_sum[7d] offset 30m)" in text
    assert "humanizePercentage" in text
    result = _tool("promtool", "check", "rules", out)
    assert result.returncode == 0, result.stdout + result.stderr
    fast = tmp_path / "fast.rules.yml"
    fast.write_text(
        render_rules(with_durations(SHIPPED_ALERTS, window=10, baseline=30, for_=2)),
        encoding="utf-8",
    )
    result = _tool("promtool", "check", "rules", fast)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_alertmanager_config_is_valid() -> None:
    result = _tool("amtool", "check-config", ALERTMANAGER_YML)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.slow
def test_the_unit_tests_catch_rules_that_ignore_segments(tmp_path: Path) -> None:
    """Rules rendered without segment labels blend index v1 and v2 of the fixture into
    one service mean: the segment test fails (no alert names app_index_version=v2)."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    blended = render_rules(SHIPPED_ALERTS, segments=())
    assert "app_index_version" not in blended
    (tmp_path / "rules" / RULES.name).write_text(blended, encoding="utf-8")
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    result = _tool("promtool", "test", "rules", tmp_path / "tests" / RULE_TESTS.name)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    # only the segment test fails: the three without segment labels pass with these rules
    failed = re.findall(r"^\s*name: (.+?),?$", out, flags=re.MULTILINE)
    assert failed == ["a drop confined to one index version, scored by three replicas"], out
    assert 'app_index_version="v2"' in out


def test_segment_labels_are_the_safe_forms_of_the_keys() -> None:
    assert segment_label("service.version") == "service_version"
    assert segment_label("app.index_version") == "app_index_version"
    assert segment_label("k8s.pod-name") == "k8s_pod_name"
    assert segment_label("9lives") == "_9lives"
    text = render_rules(SHIPPED_ALERTS, segments=["tenant.tier"])
    assert "sum by (service, metric, tenant_tier) (rate(ragtrace_eval_score_sum[15m]))" in text
    assert "{{ with $labels.tenant_tier }}, tenant_tier={{ . }}{{ end }}" in text
    assert "service_version" not in text


def test_the_segments_option_renders_valid_rules(tmp_path: Path) -> None:
    out = tmp_path / "segments.rules.yml"
    assert _main(["--segments", "tenant.tier, service.version", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "on (service, metric, tenant_tier, service_version)" in text
    result = _tool("promtool", "check", "rules", out)
    assert result.returncode == 0, result.stdout + result.stderr
    none = tmp_path / "none.rules.yml"
    assert _main(["--segments", "", "-o", str(none)]) == 0
    assert "sum by (service, metric) (" in none.read_text(encoding="utf-8")


def _one_case(tmp_path: Path, name: str, rules_text: str) -> Path:
    """``tmp_path/tests/<file>`` with only the named case of the shipped promtool tests,
    against ``rules_text`` as ``../rules/ragtrace.rules.yml``."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(rules_text, encoding="utf-8")
    doc = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    doc["tests"] = [case for case in doc["tests"] if case["name"] == name]
    assert doc["tests"], f"no promtool test case named {name!r} in {RULE_TESTS}"
    out = tmp_path / "tests" / RULE_TESTS.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return out


RESOLVE_CASE = "a fixed drop and a rollback both resolve within a window"


def test_a_fixed_drop_and_a_rollback_resolve(tmp_path: Path) -> None:
    """The shipped rules: a drop fires, and both a fix (the mean is back) and a rollback
    (the series stops growing) resolve it within one window."""
    case = _one_case(tmp_path, RESOLVE_CASE, RULES.read_text(encoding="utf-8"))
    result = _tool("promtool", "test", "rules", case)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_resolve_case_catches_an_alert_that_stays_firing(tmp_path: Path) -> None:
    """Not vacuous: the same rules made to keep firing for 30 minutes after their
    condition clears fail the case, at the resolve check (minute 1560)."""
    doc = yaml.safe_load(render_rules(SHIPPED_ALERTS))
    for rule in doc["groups"][0]["rules"]:
        if "alert" in rule:
            rule["keep_firing_for"] = "30m"
    case = _one_case(tmp_path, RESOLVE_CASE, yaml.safe_dump(doc, sort_keys=False))
    result = _tool("promtool", "test", "rules", case)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "time: 1d2h," in out, out  # 1560m: the resolve check, not the firing one
    assert "1d1h45m" not in out, out
