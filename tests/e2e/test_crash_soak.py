"""The crash soak, short: a few SIGKILLs and SIGTERMs of a real collector with the
write-ahead log, carriers or late results, a flapping backend and a flapping
Phoenix-like annotation endpoint (``tests/e2e/_soak.py``; the long version is
``benchmarks/crash_soak.py``).

Checked from the backends: no acknowledged trace is lost (both exporters), every
acknowledged trace gets its judge score, and a trace settled at a clean stop is never
judged again.  Each run prints its figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._soak import SoakOptions, run_soak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _soak(tmp_path: Path, mode: str, seed: int) -> dict[str, object]:
    opts = SoakOptions(
        workdir=tmp_path,
        traces=30,
        kills=3,
        seed=seed,
        duration=400,
        settle=120,
        rate=3.0,
        mode=mode,
        sigterm_share=0.5,
        run_s=(2.0, 6.0),
    )
    figures = run_soak(opts)
    print(f"\ncrash soak ({mode}):", json.dumps(figures))
    return figures


@pytest.mark.parametrize("mode", ["carrier", "late"])
def test_a_few_kills_lose_nothing_and_rejudge_nothing_settled(tmp_path: Path, mode: str) -> None:
    figures = _soak(tmp_path, mode, seed=27)
    assert figures["kills"] == 3
    assert figures["acknowledged"] == 30
    assert figures["unexpected_answers"] == []
    assert figures["lost"] == 0
    assert figures["phoenix_lost"] == 0
    assert figures["scores_lost"] == 0
    assert figures["rejudged_after_a_clean_stop"] == 0
