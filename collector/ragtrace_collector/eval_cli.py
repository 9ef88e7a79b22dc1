"""``ragtrace-collector eval DATA``: the metric suite over a dataset, offline.

Shows a progress bar (stderr), prints a summary table (or ``--json``) to stdout and
writes one JSON line per case or conversation to ``--output``, in input order.

Exit status:

* 0 - every row loaded and every metric produced a score or a skip;
* 1 - the evaluation ran, but some rows were bad (printed, with line and field; the
  other rows were evaluated) or some metric results are errors (e.g. judge failures);
* 2 - nothing was evaluated: bad path, unreadable data, unknown metric, invalid
  option, or bad judge / config file;
* 130 - interrupted.

Threshold failures do not change the exit status (gate on ``--json`` output in CI).

``--config`` reads YAML with optional ``judge:`` (the :class:`JudgeConfig` fields)
and ``metrics:`` sections, at the top level or under ``evaluation:``.  ``metrics`` is a
list of names or a mapping ``name: {threshold: 0.7, ...}`` (:class:`MetricOptions`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragtrace_collector.evaluate import (
    EvalReport,
    ItemResult,
    applicable_metrics,
    evaluate,
    make_judge_for,
)
from ragtrace_collector.loaders import DatasetError, load_dataset
from ragtrace_collector.metrics import (
    METRIC_NAMES,
    OFFLINE_METRICS,
    UnknownMetricError,
    build_metrics,
    parse_metric_names,
)

__all__ = ["eval_command"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
    return f"{value:.1%}" if pct else f"{value:.4f}"


def _table(report: EvalReport) -> Table:
    table = Table(title=f"ragtrace eval - judge: {report.judge}, items: {len(report.items)}")
    table.add_column("metric", no_wrap=True)
    for col in ("mean", "pass rate", "passed", "failed", "skipped", "errors", "calls", "cost $"):
        table.add_column(col, justify="right")
    heuristic = False
    for name in report.metrics:
        s = report.summary[name]
        heuristic = heuristic or s.heuristic
        table.add_row(
            name + (" *" if s.heuristic else ""),
            _fmt(s.mean),
            _fmt(s.pass_rate, pct=True),
            str(s.passed),
            str(s.failed),
            str(s.skipped),
            str(s.errors),
            str(s.calls),
            "-" if s.cost_usd is None else f"{s.cost_usd:.4f}",
        )
    if heuristic:
        table.caption = "* heuristic scores (offline lexical judge)"
    return table


def _open_output(path: Path | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"--output {path}: cannot write: {exc}") from None


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    data: Path = args.data
    judge_fields: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {}
    config_names: list[str] | None = None
    if args.config is not None:
        judge_fields, options, config_names = _read_eval_config(args.config)

    try:
        loaded = load_dataset(data)
    except DatasetError as exc:
        raise _UsageError(str(exc)) from None
    for warning in loaded.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)
    for problem in loaded.errors:
        err.print(
            f"[red]bad row:[/] {escape(str(data))}: {escape(str(problem))}",
            markup=True,
            highlight=False,
        )

    model = args.model if args.model is not None else judge_fields.pop("model", None)
    judge_fields.pop("model", None)
    try:
        judge = make_judge_for(model, concurrency=args.concurrency, **judge_fields)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None

    try:
        if args.metrics is not None:
            names = parse_metric_names(args.metrics)
        elif config_names is not None:
            names = parse_metric_names(config_names)
        else:
            names = list(OFFLINE_METRICS if judge.model == "offline" else METRIC_NAMES)
        if args.threshold is not None:
            # --threshold overrides the config's per-metric thresholds too.
            options = {n: {**options.get(n, {}), "threshold": args.threshold} for n in names}
        metrics = build_metrics(names, options)
    except (UnknownMetricError, ValueError) as exc:
        raise _UsageError(str(exc)) from None
    if args.metrics is None and config_names is None:
        metrics = applicable_metrics(metrics, loaded.items)
        if not metrics and loaded.items:
            raise _UsageError(
                f"{data}: no metric has the inputs it needs in this data "
                "(see the field names in `ragtrace-collector eval --help`)"
            )

    output = _open_output(args.output)
    concurrency = args.concurrency if args.concurrency is not None else 8
    if concurrency < 1:
        raise _UsageError("--concurrency must be >= 1")
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
                )
            )
        report.row_errors = list(loaded.errors)
        report.warnings = list(loaded.warnings)
        if output is not None:
            for item in report.items:
                output.write(json.dumps(item.to_json_dict(), ensure_ascii=False) + "\n")
    finally:
        if output is not None:
            output.close()

    if args.json:
        out.print_json(json.dumps(report.summary_dict()))
    else:
        out.print(_table(report))
        if args.output is not None:
            out.print(f"per-item results: {args.output}", highlight=False)
    status = EXIT_OK
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


def eval_command(args: argparse.Namespace) -> int:
    """Entry point of ``ragtrace-collector eval`` (arguments from ``cli.py``)."""
    out = Console(file=sys.stdout, soft_wrap=True)
    if not out.is_terminal:
        # Piped or captured: do not squeeze the table into 80 columns.
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
