"""``ragtrace-collector eval`` end to end: offline judge, output file, exit codes, and
the LLM judge path against a loopback OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from ragtrace_collector.cli import main
from tests.fakes.openai_server import FakeOpenAIServer, auto_reply, openai_server

__all__ = ["openai_server"]

ROWS = [
    {
        "input": "Who designed the Eiffel Tower?",
        "expected_output": "The Eiffel Tower was designed by Gustave Eiffel.",
        "retrieval_context": [
            {"id": "d1",
             "content": "The Eiffel Tower was designed by the engineer Gustave Eiffel."},
            {"id": "d2", "content": "The Amazon rainforest lies mostly in Brazil."},
        ],
        "reference_contexts": ["The Eiffel Tower was designed by Gustave Eiffel."],
        "reference_context_ids": ["d1"],
    },
    {
        "user_input": "How high is Mount Everest?",
        "reference": "Mount Everest is 8849 metres high.",
        "retrieved_contexts": ["Python is a programming language."],
        "reference_context_ids": ["d7"],
        "retrieved_context_ids": ["d3"],
    },
    {
        "turns": [
            {"role": "user", "content": "Who designed the Eiffel Tower?"},
            {"role": "assistant", "content": "Gustave Eiffel.",
             "retrieval_context": ["Gustave Eiffel designed the Eiffel Tower."]},
        ],
        "expected_outcome": "The user learns that Gustave Eiffel designed the Eiffel Tower.",
    },
]  # fmt: skip


def _data(tmp_path: Path, extra: list[str] | None = None) -> Path:
    path = tmp_path / "cases.jsonl"
    lines = [json.dumps(r) for r in ROWS] + (extra or [])
    path.write_text("\n".join(lines) + "\n")
    return path


def _outputs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_offline_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.jsonl"
    code = main(["eval", str(_data(tmp_path)), "--model", "offline", "--output", str(out),
                 "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("contextual_recall", "id_context_recall", "non_llm_context_recall",
                 "turn_contextual_precision"):  # fmt: skip
        assert name in captured.out
    assert "heuristic" in captured.out
    results = _outputs(out)
    assert [r["case_id"] for r in results] == ["line 1", "line 2", "line 3"]
    assert [r["line"] for r in results] == [1, 2, 3]
    first, second, third = results
    assert first["results"]["contextual_recall"]["score"] == 1.0
    assert first["results"]["id_context_recall"]["score"] == 1.0
    assert first["results"]["contextual_recall"]["reason"].startswith("[heuristic] ")
    assert second["results"]["contextual_recall"]["score"] == 0.0
    assert second["results"]["id_context_recall"]["score"] == 0.0
    assert second["results"]["non_llm_context_recall"]["skipped"] is True
    assert third["kind"] == "conversation"
    assert set(third["results"]) == {
        "turn_contextual_precision", "turn_contextual_recall", "turn_contextual_relevancy"
    }  # fmt: skip
    assert third["results"]["turn_contextual_recall"]["score"] == 1.0


def test_json_summary_metrics_and_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", str(_data(tmp_path)), "--metrics", "id_context_recall,contextual_recall",
                 "--threshold", "0.9", "--json", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["judge"] == "offline"
    assert summary["items"] == 3
    assert set(summary["metrics"]) == {"id_context_recall", "contextual_recall"}
    recall = summary["metrics"]["id_context_recall"]
    assert (recall["scored"], recall["mean"], recall["pass_rate"]) == (2, 0.5, 0.5)
    assert summary["metrics"]["contextual_recall"]["heuristic"] is True


def test_bad_rows_are_reported_and_the_rest_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.jsonl"
    data = _data(tmp_path, ['{"input": ["not", "a", "string"]}', "{broken"])
    code = main(["eval", str(data), "--metrics", "id_context_recall", "--output", str(out),
                 "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert "line 4, field 'input': expected a string, got a list" in captured.err
    assert "line 5: invalid JSON" in captured.err
    assert "2 bad row(s)" in captured.err
    rows = _outputs(out)  # the good rows were evaluated, the bad ones carry their error
    assert [r["kind"] for r in rows] == ["case", "case", "conversation", "bad_row", "bad_row"]
    assert rows[3]["field"] == "input"
    assert rows[4]["error"].startswith("invalid JSON")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such file"),
        (["{data}", "--metrics", "contextual_recal"], "did you mean 'contextual_recall'"),
        (["{data}", "--model", " "], "invalid judge configuration"),
        (["{data}", "--concurrency", "0"], "concurrency"),
        (["{data}", "--config", "{config}"], "invalid options for metric"),
        (["{data}", "--output", "{tmp}/no/such/dir/out.jsonl"], "cannot write"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    config = tmp_path / "collector.yaml"
    config.write_text("metrics:\n  contextual_recall:\n    threshold: 7\n")
    values = {"missing": str(tmp_path / "missing.jsonl"), "data": str(_data(tmp_path)),
              "config": str(config), "tmp": str(tmp_path)}  # fmt: skip
    argv = ["eval", *(a.format(**values) for a in args), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert message in " ".join(err.split())


def test_config_file_selects_metrics_and_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "collector.yaml"
    config.write_text(
        "evaluation:\n  judge:\n    model: offline\n  metrics:\n"
        "    id_context_recall:\n      threshold: 0.1\n    contextual_recall:\n      strict: true\n"
    )
    code = main(["eval", str(_data(tmp_path)), "--config", str(config), "--json", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)["metrics"]
    assert set(summary) == {"id_context_recall", "contextual_recall"}
    assert summary["id_context_recall"]["pass_rate"] == 0.5  # 1.0 and 0.0 against 0.1


def test_subprocess_with_progress(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "ragtrace_collector.cli", "eval", str(_data(tmp_path)),
         "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "contextual_recall" in proc.stdout
    assert len(_outputs(out)) == 3
    bad = subprocess.run(
        [sys.executable, "-m", "ragtrace_collector.cli", "eval", str(tmp_path / "nope.jsonl")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "no such file" in bad.stderr


@pytest.mark.slow
async def test_llm_judge_through_the_cli(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    openai_server.handler = auto_reply
    config = tmp_path / "collector.yaml"
    config.write_text(
        "judge:\n"
        f"  api_base: {openai_server.base_url}\n"
        "  api_key_env: RAGTRACE_EVAL_TEST_KEY\n"
        "  max_retries: 0\n"
    )
    out = tmp_path / "r.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ragtrace_collector.cli", "eval", str(_data(tmp_path)),
        "--model", "openai/ragtrace-eval-judge", "--config", str(config),
        "--metrics", "contextual_recall,contextual_precision,turn_contextual_recall",
        "--output", str(out), "--json", "--no-progress",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RAGTRACE_EVAL_TEST_KEY": "sk-test"},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, stderr.decode()
    summary = json.loads(stdout)
    assert summary["judge"] == "openai/ragtrace-eval-judge"
    metrics = summary["metrics"]
    # one judge call per LLM metric per case (2 cases), one per window (1 conversation)
    assert metrics["contextual_recall"]["calls"] == 2
    assert metrics["contextual_precision"]["calls"] == 2
    assert metrics["turn_contextual_recall"]["calls"] == 1
    assert metrics["contextual_recall"]["prompt_tokens"] > 0
    assert openai_server.request_count == 5
    first = _outputs(out)[0]["results"]
    assert first["contextual_recall"]["score"] == 1.0
    assert first["contextual_recall"]["heuristic"] is False
    assert first["contextual_precision"]["details"]["relevant"] == [1, 0]
