"""``ragtrace-collector eval`` never passes on nothing (issue 29, item 5): a column that
every row lacks while a chosen metric needs it is a usage error (exit 2) naming both,
and ``--fail-on-case-failure`` with nothing scored fails the gate like ``--fail-under``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.cli import main
from ragtrace_collector.metrics import build_metrics
from ragtrace_collector.offline.gate import QualityGate
from ragtrace_collector.offline.loaders import load_rows
from ragtrace_collector.offline.runner import evaluate_rows, missing_columns

#: Rows with everything but the question.
NO_INPUT: list[dict[str, Any]] = [
    {"actual_output": "Paris is the capital of France.",
     "expected_output": "Paris is the capital of France.",
     "retrieval_context": ["Paris is the capital of France."],
     "reference_contexts": ["Paris is the capital of France."]},
    {"actual_output": "It was completed in 1889.",
     "expected_output": "The Eiffel Tower was completed in 1889.",
     "retrieval_context": ["The Eiffel Tower was completed in 1889."],
     "reference_contexts": ["The Eiffel Tower was completed in 1889."]},
]  # fmt: skip


def _jsonl(tmp_path: Path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _eval(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


def test_chosen_metrics_without_their_column_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _jsonl(tmp_path, NO_INPUT)
    code, out, err = _eval(
        capsys, data, "--metrics", "contextual_relevancy,contextual_recall,contextual_precision"
    )
    assert code == 2, err
    assert "no row has the field 'input'" in err
    assert "contextual_relevancy" in err
    assert "contextual_precision" in err
    assert "contextual_recall" not in err.split("'input'")[1].split(".")[0]
    assert out == ""  # nothing was evaluated


def test_the_same_from_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _jsonl(tmp_path, NO_INPUT)
    config = tmp_path / "eval.yaml"
    config.write_text("metrics:\n  contextual_relevancy: {}\n")
    code, _, err = _eval(capsys, data, "--config", str(config))
    assert code == 2, err
    assert "'input'" in err
    assert "contextual_relevancy" in err


def test_default_metrics_leave_them_out_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No metric asked for: "all that apply" runs, and says which ones did not apply."""
    data = _jsonl(tmp_path, NO_INPUT)
    code, out, err = _eval(capsys, data)
    assert code == 0, err
    assert "warning: no row has the field 'input'" in err
    assert "contextual_relevancy" in err
    assert "contextual_relevancy" not in out


def test_a_column_some_rows_have_is_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{**NO_INPUT[0], "input": "What is the capital of France?"}, NO_INPUT[1]]
    code, _, err = _eval(capsys, _jsonl(tmp_path, rows), "--metrics", "contextual_relevancy")
    assert code == 0, err


def test_missing_columns_reads_each_metric_s_own_needs() -> None:
    loaded = load_rows([{"input": "q", "retrieval_context": ["c"]}])
    metrics = build_metrics(
        ["id_context_recall", "id_context_precision", "faithfulness", "contextual_relevancy"]
    )
    assert missing_columns(metrics, loaded.items) == {
        "actual_output": ["faithfulness"],
        "reference_context_ids": ["id_context_recall", "id_context_precision"],
        "retrieved_context_ids": ["id_context_recall", "id_context_precision"],
    }


def test_fail_on_case_failure_alone_fails_when_nothing_was_scored() -> None:
    rows = [{"input": "q", "retrieval_context": ["c"], "retrieved_context_ids": ["d1"],
             "reference_context_ids": []}] * 2  # fmt: skip
    report = evaluate_rows(rows, "id_context_recall")
    assert report.summary["id_context_recall"].scored == 0
    (line,) = QualityGate(fail_on_case_failure=True).check(report)
    assert line.startswith("id_context_recall: no scored rows to check against its threshold")
    assert "most common skip reason (2x): reference_context_ids is empty" in line
    assert QualityGate(fail_on_case_failure=True, allow_unscored=True).check(report) == []
    # Under both flags the metric is reported once.
    assert len(QualityGate(fail_under=0.5, fail_on_case_failure=True).check(report)) == 1


def test_cli_fail_on_case_failure_alone_exits_3_on_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"input": "q", "retrieval_context": ["c"], "retrieved_context_ids": ["d1"],
             "reference_context_ids": []}] * 2  # fmt: skip
    data = _jsonl(tmp_path, rows)
    code, _, err = _eval(capsys, data, "--metrics", "id_context_recall", "--fail-on-case-failure")
    assert code == 3, err
    assert "gate failed: id_context_recall: no scored rows" in err
    code, _, err = _eval(
        capsys, data, "--metrics", "id_context_recall", "--fail-on-case-failure", "--allow-unscored"
    )
    assert code == 0, err
