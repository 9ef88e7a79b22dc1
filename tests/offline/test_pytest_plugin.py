"""The pytest plugin, in a real pytest run of a small project: through the ``pytest11``
entry point, and through ``pytest_plugins`` with the entry point disabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = """
def test_good_retrieval(ragtrace_eval):
    results = ragtrace_eval.assert_passes(
        {"input": "How do I reset the router?", "retrieved_context_ids": ["manual-7", "faq"],
         "reference_context_ids": ["manual-7"]},
        metrics="id_context_recall,id_context_precision",
    )
    assert [r.score for r in results] == [1.0, 0.5]


def test_bad_retrieval(ragtrace_eval):
    ragtrace_eval.assert_passes(
        {"input": "How do I reset the router?", "retrieved_context_ids": ["faq"],
         "reference_context_ids": ["manual-7"]},
        metrics=["id_context_recall"],
    )


def test_missing_inputs_fail(ragtrace_eval):
    ragtrace_eval.assert_passes({"input": "q", "retrieved_contexts": ["c"]}, "id_context_recall")


def test_golden_file(ragtrace_eval):
    report = ragtrace_eval.assert_file("golden.jsonl", "id_context_recall", fail_under=0.5)
    assert report.summary["id_context_recall"].mean == 0.5


def test_golden_file_gate(ragtrace_eval):
    ragtrace_eval.assert_file("golden.jsonl", "id_context_recall", fail_under=0.6)
"""

GOLDEN = [
    {"retrieved_context_ids": ["a"], "reference_context_ids": ["a"]},
    {"retrieved_context_ids": ["b"], "reference_context_ids": ["a"]},
]


def _project(tmp_path: Path, conftest: str | None) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_rag.py").write_text(TESTS)
    (tmp_path / "golden.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOLDEN))
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    return tmp_path


@pytest.mark.parametrize(
    ("conftest", "flags"),
    [(None, []),  # the pytest11 entry point of the installed collector
     ('pytest_plugins = ["ragtrace_collector.offline.pytest_plugin"]\n', ["-p", "no:ragtrace"])],
    ids=["entry-point", "pytest_plugins"],
)  # fmt: skip
def test_plugin_in_a_project(tmp_path: Path, conftest: str | None, flags: list[str]) -> None:
    project = _project(tmp_path, conftest)
    # langsmith's pytest plugin (installed with langchain-core) is left out, as in this
    # suite: it has nothing to do with ours and costs the run about 2 s of imports.
    flags = [*flags, "-p", "no:langsmith_plugin"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    out = proc.stdout
    assert "3 failed, 2 passed" in out, out + proc.stderr
    assert "id_context_recall: score 0.0000 < threshold 0.5: 0 of 1 reference ids" in out
    assert "id_context_recall: skipped: no reference_context_ids" in out
    assert "id_context_recall: mean 0.5000 is under 0.6" in out
    for name in ("test_bad_retrieval", "test_missing_inputs_fail", "test_golden_file_gate"):
        assert f"FAILED test_rag.py::{name}" in out
