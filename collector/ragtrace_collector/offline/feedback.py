"""Offline agreement of each metric with a human-label column (``eval --feedback-column``).

Each row's label is read with :func:`ragtrace_collector.agreement.feedback_value`: a
bool, a number in [0, 1], or text (``true``/``false``, ``yes``/``no``, ``up``/``down``,
``positive``/``negative``, or a number).  A row without the column is *missing*; a value
that cannot be read (``"maybe"``, ``4``, ``NaN``) is *bad*: counted, its lines listed
(the first :data:`SHOWN_LINES`), never an error.  Per metric, the rows that have both a
score (not skipped, not errored) and a label give one
:class:`~ragtrace_collector.agreement.Agreement`: the AUROC of the score against
negative labels with its DeLong interval, Cohen's κ at the metric's threshold, the
number of pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ragtrace_collector.agreement import Agreement, agreement, feedback_value, is_negative

__all__ = ["SHOWN_LINES", "FeedbackReport", "measure_feedback"]

#: How many lines of bad labels a report lists.
SHOWN_LINES = 20


class FeedbackReport(BaseModel):
    """The agreement of every metric with the labels of one column."""

    model_config = ConfigDict(extra="forbid")

    column: str
    #: rows evaluated (bad rows of the dataset are not counted)
    rows: int
    #: rows whose label could be read
    labelled: int
    negatives: int
    positives: int
    #: rows without the column (or with an empty or null cell)
    missing: int
    #: rows whose label could not be read
    bad: int
    #: the lines (or rows) of the first bad labels
    bad_lines: list[int] = Field(default_factory=list)
    #: per metric, in the report's metric order
    metrics: dict[str, Agreement] = Field(default_factory=dict)

    def describe_problems(self) -> list[str]:
        """Plain warnings about the column (no label at all, bad labels)."""
        out: list[str] = []
        if self.labelled == 0 and self.bad == 0:
            out.append(f"no row has a value in the feedback column {self.column!r}")
        if self.bad:
            shown = ", ".join(str(n) for n in self.bad_lines)
            more = "" if self.bad <= len(self.bad_lines) else f" and {self.bad - SHOWN_LINES} more"
            out.append(
                f"{self.bad} row(s) have a value in the feedback column {self.column!r} that is "
                f"not a bool or a number in [0, 1], not counted (line or row {shown}{more})"
            )
        return out


def measure_feedback(
    column: str,
    labels: Sequence[object],
    metrics: Sequence[str],
    scores: Callable[[str], Sequence[float | None]],
    thresholds: Mapping[str, float],
    lines: Sequence[int] | None = None,
) -> FeedbackReport:
    """The report for ``labels`` (raw cells, None when absent, one per evaluated row).

    ``scores(metric)`` gives that metric's score per row in the same order (None when
    not scored); ``lines`` the rows' line numbers (default: 1, 2, ...).
    """
    values: list[float | None] = []
    missing = bad = 0
    bad_lines: list[int] = []
    for index, raw in enumerate(labels):
        if raw is None:
            missing += 1
            values.append(None)
            continue
        value = feedback_value(raw)
        if value is None:
            bad += 1
            if len(bad_lines) < SHOWN_LINES:
                bad_lines.append(lines[index] if lines is not None else index + 1)
        values.append(value)
    labelled = [v for v in values if v is not None]
    negatives = sum(1 for v in labelled if is_negative(v))
    per_metric: dict[str, Agreement] = {}
    for name in metrics:
        metric_scores = scores(name)
        if len(metric_scores) != len(values):
            raise ValueError(
                f"{name}: {len(metric_scores)} scores for {len(values)} feedback labels"
            )
        pairs = [
            (score, value)
            for score, value in zip(metric_scores, values, strict=True)
            if score is not None and value is not None
        ]
        per_metric[name] = agreement(pairs, threshold=thresholds.get(name))
    return FeedbackReport(
        column=column,
        rows=len(values),
        labelled=len(labelled),
        negatives=negatives,
        positives=len(labelled) - negatives,
        missing=missing,
        bad=bad,
        bad_lines=bad_lines,
        metrics=per_metric,
    )
