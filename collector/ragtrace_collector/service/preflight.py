"""The checks a valid-looking configuration must still pass before the collector
starts, shared by ``serve`` and ``check-config``.

The schema (:mod:`ragtrace_collector.config`) checks each key on its own.  These
checks need more: names that must agree across sections (an alert rule on a metric
that is not evaluated), files to read (the reference file, prompt templates) and the
environment (the judge's API key variable).  :func:`preflight_problems` runs every one
of them and returns every problem, one line each, naming the key.

``serve`` runs them through :func:`ragtrace_collector.service.stages.build_stage` (which also
builds the parts) and refuses to start on any problem; ``check-config`` runs them
without starting anything, also on the valid sections of a configuration whose other
sections failed the schema, so that one run reports everything.

This module imports only light modules: ``check-config`` must stay fast.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ragtrace_collector.alerts.config import feedback_name
from ragtrace_collector.config import CollectorConfig, ConfigError, describe_errors, load_config
from ragtrace_collector.exitcodes import EXIT_OK, EXIT_USAGE
from ragtrace_collector.metrics import (
    METRIC_NAMES,
    OFFLINE_METRICS,
    Metric,
    MetricOptions,
    build_metrics,
)

if TYPE_CHECKING:
    from ragtrace_collector.component import Supervisor
    from ragtrace_collector.stores.reference import ReferenceStore

__all__ = [
    "alert_rule_problems",
    "check_config_command",
    "checked_metrics",
    "judge_problems",
    "load_reference_store",
    "metric_defaults_problems",
    "preflight_problems",
    "storage_problems",
]


def judge_problems(config: CollectorConfig) -> list[str]:
    """The judge's API key variable is set; its prompt directory loads."""
    from ragtrace_collector.judges.prompting import PromptError, PromptLibrary

    judge = config.judge
    if judge.is_offline:
        return []
    problems = []
    try:
        judge.api_key()
    except ValueError as exc:
        problems.append(f"judge.api_key_env: {exc}")
    try:
        PromptLibrary(judge.prompt_dir)
    except (PromptError, OSError, UnicodeDecodeError) as exc:
        problems.append(f"judge.prompt_dir: {exc}")
    return problems


def metric_defaults_problems(defaults: Mapping[str, Any]) -> list[str]:
    """``evaluation.metric_defaults`` holds metric options: checked on their own, so
    that a typo names its key rather than the first metric it is applied to."""
    try:
        MetricOptions.model_validate(dict(defaults))
    except ValidationError as exc:
        at = ("evaluation", "metric_defaults")
        return [line for _loc, line in describe_errors(exc, MetricOptions, at)]
    return []


def metric_names(config: CollectorConfig) -> list[str]:
    """The names under ``metrics:`` (the default set when unset)."""
    return list(config.metrics) if config.metrics is not None else list(OFFLINE_METRICS)


def checked_metrics(config: CollectorConfig) -> tuple[list[Metric], list[str]]:
    """The metrics the configuration evaluates (built from their options over
    ``evaluation.metric_defaults``; ``enabled: false`` ones left out), and a problem
    for each metric whose options do not build."""
    metrics: list[Metric] = []
    problems = []
    for name in metric_names(config):
        try:
            metrics += build_metrics(
                [name], config.metrics or {}, defaults=config.evaluation.metric_defaults
            )
        except ValueError as exc:
            problems.append(f"metrics.{name}: {exc}")
    return metrics, problems


def alert_rule_problems(config: CollectorConfig, evaluated: list[str]) -> list[str]:
    """A rule on a metric this collector does not evaluate could never fire: that is a
    configuration error, not a silent no-op.  Every such rule is reported."""
    if not config.alerts.enabled:
        return []
    problems = []
    for index, rule in enumerate(config.alerts.rules):
        if rule.metric in evaluated:
            continue
        where = f"alerts.rules.{index}.metric: rule {rule.name!r} watches {rule.metric!r}"
        name = feedback_name(rule.metric)
        if name is not None:
            if not name:
                problems.append(f"{where}: name the feedback after 'feedback:'")
            elif not config.feedback.enabled:
                problems.append(f"{where}, user feedback, which feedback.enabled: false turns off")
            continue
        if rule.metric not in METRIC_NAMES:
            close = difflib.get_close_matches(rule.metric, METRIC_NAMES, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"metrics: {', '.join(METRIC_NAMES)}"
            problems.append(f"{where}, which is not a metric, so it could never fire ({hint})")
            continue
        how = (
            "add it under metrics: (with include_defaults: true to keep the default set: "
            f"{', '.join(OFFLINE_METRICS)})"
            if config.metrics is None
            else f"list it under metrics: (evaluated now: {', '.join(evaluated) or 'none'})"
        )
        problems.append(
            f"{where}, which this collector does not evaluate, so it could never fire; {how}"
        )
    return problems


def load_reference_store(
    config: CollectorConfig, *, supervisor: Supervisor | None = None, missing_ok: bool = False
) -> tuple[ReferenceStore | None, list[str]]:
    """The reference store, loaded from its file (None when not configured), or the
    problem that stops it loading.  With ``missing_ok`` (``serve``), a file that does
    not exist yet is a ``reference_store`` status, not a problem; ``check-config`` still
    reports it."""
    if config.reference_store is None:
        return None, []
    from ragtrace_collector.stores.reference import ReferenceStore, ReferenceStoreError

    try:
        store = ReferenceStore(config.reference_store, supervisor=supervisor, missing_ok=missing_ok)
        return store, []
    except (ReferenceStoreError, OSError, ValueError) as exc:
        return None, [f"reference_store.path: {exc}"]


def storage_problems(config: CollectorConfig) -> list[str]:
    """``storage.directory`` can be created or written, and no collector holds it."""
    from ragtrace_collector.storage.wal import directory_problem

    if config.storage.directory is None:
        return []
    problem = directory_problem(Path(config.storage.directory))
    return [] if problem is None else [f"storage.directory: {problem}"]


def preflight_problems(
    config: CollectorConfig, *, skip: Collection[str] = (), reference_file: bool = True
) -> list[str]:
    """Every problem ``serve`` would refuse to start with, beyond the schema.

    ``skip`` names top-level sections that failed the schema: checks that read them
    are left out (their values are defaults, not what the file says).
    ``reference_file=False`` leaves the reference file to the caller, which loads
    the store anyway (``build_stage``), so that it is read once.
    """
    problems: list[str] = []
    if "storage" not in skip:
        problems += storage_problems(config)
    if not config.evaluation.enabled:
        return problems  # serve builds no evaluation stage: nothing below is used
    if "judge" not in skip:
        problems += judge_problems(config)
    defaults = metric_defaults_problems(config.evaluation.metric_defaults)
    problems += defaults
    if not {"metrics", "evaluation"} & set(skip) and not defaults:
        metrics, metric_errors = checked_metrics(config)
        problems += metric_errors
        if "alerts" not in skip and not metric_errors:
            problems += alert_rule_problems(config, [m.name for m in metrics])
    if reference_file and "reference_store" not in skip:
        problems += load_reference_store(config)[1]
    return problems


# ---------------------------------------------------------------- check-config
def check_config_command(path: Path) -> int:
    """``ragtrace-collector check-config FILE``: 0 valid; 2 (:data:`EXIT_USAGE`, as
    every command says of a configuration it cannot use) when the file cannot be read
    or is invalid.

    Reports every problem in one run: the schema's and, on the sections that passed
    it, every check ``serve`` runs before it listens."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        if exc.partial is not None:
            exc.problems += preflight_problems(exc.partial, skip=exc.failed_sections)
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    problems = preflight_problems(config)
    if problems:
        print(ConfigError(problems, str(path)).render(), file=sys.stderr)
        return EXIT_USAGE
    exporters = ", ".join(f"{name} ({e.type})" for name, e in config.exporters.items())
    receivers = [
        f"{kind} {cfg.endpoint}"
        for kind, cfg in (("grpc", config.receivers.grpc), ("http", config.receivers.http))
        if cfg.enabled
    ]
    print(f"{path}: ok")
    print(f"  receivers: {', '.join(receivers) or 'none'}")
    print(f"  exporters: {exporters}")
    if config.evaluation.enabled:
        names = [m.name for m in checked_metrics(config)[0]]
        print(f"  metrics: {', '.join(names) or 'none'}")
    return EXIT_OK
