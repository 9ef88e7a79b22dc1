"""``ragtrace-collector eval`` in CI: the quality gate and its exit code, early usage
errors, CSV / Parquet / ``datasets`` input, the size guard, the ``--output`` rows, the
``--json`` warnings and an 80-column summary."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ragtrace_collector.cli import main
from ragtrace_collector.metrics import METRIC_NAMES
from ragtrace_collector.offline.cli import EXIT_CODES, _table
from ragtrace_collector.offline.gate import QualityGate, parse_fail_under
from ragtrace_collector.offline.loaders import DatasetError, load_dataset
from ragtrace_collector.offline.runner import (
    EvalReport,
    MetricSummary,
    evaluate_file,
    evaluate_rows,
)

# id_context_recall: 1.0 and 0.0 (mean 0.5); id_context_precision: 0.5 and 0.0.
ROWS: list[dict[str, Any]] = [
    {"id": "eiffel", "input": "Who designed the Eiffel Tower?",
     "retrieved_contexts": ["The Eiffel Tower was designed by Gustave Eiffel.", "Amazon."],
     "reference_contexts": ["The Eiffel Tower was designed by Gustave Eiffel."],
     "retrieved_context_ids": ["d1", "d2"], "reference_context_ids": ["d1"]},
    {"id": "everest", "user_input": "How high is Mount Everest?",
     "retrieved_contexts": ["Python is a programming language."],
     "reference_contexts": ["Mount Everest is 8849 metres high."],
     "retrieved_context_ids": ["d3"], "reference_context_ids": ["d7"]},
]  # fmt: skip
IDS = "id_context_recall,id_context_precision"


def _jsonl(tmp_path: Path, rows: list[dict[str, Any]] | None = None, extra: str = "") -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows or ROWS) + extra)
    return path


def _csv(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "cases.csv"
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return path


def _eval(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


# ------------------------------------------------------------------ the gate
def test_fail_under_every_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(_jsonl(tmp_path))
    code, _, err = _eval(capsys, data, "--metrics", IDS, "--fail-under", "0.3")
    assert code == 3
    assert "gate failed: id_context_precision: mean 0.2500 is under 0.3" in err
    assert "id_context_recall" not in err
    code, _, err = _eval(capsys, data, "--metrics", IDS, "--fail-under", "0.25")
    assert code == 0, err
    assert "quality gate passed" in err


def test_fail_under_per_metric_is_repeatable_and_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(_jsonl(tmp_path))
    code, out, _ = _eval(capsys, data, "--metrics", IDS, "--json",
                         "--fail-under", "id_context_recall=0.4",
                         "--fail-under", "id_context_precision=0.3")  # fmt: skip
    assert code == 3
    gate = json.loads(out)["gate"]
    assert gate == {"passed": False,
                    "failures": ["id_context_precision: mean 0.2500 is under 0.3"]}  # fmt: skip
    # A per-metric value overrides the overall one for that metric.
    code, out, _ = _eval(capsys, data, "--metrics", IDS, "--json", "--fail-under", "0.5",
                         "--fail-under", "id_context_precision=0.2")  # fmt: skip
    assert code == 0
    assert json.loads(out)["gate"] == {"passed": True, "failures": []}


def test_fail_on_case_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(_jsonl(tmp_path))
    code, _, _ = _eval(capsys, data, "--metrics", "id_context_recall")
    assert code == 0  # a failing case alone does not fail the run
    code, _, err = _eval(capsys, data, "--metrics", "id_context_recall", "--fail-on-case-failure")
    assert code == 3
    assert "id_context_recall: 1 case(s) under the metric's threshold (everest)" in err


def test_bad_rows_exit_1_even_when_the_gate_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(_jsonl(tmp_path, extra='{"input": 3}\n'))
    code, _, err = _eval(capsys, data, "--metrics", IDS, "--fail-under", "0.9")
    assert code == 1
    assert "gate failed" in err
    assert "1 bad row(s)" in err


def test_gated_metric_without_scores_fails() -> None:
    rows = [{"input": "q", "retrieved_contexts": ["c"]}, {"input": "r", "retrieved_contexts": []}]
    report = evaluate_rows(rows, "id_context_recall")
    assert report.summary["id_context_recall"].skipped == 2
    reason = report.items[0].results[0].reason
    assert reason  # the metric says why it skipped
    line = (
        "id_context_recall: no scored rows to compare with 0.5 (2 skipped, 0 error(s)); "
        f"most common skip reason (2x): {reason}"
    )
    # Under the overall --fail-under as under a per-metric one: no data never passes.
    assert QualityGate(fail_under=0.5).check(report) == [line]
    assert QualityGate(per_metric={"id_context_recall": 0.5}).check(report) == [line]
    assert QualityGate(fail_under=0.5, allow_unscored=True).check(report) == []
    assert (
        QualityGate(per_metric={"id_context_recall": 0.5}, allow_unscored=True).check(report) == []
    )
    # A metric gated by name that did not run at all fails too.
    assert QualityGate(per_metric={"faithfulness": 0.5}).check(report) == [
        "faithfulness: no scored rows to compare with 0.5 (the metric did not run)"
    ]


def test_most_common_skip_reason_is_named() -> None:
    rows = [{"input": "q", "retrieved_contexts": ["c"]}] * 2 + [
        {"input": "r", "retrieved_contexts": ["c"], "reference_context_ids": ["x"]}
    ]
    report = evaluate_rows(rows, "id_context_recall")
    reasons = [item.results[0].reason for item in report.items]
    assert reasons[0] == reasons[1] != reasons[2]
    (line,) = QualityGate(fail_under=0.1).check(report)
    assert line.endswith(f"most common skip reason (2x): {reasons[0]}")


def test_cli_gate_fails_on_a_metric_that_scored_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Empty reference id lists: the field is there, no row can be scored.  (A field no
    # row has at all is a usage error: tests/offline/test_eval_nothing_scored.py.)
    rows = [{**r, "reference_context_ids": []} for r in ROWS]
    data = str(_jsonl(tmp_path, rows))
    code, out, err = _eval(capsys, data, "--metrics", IDS, "--fail-under", "0.1", "--json")
    assert code == 3, err
    failures = json.loads(out)["gate"]["failures"]
    assert len(failures) == 2
    assert all("no scored rows" in f and "most common skip reason (2x)" in f for f in failures)
    assert "gate failed: id_context_recall: no scored rows to compare with 0.1" in err
    code, _, err = _eval(capsys, data, "--metrics", IDS, "--fail-under", "0.1", "--allow-unscored")
    assert code == 0, err
    assert "quality gate passed" in err


@pytest.mark.parametrize(
    ("values", "message"),
    [(["1.5"], "outside 0..1"), (["x=abc"], "not a number"), (["0.1", "0.2"], "given twice"),
     (["=0.3"], "METRIC=VALUE")],
)  # fmt: skip
def test_parse_fail_under_rejects(values: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fail_under(values)


# ---------------------------------------------------------- early usage errors
def test_unknown_metrics_fail_before_the_data_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "not-there.jsonl")
    code, _, err = _eval(capsys, missing, "--metrics", "id_context_recal,bogus,id_context_recall")
    assert code == 2
    assert "no such file" not in err
    assert "unknown metrics 'id_context_recal' (did you mean 'id_context_recall'?), 'bogus'" in err
    assert "Valid metrics: " + ", ".join(METRIC_NAMES) in err
    code, _, err = _eval(capsys, missing, "--fail-under", "bogus=0.5")
    assert code == 2
    assert "--fail-under: unknown metric 'bogus'" in err
    assert "no such file" not in err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "the file is empty"),
        ("blank.csv", "\n\n", "the file is empty"),
        ("header.csv", "input,retrieved_contexts\n", "no rows"),
        ("data.xlsx", "PK\x03\x04 binary-ish", "unsupported format .xlsx"),
        ("notes.txt", "input: hello\n", "unsupported format .txt"),
    ],
)
def test_empty_or_unsupported_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    code, _, err = _eval(capsys, str(path))
    assert code == 2
    assert "error:" in err
    assert message in err


# ------------------------------------------------------------------- formats
def test_csv_scores_like_jsonl(tmp_path: Path) -> None:
    from_csv = evaluate_file(_csv(tmp_path, ROWS), IDS)
    from_jsonl = evaluate_file(_jsonl(tmp_path), IDS)
    assert from_csv.row_errors == []
    assert [i.case_id for i in from_csv.items] == ["eiffel", "everest"]
    for name in IDS.split(","):
        assert from_csv.summary[name] == from_jsonl.summary[name]


def test_csv_bad_cell_multiline_cells_and_line_numbers(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "input": "first\nquestion over\nthree lines", "retrieved_context_ids": ["x"],
         "reference_context_ids": ["x"]},
        {"id": "b", "input": "second", "retrieved_context_ids": "not json",
         "reference_context_ids": ["x"]},
        {"id": "c", "input": "third", "retrieved_context_ids": [1, 2],
         "reference_context_ids": [2.0]},
    ]  # fmt: skip
    loaded = load_dataset(_csv(tmp_path, rows))
    assert loaded.lines == [2, 6]  # the header is line 1; "a" spans lines 2-4
    (bad,) = loaded.errors
    assert (bad.line, bad.field, bad.case_id, bad.input) == (5, "retrieved_context_ids", "b",
                                                             "second")  # fmt: skip
    assert "expected JSON in the cell" in bad.message
    assert loaded.cases[1].retrieved_context_ids == ["1", "2"]


def test_parquet_scores_like_jsonl(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "cases.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    report = evaluate_file(path, IDS)
    assert report.summary == evaluate_file(_jsonl(tmp_path), IDS).summary
    assert [i.line for i in report.items] == [1, 2]


def test_parquet_without_pyarrow_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cases.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    with pytest.raises(DatasetError, match="reading Parquet needs pyarrow"):
        load_dataset(path)


def test_huggingface_dataset_rows() -> None:
    datasets = pytest.importorskip("datasets")
    report = evaluate_rows(datasets.Dataset.from_list([*ROWS, {"id": "empty"}]), IDS)
    assert report.summary["id_context_recall"].mean == 0.5
    ((error),) = report.row_errors
    assert str(error).startswith("row 3: no case fields")
    assert [i.case_id for i in report.items] == ["eiffel", "everest"]


# ---------------------------------------------------------------- size guard
def test_a_row_over_the_size_limit_is_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = {**ROWS[0], "id": "huge", "retrieved_contexts": ["x" * 3000, "y"]}
    data = str(_jsonl(tmp_path, [huge, ROWS[1]]))
    out = tmp_path / "out.jsonl"
    code, _, err = _eval(capsys, data, "--metrics", IDS, "--max-row-size", "2000",
                         "--output", str(out))  # fmt: skip
    assert code == 1
    assert re.search(r"line 1: 3,\d{3} characters of text, over the limit of 2,000", err)
    first = json.loads(out.read_text().splitlines()[0])
    assert (first["kind"], first["case_id"]) == ("bad_row", "huge")
    assert _eval(capsys, data, "--metrics", IDS)[0] == 0  # the default limit is 1,000,000
    rows = evaluate_rows([huge], IDS, max_row_size=2000)
    assert rows.items == []
    assert "over the limit" in rows.row_errors[0].message


# -------------------------------------------------------------------- output
def test_output_keeps_inputs_and_bad_rows_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = '{"id": "broken", "input": "Why?", "retrieved_context_ids": "d1"}\n'
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + bad + json.dumps(ROWS[1]) + "\n")
    out = tmp_path / "out.jsonl"
    code, _, _ = _eval(capsys, str(path), "--metrics", IDS, "--output", str(out))
    assert code == 1
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["line"] for x in lines] == [1, 2, 3]
    assert [x.get("input") for x in lines] == [
        "Who designed the Eiffel Tower?", "Why?", "How high is Mount Everest?"
    ]  # fmt: skip
    assert lines[1] == {"case_id": "broken", "kind": "bad_row", "line": 2, "input": "Why?",
                        "error": "expected a list, got a string",
                        "field": "retrieved_context_ids"}  # fmt: skip


def test_json_summary_carries_grouped_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{**r, "expected_ouput": "x"} for r in ROWS]
    code, out, err = _eval(capsys, str(_jsonl(tmp_path, rows)), "--metrics", IDS, "--json")
    assert code == 0
    expected = (
        "unknown field 'expected_ouput' ignored (did you mean 'expected_output'?) (lines 1, 2)"
    )
    assert json.loads(out)["warnings"] == [expected]
    assert err.count("expected_ouput") == 1  # one line for both rows


def test_summary_table_fits_80_columns_with_costs() -> None:
    names = list(METRIC_NAMES)
    summary = {
        n: MetricSummary(metric=n, count=10000, scored=9999, mean=0.123456, passed=9999,
                         failed=1, pass_rate=0.9999, skipped=1, errors=12345, calls=99999,
                         cost_usd=123.456789, heuristic=True)
        for n in names
    }  # fmt: skip
    report = EvalReport(judge="openai/gpt-4o-mini", metrics=names, items=[], summary=summary)
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(_table(report))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    assert text.count("0.1235") == len(names)  # every mean in full
    assert text.count("123.4568") == len(names)


def test_cli_table_under_columns_80(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ragtrace_collector.cli", "eval", str(_jsonl(tmp_path)),
         "--no-progress"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in proc.stdout
    assert any(
        line.split()[:2] == ["id_context_recall", "0.5000"] for line in lines if line.strip()
    )


def test_help_lists_exit_codes_metrics_and_fields() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ragtrace_collector.cli", "eval", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for code in EXIT_CODES:
        assert f" {code} " in text
    assert "the quality gate failed" in text
    assert "turn_contextual_relevancy" in text
    assert "retrieval_context | retrieved_contexts" in text
    assert "--fail-on-case-failure" in text
    assert "docs/metrics.md" in text


def test_pytest_plugin_gate_fails_on_no_scored_rows(tmp_path: Path) -> None:
    from ragtrace_collector.offline.pytest_plugin import RagtraceEval

    rows = [{k: v for k, v in r.items() if k != "reference_context_ids"} for r in ROWS]
    data = _jsonl(tmp_path, rows)
    with pytest.raises(AssertionError, match="id_context_recall: no scored rows"):
        RagtraceEval().assert_file(data, "id_context_recall", fail_under=0.1)
    report = RagtraceEval().assert_file(
        data, "id_context_recall", fail_under=0.1, allow_unscored=True
    )
    assert report.summary["id_context_recall"].scored == 0
