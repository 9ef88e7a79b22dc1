"""What the demo shows: the introduction, the live panel, the results, the alert."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.json import JSON
from rich.measure import Measurement
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from examples.demo.collector import ScoreTotals
from examples.demo.plan import (
    ALERT_METRICS,
    CANDIDATE_INDEX,
    FAULT_DESCRIPTIONS,
    INDEX_VERSION_KEY,
    ROLLOUT_EVERY,
    STABLE_INDEX,
    DemoPlan,
    alert_kind,
    alert_rules,
)
from examples.demo.results import MetricPhaseStats, SpanReport
from examples.demo.traffic import Phase
from examples.demo.webhook import ReceivedAlert
from examples.support_bot import FaultMode
from ragtrace import semconv
from ragtrace_collector.metrics import NO_JUDGE_METRICS, build_metric, is_conversation_metric

__all__ = [
    "CALLER_CWD_ENV",
    "LiveView",
    "alert_panel",
    "caller_cwd",
    "feedback_table",
    "intro",
    "locations_panel",
    "print_table",
    "results_table",
    "shown_path",
]

_DROP_STYLE = "bold red"
_RISE_STYLE = "bold green"
_FLAT_STYLE = "dim"
_NOTABLE = 0.05


#: The directory the user ran the demo from: ``scripts/demo.sh`` changes to the
#: repository root before it starts Python and passes the original one here.
CALLER_CWD_ENV = "RAGTRACE_DEMO_CALLER_CWD"


def caller_cwd() -> Path:
    return Path(os.environ.get(CALLER_CWD_ENV) or os.getcwd())


def shown_path(path: Path) -> str:
    """``path`` relative to the user's working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(caller_cwd().resolve()))
    except ValueError:
        return str(path)


def _score(value: float | None) -> Text:
    return Text("—", style="dim") if value is None else Text(f"{value:.3f}")


def _delta(value: float | None) -> Text:
    if value is None:
        return Text("—", style="dim")
    style = _DROP_STYLE if value <= -_NOTABLE else _RISE_STYLE if value >= _NOTABLE else _FLAT_STYLE
    return Text(f"{value:+.3f}", style=style)


def intro(
    console: Console, plan: DemoPlan, fault: FaultMode, *, phoenix: bool, rollout: bool = False
) -> None:
    console.rule("[bold]ragtrace demo[/]: watching retrieval quality of a live RAG app")
    steps = Table.grid(padding=(0, 1))
    steps.add_column(style="bold cyan", justify="right")
    steps.add_column()
    steps.add_row(
        "1",
        "Start the [bold]ragtrace collector[/]: it receives the app's spans over OTLP, scores "
        "every trace with the [italic]offline judge[/] (no network, no model) and writes the "
        "scores onto the spans.",
    )
    steps.add_row(
        "2",
        f"Run the [bold]Orla support bot[/] (BM25 + reranker RAG, instrumented with ragtrace) "
        f"with [green]healthy retrieval[/] for {plan.healthy_seconds:g} s: golden questions "
        "that carry their ground truth, and multi-turn conversations.",
    )
    if rollout:
        steps.add_row(
            "3",
            f"Roll a new index version out to one request in {ROLLOUT_EVERY} "
            f"([bold]{INDEX_VERSION_KEY}={CANDIDATE_INDEX}[/], broken: [red]{fault.value}[/], "
            f"{FAULT_DESCRIPTIONS[fault]}) while {STABLE_INDEX} serves the rest, until the "
            "collector's [bold]canary rule[/] (v2 against v1, same window) fires.",
        )
    else:
        steps.add_row(
            "3",
            f"Break retrieval ([red]{fault.value}[/]: {FAULT_DESCRIPTIONS[fault]}) and keep the "
            "traffic going until the collector's [bold]drop detector[/] fires.",
        )
    steps.add_row(
        "4",
        "Read the scores back from the enriched spans: before and after, per metric."
        + (" The spans also go to [bold]Arize Phoenix[/]." if phoenix else ""),
    )
    console.print(steps)
    console.print()


@dataclass
class LiveView:
    """The live panel: phase, traffic, the collector's running scores, the alerts."""

    plan: DemoPlan
    fault: FaultMode
    phases: list[Phase] = field(default_factory=list)
    #: /metrics totals when each phase began (index-aligned with ``phases``)
    snapshots: list[ScoreTotals] = field(default_factory=list)
    latest: ScoreTotals = field(default_factory=ScoreTotals)
    alerts: dict[str, float] = field(default_factory=dict)  # rule -> seconds after the fault
    #: a rollout: the degraded phase's scores per index version
    rollout: bool = False

    def begin(self, phase: Phase, snapshot: ScoreTotals) -> None:
        self.phases.append(phase)
        self.snapshots.append(snapshot)

    def _phase_mean(self, index: int, metric: str, version: str | None = None) -> float | None:
        end = self.snapshots[index + 1] if index + 1 < len(self.snapshots) else self.latest
        return end.mean_since(self.snapshots[index], metric, version)

    def render(self) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", min_width=12)
        grid.add_column()
        if self.phases:
            phase = self.phases[-1]
            label = (
                "[green]healthy retrieval[/]"
                if phase.fault is FaultMode.NONE
                else f"[red]index {CANDIDATE_INDEX} rolling out[/] to 1 request in "
                f"{phase.rollout_every} (fault [bold]{phase.fault.value}[/])"
                if phase.rollout_every
                else f"[red]degraded retrieval[/] (fault [bold]{phase.fault.value}[/])"
            )
            elapsed = phase.elapsed()
            if phase.fault is FaultMode.NONE:
                bar: RenderableType = ProgressBar(
                    total=self.plan.healthy_seconds, completed=elapsed, width=30
                )
                progress = Table.grid(padding=(0, 1))
                progress.add_row(bar, Text(f"{elapsed:4.1f} / {self.plan.healthy_seconds:g} s"))
                grid.add_row("Phase", Group(Text.from_markup(f"{len(self.phases)}/2 {label}")))
                grid.add_row("", progress)
            else:
                grid.add_row(
                    "Phase",
                    Text.from_markup(
                        f"{len(self.phases)}/2 {label}  {elapsed:4.1f} s "
                        f"[dim](until the {alert_kind(rollout=self.rollout)} alerts fire, "
                        "at most "
                        f"{self.plan.degraded_max_seconds:g} s)[/]"
                    ),
                )
            golden = sum(p.golden for p in self.phases)
            conversations = sum(p.conversations for p in self.phases)
            turns = sum(p.turns for p in self.phases)
            # In a rollout, where each kind of request goes: why v2 has no conversation
            # scores.
            on_new = sum(p.candidate_golden for p in self.phases)
            questions = f" ({on_new} on {CANDIDATE_INDEX})" if self.rollout else ""
            on_old = f", all on {STABLE_INDEX}" if self.rollout else ""
            grid.add_row(
                "Requests",
                f"{golden} golden questions{questions} · "
                f"{conversations} conversations ({turns} turns{on_old})",
            )
        grid.add_row(
            "Scored", f"{self.latest.traces_evaluated:.0f} traces evaluated by the collector"
        )
        scores = Table(box=None, padding=(0, 2), show_edge=False, header_style="dim")
        scores.add_column("live mean (collector /metrics)")
        scores.add_column("healthy", justify="right")
        if self.rollout:
            scores.add_column(f"rollout: {STABLE_INDEX}", justify="right")
            scores.add_column(CANDIDATE_INDEX, justify="right")
        else:
            scores.add_column("degraded", justify="right")
        for metric in ALERT_METRICS:
            healthy = self._phase_mean(0, metric) if self.snapshots else None
            if len(self.snapshots) < 2:
                later: list[float | None] = [None, None] if self.rollout else [None]
            elif self.rollout:
                later = [self._phase_mean(1, metric, v) for v in (STABLE_INDEX, CANDIDATE_INDEX)]
            else:
                later = [self._phase_mean(1, metric)]
            scores.add_row(metric, _score(healthy), *map(_score, later))
        grid.add_row("Scores", scores)
        lines = []
        for rule in alert_rules(rollout=self.rollout):
            if rule in self.alerts:
                after = self.alerts[rule]
                lines.append(f"[bold red]FIRING[/] {rule} [dim]({after:.1f} s after the fault)[/]")
            else:
                lines.append(f"[dim]watching[/] {rule}")
        grid.add_row("Alerts", Text.from_markup("\n".join(lines)))
        return Panel(grid, title="live", title_align="left", border_style="cyan")


def results_table(report: SpanReport, fault: FaultMode, *, rollout: bool = False) -> Table:
    """Per-metric means before and after the fault; in a rollout, after it per index
    version.  The metric column never wraps and is never cut: on a narrow terminal the
    other columns wrap (at their spaces).  Both tables fit 80 columns without wrapping
    a cell; for that the rollout table leaves out the mean after the fault over both
    versions and its Δ (they are in summary.json)."""
    title = (
        f"Retrieval quality before and during the rollout of index {CANDIDATE_INDEX} "
        f"({fault.value})"
        if rollout
        else f"Retrieval quality before and after the fault ({fault.value})"
    )
    table = Table(
        title=title,
        caption=_caption(report, rollout=rollout),
        caption_justify="left",
        header_style="bold",
        title_style="bold",
    )
    table.add_column("Metric", no_wrap=True)
    table.add_column("Judge", style="dim")
    table.add_column("Before", justify="right")
    if rollout:
        for version in (STABLE_INDEX, CANDIDATE_INDEX):
            table.add_column(f"After\n{version}", justify="right")
    else:
        table.add_column("After", justify="right")
        table.add_column("Δ", justify="right")
    table.add_column("Scored", justify="right", style="dim")
    for summary in report.metrics.values():
        after: list[RenderableType] = (
            [
                _version_score(_mean(summary.after_by.get(v)), summary.before.mean)
                for v in (STABLE_INDEX, CANDIDATE_INDEX)
            ]
            if rollout
            else [_score(summary.after.mean), _delta(summary.delta)]
        )
        table.add_row(
            _metric_name(summary.name),
            "no judge" if summary.name in NO_JUDGE_METRICS else "offline",
            _score(summary.before.mean),
            *after,
            f"{summary.before.count} / {summary.after.count}",
        )
    return table


def feedback_table(report: dict[str, Any], *, sent: int) -> Table:
    """The metrics ranked by how well they predict a thumbs-down (the collector's
    ``GET /feedback``): AUROC with its interval, Cohen's kappa at the threshold, and
    the joined requests behind them."""
    table = Table(
        title="Which metric predicts an unhappy user (AUROC against the users' thumbs)",
        caption_justify="left",
        header_style="bold",
        title_style="bold",
    )
    table.add_column("Metric", no_wrap=True)
    table.add_column("AUROC", justify="right")
    table.add_column("95% interval", justify="right", style="dim")
    table.add_column("κ", justify="right")
    table.add_column("Pairs", justify="right", style="dim")
    for series in report.get("series", []):
        if series.get("name") != semconv.FEEDBACK_DEFAULT_NAME:
            continue
        interval = series.get("interval")
        kappa = series.get("kappa")
        table.add_row(
            _metric_name(str(series.get("metric"))),
            _score(series.get("auroc")),
            f"{interval[0]:.2f}–{interval[1]:.2f}" if interval else "—",
            "—" if kappa is None else f"{kappa:.2f}",
            str(series.get("pairs", 0)),
        )
    counts = report.get("counts", {})
    table.caption = (
        f"{sent} feedback sent, some late; the collector joined "
        f"{counts.get('recorded', 0)} to the requests' scores. AUROC: the chance that a "
        "request with a thumbs-down scored lower than one with a thumbs-up (0.5: no better "
        "than a coin). κ: pass/fail at the threshold against up/down."
    )
    return table


def _mean(stats: MetricPhaseStats | None) -> float | None:
    return stats.mean if stats is not None else None


def _caption(report: SpanReport, *, rollout: bool) -> str:
    """What the figures are; in a rollout, why a v2 cell can be empty."""
    caption = (
        f"Means of {semconv.eval_attr('<metric>', semconv.EVAL_FIELD_SCORE)} on the enriched "
        "spans the collector wrote. Offline judge: lexical heuristics, not an LLM."
    )
    if not rollout:
        return caption
    caption += (
        f" After {STABLE_INDEX}, after {CANDIDATE_INDEX}: means over the requests each "
        "index version served during the rollout (the mean over both, and its Δ, are in "
        "summary.json). —: no score."
    )
    unscored = [
        name
        for name, summary in report.metrics.items()
        if CANDIDATE_INDEX not in summary.after_by and is_conversation_metric(build_metric(name))
    ]
    if unscored:
        caption += (
            f" {CANDIDATE_INDEX} has no {_or(unscored)} scores: these metrics score "
            f"multi-turn conversations, and the rollout sends only single golden questions "
            f"to {CANDIDATE_INDEX}; every conversation stays on {STABLE_INDEX}."
        )
    return caption


def _or(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` whole.  On a terminal it fits the terminal's width (the table
    wraps what it can).  Elsewhere (a pipe, a file) nothing limits the width of a line,
    so it is printed at its natural width and nothing is cut, whatever ``COLUMNS``."""
    if console.is_terminal:
        console.print(table)
    else:
        console.print(_NaturalWidth(table), crop=False)


@dataclass(frozen=True, slots=True)
class _NaturalWidth:
    """A renderable drawn as wide as it wants, not as wide as the console."""

    renderable: RenderableType

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.update(max_width=_UNBOUNDED)
        width = Measurement.get(console, wide, self.renderable).maximum
        yield from console.render(self.renderable, options.update_width(width))


#: Wider than any table the demo prints.
_UNBOUNDED = 10_000


def _version_score(value: float | None, before: float | None) -> Text:
    """One index version's mean after the fault, red when it is well below before."""
    text = _score(value)
    if value is not None and before is not None and value - before <= -_NOTABLE:
        text.stylize(_DROP_STYLE)
    return text


def _metric_name(name: str) -> Text:
    text = Text(name)
    if name in ALERT_METRICS:
        text.append(" (alert)", style="yellow")
    return text


def alert_panel(
    primary: ReceivedAlert | None,
    others: Sequence[ReceivedAlert],
    *,
    webhook_url: str,
    seconds_after_fault: float | None,
    logged: dict[str, Any] | None,
    kind: str = "drop",
) -> RenderableType:
    if primary is None:
        return Panel(
            Text(f"No {kind} alert arrived at the webhook.", style="bold red"),
            title="alert",
            border_style="red",
        )
    parts: list[RenderableType] = [
        Text.from_markup(
            f"[bold]{primary.payload.get('summary', primary.rule)}[/]\n"
            f"[dim]Fired {seconds_after_fault or 0:.1f} s after the fault was switched on; "
            f"the collector POSTed this to {webhook_url}:[/]"
        ),
        _folded_json(primary.payload),
    ]
    for alert in others:
        parts.append(Text.from_markup(f"[bold]Also firing:[/] {alert.payload.get('summary')}"))
    if logged is not None:
        parts.append(
            Text.from_markup(
                f"[dim]The log notifier wrote it to the collector's log too "
                f"(event {logged.get('event')}, level {logged.get('level')}).[/]"
            )
        )
    return Panel(
        Group(*parts),
        title=f"[bold red]{kind} alert[/]",
        title_align="left",
        border_style="red",
    )


def _folded_json(data: dict[str, Any]) -> RenderableType:
    """Pretty JSON whose long strings fold onto the next line instead of being cut."""
    rendered = JSON(json.dumps(data)).text
    rendered.no_wrap = False
    rendered.overflow = "fold"
    return rendered


def locations_panel(rows: Sequence[tuple[str, str]], hint: str) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, where in rows:
        grid.add_row(label, where)
    return Panel(
        Group(grid, Text(""), Text.from_markup(hint)),
        title="where the enriched spans are",
        title_align="left",
        border_style="green",
    )
