"""The README's first command, end to end: ``bash scripts/demo.sh --quick --json``.

The demo runs for real: it (re)uses the project venv, starts a ``ragtrace-collector``
subprocess on free loopback ports, drives the support bot's traffic through the SDK,
breaks retrieval, waits for the drop alert on its own webhook, stops the collector and
reads the enriched spans back.  These tests check what it reports against the files it
leaves behind, and that it leaves no process behind (also when interrupted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ragtrace import semconv

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
#: Generous: the quick demo takes about 15 s; a busy 2-core machine may be much slower.
RUN_TIMEOUT = 240.0
PRIMARY_RULE = "id_context_recall_drop"
#: Retrieval metrics that must fall when the index is out of sync (``wrong_index``).
DEGRADING = (
    "id_context_recall",
    "id_context_precision",
    "non_llm_context_recall",
    "non_llm_context_precision",
    "contextual_recall",
    "contextual_precision",
    "context_entity_recall",
)
_EVAL_PREFIX = semconv.EVAL_PREFIX + "."


@dataclass(frozen=True)
class DemoRun:
    returncode: int
    stdout: str
    stderr: str
    output: Path

    @property
    def summary(self) -> dict[str, Any]:
        data = json.loads(self.stdout)
        assert isinstance(data, dict)
        return data


def _env() -> dict[str, str]:
    """The test's environment without ragtrace/OTel settings that would steer the demo,
    and a fixed console width so the table's rows are not wrapped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGTRACE_", "OTEL_"))}
    env["COLUMNS"] = "100"
    return env


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _otlp_value(value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return value


def _spans(path: Path) -> Iterator[dict[str, Any]]:
    """Every span of an OTLP/JSON lines file, attributes flattened to a dict."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            request = json.loads(line)
            for rs in request["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        span["attrs"] = {
                            a["key"]: _otlp_value(a["value"]) for a in span.get("attributes", [])
                        }
                        yield span


def _run_demo(tmp_path_factory: pytest.TempPathFactory, folder: str, *options: str) -> DemoRun:
    """``demo.sh --quick --json`` with ``options``, its output in a fresh ``folder``."""
    output = tmp_path_factory.mktemp(folder) / "out"
    proc = subprocess.run(
        ["bash", str(DEMO), *options, "--quick", "--json", "--output", str(output)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    return DemoRun(proc.returncode, proc.stdout, proc.stderr, output)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    return _run_demo(tmp_path_factory, "demo")


def test_the_demo_succeeds_and_prints_a_json_summary(demo: DemoRun) -> None:
    assert demo.returncode == 0, demo.stderr[-4000:]
    summary = demo.summary  # stdout is the JSON summary and nothing else
    assert summary["fault"] == "wrong_index"
    assert summary["quick"] is True
    assert summary["collector_exit_code"] == 0
    on_disk = json.loads((demo.output / "summary.json").read_text())
    assert on_disk == summary
    before, after = summary["phases"]["before"], summary["phases"]["after"]
    assert before["fault"] == "none"
    assert after["fault"] == "wrong_index"
    assert before["golden_requests"] > 0
    assert after["golden_requests"] > 0
    assert before["conversation_turns"] > 0
    assert before["started_unix_nano"] < after["started_unix_nano"]


def test_retrieval_scores_fall_after_the_fault(demo: DemoRun) -> None:
    metrics = demo.summary["metrics"]
    for name in DEGRADING:
        before, after = metrics[name]["before"], metrics[name]["after"]
        assert before["count"] > 0, name
        assert after["count"] > 0, name
        assert after["mean"] < before["mean"], (name, before, after)
        assert metrics[name]["delta"] == pytest.approx(after["mean"] - before["mean"])
    # The example app's documented behaviour: ID recall 1.0 healthy, ~0.07 under wrong_index.
    assert metrics["id_context_recall"]["before"]["mean"] >= 0.9
    assert metrics["id_context_recall"]["after"]["mean"] <= 0.3


def test_the_table_shows_before_and_after(demo: DemoRun) -> None:
    table = demo.stderr
    assert "Retrieval quality before and after the fault (wrong_index)" in table
    for header in ("Metric", "Before", "After", "Δ", "Scored"):
        assert header in table
    metrics = demo.summary["metrics"]
    for name in DEGRADING:
        row = next((line for line in table.splitlines() if f"│ {name} " in line), None)
        assert row is not None, f"no table row for {name}"
        m = metrics[name]
        for cell in (
            f"{m['before']['mean']:.3f}",
            f"{m['after']['mean']:.3f}",
            f"{m['delta']:+.3f}",
            f"{m['before']['count']} / {m['after']['count']}",
        ):
            assert cell in row, (name, cell, row)


def test_the_drop_alert_fired_and_its_payload_is_shown(demo: DemoRun) -> None:
    alert = demo.summary["alert"]
    assert alert["rule"] == PRIMARY_RULE
    assert alert["fired"] is True
    assert alert["seconds_after_fault"] > 0
    payload = alert["payload"]
    assert payload["status"] == "firing"
    assert payload["source"] == "ragtrace-collector"
    assert payload["rule"] == PRIMARY_RULE
    assert payload["metric"] == "id_context_recall"
    assert payload["service"] == "support-bot"
    assert payload["baseline_kind"] == "trailing"
    assert payload["drop"] >= payload["drop_threshold"] > 0
    assert payload["window_mean"] < payload["baseline"]
    assert payload["sample_count"] >= 2
    assert payload["p_value"] <= 1 - payload["confidence"]
    # Exactly as the webhook received it (the demo appends every POST to alerts.jsonl).
    received = [
        json.loads(line) for line in (demo.output / "alerts.jsonl").read_text().splitlines()
    ]
    assert payload in received
    # Printed: the pretty JSON and the headline.
    assert f'"rule": "{PRIMARY_RULE}"' in demo.stderr
    assert '"status": "firing"' in demo.stderr
    assert "drop alert" in demo.stderr
    # The log notifier logged it too.
    logged = [
        json.loads(line)
        for line in (demo.output / "collector.log").read_text().splitlines()
        if '"alert_firing"' in line
    ]
    assert any(e["rule"] == PRIMARY_RULE and e["level"] == "warning" for e in logged)


def test_the_enriched_span_file_carries_the_scores(demo: DemoRun) -> None:
    summary = demo.summary
    spans_file = Path(summary["spans_file"])
    assert spans_file.parent == demo.output
    spans = list(_spans(spans_file))
    enriched = [s for s in spans if any(k.startswith(_EVAL_PREFIX) for k in s["attrs"])]
    assert enriched
    assert len(spans) == summary["spans"]["spans"]
    assert len(enriched) == summary["spans"]["enriched_spans"]
    score_key = semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_SCORE)
    scored = [s for s in enriched if score_key in s["attrs"]]
    assert scored
    for span in scored:
        assert span["attrs"][semconv.RAGTRACE_SPAN_KIND] == semconv.KIND_RAG
        assert semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_REASON) in span["attrs"]
        assert span["attrs"][semconv.EVAL_MODEL] == "offline"
        names = {e["name"] for e in span.get("events", [])}
        assert semconv.GEN_AI_EVALUATION_RESULT_EVENT in names
        assert semconv.evaluation_attr(0, semconv.EVALUATION_NAME) in span["attrs"]
    # Recompute the table's figure for ID recall from the file, split at the fault.
    boundary = summary["phases"]["after"]["started_unix_nano"]
    before = [s["attrs"][score_key] for s in scored if int(s["startTimeUnixNano"]) < boundary]
    after = [s["attrs"][score_key] for s in scored if int(s["startTimeUnixNano"]) >= boundary]
    figures = summary["metrics"]["id_context_recall"]
    assert len(before) == figures["before"]["count"]
    assert len(after) == figures["after"]["count"]
    assert sum(before) / len(before) == pytest.approx(figures["before"]["mean"])
    assert sum(after) / len(after) == pytest.approx(figures["after"]["mean"])


# ------------------------------------------------------------------ --rollout
CANARY_RULE = "id_context_recall_canary"
INDEX_KEY = "app.index_version"


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    return _run_demo(tmp_path_factory, "demo-rollout", "--rollout")


def test_the_rollout_demo_sends_part_of_the_traffic_to_the_new_index(rollout: DemoRun) -> None:
    assert rollout.returncode == 0, rollout.stderr[-4000:]
    summary = rollout.summary
    assert summary["rollout"] is True
    assert summary["collector_exit_code"] == 0
    after = summary["phases"]["after"]
    assert after["rollout_every"] == 3
    assert 0 < after["candidate_golden_requests"] < after["golden_requests"]
    config = (rollout.output / "collector.yaml").read_text()
    assert "segments:\n- app.index_version\n" in config
    assert "kind: canary" in config


def test_the_canary_alert_names_the_new_index_and_the_old_one_holding(rollout: DemoRun) -> None:
    alert = rollout.summary["alert"]
    assert alert["rule"] == CANARY_RULE
    assert alert["fired"] is True
    assert alert["seconds_after_fault"] > 0
    payload = alert["payload"]
    assert payload["kind"] == "canary"
    assert payload["segments"] == {INDEX_KEY: "v2"}
    assert payload["against"] == f"{INDEX_KEY}=v1"
    assert payload["baseline_kind"] == "segment"
    assert payload["window_mean"] <= 0.3  # v2: the index is out of sync
    assert payload["baseline"] >= 0.9  # v1 over the same window
    assert payload["p_value"] <= 1 - payload["confidence"]
    (sibling,) = payload["siblings"]
    assert sibling["segments"] == {INDEX_KEY: "v1"}
    assert sibling["window_mean"] >= 0.9
    text = payload["summary"]
    assert f"{INDEX_KEY}=v2 is " in text
    assert f"against {INDEX_KEY}=v1 at " in text
    # as received by the webhook, and the final panel shows it
    received = [
        json.loads(line) for line in (rollout.output / "alerts.jsonl").read_text().splitlines()
    ]
    assert payload in received
    assert "canary alert" in rollout.stderr
    assert " ".join(text.split()) in " ".join(rollout.stderr.replace("│", " ").split())


def test_the_old_index_stays_quiet_and_holds(rollout: DemoRun) -> None:
    """The drop rules are split by index version: v1 is compared with its own healthy
    past and does not fire (a rule over the blended service would have)."""
    summary = rollout.summary
    drop_rules = [r for r in summary["alert_rules"] if r.get("kind", "drop") == "drop"]
    assert drop_rules
    assert all(r["group_by"] == [INDEX_KEY] for r in drop_rules)
    received = [
        json.loads(line) for line in (rollout.output / "alerts.jsonl").read_text().splitlines()
    ]
    fired = {a["rule"] for a in received if a["status"] == "firing"}
    assert fired == set(summary["rules_fired"])
    assert CANARY_RULE in fired
    assert not any(rule.endswith("_drop") for rule in fired), fired
    # Per index version after the fault, recomputed from the enriched spans.
    score_key = semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_SCORE)
    boundary = summary["phases"]["after"]["started_unix_nano"]
    by_version: dict[str, list[float]] = {}
    for span in _spans(Path(summary["spans_file"])):
        if score_key in span["attrs"] and int(span["startTimeUnixNano"]) >= boundary:
            by_version.setdefault(span["attrs"][INDEX_KEY], []).append(span["attrs"][score_key])
    assert set(by_version) == {"v1", "v2"}
    figures = summary["metrics"]["id_context_recall"]
    for version, scores in by_version.items():
        assert figures["after_by"][version]["count"] == len(scores)
        assert figures["after_by"][version]["mean"] == pytest.approx(sum(scores) / len(scores))
    assert figures["before"]["mean"] >= 0.9
    assert figures["after_by"]["v1"]["mean"] >= figures["before"]["mean"] - 0.05
    assert figures["after_by"]["v2"]["mean"] <= 0.3
    table = rollout.stderr
    assert "Retrieval quality before and during the rollout of index v2" in table
    row = next(line for line in table.splitlines() if "│ id_context_recall " in line)
    for cell in (
        f"{figures['after_by']['v1']['mean']:.3f}",
        f"{figures['after_by']['v2']['mean']:.3f}",
    ):
        assert cell in row, (cell, row)


def test_no_process_is_left_behind(demo: DemoRun) -> None:
    pid = demo.summary["collector_pid"]
    assert isinstance(pid, int)
    assert not _alive(pid)
    assert _processes_mentioning(str(demo.output)) == []
    log = (demo.output / "collector.log").read_text()
    assert '"signal_received"' in log
    assert '"shutdown_complete"' in log


def test_an_interrupted_demo_cleans_up(tmp_path: Path) -> None:
    output = tmp_path / "out"
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            ["bash", str(DEMO), "--quick", "--json", "--output", str(output)],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        text = ""
        while "phase 1" not in text:
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "the demo never started its traffic"
            time.sleep(0.1)
            text = stderr_path.read_text()
        pid_text = text.split("collector ready (pid ", 1)[1].split(")", 1)[0]
        collector_pid = int(pid_text)
        assert _alive(collector_pid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Interrupted (SIGINT)" in stderr_path.read_text()
    assert not _alive(collector_pid)
    assert _processes_mentioning(str(output)) == []
    assert '"shutdown_complete"' in (output / "collector.log").read_text()


def test_bad_arguments_are_refused_clearly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--fault", "meteor", "--output", str(tmp_path)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "invalid choice: 'meteor'" in proc.stderr
    assert "wrong_index" in proc.stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--quick", "--output", str(not_a_dir)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "is not a directory" in " ".join(proc.stdout.split())
    assert _processes_mentioning(str(not_a_dir)) == []
