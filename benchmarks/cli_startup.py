"""Wall time of ``ragtrace-collector --help`` and ``check-config`` against the floor.

``check-config`` reads the shipped ``docker/collector.yaml`` (every section, a reference
file, eleven metrics, alert rules) and runs every check ``serve`` runs before it listens.
The baseline, measured in the same run, is a bare interpreter importing what any YAML
config check needs (``pydantic``, ``yaml``); the ratio is what ragtrace adds on top.
Each command runs ``--repeat`` times (after one warm-up run that also writes the
bytecode caches); the median is reported.  Target: both commands within 1 s.

Run: ``.venv/bin/python benchmarks/cli_startup.py [--repeat N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTOR = Path(sys.executable).with_name("ragtrace-collector")


def _median_seconds(argv: list[str], env: dict[str, str], repeat: int) -> float:
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGTRACE_", "OTEL_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's install has bytecode caches
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["RAGTRACE_REFERENCE_FILE"] = str(ROOT / "examples/support_bot/data/golden.jsonl")
    env["RAGTRACE_BEARER_TOKEN"] = "benchmark-token"  # the shipped config requires one
    baseline = _median_seconds([sys.executable, "-c", "import pydantic, yaml"], env, args.repeat)
    runs = {
        "--help": [str(COLLECTOR), "--help"],
        "serve --help": [str(COLLECTOR), "serve", "--help"],
        "check-config docker/collector.yaml": [
            str(COLLECTOR),
            "check-config",
            str(ROOT / "docker" / "collector.yaml"),
        ],
    }
    print(f"baseline (python -c 'import pydantic, yaml'): {baseline * 1000:.0f} ms")
    for name, argv in runs.items():
        seconds = _median_seconds(argv, env, args.repeat)
        verdict = "ok" if seconds <= 1.0 else "over the 1 s target"
        print(
            f"{name}: {seconds * 1000:.0f} ms, {seconds / baseline:.2f}x the baseline ({verdict})"
        )


if __name__ == "__main__":
    main()
