"""The collector the demo runs: its config file, its process, and its /metrics.

The collector is a real ``ragtrace-collector serve --config FILE`` subprocess.  Its
receivers and admin port bind port 0 on 127.0.0.1; the demo reads the ports the
collector actually bound from its JSON log (``receiver_listening`` and
``admin_listening`` events), so two demos, or a demo and the tests, never collide.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from examples.demo.plan import INDEX_VERSION_KEY, DemoPlan
from examples.demo.processes import ChildProcess, tail
from ragtrace_collector.metrics import OFFLINE_METRICS
from ragtrace_collector.segments import prometheus_label

#: The demo's metrics: the offline set, and answer_relevancy, which reads only the
#: question and the answer, so the feedback ranking shows a metric that cannot tell a
#: missed article apart ranking low.
DEMO_METRICS: tuple[str, ...] = (*OFFLINE_METRICS, "answer_relevancy")

__all__ = [
    "CollectorError",
    "CollectorProcess",
    "ScoreTotals",
    "collector_config",
    "write_collector_config",
]

_READY_TIMEOUT = 90.0
_HEADER = """\
# Written by the ragtrace demo (python -m examples.demo); rewritten on every run.
# The collector receives the support bot's spans over OTLP/HTTP, scores every trace
# with the offline judge (no network, no model: scores are lexical heuristics), writes
# the scores onto the spans, exports them to {exporters}, and runs the drop detector
# with short demo windows.  The same collector runs outside the demo with
#   ragtrace-collector serve --config {path}
# (its webhook receiver, though, lives only as long as the demo).
"""


class CollectorError(RuntimeError):
    """The collector could not start, or stopped unexpectedly."""


def collector_config(
    plan: DemoPlan,
    *,
    spans_path: Path,
    webhook_url: str,
    phoenix_url: str | None = None,
    phoenix_project: str | None = None,
    rollout: bool = False,
) -> dict[str, Any]:
    """The demo's collector config, as data (``collector.yaml`` syntax).  With
    ``phoenix_url``, a ``type: phoenix`` exporter sends the spans there and posts the
    scores as Phoenix annotations.  With ``rollout``, the scores are split by index
    version (``segments:``) and the rules are the rollout's (:meth:`DemoPlan.rules`)."""
    exporters: dict[str, Any] = {
        "file": {"type": "file", "path": str(spans_path), "max_bytes": "1GiB"},
    }
    if phoenix_url is not None:
        exporters["phoenix"] = {
            "type": "phoenix",
            "endpoint": phoenix_url,
            "project": phoenix_project,
            "retry": {"initial_interval": "200ms", "max_interval": "2s"},
        }
    config: dict[str, Any] = {
        "receivers": {
            "grpc": {"enabled": False},
            "http": {"endpoint": "127.0.0.1:0"},
        },
        "admin": {"endpoint": "127.0.0.1:0"},
        # Ready 300 ms after a trace's last span: quick enough to watch live.
        "assembly": {"decision_wait": "300ms", "max_trace_wait": "10s"},
        "judge": {"model": "offline"},
        "metrics": {name: {} for name in DEMO_METRICS},
        "sampling": {"rate": 1.0},
        "exporters": exporters,
        "alerts": {
            "evaluation_interval": f"{plan.evaluation_interval:g}s",
            "rules": plan.rules(rollout=rollout),
            "webhook": {"url": webhook_url, "timeout": "5s", "max_attempts": 3},
            "log": {"enabled": True},
        },
        "logging": {"level": "info", "format": "json"},
        # Phoenix stores spans (and then takes their annotations) at its own pace:
        # give its exporter longer to finish at shutdown.
        "shutdown": {
            "receiver_grace": "1s",
            "processor_timeout": "10s",
            "flush_timeout": "60s" if phoenix_url is not None else "20s",
        },
    }
    if rollout:
        config = {"segments": [INDEX_VERSION_KEY], **config}
    return config


def write_collector_config(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` as YAML with an explanatory header; returns ``path``."""
    exporters = " and ".join(
        "the OTLP JSON file" if e["type"] == "file" else "Phoenix"
        for e in config["exporters"].values()
    )
    text = _HEADER.format(exporters=exporters, path=path)
    text += yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


#: The label of the index version on the score metrics (rollout mode).
_INDEX_LABEL = prometheus_label(INDEX_VERSION_KEY)


@dataclass(frozen=True, slots=True)
class ScoreTotals:
    """Cumulative ``ragtrace_eval_score`` count and sum per metric, from /metrics, and
    per (metric, index version) when the scores carry that label."""

    count: dict[str, float] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    #: traces whose evaluation finished (``ragtrace_eval_latency_seconds_count``)
    traces_evaluated: float = 0.0
    by_index: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def mean_since(
        self, earlier: ScoreTotals, metric: str, index: str | None = None
    ) -> float | None:
        """Mean of the scores recorded between ``earlier`` and this snapshot (of one
        index version's scores only, with ``index``)."""
        if index is None:
            n = self.count.get(metric, 0.0) - earlier.count.get(metric, 0.0)
            total = self.total.get(metric, 0.0) - earlier.total.get(metric, 0.0)
        else:
            now_n, now_total = self.by_index.get((metric, index), (0.0, 0.0))
            then_n, then_total = earlier.by_index.get((metric, index), (0.0, 0.0))
            n, total = now_n - then_n, now_total - then_total
        return total / n if n > 0 else None


def _collector_program() -> str:
    script = Path(sys.executable).parent / "ragtrace-collector"
    if not script.exists():
        raise CollectorError(
            f"{script} not found: run the demo with the project venv (bash scripts/demo.sh)"
        )
    return str(script)


class CollectorProcess:
    """``ragtrace-collector serve --config FILE`` as a child process."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.otlp_http_url = ""
        self.admin_url = ""
        self._process: ChildProcess | None = None
        self._log_offset = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def process(self) -> ChildProcess | None:
        return self._process

    async def start(self) -> None:
        """Start it and wait until it is ready; :class:`CollectorError` if it is not."""
        argv = [_collector_program(), "serve", "--config", str(self.config_path)]
        self._process = ChildProcess("collector", argv, log_path=self.log_path)
        http: str | None = None
        admin: str | None = None
        ready = False
        deadline = time.monotonic() + _READY_TIMEOUT
        while not (ready and http and admin):
            code = self._process.returncode
            if code is not None:
                raise CollectorError(
                    f"the collector exited with code {code} during startup:\n{tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise CollectorError(
                    f"the collector was not ready after {_READY_TIMEOUT:g}s:\n{tail(self.log_path)}"
                )
            for event in self._new_log_events():
                name = event.get("event")
                if name == "receiver_listening" and event.get("receiver") == "otlp_http":
                    http = str(event.get("endpoint"))
                elif name == "admin_listening":
                    admin = str(event.get("endpoint"))
                elif name == "collector_ready":
                    ready = True
            await asyncio.sleep(0.05)
        self.otlp_http_url = f"http://{http}"
        self.admin_url = f"http://{admin}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    def _new_log_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # only whole lines
        self._log_offset += end
        events = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not a structured line (e.g. a warning from a library)
            if isinstance(event, dict):
                events.append(event)
        return events

    def log_events(self, name: str) -> list[dict[str, Any]]:
        """Every structured log line of the collector with ``event == name``."""
        found = []
        try:
            lines = self.log_path.read_bytes().splitlines()
        except OSError:
            return []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                found.append(event)
        return found

    async def scores(self) -> ScoreTotals | None:
        """The collector's score histogram totals, or None if /metrics did not answer."""
        if self._session is None:
            return None
        try:
            async with self._session.get(f"{self.admin_url}/metrics") as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        totals = ScoreTotals()
        evaluated = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if not math.isfinite(value):
                    continue
                metric = sample.labels.get("metric", "")
                index = sample.labels.get(_INDEX_LABEL)
                n, total = totals.by_index.get((metric, index or ""), (0.0, 0.0))
                if sample.name == "ragtrace_eval_score_count":
                    totals.count[metric] = totals.count.get(metric, 0.0) + value
                    if index is not None:
                        totals.by_index[metric, index] = (n + value, total)
                elif sample.name == "ragtrace_eval_score_sum":
                    totals.total[metric] = totals.total.get(metric, 0.0) + value
                    if index is not None:
                        totals.by_index[metric, index] = (n, total + value)
                elif sample.name == "ragtrace_eval_latency_seconds_count":
                    evaluated += value
        return ScoreTotals(totals.count, totals.total, evaluated, totals.by_index)

    async def feedback(self, sent: int, wait: float = 15.0) -> dict[str, Any] | None:
        """The collector's ``GET /feedback`` once it has counted the ``sent`` feedback
        and computed figures (they refresh every few seconds), at most ``wait``
        seconds; None if it never answered (a collector without the endpoint)."""
        if self._session is None:
            return None
        deadline = time.monotonic() + wait
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            try:
                async with self._session.get(f"{self.admin_url}/feedback") as resp:
                    if resp.status == 404:
                        return None
                    if resp.status == 200:
                        last = await resp.json()
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            if last is not None:
                counts = last.get("counts", {})
                seen = int(counts.get("recorded", 0)) + int(counts.get("replaced", 0))
                if seen >= sent and last.get("series"):
                    return last
            await asyncio.sleep(0.5)
        return last

    async def stop(self, grace: float = 60.0) -> int | None:
        """Graceful shutdown (SIGTERM; the collector flushes every span), bounded."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._process is None:
            return None
        return await self._process.stop(grace)
