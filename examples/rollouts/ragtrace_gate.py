#!/usr/bin/env python3
"""Gate a rollout on retrieval quality, for any deploy tool (docs/rollouts.md).

Asks Prometheus for the candidate version's mean score over the last window divided by
the mean of every other version of the same service (ragtrace's ``ragtrace_eval_score``,
split by a segment label such as ``service_version``) and exits:

* 0 -- pass: the ratio is at least ``--min-ratio``;
* 1 -- fail: the ratio is below it (stop or roll back);
* 2 -- inconclusive: either side has fewer than ``--min-samples`` scores in the window;
* 3 -- Prometheus could not be asked (unreachable, error answer).

The query is the one in ``analysis-template.yaml`` (the Argo Rollouts form); a test
checks that the two are the same text and runs both against a real Prometheus.
Standard library only::

    python3 ragtrace_gate.py --prometheus http://prometheus:9090 \\
        --service support-bot --candidate 2.4.0 --metric contextual_recall
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

PASS, FAIL, INCONCLUSIVE, ERROR = 0, 1, 2, 3

#: Same text as the AnalysisTemplate's query, with $names for its {{args.names}}.
QUERY = string.Template(
    """(
  sum(rate(ragtrace_eval_score_sum{service="$service", metric="$metric", $label="$candidate"}[$window]))
  /
  sum(rate(ragtrace_eval_score_count{service="$service", metric="$metric", $label="$candidate"}[$window]))
)
/
(
  sum(rate(ragtrace_eval_score_sum{service="$service", metric="$metric", $label!="$candidate"}[$window]))
  /
  sum(rate(ragtrace_eval_score_count{service="$service", metric="$metric", $label!="$candidate"}[$window]))
)
and sum(increase(ragtrace_eval_score_count{service="$service", metric="$metric", $label="$candidate"}[$window])) >= $min_samples
and sum(increase(ragtrace_eval_score_count{service="$service", metric="$metric", $label!="$candidate"}[$window])) >= $min_samples
"""  # noqa: E501
)


def _quote(value: str) -> str:
    """A PromQL string literal's content."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


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
    return QUERY.substitute(
        service=_quote(service),
        metric=_quote(metric),
        candidate=_quote(candidate),
        label=label,
        window=window,
        min_samples=min_samples,
    )


def ask(prometheus: str, query: str, at: float | None = None, timeout: float = 10.0) -> list[float]:
    """The values of an instant query's answer (one per series; [] when empty)."""
    params = {"query": query}
    if at is not None:
        params["time"] = repr(at)
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as response:
        answer = json.load(response)
    if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
        raise ValueError(f"unexpected answer: {json.dumps(answer)[:300]}")
    return [float(sample["value"][1]) for sample in answer["data"]["result"]]


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
        values = ask(args.prometheus, query, args.time)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ragtrace gate: ERROR {where}: {exc}", file=sys.stderr)
        return ERROR
    if not values:
        print(
            f"ragtrace gate: INCONCLUSIVE {where}: fewer than {args.min_samples} scores"
            f" on a side in the last {args.window}"
        )
        return INCONCLUSIVE
    ratio = values[0]
    if ratio != ratio:  # NaN (both means 0): Argo's two conditions are both false too
        print(f"ragtrace gate: INCONCLUSIVE {where}: candidate/stable is not a number")
        return INCONCLUSIVE
    if ratio >= args.min_ratio:
        print(f"ragtrace gate: PASS {where}: candidate/stable = {ratio:.3f} >= {args.min_ratio}")
        return PASS
    print(f"ragtrace gate: FAIL {where}: candidate/stable = {ratio:.3f} < {args.min_ratio}")
    return FAIL


if __name__ == "__main__":
    sys.exit(main())
