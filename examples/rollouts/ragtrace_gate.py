#!/usr/bin/env python3
"""Gate a rollout on retrieval quality, for any deploy tool (docs/rollouts.md).

Asks Prometheus for the candidate version's mean score over the last window divided by
the mean of every other version of the same service (ragtrace's ``ragtrace_eval_score``,
split by a segment label such as ``service_version``) and exits:

* 0 -- pass: the ratio is at least ``--min-ratio``;
* 1 -- fail: the ratio is below it (stop or roll back);
* 2 -- inconclusive: either side has fewer than ``--min-samples`` scores in the window,
  or both sides score 0 (no evidence either way);
* 3 -- Prometheus could not be asked (unreachable, error answer).

When the other versions score 0 the ratio has no value (Prometheus answers +Inf or NaN):
the script then prints the two means and their difference instead. A candidate scoring
above 0 passes, as the Argo template's conditions decide for +Inf.

The query is the one in ``analysis-template.yaml`` (the Argo Rollouts form); a test
checks that the two are the same text and runs both against a real Prometheus.
Standard library only::

    python3 ragtrace_gate.py --prometheus http://prometheus:9090 \\
        --service support-bot --candidate 2.4.0 --metric contextual_recall
"""

from __future__ import annotations

import argparse
import json
import math
import string
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import NamedTuple

PASS, FAIL, INCONCLUSIVE, ERROR = 0, 1, 2, 3
_WORDS = {PASS: "PASS", FAIL: "FAIL", INCONCLUSIVE: "INCONCLUSIVE"}


def _selector(op: str) -> str:
    """The series of the candidate (``op`` ``=``) or of every other version (``!=``)."""
    return '{service="$service", metric="$metric", $label' + op + '"$candidate"}'


def _mean(op: str) -> str:
    """One side's mean score over the window."""
    return (
        "(\n"
        f"  sum(rate(ragtrace_eval_score_sum{_selector(op)}[$window]))\n"
        "  /\n"
        f"  sum(rate(ragtrace_eval_score_count{_selector(op)}[$window]))\n"
        ")"
    )


def _enough(op: str) -> str:
    """The guard that one side has at least min-samples scores in the window."""
    return f"and sum(increase(ragtrace_eval_score_count{_selector(op)}[$window])) >= $min_samples"


#: Same text as the AnalysisTemplate's query, with $names for its {{args.names}}.
QUERY = string.Template(f"{_mean('=')}\n/\n{_mean('!=')}\n{_enough('=')}\n{_enough('!=')}\n")
#: The ratio's two halves: the candidate's mean, and the mean of every other version.
CANDIDATE_MEAN = string.Template(_mean("="))
STABLE_MEAN = string.Template(_mean("!="))


def _quote(value: str) -> str:
    """A PromQL string literal's content."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _names(service: str, metric: str, candidate: str, label: str, window: str) -> dict[str, str]:
    """The templates' $names, quoted where they stand in a string literal."""
    return {
        "service": _quote(service),
        "metric": _quote(metric),
        "candidate": _quote(candidate),
        "label": label,
        "window": window,
    }


def gate_query(
    service: str,
    metric: str,
    candidate: str,
    *,
    label: str = "service_version",
    window: str = "10m",
    min_samples: int = 30,
) -> str:
    """The candidate/stable ratio of mean scores, empty while either side is thin."""
    names = _names(service, metric, candidate, label, window)
    return QUERY.substitute(names, min_samples=min_samples)


def mean_queries(
    service: str,
    metric: str,
    candidate: str,
    *,
    label: str = "service_version",
    window: str = "10m",
) -> tuple[str, str]:
    """The candidate's mean score and the other versions' (the ratio's two halves)."""
    names = _names(service, metric, candidate, label, window)
    return CANDIDATE_MEAN.substitute(names), STABLE_MEAN.substitute(names)


class Sample(NamedTuple):
    """One series of an instant query's answer."""

    #: when Prometheus evaluated the query (Unix time)
    at: float
    value: float


def ask(
    prometheus: str, query: str, at: float | None = None, timeout: float = 10.0
) -> list[Sample]:
    """An instant query's answer, one sample per series ([] when empty)."""
    params = {"query": query}
    if at is not None:
        params["time"] = repr(at)
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as response:
        answer = json.load(response)
    if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
        raise ValueError(f"unexpected answer: {json.dumps(answer)[:300]}")
    return [Sample(float(s["value"][0]), float(s["value"][1])) for s in answer["data"]["result"]]


def _verdict(ratio: float, min_ratio: float) -> int:
    """What the Argo template's two conditions decide: +Inf (the other versions score 0,
    the candidate more) passes; NaN (both sides score 0) meets neither: inconclusive."""
    if math.isnan(ratio):
        return INCONCLUSIVE
    return PASS if ratio >= min_ratio else FAIL


def _without_ratio(candidate: float, stable: float) -> str:
    """The two means and their difference, in place of a ratio that has no value."""
    means = (
        f"candidate mean {candidate:.3f}, stable mean {stable:.3f}"
        f" (difference {candidate - stable:+.3f})"
    )
    why = "candidate/stable is undefined because stable scores 0"
    if stable == 0 and candidate > 0:
        return f"{means}; {why}: the candidate does better"
    if stable == 0 and candidate == 0:
        return f"{means}; {why}, and so does the candidate: no evidence either way"
    return f"{means}; candidate/stable is not a number"


def _first(samples: list[Sample]) -> float:
    """The first series' value, NaN for an empty answer."""
    return samples[0].value if samples else math.nan


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Pass (0), fail (1) or inconclusive (2): the candidate version's mean "
        "ragtrace score against the other versions' in the same window."
    )
    p.add_argument("--prometheus", help="base URL, e.g. http://prometheus:9090")
    p.add_argument("--service", required=True, help="service.name of the app")
    p.add_argument("--candidate", required=True, help="the version being rolled out")
    p.add_argument("--metric", default="contextual_recall")
    p.add_argument("--label", default="service_version", help="segment label of the version")
    p.add_argument("--window", default="10m")
    p.add_argument("--min-samples", type=int, default=30, help="scores needed on each side")
    p.add_argument("--min-ratio", type=float, default=0.95, help="pass at this ratio or more")
    p.add_argument("--time", type=float, default=None, help="evaluate at this Unix time")
    p.add_argument("--print-query", action="store_true", help="print the PromQL and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    query = gate_query(
        args.service,
        args.metric,
        args.candidate,
        label=args.label,
        window=args.window,
        min_samples=args.min_samples,
    )
    if args.print_query:
        print(query, end="")
        return PASS
    if not args.prometheus:
        parser.error("--prometheus is required (or --print-query)")
    where = f"{args.service} {args.metric} {args.label}={args.candidate}"
    try:
        samples = ask(args.prometheus, query, args.time)
        if not samples:
            print(
                f"ragtrace gate: INCONCLUSIVE {where}: fewer than {args.min_samples} scores"
                f" on a side in the last {args.window}"
            )
            return INCONCLUSIVE
        at, ratio = samples[0]
        verdict = _verdict(ratio, args.min_ratio)
        if math.isfinite(ratio):
            sign = ">=" if verdict == PASS else "<"
            detail = f"candidate/stable = {ratio:.3f} {sign} {args.min_ratio}"
        else:
            # Each half on its own, at the instant the ratio was evaluated.
            halves = mean_queries(
                args.service, args.metric, args.candidate, label=args.label, window=args.window
            )
            candidate, stable = (_first(ask(args.prometheus, half, at)) for half in halves)
            detail = _without_ratio(candidate, stable)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ragtrace gate: ERROR {where}: {exc}", file=sys.stderr)
        return ERROR
    print(f"ragtrace gate: {_WORDS[verdict]} {where}: {detail}")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
