"""One kind of mistake, one exit code, in every command that takes a configuration
file: ``serve --config``, ``check-config`` and ``eval --config`` exit 2 when the file
cannot be read or is not a valid configuration (argparse's own code for a bad command
line), and ``serve`` keeps 1 for failures that come after the checks (a port in use)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragtrace_collector.cli import main

COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")

#: A configuration mistake -> what the file holds (None: no file; "/": a directory).
MISTAKES: dict[str, str | None] = {
    "missing": None,
    "a directory": "/",
    "not YAML": "judge: {model: [offline\n",
    "invalid": "judge: {modle: offline}\n",
}


def _argv(command: str, config: Path, data: Path) -> list[str]:
    if command == "serve":
        return ["serve", "--config", str(config)]
    if command == "check-config":
        return ["check-config", str(config)]
    return ["eval", str(data), "--config", str(config), "--no-progress"]


@pytest.mark.parametrize("mistake", list(MISTAKES))
@pytest.mark.parametrize("command", ["serve", "check-config", "eval"])
def test_a_config_that_cannot_be_used_exits_2_in_every_command(
    tmp_path: Path, command: str, mistake: str
) -> None:
    config = tmp_path / "collector.yaml"
    content = MISTAKES[mistake]
    if content == "/":
        config.mkdir()
    elif content is not None:
        config.write_text(content, encoding="utf-8")
    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps({"input": "q", "actual_output": "a"}) + "\n", encoding="utf-8")
    done = subprocess.run(
        [str(COLLECTOR), *_argv(command, config, data)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert str(config) in done.stderr or "modle" in done.stderr, done.stderr
    assert "listening" not in done.stderr


def test_a_check_beyond_the_schema_gets_the_same_code_and_line_in_serve(tmp_path: Path) -> None:
    """A storage directory that cannot be used, with evaluation off (no evaluation
    stage to run the checks): serve refuses it as check-config does, before it starts."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = tmp_path / "collector.yaml"
    config.write_text(
        "evaluation: {enabled: false}\n"
        "receivers: {grpc: {endpoint: '127.0.0.1:0'}, http: {endpoint: '127.0.0.1:0'}}\n"
        "admin: {endpoint: '127.0.0.1:0'}\n"
        f"exporters: {{f: {{type: file, path: '{tmp_path / 'out.jsonl'}'}}}}\n"
        f"storage: {{directory: '{blocker / 'wal'}'}}\n",
        encoding="utf-8",
    )
    line = f"  - storage.directory: {blocker} is not a directory"
    runs = [
        subprocess.run(
            [str(COLLECTOR), *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
        )
        for argv in (["check-config", str(config)], ["serve", "--config", str(config)])
    ]
    for done in runs:
        assert done.returncode == 2, done.stderr
        assert line in done.stderr.splitlines(), done.stderr
    assert "listening" not in runs[1].stderr


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_help_states_the_configuration_exit_code(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "2 the configuration file cannot be read or is invalid" in text
