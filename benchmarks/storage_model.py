"""The write-ahead log against its reference model, for longer than the suite can.

``tests/storage/model.py`` is a Hypothesis state machine: it drives the storage with
generated sequences of requests, deliveries per exporter, results and carriers with
holds, replays, crashes (with torn writes), clean stops, a disk that fills, stalls or
fails, flipped bytes and forged records, and checks the model's invariants after every
step.  The suite runs a few dozen sequences per profile; this script runs each profile
for its share of ``--minutes``, in rounds of fresh random sequences, and prints how many
sequences and steps it checked.  When a profile finds a failure, Hypothesis shrinks it
and the shortest sequence is printed (as Python calls on the machine), and that profile
stops.

Profiles (``model.PROFILES``): ``checkpoint``, ``clean_restart``, ``holds``,
``forgery``, ``disk_bound`` (one invariant each, with the faults it needs) and
``everything`` (every invariant, every fault).

Run: ``.venv/bin/python benchmarks/storage_model.py [--minutes 3] [--steps 40]
[--profile checkpoint --profile holds ...]``

Exit status: 0 when no profile found a failure, 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ragtrace_collector.component.logs import configure_logging
from tests.storage.model import PROFILES, machine_for

_ROUND = 100  # sequences per Hypothesis run


def _profile(name: str, budget: float, steps: int) -> tuple[int, int, float, str | None]:
    """Run ``name`` for about ``budget`` seconds: (sequences, steps, seconds, failure)."""
    machine = machine_for(name)
    started = time.monotonic()
    failure: str | None = None
    while time.monotonic() - started < budget:
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=_ROUND,
                    stateful_step_count=steps,
                    deadline=None,
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
    return machine.runs, machine.steps, time.monotonic() - started, failure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="total time budget")
    parser.add_argument("--steps", type=int, default=40, help="steps per sequence")
    parser.add_argument(
        "--profile",
        action="append",
        choices=sorted(PROFILES),
        help="profiles to run (default: all)",
    )
    args = parser.parse_args(argv)
    configure_logging("critical", "json", stream=io.StringIO())  # the log's own logs
    names = args.profile or list(PROFILES)
    budget = args.minutes * 60 / len(names)
    total_runs = total_steps = 0
    failed: list[str] = []
    print(f"{'profile':<14} {'sequences':>9} {'steps':>8} {'seconds':>8}  result")
    for name in names:
        runs, steps, seconds, failure = _profile(name, budget, args.steps)
        total_runs += runs
        total_steps += steps
        result = "no failure" if failure is None else "FAILED (shortest sequence below)"
        print(f"{name:<14} {runs:>9} {steps:>8} {seconds:>8.1f}  {result}", flush=True)
        if failure is not None:
            failed.append(name)
            print("    " + failure.replace("\n", "\n    "), flush=True)
    print(f"{'total':<14} {total_runs:>9} {total_steps:>8}")
    if failed:
        print(f"failures in: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
