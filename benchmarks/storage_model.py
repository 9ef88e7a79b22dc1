"""The write-ahead log against its reference model, for longer than the suite can.

``tests/storage/model.py`` is a Hypothesis state machine: it drives the storage with
generated sequences of requests, deliveries per exporter, results and carriers with
holds, replays, crashes (with torn writes), clean stops, a disk that fills, stalls or
fails, flipped bytes and forged records, and checks the model's invariants after every
step.  The suite runs a fixed set of sequences in seconds (``tests/storage/
test_model.py``); this script runs fresh random sequences for each profile, in rounds,
until its share of ``--seconds`` is spent or it has run ``--examples`` sequences, and
prints how many sequences, steps, crashes (kill -9, torn writes included) and clean
stops it checked.  When a profile finds a failure, Hypothesis shrinks it, the shortest
sequence is printed (as Python calls on the machine), and that profile stops.

Profiles (``model.PROFILES``): ``checkpoint``, ``clean_restart``, ``holds``,
``forgery``, ``disk_bound`` (one invariant each, with the faults it needs) and
``everything`` (every invariant, every fault).

Run: ``.venv/bin/python benchmarks/storage_model.py [--seconds 300] [--examples N]
[--steps 40] [--profile checkpoint --profile holds ...]``

Exit status: 0 when no profile found a failure, 1 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ragtrace_collector.component.logs import configure_logging
from tests.storage.model import PROFILES, machine_for

#: Sequences per Hypothesis run (the budget is checked between runs).
_ROUND = 25


@dataclass
class _Figures:
    sequences: int
    steps: int
    crashes: int
    clean_stops: int
    seconds: float
    failure: str | None


def _profile(name: str, budget: float, examples: int, steps: int) -> _Figures:
    """Run ``name`` for about ``budget`` seconds, or ``examples`` sequences (0: no
    bound), whichever comes first."""
    machine = machine_for(name)
    started = time.monotonic()
    failure: str | None = None
    asked = 0
    while time.monotonic() - started < budget and (not examples or asked < examples):
        count = min(_ROUND, examples - asked) if examples else _ROUND
        asked += count
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=count,
                    stateful_step_count=steps,
                    deadline=None,  # a slow, shared machine: no per-example deadline
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except Exception as exc:  # a falsified invariant (or a bug in the machine)
            found = list(exc.exceptions) if isinstance(exc, ExceptionGroup) else [exc]
            failure = "\n\n".join(
                f"{type(e).__name__}: {e}\n" + "\n".join(getattr(e, "__notes__", [])) for e in found
            )
            break
    return _Figures(
        machine.runs,
        machine.steps,
        machine.crashes,
        machine.clean_stops,
        time.monotonic() - started,
        failure,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=180.0, help="total time budget (default: %(default)s)"
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=0,
        help="at most this many sequences per profile (default: bounded by time only)",
    )
    parser.add_argument("--steps", type=int, default=40, help="steps per sequence at most")
    parser.add_argument(
        "--profile",
        action="append",
        choices=sorted(PROFILES),
        help="profiles to run (default: all)",
    )
    args = parser.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it?
    configure_logging("critical", "json", stream=io.StringIO())  # the log's own logs
    names = args.profile or list(PROFILES)
    budget = args.seconds / len(names)
    header = ("profile", "sequences", "steps", "crashes", "clean", "seconds")
    print(f"{header[0]:<14}" + "".join(f"{h:>10}" for h in header[1:]) + "  result")
    total = _Figures(0, 0, 0, 0, 0.0, None)
    failed: list[str] = []
    for name in names:
        fig = _profile(name, budget, args.examples, args.steps)
        total.sequences += fig.sequences
        total.steps += fig.steps
        total.crashes += fig.crashes
        total.clean_stops += fig.clean_stops
        total.seconds += fig.seconds
        result = "no violation" if fig.failure is None else "VIOLATION (shortest sequence below)"
        print(
            f"{name:<14}{fig.sequences:>10}{fig.steps:>10}{fig.crashes:>10}"
            f"{fig.clean_stops:>10}{fig.seconds:>10.1f}  {result}",
            flush=True,
        )
        if fig.failure is not None:
            failed.append(name)
            print("    " + fig.failure.replace("\n", "\n    "), flush=True)
    print(
        f"{'total':<14}{total.sequences:>10}{total.steps:>10}{total.crashes:>10}"
        f"{total.clean_stops:>10}{total.seconds:>10.1f}  violations found: {len(failed)}"
    )
    if failed:
        print(f"violations in: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
