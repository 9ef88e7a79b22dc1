"""``eval --feedback-column`` and ``evaluate_*(feedback_column=...)``: each metric's
agreement with a column of human labels."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.agreement import agreement
from ragtrace_collector.cli import main
from ragtrace_collector.offline import evaluate_file, evaluate_rows
from ragtrace_collector.offline.loaders import load_rows
from ragtrace_collector.offline.runner import evaluate, make_judge_for

# id_context_recall: 1, 1, 0, 1 on the labelled rows; labels +, +, -, - (0.2 < 0.5).
# AUROC: negatives score {0, 1}, positives {1, 1}: (1 + 1 + 0.5 + 0.5) / 4 = 0.75.
# kappa at 0.5: pass T T F T vs positive T T F F: agree 3/4, chance 3/8 + 1/8 = 1/2,
# so (3/4 - 1/2) / (1/2) = 0.5.
ROWS: list[dict[str, Any]] = [
    {"input": "q1", "retrieved_context_ids": ["a"], "reference_context_ids": ["a"],
     "thumbs": True},
    {"input": "q2", "retrieved_context_ids": ["a", "x"], "reference_context_ids": ["a"],
     "thumbs": True},
    {"input": "q3", "retrieved_context_ids": ["x"], "reference_context_ids": ["a"],
     "thumbs": False},
    {"input": "q4", "retrieved_context_ids": ["x", "y", "a"], "reference_context_ids": ["a"],
     "thumbs": 0.2},
    {"input": "q5", "retrieved_context_ids": ["a"], "reference_context_ids": ["a"],
     "thumbs": "maybe"},
    {"input": "q6", "retrieved_context_ids": ["a"], "reference_context_ids": ["a"]},
    {"input": "q7", "retrieved_context_ids": ["a"], "reference_context_ids": ["a"],
     "thumbs": 4},
]  # fmt: skip
METRICS = "id_context_recall,id_context_precision"


def _jsonl(tmp_path: Path, rows: list[dict[str, Any]] = ROWS) -> Path:
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_python_api_reports_agreement_per_metric() -> None:
    report = evaluate_rows(ROWS, metrics=METRICS, feedback_column="thumbs")
    fb = report.feedback
    assert fb is not None
    assert (fb.column, fb.rows, fb.labelled, fb.missing, fb.bad) == ("thumbs", 7, 4, 1, 2)
    assert (fb.negatives, fb.positives) == (2, 2)
    assert fb.bad_lines == [5, 7]
    recall = fb.metrics["id_context_recall"]
    assert recall.pairs == 4
    assert recall.auroc == 0.75
    assert recall.kappa == pytest.approx(0.5)
    assert recall.threshold == 0.5
    assert recall.auroc_low is not None
    assert recall.auroc_high is not None
    assert recall.auroc_low < 0.75 < recall.auroc_high
    # The same numbers as the statistics module over the same pairs.
    precision_scores = report.scores("id_context_precision")[:4]
    labels = [1.0, 1.0, 0.0, 0.2]
    expected = agreement(
        [(s, f) for s, f in zip(precision_scores, labels, strict=True) if s is not None],
        threshold=0.5,
    )
    assert fb.metrics["id_context_precision"] == expected
    # The label column is not mistaken for an unknown case field.
    assert not any("thumbs" in w for w in report.warnings)


def test_the_metrics_threshold_is_the_one_kappa_uses() -> None:
    report = evaluate_rows(ROWS, metrics="id_context_recall", feedback_column="thumbs",
                           threshold=1.0)  # fmt: skip
    assert report.feedback is not None
    assert report.feedback.metrics["id_context_recall"].threshold == 1.0


def test_files_and_rows_agree(tmp_path: Path) -> None:
    from_rows = evaluate_rows(ROWS, metrics=METRICS, feedback_column="thumbs")
    from_file = evaluate_file(_jsonl(tmp_path), metrics=METRICS, feedback_column="thumbs")
    assert from_rows.feedback is not None
    assert from_file.feedback is not None
    assert from_file.feedback.metrics == from_rows.feedback.metrics
    assert from_file.feedback.bad_lines == [5, 7]  # lines of the file


def test_without_the_option_there_is_no_feedback_report() -> None:
    report = evaluate_rows(ROWS, metrics=METRICS)
    assert report.feedback is None
    assert "feedback" not in report.summary_dict()
    assert any("thumbs" in w for w in report.warnings)  # just an unknown field then


def test_a_column_that_is_a_case_field_is_refused() -> None:
    with pytest.raises(ValueError, match="field of the cases"):
        evaluate_rows(ROWS, metrics=METRICS, feedback_column="input")


def test_async_evaluate_takes_labels_per_item() -> None:
    loaded = load_rows(ROWS, feedback_column="thumbs")
    judge = make_judge_for("offline")
    report = asyncio.run(
        evaluate(loaded.items, ["id_context_recall"], judge,
                 feedback=loaded.feedback, feedback_column="thumbs")
    )  # fmt: skip
    assert report.feedback is not None
    assert report.feedback.metrics["id_context_recall"].auroc == 0.75
    with pytest.raises(ValueError, match="labels"):
        asyncio.run(evaluate(loaded.items, ["id_context_recall"], judge, feedback=[True]))


def test_unscored_rows_are_not_pairs() -> None:
    rows = [
        {"input": "q", "retrieved_context_ids": ["a"], "reference_context_ids": ["a"],
         "thumbs": True},
        {"input": "q", "retrieved_context_ids": ["a"], "thumbs": False},  # recall skipped
    ]  # fmt: skip
    report = evaluate_rows(rows, metrics="id_context_recall", feedback_column="thumbs")
    assert report.feedback is not None
    recall = report.feedback.metrics["id_context_recall"]
    assert (recall.pairs, recall.positives, recall.negatives) == (1, 1, 0)
    assert recall.auroc is None  # one class only: no AUROC, no interval
    assert report.feedback.labelled == 2


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", str(_jsonl(tmp_path)), "--metrics", METRICS,
                 "--feedback-column", "thumbs", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = " ".join(captured.out.split())
    assert "agreement with 'thumbs'" in out
    assert "4 labelled rows (2 negative)" in out
    assert "id_context_recall 0.750 0.18-0.98 +0.50 4" in out
    # ranked: the better predictor first
    assert out.index("id_context_precision 1.000") < out.index("id_context_recall 0.750")
    err = " ".join(captured.err.split())
    assert "2 row(s) have a value in the feedback column 'thumbs'" in err
    assert "line or row 5, 7" in err


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", str(_jsonl(tmp_path)), "--metrics", METRICS,
                 "--feedback-column", "thumbs", "--json", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    feedback = json.loads(captured.out)["feedback"]
    assert feedback["bad"] == 2
    assert feedback["missing"] == 1
    recall = feedback["metrics"]["id_context_recall"]
    assert recall["auroc"] == 0.75
    assert recall["kappa"] == pytest.approx(0.5)
    assert recall["pairs"] == 4
    assert set(recall) >= {"auroc_low", "auroc_high", "negatives", "positives", "threshold"}


def test_cli_csv_labels_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "labelled.csv"
    path.write_text(
        "input,retrieved_context_ids,reference_context_ids,label\n"
        'q1,"[""a""]","[""a""]",true\n'
        'q2,"[""x""]","[""a""]",false\n'
        'q3,"[""a""]","[""a""]",0.9\n'
        'q4,"[""x""]","[""a""]",thumbs_down\n'
        'q5,"[""x""]","[""a""]",NaN\n'
        'q6,"[""x""]","[""a""]",\n'
    )
    code = main(["eval", str(path), "--metrics", "id_context_recall",
                 "--feedback-column", "label", "--json", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    feedback = json.loads(captured.out)["feedback"]
    assert (feedback["labelled"], feedback["bad"], feedback["missing"]) == (4, 1, 1)
    assert feedback["bad_lines"] == [6]
    recall = feedback["metrics"]["id_context_recall"]
    assert (recall["auroc"], recall["kappa"], recall["pairs"]) == (1.0, 1.0, 4)


def test_cli_column_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", str(_jsonl(tmp_path)), "--metrics", METRICS,
                 "--feedback-column", "stars", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "no row has a value in the feedback column 'stars'" in " ".join(captured.err.split())


def test_cli_column_that_is_a_field_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", str(_jsonl(tmp_path)), "--feedback-column", "question",
                 "--no-progress"])  # fmt: skip
    assert code == 2
    assert "--feedback-column" in capsys.readouterr().err
