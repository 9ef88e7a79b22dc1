"""The offline-evaluation document (docs/offline-evaluation.md, once a README section)
cannot drift: the exit-code table is the CLI's, and the pytest example passes in a real
pytest run of a fresh project.  The blocks are found by their markers, in whichever
document holds them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ragtrace_collector.offline.cli import EXIT_CODES
from tests.docs._readme import find_between, find_marked


def test_exit_code_table_is_the_clis() -> None:
    rows = [
        line.strip().strip("|").split("|")
        for line in find_between("exit-codes").strip().splitlines()[2:]
    ]
    assert [int(cells[0]) for cells in rows] == list(EXIT_CODES)


def test_pytest_plugin_example_passes(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_example.py").write_text(find_marked("eval-pytest").body)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
