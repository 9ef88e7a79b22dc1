"""``python -m examples.demo`` (``bash scripts/demo.sh``): the end-to-end demo.

1. start ``ragtrace-collector serve`` (offline judge, every offline metric, file
   exporter, drop-alert rules with demo-sized windows, webhook and log notifiers);
2. send the support bot's traffic through the SDK: healthy, then with a retrieval fault
   (``--rollout``: only on a new index version that serves a third of the requests);
3. show live progress, then per-metric means before and after the fault, read back
   from the enriched spans the collector wrote;
4. show the drop alert as the in-process webhook received it;
5. say where the enriched spans are (and, with ``--phoenix``, in Phoenix).

Exit codes: 0 done; 1 something failed (the alert did not fire, the collector did not
start or did not exit cleanly); 2 bad arguments; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

import ragtrace
from examples.demo.collector import (
    DEMO_METRICS,
    CollectorError,
    CollectorProcess,
    collector_config,
    write_collector_config,
)
from examples.demo.display import (
    LiveView,
    alert_panel,
    caller_cwd,
    feedback_table,
    intro,
    locations_panel,
    print_table,
    results_table,
    shown_path,
)
from examples.demo.feedback import SimulatedUsers
from examples.demo.phoenix import PhoenixError, PhoenixProcess, phoenix_python
from examples.demo.plan import (
    FAULT_DESCRIPTIONS,
    INDEX_VERSION_KEY,
    NORMAL,
    PRIMARY_ALERT_METRIC,
    QUICK,
    ROLLOUT_EVERY,
    DemoPlan,
    alert_kind,
    alert_rules,
    primary_rule,
)
from examples.demo.processes import ChildProcess
from examples.demo.results import SpanReport, read_spans, summarise
from examples.demo.traffic import DemoBot, IndexedBot, Phase, TrafficDriver
from examples.demo.webhook import AlertReceiver
from examples.support_bot import FaultMode
from ragtrace import semconv

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
SERVICE_NAME = "support-bot"

_CONFIG = "collector.yaml"
_COLLECTOR_LOG = "collector.log"
_SPANS = "spans.jsonl"
_ALERTS = "alerts.jsonl"
_SUMMARY = "summary.json"
_PHOENIX_DIR = "phoenix"
_EVAL_ATTRS = f"{semconv.EVAL_PREFIX}.*"
_SCORE_ATTR = semconv.eval_attr("<metric>", semconv.EVAL_FIELD_SCORE)
_FAULTS = [mode.value for mode in FaultMode if mode is not FaultMode.NONE]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bash scripts/demo.sh",
        description=(
            "End-to-end ragtrace demo, offline: a collector scores a live RAG app's "
            "retrieval, the app's retrieval breaks, the drop alert fires."
        ),
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the collector config, log, enriched spans and summary go "
        "(default: demo-output/ in the repository)",
    )
    parser.add_argument(
        "--fault",
        choices=_FAULTS,
        default=FaultMode.WRONG_INDEX.value,
        help="how retrieval breaks in the second phase (default: wrong_index)",
    )
    parser.add_argument(
        "--rollout",
        action="store_true",
        help="instead of breaking every request, roll a new index version (v2, with the "
        "fault) out to a third of the traffic: the canary alert names app.index_version=v2 "
        "while v1's scores hold",
    )
    parser.add_argument(
        "--phoenix",
        action="store_true",
        help="also export the enriched spans to Arize Phoenix (installed into .venv-phoenix) "
        "and keep it running until Ctrl-C",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="with --phoenix: stop Phoenix and exit after printing its URL",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer requests and shorter alert windows (tests)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a machine-readable summary as JSON on stdout (the display goes to stderr)",
    )
    return parser


def _output_dir(value: Path | None) -> Path:
    if value is None:
        return ROOT / "demo-output"
    if value.is_absolute():
        return value
    return (caller_cwd() / value).resolve()


def _prepare_output(directory: Path) -> None:
    """Create the output directory and remove what an earlier run left in it (only the
    demo's own files)."""
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"--output {directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    for name in (_CONFIG, _COLLECTOR_LOG, _ALERTS, _SUMMARY):
        (directory / name).unlink(missing_ok=True)
    for spans in directory.glob(_SPANS + "*"):
        spans.unlink(missing_ok=True)
    shutil.rmtree(directory / _PHOENIX_DIR, ignore_errors=True)


def _configure_sdk(endpoint: str, *, phoenix_project: str | None) -> None:
    # Export batches every 200 ms (OTel's default is 5 s) so the collector sees the
    # traffic as it happens; the scores are timestamped when they are computed.
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    if phoenix_project is not None:
        extra = f"{semconv.OPENINFERENCE_PROJECT_NAME}={phoenix_project}"
        existing = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").strip()
        os.environ["OTEL_RESOURCE_ATTRIBUTES"] = f"{existing},{extra}" if existing else extra
    ragtrace.configure(
        endpoint=endpoint,
        service_name=SERVICE_NAME,
        protocol="http/protobuf",
        sample_rate=1.0,
        capture_content=True,
        enabled=True,
    )


class Demo:
    """One run of the demo; :meth:`cleanup` always runs after :meth:`run`."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console
        self.plan: DemoPlan = QUICK if args.quick else NORMAL
        self.fault = FaultMode(args.fault)
        self.rollout = bool(args.rollout)
        self.primary_rule = primary_rule(rollout=self.rollout)
        #: What fires: ``canary`` rules in a rollout, ``drop`` rules otherwise.
        self.alert_kind = alert_kind(rollout=self.rollout)
        self.alert_rules = alert_rules(rollout=self.rollout)
        self.out = _output_dir(args.output)
        self.receiver: AlertReceiver | None = None
        self.collector: CollectorProcess | None = None
        self.phoenix: PhoenixProcess | None = None
        #: Ragtrace annotations Phoenix holds, and the page of one low-scoring span.
        self.phoenix_annotations = 0
        self.low_span: tuple[str, float, str] | None = None
        self.sdk_configured = False
        #: The simulated users' feedback, and the collector's ``GET /feedback`` after it.
        self.users = SimulatedUsers(random.Random(7))
        self.feedback: dict[str, Any] | None = None
        self.waiting_for_user = False
        self.cleaning = False
        self.exit_code = 1
        self._t0 = time.monotonic()

    # ----------------------------------------------------------------- output
    def say(self, message: str) -> None:
        # soft_wrap: long paths and URLs stay whole (copyable); the terminal wraps them.
        self.console.print(
            f"[dim]{time.monotonic() - self._t0:6.1f}s[/]  {message}", soft_wrap=True
        )

    # -------------------------------------------------------------------- run
    async def run(self) -> int:
        args = self.args
        _prepare_output(self.out)
        intro(self.console, self.plan, self.fault, phoenix=args.phoenix, rollout=self.rollout)
        webhook_url = await self._start_services()
        healthy, degraded = await self._send_traffic()

        self.users.flush()  # the late feedback still held
        self.say(
            f"traffic done: {self.users.sent} feedback sent ({self.users.negative} thumbs-down); "
            "flushing the SDK, reading /feedback, then stopping the collector with SIGTERM"
        )
        ragtrace.shutdown()
        self.sdk_configured = False
        assert self.collector is not None
        self.feedback = await self.collector.feedback(self.users.sent)
        collector_code = await self.collector.stop()
        clean = collector_code == 0
        self.say(
            f"collector exited with code {collector_code}"
            + (" after flushing every span" if clean else " [bold red](not clean)[/]")
        )
        records = list(read_spans(self.out / _SPANS))
        report = summarise(
            records,
            DEMO_METRICS,
            degraded.started_ns,
            split_by=INDEX_VERSION_KEY if self.rollout else None,
        )
        phoenix_counts: tuple[int, int] | None = None
        if self.phoenix is not None:
            self.say("checking that Phoenix stored the enriched spans and their annotations")
            phoenix_counts = await self.phoenix.wait_for_spans(report.spans)
            scored = [
                r.span_id
                for r in records
                if any(k.startswith(semconv.EVAL_PREFIX + ".") for k in r.attributes)
            ]
            self.phoenix_annotations = await self.phoenix.count_annotations(scored)
            metric = (
                PRIMARY_ALERT_METRIC
                if PRIMARY_ALERT_METRIC in report.lowest
                else min(report.lowest, default=None)
            )
            if metric is not None:
                score, span_id = report.lowest[metric]
                self.low_span = (metric, score, self.phoenix.span_url(span_id))

        self._show_results(report, degraded, phoenix_counts, webhook_url)
        summary = self._summary(report, healthy, degraded, collector_code, phoenix_counts)
        (self.out / _SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if args.json:
            sys.stdout.write(json.dumps(summary) + "\n")
            sys.stdout.flush()

        problems = []
        if not summary["alert"]["fired"]:
            problems.append(
                f"the {self.primary_rule} alert did not fire within "
                f"{self.plan.degraded_max_seconds:g} s of degraded traffic (see "
                f"{shown_path(self.out / _COLLECTOR_LOG)})"
            )
        if not clean:
            problems.append(f"the collector exited with code {collector_code}")
        if report.enriched_spans == 0:
            problems.append(f"no span in the output file carries {_EVAL_ATTRS} scores")
        for problem in problems:
            self.console.print(f"[bold red]Problem:[/] {problem}", soft_wrap=True)
        self.exit_code = 1 if problems else 0

        if self.phoenix is not None and not args.no_wait:
            self.waiting_for_user = True
            self.console.print(
                f"\n[bold]Phoenix keeps running on {self.phoenix.url}[/]. "
                "Press [bold]Ctrl-C[/] to stop it and exit."
            )
            await asyncio.Event().wait()  # until Ctrl-C (or SIGTERM) cancels the run
        return self.exit_code

    async def _start_services(self) -> str:
        """Webhook receiver, Phoenix (optional), collector; returns the webhook URL."""
        self.receiver = AlertReceiver(self.out / _ALERTS)
        webhook_url = await self.receiver.start()
        self.say(f"webhook receiver listening on [cyan]{webhook_url}[/]")
        if self.args.phoenix:
            self.phoenix = PhoenixProcess(
                phoenix_python(ROOT), self.out / _PHOENIX_DIR, project=SERVICE_NAME
            )
            self.phoenix.launch()
            self.say("starting Arize Phoenix in the background (it takes 10-30 s)")
        config = collector_config(
            self.plan,
            spans_path=self.out / _SPANS,
            webhook_url=webhook_url,
            phoenix_url=self.phoenix.url if self.phoenix else None,
            phoenix_project=self.phoenix.project if self.phoenix else None,
            rollout=self.rollout,
        )
        config_path = write_collector_config(self.out / _CONFIG, config)
        self.collector = CollectorProcess(config_path, self.out / _COLLECTOR_LOG)
        self.say(f"starting [bold]ragtrace-collector serve --config {shown_path(config_path)}[/]")
        await self.collector.start()
        self.say(
            f"collector ready (pid {self.collector.pid}): OTLP/HTTP on "
            f"[cyan]{self.collector.otlp_http_url}[/], metrics on "
            f"[cyan]{self.collector.admin_url}/metrics[/]; "
            f"{len(DEMO_METRICS)} metrics, offline judge, sampling 100%"
        )
        if self.phoenix is not None:
            await self.phoenix.wait_ready()
            self.say(f"Phoenix ready on [cyan]{self.phoenix.url}[/]")
        return webhook_url

    async def _send_traffic(self) -> tuple[Phase, Phase]:
        """The support bot's traffic through the SDK: healthy, then degraded."""
        assert self.collector is not None
        _configure_sdk(
            self.collector.otlp_http_url,
            phoenix_project=SERVICE_NAME if self.phoenix else None,
        )
        self.sdk_configured = True
        bot_type = IndexedBot if self.rollout else DemoBot
        bot = bot_type(fault=FaultMode.NONE, model="extractive")
        driver = TrafficDriver(
            bot,
            interval=self.plan.interval,
            conversation_every=self.plan.conversation_every,
            users=self.users,
        )
        healthy = Phase("healthy", FaultMode.NONE)
        degraded = Phase("degraded", self.fault, rollout_every=ROLLOUT_EVERY if self.rollout else 0)
        await self._traffic(driver, healthy, degraded)
        return healthy, degraded

    async def _traffic(self, driver: TrafficDriver, healthy: Phase, degraded: Phase) -> None:
        assert self.collector is not None
        assert self.receiver is not None
        collector, receiver, plan = self.collector, self.receiver, self.plan
        view = LiveView(plan, self.fault, rollout=self.rollout)
        announced: set[str] = set()
        rules = self.alert_rules

        def refresh() -> None:
            for rule in rules:
                alert = receiver.first_firing(rule)
                if alert is not None and rule not in announced:
                    announced.add(rule)
                    after = alert.received_at - degraded.started
                    view.alerts[rule] = after
                    self.say(
                        f"[bold red]{self.alert_kind} alert fired[/]: {rule} "
                        f"({after:.1f} s after the fault), received by the webhook"
                    )
            live.update(view.render(), refresh=True)

        def done() -> bool:
            first = receiver.first_firing(self.primary_rule)
            if first is None:
                return False
            fired = {rule for rule in rules if receiver.first_firing(rule)}
            everything = len(fired) == len(rules)
            return everything or time.monotonic() - first.received_at >= plan.window

        async def poll() -> None:
            while True:
                scores = await collector.scores()
                if scores is not None:
                    view.latest = scores
                refresh()
                await asyncio.sleep(0.5)

        with Live(view.render(), console=self.console, auto_refresh=False, transient=False) as live:
            poller = asyncio.create_task(poll())
            try:
                self.say("[green]phase 1[/]: healthy retrieval")
                view.begin(healthy, await collector.scores() or view.latest)
                await driver.run(
                    healthy,
                    min_seconds=plan.healthy_seconds,
                    max_seconds=plan.healthy_seconds,
                    on_tick=refresh,
                )
                if self.rollout:
                    self.say(
                        f"[red]phase 2[/]: index [bold]v2[/] rolls out to one request in "
                        f"{ROLLOUT_EVERY}, with fault [bold]{self.fault.value}[/]: "
                        f"{FAULT_DESCRIPTIONS[self.fault]}; v1 serves the rest"
                    )
                else:
                    self.say(
                        f"[red]phase 2[/]: fault [bold]{self.fault.value}[/] switched on: "
                        f"{FAULT_DESCRIPTIONS[self.fault]}"
                    )
                view.begin(degraded, await collector.scores() or view.latest)
                await driver.run(
                    degraded,
                    min_seconds=plan.degraded_min_seconds,
                    max_seconds=plan.degraded_max_seconds,
                    done=done,
                    on_tick=refresh,
                )
                refresh()
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
        if not self.console.is_terminal:
            self.console.line()  # the last live frame ends without a newline

    # --------------------------------------------------------------- results
    def _show_results(
        self,
        report: SpanReport,
        degraded: Phase,
        phoenix_counts: tuple[int, int] | None,
        webhook_url: str,
    ) -> None:
        assert self.receiver is not None
        assert self.collector is not None
        console = self.console
        console.print()
        print_table(console, results_table(report, self.fault, rollout=self.rollout))
        console.print()
        primary = self.receiver.first_firing(self.primary_rule)
        others = [
            alert
            for rule in self.alert_rules[1:]
            if (alert := self.receiver.first_firing(rule)) is not None
        ]
        logged = next(
            (
                e
                for e in self.collector.log_events("alert_firing")
                if e.get("rule") == self.primary_rule
            ),
            None,
        )
        if self.feedback is not None:
            print_table(console, feedback_table(self.feedback, sent=self.users.sent))
        else:
            console.print(
                f"[dim]{self.users.sent} feedback sent; the collector did not answer "
                "GET /feedback, so there is no ranking of the metrics to show.[/]"
            )
        console.print()
        console.print(
            alert_panel(
                primary,
                others,
                webhook_url=webhook_url,
                seconds_after_fault=(primary.received_at - degraded.started) if primary else None,
                logged=logged,
                kind=self.alert_kind,
            )
        )
        console.print()
        rows = [
            (
                "Enriched spans",
                f"{shown_path(self.out / _SPANS)}  [dim](OTLP JSON lines: {report.spans} spans, "
                f"{report.enriched_spans} carry {_EVAL_ATTRS} scores)[/]",
            ),
            ("Collector config", shown_path(self.out / _CONFIG)),
            ("Collector log", shown_path(self.out / _COLLECTOR_LOG)),
            ("Alerts received", shown_path(self.out / _ALERTS)),
            ("Summary (JSON)", shown_path(self.out / _SUMMARY)),
        ]
        if self.phoenix is not None and phoenix_counts is not None:
            stored, scored = phoenix_counts
            state = "running" if not self.args.no_wait else "stopped on exit (--no-wait)"
            rows.append(
                (
                    "Phoenix",
                    f"[cyan]{self.phoenix.url}[/]  [dim]({state}; project "
                    f"{self.phoenix.project}: {stored} spans, {scored} with scores, "
                    f"{self.phoenix_annotations} score annotations)[/]",
                )
            )
            if self.low_span is not None:
                metric, score, url = self.low_span
                rows.append(
                    (
                        "Low-scoring span",
                        f"[cyan]{url}[/]  [dim]({metric} = {score:.2f}, open it in Phoenix)[/]",
                    )
                )
        hint = (
            "Each line of the span file is one OTLP ExportTraceServiceRequest. The scores are "
            "attributes of the [bold]support_bot.answer[/] spans: "
            f"[cyan]{_SCORE_ATTR}[/], [cyan].{semconv.EVAL_FIELD_REASON}[/], "
            f"[cyan].{semconv.EVAL_FIELD_PASSED}[/], plus OpenInference "
            f"[cyan]{semconv.EVALUATIONS}.N.*[/] and "
            f"[cyan]{semconv.GEN_AI_EVALUATION_RESULT_EVENT}[/] events."
        )
        if self.phoenix is not None:
            hint += (
                f"\nIn Phoenix (project [bold]{self.phoenix.project}[/]) the scores are "
                "[bold]annotations[/]: chips on each support_bot.answer span, columns and "
                "filters in the spans table (e.g. "
                f"[cyan]annotations['{PRIMARY_ALERT_METRIC}'].score < 0.5[/]), charts on "
                "the Metrics tab, per-document verdicts under the retrieved documents, and "
                "conversation scores on the sessions."
            )
        console.print(locations_panel(rows, hint))

    def _summary(
        self,
        report: SpanReport,
        healthy: Phase,
        degraded: Phase,
        collector_code: int | None,
        phoenix_counts: tuple[int, int] | None,
    ) -> dict[str, Any]:
        assert self.receiver is not None
        assert self.collector is not None
        primary = self.receiver.first_firing(self.primary_rule)
        fired = {
            rule: alert.payload
            for rule in self.alert_rules
            if (alert := self.receiver.first_firing(rule)) is not None
        }
        return {
            "fault": self.fault.value,
            "quick": bool(self.args.quick),
            "rollout": self.rollout,
            "service": SERVICE_NAME,
            "output_dir": str(self.out),
            "spans_file": str(self.out / _SPANS),
            "collector_config": str(self.out / _CONFIG),
            "collector_log": str(self.out / _COLLECTOR_LOG),
            "collector_pid": self.collector.pid,
            "collector_exit_code": collector_code,
            "phases": {"before": healthy.to_dict(), "after": degraded.to_dict()},
            "spans": report.to_dict(),
            "metrics": {name: m.to_dict() for name, m in report.metrics.items()},
            "alert": {
                "rule": self.primary_rule,
                "fired": primary is not None,
                "seconds_after_fault": (
                    round(primary.received_at - degraded.started, 3) if primary else None
                ),
                "payload": primary.payload if primary else None,
            },
            "alerts_fired": fired,
            "feedback": {
                "sent": self.users.sent,
                "negative": self.users.negative,
                "collector": self.feedback,
            },
            # every rule that fired at least once (a rollout: the split drop rules of the
            # stable index must not be among them)
            "rules_fired": sorted({a.rule for a in self.receiver.alerts if a.firing}),
            "alert_rules": self.plan.rules(rollout=self.rollout),
            "phoenix": (
                {
                    "url": self.phoenix.url,
                    "project": self.phoenix.project,
                    "spans": phoenix_counts[0],
                    "scored_spans": phoenix_counts[1],
                    "annotations": self.phoenix_annotations,
                    "low_scoring_span_url": self.low_span[2] if self.low_span else None,
                    "pid": self.phoenix.process.pid if self.phoenix.process else None,
                }
                if self.phoenix is not None and phoenix_counts is not None
                else None
            ),
        }

    # --------------------------------------------------------------- cleanup
    def hurry(self) -> None:
        """A second interrupt during cleanup: kill the children now."""
        for child in (
            self.collector.process if self.collector else None,
            self.phoenix.process if self.phoenix else None,
        ):
            if child is not None:
                child.kill()

    async def cleanup(self) -> None:
        """Stop everything this run started, whatever happened (idempotent)."""
        self.cleaning = True
        if self.sdk_configured:
            self.sdk_configured = False
            with contextlib.suppress(Exception):
                ragtrace.shutdown()
        if self.collector is not None:
            await self.collector.stop()
        if self.phoenix is not None:
            if self.phoenix.process is not None and self.phoenix.process.running():
                self.console.print("[dim]stopping Phoenix[/]")
            await self.phoenix.stop()
        if self.receiver is not None:
            await self.receiver.stop()

    def children(self) -> list[ChildProcess]:
        return [
            c
            for c in (
                self.collector.process if self.collector else None,
                self.phoenix.process if self.phoenix else None,
            )
            if c is not None
        ]


async def _main(demo: Demo) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if demo.cleaning:
            demo.hurry()
            return
        interrupted.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await demo.run()
    except asyncio.CancelledError:
        if not interrupted:
            raise
        if demo.waiting_for_user:
            return demo.exit_code
        demo.console.print(f"\n[bold yellow]Interrupted ({interrupted[0].name})[/]: cleaning up")
        return 130
    except (CollectorError, PhoenixError, OSError, ValueError) as exc:
        demo.console.print(f"[bold red]Error:[/] {exc}", soft_wrap=True)
        return 1
    finally:
        await demo.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.no_wait and not args.phoenix:
        args.no_wait = False  # nothing to wait for without Phoenix
    console = Console(stderr=bool(args.json), highlight=False)
    demo = Demo(args, console)
    try:
        return asyncio.run(_main(demo))
    except KeyboardInterrupt:
        return 130
    finally:
        for child in demo.children():  # last resort; normally already stopped
            child.stop_now()
