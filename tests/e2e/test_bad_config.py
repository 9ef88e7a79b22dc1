"""A bad evaluation config stops ``ragtrace-collector serve`` before it listens, with
a message that names the key."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.harness import COLLECTOR
from tests.fakes.ports import free_port

#: A reference file that exists but does not parse (a missing one is only a status).
_BROKEN_REFS = Path(__file__).with_name("broken_refs.jsonl")


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        (
            {"metrics": {"contextual_recal": {}}},
            ["metrics", "contextual_recal", "contextual_recall"],
        ),
        ({"metrics": {"id_context_recall": {"treshold": 0.7}}}, ["metrics.id_context_recall"]),
        ({"evaluation": {"queue_sise": 10}}, ["evaluation.queue_sise", "queue_size"]),
        ({"evaluation": {"metric_defaults": {"treshold": 0.7}}}, ["evaluation.metric_defaults"]),
        ({"reference_store": {"path": str(_BROKEN_REFS)}}, ["reference_store.path", "refs"]),
        ({"judge": {"model": "openai/gpt-4o-mini", "api_key_env": "E2E_NO_SUCH_KEY"}}, ["judge"]),
    ],
    ids=["unknown-metric", "metric-option", "evaluation-typo", "defaults-typo", "bad-refs", "key"],
)
def test_bad_evaluation_config_exits_nonzero_before_listening(
    tmp_path: Path, sections: dict[str, Any], names: list[str]
) -> None:
    http_port = free_port()
    config: dict[str, Any] = {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0"},
            "http": {"endpoint": f"127.0.0.1:{http_port}"},
        },
        "admin": {"endpoint": "127.0.0.1:0"},
        "exporters": {"file": {"type": "file", "path": str(tmp_path / "spans.jsonl")}},
        **sections,
    }
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(COLLECTOR), "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode != 0
    message = done.stderr
    for name in names:
        assert name in message, message
    # Nothing listened: no receiver log line, and the port is still free.
    assert "receiver_listening" not in message
    assert "collector_ready" not in message
    with socket.socket() as s:
        s.bind(("127.0.0.1", http_port))
