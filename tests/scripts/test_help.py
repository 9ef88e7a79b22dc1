"""``--help`` of the two entry scripts prints at once: no venv, no download, no install.

Each script runs from a copy of ``scripts/`` in an empty directory, so a script that
reached for ``uv`` or the venv before printing its help would leave ``.tools/`` or
``.venv/`` behind there (or fail, offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _help(tmp_path: Path, script: str, *args: str) -> str:
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV")}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"], "it built something"
    return done.stdout


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_demo_help_builds_nothing_and_is_the_demo_s_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    printed = _help(tmp_path, "demo.sh", "--quick", flag)
    monkeypatch.setenv("COLUMNS", "80")
    from examples.demo.cli import _parser

    # The script keeps a copy of the demo's argparse help: the same text (wrapping
    # aside), then a note on the first run.
    words = " ".join(printed.split())
    assert words.startswith(" ".join(_parser().format_help().split()))
    assert "The first run builds .venv" in printed


def test_test_help_builds_nothing_and_tells_how_to_pass_pytest_arguments(tmp_path: Path) -> None:
    printed = _help(tmp_path, "test.sh", "--help")
    assert printed.startswith("The whole test suite")
    assert "bash scripts/test.sh [--fast] [PYTEST ARGS...]" in printed
    assert '-m "not services and not slow"' in printed
    assert "--fast" in printed
    assert "-n 0" in printed
    assert "source" not in printed  # the comment block only, not the script
