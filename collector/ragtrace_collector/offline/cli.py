"""``ragtrace-collector eval DATA``: the metric suite over a dataset, offline.

Shows a progress bar (stderr), prints a summary table (or ``--json``) to stdout and
writes one JSON line per case or conversation to ``--output``, in input order (bad rows
too, with their error).  :data:`EXIT_CODES` are the exit codes (also in ``--help``).

``--config`` reads YAML with optional ``judge:`` (the :class:`JudgeConfig` fields)
and ``metrics:`` sections, at the top level or under ``evaluation:``.  ``metrics`` is a
list of names or a mapping ``name: {threshold: 0.7, ...}`` (:class:`MetricOptions`).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragtrace_collector.exitcodes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from ragtrace_collector.metrics import (
    METRIC_NAMES,
    OFFLINE_METRICS,
    UnknownMetricError,
    build_metrics,
)
from ragtrace_collector.offline.feedback import FeedbackReport
from ragtrace_collector.offline.gate import QualityGate, parse_fail_under
from ragtrace_collector.offline.loaders import (
    DatasetError,
    accepted_fields,
    check_feedback_column,
    load_dataset,
)
from ragtrace_collector.offline.runner import (
    EvalReport,
    ItemResult,
    applicable_metrics,
    evaluate,
    make_judge_for,
    missing_columns,
)

__all__ = ["EXIT_CODES", "epilog", "eval_command"]

EXIT_PROBLEMS = 1
EXIT_GATE = 3

#: Exit code -> meaning (``--help`` and docs/offline-evaluation.md say the same).
EXIT_CODES = {
    EXIT_OK: "every row loaded, every result is a score or a skip, the quality gate passed",
    EXIT_PROBLEMS: "some rows were bad (reported with line and field, skipped; the other "
    "rows were evaluated) or some results are errors (e.g. judge failures)",
    EXIT_USAGE: "nothing was evaluated: bad path, empty file, unsupported format, unknown "
    "metric, invalid option, a field that no row has while a chosen metric needs it, or a "
    "config file that cannot be read or is invalid (2 in every command)",
    EXIT_GATE: "the quality gate failed (--fail-under, --fail-on-case-failure), or a "
    "metric it gates scored no row (unless --allow-unscored); 1 wins when rows were bad too",
    EXIT_INTERRUPTED: "interrupted",
}


class _UsageError(Exception):
    pass


def _read_eval_config(
    path: Path,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[str] | None]:
    """(judge fields, per-metric options, metric names or None) from a YAML file.

    Integration point: once ``collector.yaml`` has validated judge/metric sections in
    ``ragtrace_collector.config``, read them from there instead.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _UsageError(f"--config {path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise _UsageError(f"--config {path}: invalid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _UsageError(f"--config {path}: expected a mapping at the top level")
    section = data.get("evaluation") if isinstance(data.get("evaluation"), Mapping) else data
    assert isinstance(section, Mapping)
    judge = section.get("judge", data.get("judge")) or {}
    if not isinstance(judge, Mapping):
        raise _UsageError(f"--config {path}: 'judge' must be a mapping")
    raw_metrics = section.get("metrics", data.get("metrics"))
    options: dict[str, dict[str, Any]] = {}
    names: list[str] | None = None
    if isinstance(raw_metrics, list):
        names = [str(n) for n in raw_metrics]
    elif isinstance(raw_metrics, Mapping):
        names = []
        for name, value in raw_metrics.items():
            if value is None or value is True:
                value = {}
            elif value is False:
                value = {"enabled": False}
            if not isinstance(value, Mapping):
                raise _UsageError(f"--config {path}: metrics.{name} must be a mapping of options")
            options[str(name)] = dict(value)
            names.append(str(name))
    elif raw_metrics is not None:
        raise _UsageError(f"--config {path}: 'metrics' must be a list or a mapping")
    return dict(judge), options, names


def _progress(console: Console, total: int, enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]evaluating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
        transient=True,
    )


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.0%}" if pct else f"{value:.4f}"


def _table(report: EvalReport) -> Table:
    """The summary; fits 80 columns (no column for judge calls or cost when there were
    none, names fold rather than numbers being cut)."""
    table = Table(
        title=f"ragtrace eval - judge: {report.judge}, items: {len(report.items)}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("metric", overflow="fold", ratio=1, min_width=12)
    summaries = [report.summary[name] for name in report.metrics]
    # The offline judge's calls cost nothing: no columns for them.
    paid = any(s.prompt_tokens or s.cost_usd is None or s.cost_usd > 0 for s in summaries)
    columns = ["mean", "pass%", "pass", "fail", "skip", "error"]
    if paid:
        columns += ["calls", "cost $"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True, overflow="ignore")
    heuristic = False
    for s in summaries:
        heuristic = heuristic or s.heuristic
        row = [
            _fmt(s.mean),
            _fmt(s.pass_rate, pct=True),
            str(s.passed),
            str(s.failed),
            str(s.skipped),
            str(s.errors),
        ]
        if paid:
            row += [str(s.calls), "-" if s.cost_usd is None else f"{s.cost_usd:.4f}"]
        table.add_row(s.metric + (" *" if s.heuristic else ""), *row)
    if heuristic:
        table.caption = "* heuristic scores (offline lexical judge)"
    return table


def _feedback_table(feedback: FeedbackReport) -> Table:
    """Each metric's agreement with the labels, best AUROC first."""
    table = Table(
        title=(
            f"agreement with {feedback.column!r} - {feedback.labelled} labelled rows "
            f"({feedback.negatives} negative)"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("metric", overflow="fold", ratio=1, min_width=12)
    for col in ("AUROC", "95% interval", "kappa", "rows"):
        table.add_column(col, justify="right", no_wrap=True, overflow="ignore")
    ranked = sorted(
        feedback.metrics.items(),
        key=lambda kv: (kv[1].auroc is None, -(kv[1].auroc or 0.0), kv[0]),
    )
    for name, a in ranked:
        interval = (
            "-"
            if a.auroc_low is None or a.auroc_high is None
            else f"{a.auroc_low:.2f}-{a.auroc_high:.2f}"
        )
        kappa = "-" if a.kappa is None else f"{a.kappa:+.2f}"
        auroc = "-" if a.auroc is None else f"{a.auroc:.3f}"
        table.add_row(name, auroc, interval, kappa, str(a.pairs))
    table.caption = (
        "AUROC: how often a negatively labelled row scored lower than a positive one "
        "(0.5 is chance); kappa: pass/fail at the threshold against the labels"
    )
    return table


def _open_output(path: Path | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"--output {path}: cannot write: {exc}") from None


def _check_metric_names(names: Sequence[str], where: str) -> list[str]:
    """``names``, deduplicated; every unknown one is reported at once, with the valid
    names (a usage error, before any data is read)."""
    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in dict.fromkeys(names) if n not in METRIC_NAMES]
    if bad:
        listed = []
        for name in bad:
            close = difflib.get_close_matches(name, METRIC_NAMES, n=1, cutoff=0.5)
            listed.append(repr(name) + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise _UsageError(
            f"{where}: unknown metric{'s' if len(bad) > 1 else ''} {', '.join(listed)}. "
            f"Valid metrics: {', '.join(METRIC_NAMES)}"
        )
    return list(dict.fromkeys(names))


def _gate(args: argparse.Namespace) -> QualityGate:
    try:
        overall, per_metric = parse_fail_under(args.fail_under or [])
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    _check_metric_names(list(per_metric), "--fail-under")
    return QualityGate(
        overall,
        per_metric,
        bool(args.fail_on_case_failure),
        allow_unscored=bool(args.allow_unscored),
    )


def _missing_line(fld: str, metrics: Sequence[str]) -> str:
    """ "no row has the field 'input' (or user_input, ...), which X and Y need"."""
    names = accepted_fields().get(fld, (fld,))
    aliases = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    verb = "needs" if len(metrics) == 1 else "need"
    return f"no row has the field {fld!r}{aliases}, which {', '.join(metrics)} {verb}"


def _output_rows(report: EvalReport) -> list[dict[str, Any]]:
    """The ``--output`` lines: results and bad rows, in input order."""
    rows = [(item.line or 0, item.index, item.to_json_dict()) for item in report.items]
    for n, e in enumerate(report.row_errors):
        bad: dict[str, Any] = {"case_id": e.case_id, "kind": "bad_row", "line": e.line}
        if e.input is not None:
            bad["input"] = e.input
        bad["error"] = e.message
        if e.field is not None:
            bad["field"] = e.field
        rows.append((e.line, -len(report.row_errors) + n, bad))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows]


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    data: Path = args.data
    gate = _gate(args)
    if args.max_row_size is not None and args.max_row_size < 1:
        raise _UsageError("--max-row-size must be >= 1")
    feedback_column: str | None = getattr(args, "feedback_column", None)
    if feedback_column is not None:
        try:
            check_feedback_column(feedback_column)
        except ValueError as exc:
            raise _UsageError(f"--feedback-column: {exc}") from None
    concurrency = args.concurrency if args.concurrency is not None else 8
    if concurrency < 1:
        raise _UsageError("--concurrency must be >= 1")
    judge_fields: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {}
    config_names: list[str] | None = None
    if args.config is not None:
        judge_fields, options, config_names = _read_eval_config(args.config)

    # Everything that does not need the data is checked before the data is read.
    if args.metrics is not None:
        names: list[str] | None = _check_metric_names(args.metrics.split(","), "--metrics")
    elif config_names is not None:
        names = _check_metric_names(config_names, f"--config {args.config}")
    else:
        names = None
    model = args.model if args.model is not None else judge_fields.pop("model", None)
    judge_fields.pop("model", None)
    try:
        judge = make_judge_for(model, concurrency=args.concurrency, **judge_fields)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if names is None:
        names = list(OFFLINE_METRICS if judge.model == "offline" else METRIC_NAMES)
    if args.threshold is not None:
        # --threshold overrides the config's per-metric thresholds too.
        options = {n: {**options.get(n, {}), "threshold": args.threshold} for n in names}
    try:
        metrics = build_metrics(names, options)
    except (UnknownMetricError, ValueError) as exc:
        raise _UsageError(str(exc)) from None
    output = _open_output(args.output)

    try:
        loaded = load_dataset(
            data,
            format=args.format,
            max_row_size=args.max_row_size,
            feedback_column=feedback_column,
        )
    except DatasetError as exc:
        if output is not None:
            output.close()
        raise _UsageError(str(exc)) from None
    for warning in loaded.grouped_warnings():
        err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)
    for problem in loaded.errors:
        err.print(
            f"[red]bad row:[/] {escape(str(data))}: {escape(str(problem))}",
            markup=True,
            highlight=False,
        )
    unmet = missing_columns(metrics, loaded.items)
    if unmet and (args.metrics is not None or config_names is not None):
        if output is not None:
            output.close()
        raise _UsageError(
            f"{data}: "
            + "; ".join(_missing_line(fld, names) for fld, names in unmet.items())
            + ". These metrics would be skipped on every row: add the field, or leave them "
            "out of --metrics"
        )
    for fld, names in unmet.items():
        err.print(
            f"[yellow]warning:[/] {escape(_missing_line(fld, names))}: left out",
            markup=True,
            highlight=False,
        )
    if args.metrics is None and config_names is None:
        metrics = applicable_metrics(metrics, loaded.items)
        if not metrics and loaded.items:
            if output is not None:
                output.close()
            raise _UsageError(
                f"{data}: no metric has the inputs it needs in this data "
                "(see the field names in `ragtrace-collector eval --help`)"
            )

    try:
        with _progress(err, len(loaded.items), not args.no_progress) as progress:
            task = progress.add_task("evaluate", total=len(loaded.items))

            def advance(_: ItemResult) -> None:
                progress.advance(task)

            report = asyncio.run(
                evaluate(
                    loaded.items,
                    metrics,
                    judge,
                    concurrency,
                    lines=loaded.lines,
                    on_item=advance,
                    feedback=loaded.feedback if loaded.feedback_column is not None else None,
                    feedback_column=loaded.feedback_column or "feedback",
                )
            )
        report.row_errors = list(loaded.errors)
        report.warnings = loaded.grouped_warnings()
        if output is not None:
            for row in _output_rows(report):
                output.write(json.dumps(row, ensure_ascii=False) + "\n")
    finally:
        if output is not None:
            output.close()

    if report.feedback is not None:
        for note in report.feedback.describe_problems():
            err.print(f"[yellow]warning:[/] {escape(note)}", markup=True, highlight=False)
    failures = gate.check(report) if gate.active else []
    if args.json:
        summary = report.summary_dict()
        if gate.active:
            summary["gate"] = {"passed": not failures, "failures": failures}
        out.print_json(json.dumps(summary))
    else:
        out.print(_table(report))
        if report.feedback is not None:
            out.print(_feedback_table(report.feedback))
        if args.output is not None:
            out.print(f"per-item results: {args.output}", highlight=False)
    status = EXIT_OK
    if failures:
        for failure in failures:
            err.print(f"[red]gate failed:[/] {escape(failure)}", markup=True, highlight=False)
        status = EXIT_GATE
    elif gate.active:
        err.print("quality gate passed", highlight=False)
    if loaded.errors:
        err.print(
            f"[red]{len(loaded.errors)} bad row(s)[/] in {escape(str(data))} were not evaluated",
            markup=True,
            highlight=False,
        )
        status = EXIT_PROBLEMS
    if report.error_count:
        err.print(
            f"[red]{report.error_count} metric result(s) are errors[/] (see the output file "
            "or --json for the messages)",
            markup=True,
            highlight=False,
        )
        status = EXIT_PROBLEMS
    return status


def epilog() -> str:
    """The end of ``eval --help``: metric names, field names, formats, exit codes."""
    import textwrap

    fields = accepted_fields()
    lines = ["metrics (default: all that apply to the data; docs/metrics.md describes each):"]
    lines += textwrap.wrap(", ".join(METRIC_NAMES), 76, initial_indent="  ", subsequent_indent="  ")
    lines += ["", "fields (ragtrace name first, then the DeepEval / Ragas names accepted):"]
    lines += [f"  {' | '.join(names)}" for names in fields.values()]
    lines += [
        "",
        "formats: .jsonl/.ndjson, .json, .csv (list fields as JSON in a cell),",
        "  .parquet/.pq (needs pyarrow); other names are sniffed as JSON/JSONL",
        "",
        "exit status:",
    ]
    for code, meaning in EXIT_CODES.items():
        lines += textwrap.wrap(
            meaning, 76, initial_indent=f"  {code:<4d}", subsequent_indent="      "
        )
    return "\n".join(lines)


def eval_command(args: argparse.Namespace) -> int:
    """Entry point of ``ragtrace-collector eval`` (arguments from ``cli.py``)."""
    out = Console(file=sys.stdout, soft_wrap=True)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        # Piped or captured, no width given: do not squeeze the table into 80 columns.
        out = Console(file=sys.stdout, soft_wrap=True, width=160)
    err = Console(file=sys.stderr, soft_wrap=True)
    try:
        return _run(args, out, err)
    except _UsageError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        return EXIT_INTERRUPTED
