"""Crash soak: ``ragtrace-collector serve`` killed (SIGKILL and SIGTERM) at random
points, many times, restarted each time on the same write-ahead log, while a sender
keeps sending traces and records which were acknowledged (issue 27).

The collector runs with ``storage`` on, ``assembly.max_buffered_spans`` small (the
backlog never fits in memory at once), ``enrichment.attach: carrier`` and
``evaluation.late_results: carrier`` with an LLM judge (the loopback OpenAI-compatible
server through litellm) slower than ``trace_timeout``.  Two exporters: an OTLP backend
that flaps (accepts, then 503, then accepts) and a Phoenix-like server whose annotation
endpoint flaps too.  A last start with both backends up delivers what is owed (bounded
by ``--settle``).  Then it prints: kills, acknowledged, delivered, lost (must be 0),
duplicated, judge calls repeated, and traces re-judged after a clean stop at which
they were settled (must be 0).  The machinery is ``tests/e2e/_soak.py``.

``--scenario replay-stop`` runs instead the issue's scenario 1 as it is written: 400
traces acknowledged, kill -9; a restart with a backend that accepts 60 of them then
answers 503, a Phoenix exporter, ``attach: carrier``, ``max_buffered_spans: 20``; a
clean SIGTERM; a third start.

Everything listens on 127.0.0.1, and every loop is bounded in count and time
(``--duration``).  Exit status: 0 when nothing acknowledged was lost and nothing
settled was judged again, 1 otherwise.

    .venv/bin/python benchmarks/crash_soak.py --kills 20 --traces 200
    .venv/bin/python benchmarks/crash_soak.py --scenario replay-stop
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.e2e._soak import SoakOptions, run_replay_stop, run_soak


def _summary(f: dict[str, Any]) -> str:
    return (
        f"{f['mode']:<8} kills {f['kills']} ({f['sigkill']} SIGKILL, {f['sigterm']} SIGTERM)  "
        f"acknowledged {f['acknowledged']}  delivered {f['delivered']}  lost {f['lost']}  "
        f"duplicated {f['duplicated']}  scores lost {f['scores_lost']}  judge calls "
        f"{f['judge_calls']}, repeated {f['judge_calls_repeated']}  re-judged after a "
        f"clean stop {f['rejudged_after_a_clean_stop']}  ({f['seconds']} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["soak", "replay-stop"], default="soak")
    parser.add_argument(
        "--mode",
        choices=["both", "carrier", "late"],
        default="both",
        help="carrier: attach: carrier; late: late_results: carrier (judge slower than "
        "trace_timeout); both: one soak of each, --kills each",
    )
    parser.add_argument("--kills", type=int, default=10, help="stops before the last start")
    parser.add_argument("--traces", type=int, default=100, help="traces the sender sends")
    parser.add_argument("--rate", type=float, default=2.0, help="traces per second, at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=900.0, help="bound per soak, s")
    parser.add_argument("--settle", type=float, default=180.0, help="bound on the last start")
    parser.add_argument("--sigterm-share", type=float, default=0.4)
    parser.add_argument("--judge-delay", type=float, default=1.0, help="s per judge answer")
    parser.add_argument("--trace-timeout", type=float, default=0.5, help="late mode")
    parser.add_argument("--max-buffered-spans", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crash-soak-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.scenario == "replay-stop":
            print("issue 27, scenario 1 (replay, then a clean stop):")
            figures = run_replay_stop(workdir)
            print(json.dumps(figures, default=str))
            print(
                f"\nacknowledged {figures['acknowledged']}  delivered {figures['delivered']}  "
                f"lost {figures['lost']}  duplicated {figures['duplicated']}"
            )
            return 0 if figures["lost"] == 0 else 1
        results = []
        for mode in ("carrier", "late") if args.mode == "both" else (args.mode,):
            opts = SoakOptions(
                workdir=workdir / mode,
                traces=args.traces,
                kills=args.kills,
                seed=args.seed,
                duration=args.duration,
                settle=args.settle,
                rate=args.rate,
                judge_delay=args.judge_delay,
                mode=mode,
                trace_timeout=args.trace_timeout,
                max_buffered_spans=args.max_buffered_spans,
                sigterm_share=args.sigterm_share,
            )
            opts.workdir.mkdir()
            print(
                f"crash soak, {mode}: {args.kills} stops, {args.traces} traces, seed "
                f"{args.seed}, judge {args.judge_delay}s, max_buffered_spans "
                f"{args.max_buffered_spans}"
            )
            figures = run_soak(opts)
            print(json.dumps(figures))
            results.append(figures)
    print()
    for figures in results:
        print(_summary(figures))
    ok = all(f["lost"] == 0 and f["rejudged_after_a_clean_stop"] == 0 for f in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
