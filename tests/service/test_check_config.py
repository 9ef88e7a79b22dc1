"""check-config refuses what serve refuses, reports everything in one run, and starts
without the heavy modules; ``metrics: {include_defaults: true}``; plain-word errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ragtrace_collector.cli import main
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.metrics import OFFLINE_METRICS
from ragtrace_collector.service.preflight import preflight_problems
from tests.fakes.harness import serve_until_exit

COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")
ROOT = Path(__file__).resolve().parents[2]

RULE = "{name: %s, metric: %s, window: 5m, baseline: 0.8, drop: 0.1}"
FAITHFULNESS_RULE = {
    "name": "f",
    "metric": "faithfulness",
    "window": 60,
    "baseline": 0.9,
    "drop": 0.1,
}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "collector.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["check-config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_check_config_refuses_what_serve_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        f"""
        metrics:
          contextual_recall: {{}}
          id_context_recall: {{}}
        alerts:
          rules:
            - {RULE % ("typo", "contextual_recal")}
            - {RULE % ("unused", "faithfulness")}
            - {RULE % ("fine", "contextual_recall")}
        reference_store:
          path: {tmp_path / "missing.jsonl"}
        """,
    )
    code, out = _check(path, capsys)
    assert code == 2, out
    assert (
        "alerts.rules.0.metric: rule 'typo' watches 'contextual_recal', which is not a metric"
        in out
    )
    assert "did you mean 'contextual_recall'?" in out
    assert "alerts.rules.1.metric: rule 'unused' watches 'faithfulness', which this" in out
    assert "evaluated now: contextual_recall, id_context_recall" in out
    assert "alerts.rules.2" not in out
    assert f"reference_store.path: reference store {tmp_path / 'missing.jsonl'}" in out
    # serve refuses the same configuration, with the same lines, before it listens;
    # except the missing reference file, which serve starts without (a reference_store
    # status until the file appears), while check-config reports it.
    done = serve_until_exit(path, tmp_path)
    assert done.returncode == 2, done.stderr
    for line in out.splitlines()[1:]:
        if "reference_store.path" not in line:
            assert line.strip() in done.stderr
    assert "listening" not in done.stderr


def test_every_error_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(
        tmp_path,
        f"""
        assembly:
          decison_wait: 2s
        evaluation:
          workers: lots
        metrics:
          contextual_recal: {{}}
          faithfulnes: {{}}
          id_context_recall: {{}}
        exporters:
          a: {{type: otlp_http, endpoint: "${{RT_TEST_UNSET_A}}"}}
          b:
            type: otlp_http
            endpoint: "http://127.0.0.1:1"
            headers: {{k: "${{RT_TEST_UNSET_B}}"}}
        alerts:
          rules:
            - {RULE % ("typo", "contextual_precison")}
        reference_store:
          path: {tmp_path / "missing.jsonl"}
        """,
    )
    os.environ.pop("RT_TEST_UNSET_A", None)
    os.environ.pop("RT_TEST_UNSET_B", None)
    code, out = _check(path, capsys)
    assert code == 2
    expected = [
        "exporters.a.endpoint: environment variable RT_TEST_UNSET_A is not set",
        "exporters.b.headers.k: environment variable RT_TEST_UNSET_B is not set",
        "assembly.decison_wait: unknown key (did you mean 'decision_wait'?)",
        "evaluation.workers: expected a whole number, got 'lots'",
        "metrics.contextual_recal: unknown metric 'contextual_recal' (did you mean",
        "metrics.faithfulnes: unknown metric 'faithfulnes' (did you mean 'faithfulness'?)",
        # the sections that passed the schema still get serve's checks
        f"reference_store.path: reference store {tmp_path / 'missing.jsonl'}",
    ]
    for line in expected:
        assert line in out, out
    # The alert rule is judged against the metrics, which failed: not reported twice.
    assert "alerts.rules" not in out
    assert "exporters.a.endpoint: '${" not in out  # no noise about the unset value


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"evaluation": {"workers": "many"}},
            "evaluation.workers: expected a whole number, got 'many'",
        ),
        (
            {"evaluation": {"enabled": "maybe"}},
            "evaluation.enabled: expected true or false, got 'maybe'",
        ),
        ({"assembly": {"max_buffered_spans": 0}}, "greater than or equal to 1, got 0"),
        ({"logging": {"level": "loud"}}, "logging.level: expected 'debug', 'info', 'warning' or"),
        ({"judge": {"temperature": "warm"}}, "judge.temperature: expected a number, got 'warm'"),
        ({"admin": []}, "admin: expected a mapping (key: value lines), got a list"),
        (
            {"receivers": {"auth": {"bearer_tokens": [12345678]}}},
            "receivers.auth.bearer_tokens[0]: expected text (a string), got a value of type "
            "int (not shown",
        ),
    ],
)
def test_a_wrong_type_names_the_value_and_the_expected_type(
    data: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, env={})
    assert any(expected in p for p in err.value.problems), err.value.problems
    assert "12345678" not in err.value.render()


def test_include_defaults_adds_a_metric_to_the_default_set() -> None:
    config = parse_config(
        {
            "metrics": {
                "include_defaults": True,
                "faithfulness": {},
                "contextual_recall": {"threshold": 0.7},
            },
            "alerts": {"rules": [FAITHFULNESS_RULE]},
        },
        env={},
    )
    assert config.metrics is not None
    assert list(config.metrics) == [*OFFLINE_METRICS, "faithfulness"]
    assert config.metrics["contextual_recall"].threshold == 0.7
    assert preflight_problems(config) == []
    only = parse_config({"metrics": {"include_defaults": False, "faithfulness": {}}}, env={})
    assert only.metrics is not None
    assert list(only.metrics) == ["faithfulness"]
    with pytest.raises(ConfigError) as err:
        parse_config({"metrics": {"include_defaults": "yes"}}, env={})
    assert "include_defaults: expected true or false, got 'yes'" in err.value.render()


def test_an_alert_on_a_metric_outside_the_default_set_shows_the_fix() -> None:
    config = parse_config(
        {"alerts": {"rules": [FAITHFULNESS_RULE]}},
        env={},
    )
    (problem,) = preflight_problems(config)
    assert "include_defaults: true" in problem
    assert ", ".join(OFFLINE_METRICS) in problem


def test_judge_key_variable_and_evaluation_off(tmp_path: Path) -> None:
    config = parse_config(
        {"judge": {"model": "openai/gpt-4o-mini", "api_key_env": "RT_TEST_NO_SUCH_KEY"}}, env={}
    )
    os.environ.pop("RT_TEST_NO_SUCH_KEY", None)
    assert preflight_problems(config) == [
        "judge.api_key_env: environment variable RT_TEST_NO_SUCH_KEY (api_key_env) is not set"
    ]
    off = parse_config(
        {
            "evaluation": {"enabled": False},
            "reference_store": {"path": str(tmp_path / "missing.jsonl")},
        },
        env={},
    )
    assert preflight_problems(off) == []  # serve builds no stage: nothing to refuse


_HEAVY = ("scipy", "numpy", "redis", "aiohttp", "grpc", "litellm", "structlog", "rich")


@pytest.mark.parametrize("argv", [["check-config", "{config}"], ["--help"], ["serve", "--help"]])
def test_check_config_and_help_import_no_heavy_module(tmp_path: Path, argv: list[str]) -> None:
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"input": "q", "expected_output": "a"}) + "\n")
    config = _write(
        tmp_path,
        f"""
        judge: {{model: openai/gpt-4o-mini}}
        metrics: {{include_defaults: true, faithfulness: {{}}}}
        alerts:
          rules: [{RULE % ("r", "faithfulness")}]
          webhook: {{url: "http://127.0.0.1:9/hook"}}
        session_store: {{backend: redis, url: "redis://127.0.0.1:1/0"}}
        reference_store: {{path: {refs}}}
        """,
    )
    args = [a.format(config=config) for a in argv]
    script = (
        "import sys\n"
        "from ragtrace_collector.cli import main\n"
        "try:\n"
        f"    code = main({args!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {_HEAVY!r})\n"
        "print('HEAVY', heavy, 'CODE', code, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert "HEAVY [] CODE 0" in done.stderr, done.stderr


def test_check_config_refuses_a_storage_directory_serve_cannot_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcntl

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    body = """
        evaluation: {{enabled: false}}
        receivers: {{grpc: {{endpoint: "127.0.0.1:0"}}, http: {{endpoint: "127.0.0.1:0"}}}}
        admin: {{endpoint: "127.0.0.1:0"}}
        exporters: {{f: {{type: file, path: {out}}}}}
        storage: {{directory: {directory}}}
        """
    out = tmp_path / "out.jsonl"
    bad = _write(tmp_path, body.format(out=out, directory=blocker / "wal"))
    code, text = _check(bad, capsys)
    assert code == 2
    assert f"storage.directory: {blocker} is not a directory" in text
    done = serve_until_exit(bad, tmp_path)
    assert done.returncode == 2
    assert f"storage.directory: {blocker} is not a directory" in done.stderr

    # A directory that does not exist yet is fine, and checking does not create it.
    fresh = tmp_path / "new" / "wal"
    code, text = _check(_write(tmp_path, body.format(out=out, directory=fresh)), capsys)
    assert code == 0, text
    assert not fresh.parent.exists()

    # A directory another collector holds: check-config says who, as serve would.
    held = tmp_path / "held"
    held.mkdir()
    with open(held / "lock", "a+") as lock:
        lock.write("4242\n")
        lock.flush()
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, text = _check(_write(tmp_path, body.format(out=out, directory=held)), capsys)
    assert code == 2
    assert f"storage.directory: {held} is in use by another collector (pid 4242)" in text
    code, text = _check(_write(tmp_path, body.format(out=out, directory=held)), capsys)
    assert code == 0, text  # released: fine again
