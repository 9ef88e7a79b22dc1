"""What ``ragtrace_collector.agreement.agreement()`` costs, against the O(n²) definition.

The AUROC, its DeLong variance and Cohen's kappa over (score, feedback) pairs: one sort
per class and one walk (O(n log n)).  The baseline, measured in the same run, is the
definition the tests check it against: every (negative, positive) pair compared, and
DeLong's structural components summed pair by pair (O(n²)).  Both run on the same
pairs, CPU time, best of ``--rounds``, interleaved; the script also checks they agree.

Then the cost per pair of ``agreement()`` alone at larger sizes (a sliding window of
live feedback may hold tens of thousands of pairs per metric), on continuous scores
and on a 0/1/2/3/4-quarter metric (many ties).

    .venv/bin/python benchmarks/agreement.py            # about 10 s on an idle core
    .venv/bin/python benchmarks/agreement.py --quick
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragtrace_collector.agreement import agreement


def _best_cpu_s(rounds: int, *steps: Callable[[], object]) -> list[float]:
    best = [float("inf")] * len(steps)
    for _ in range(rounds):
        for i, step in enumerate(steps):
            cpu0 = time.process_time()
            step()
            best[i] = min(best[i], time.process_time() - cpu0)
    return best


def _pairs(n: int, rng: random.Random, *, ties: bool = False) -> list[tuple[float, float]]:
    """``n`` pairs, 30% negative, the metric shifted up on positive feedback."""
    out = []
    for _ in range(n):
        positive = rng.random() >= 0.3
        score = rng.gauss(0.6 if positive else 0.4, 0.2)
        if ties:
            score = round(min(1.0, max(0.0, score)) * 4) / 4
        out.append((score, 1.0 if positive else 0.0))
    return out


def _definition(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """AUROC and DeLong's variance straight from their definitions, O(n²)."""
    neg = [s for s, f in pairs if f < 0.5]
    pos = [s for s, f in pairs if f >= 0.5]
    m, n = len(pos), len(neg)
    v10 = [sum(1.0 if y < x else 0.5 if y == x else 0.0 for y in neg) / n for x in pos]
    v01 = [sum(1.0 if y < x else 0.5 if y == x else 0.0 for x in pos) / m for y in neg]
    area = sum(v10) / m

    def var(v: list[float]) -> float:
        mean = sum(v) / len(v)
        return sum((a - mean) ** 2 for a in v) / (len(v) - 1)

    return area, var(v10) / m + var(v01) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    rng = random.Random(20261127)

    n = 1000 if args.quick else 3000
    pairs = _pairs(n, rng)
    fast = agreement(pairs, threshold=0.5)
    slow_auc, _ = _definition(pairs)
    assert fast.auroc is not None
    assert abs(fast.auroc - slow_auc) < 1e-12
    ours, baseline = _best_cpu_s(
        args.rounds, lambda: agreement(pairs, threshold=0.5), lambda: _definition(pairs)
    )
    print(f"{n} pairs: agreement() {ours * 1e3:.1f} ms, O(n^2) definition "
          f"{baseline * 1e3:.0f} ms: {baseline / ours:.0f}x faster")  # fmt: skip

    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    for ties in (False, True):
        for size in sizes:
            data = _pairs(size, rng, ties=ties)
            rounds = 1 if size >= 1_000_000 else args.rounds
            (used,) = _best_cpu_s(rounds, functools.partial(agreement, data, threshold=0.5))
            kind = "quarter scores" if ties else "continuous scores"
            print(f"{size:>9} pairs, {kind}: {used * 1e3:8.1f} ms, "
                  f"{used / size * 1e6:.2f} us per pair")  # fmt: skip


if __name__ == "__main__":
    main()
