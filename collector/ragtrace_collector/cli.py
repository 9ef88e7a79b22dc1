"""Command line entry point: ``ragtrace-collector {serve,check-config,eval,replay}``.

Each subcommand's implementation lives in its own module and is imported lazily, so
``ragtrace-collector --help`` stays fast and one subcommand's imports never slow
another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: serve's endpoint flags and the config keys they override.
_ENDPOINT_FLAGS = {
    "--grpc-endpoint": "receivers.grpc.endpoint",
    "--http-endpoint": "receivers.http.endpoint",
    "--admin-endpoint": "admin.endpoint",
}


def _key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: the value is read as YAML (``1``, ``true``, ``[a]``)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


def _parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    from ragtrace_collector import __version__

    eval_epilog = None
    if argv is not None and "eval" in argv:
        # Only `eval` pays for importing the metric and field names its help lists.
        from ragtrace_collector.offline.cli import epilog

        eval_epilog = epilog()

    parser = argparse.ArgumentParser(
        prog="ragtrace-collector",
        description="Receive OTLP spans, score RAG retrieval quality, forward enriched spans.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the collector service",
        description="Run the collector: OTLP receivers (gRPC, HTTP), the evaluation stage, "
        "the exporters and the admin port (/metrics, /healthz, /readyz), until SIGTERM or "
        "SIGINT, then shut down gracefully.  The configuration is checked first (the "
        "checks of check-config); every key is described in docs/configuration.md.",
        epilog="exit codes: 0 after a graceful shutdown; 1 it cannot start for a reason "
        "check-config does not check (a port that cannot be bound, named with its config "
        "key); 2 the configuration file cannot be read or is invalid (the problems "
        "check-config reports, with the same lines); 3 spans were not delivered by the "
        "shutdown deadline (without storage.directory); 130 interrupted while starting.",
    )
    serve.add_argument(
        "--config", type=Path, default=None, help="collector.yaml (default: built-in defaults)"
    )
    for flag, key in _ENDPOINT_FLAGS.items():
        serve.add_argument(
            flag, metavar="HOST:PORT", default=None, help=f"listen here (overrides {key})"
        )
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value,
        help="override one config key, e.g. --set sampling.rate=1 (the value is read as "
        "YAML; repeatable)",
    )

    check = sub.add_parser(
        "check-config",
        help="validate a config file and exit",
        description="Validate a collector.yaml without starting anything: the schema (unknown "
        "keys, types, ${ENV} variables) and every check serve runs before it listens "
        "(metric names and options, alert rules on evaluated metrics, the reference file, "
        "the judge's API key variable).  Every problem is reported in one run.",
        epilog="exit codes: 0 valid; 2 the configuration file cannot be read or is invalid "
        "(each problem on its own line), as for serve --config and eval --config.",
    )
    check.add_argument("config", type=Path, help="the collector.yaml to check")

    ev = sub.add_parser(
        "eval",
        help="evaluate a dataset offline (JSONL, JSON, CSV or Parquet)",
        description="Score a dataset of RAG cases and conversations with ragtrace's metrics,\n"
        "offline, and gate CI on the scores.",
        epilog=eval_epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("data", type=Path, help="cases or conversations: JSONL, JSON, CSV or Parquet")
    ev.add_argument(
        "--metrics", default=None, help="comma-separated metric names (default: all that apply)"
    )
    ev.add_argument("--model", default=None, help="litellm model string, or 'offline' (default)")
    ev.add_argument("--output", type=Path, default=None, help="write per-case results as JSONL")
    ev.add_argument("--concurrency", type=int, default=None, help="judge calls in flight")
    ev.add_argument(
        "--config", type=Path, default=None, help="collector.yaml for judge and metric options"
    )
    ev.add_argument(
        "--threshold", type=float, default=None, help="override every metric's threshold"
    )
    ev.add_argument(
        "--json", action="store_true", help="print the summary as JSON instead of a table"
    )
    ev.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ev.add_argument(
        "--format",
        choices=("jsonl", "json", "csv", "parquet"),
        default=None,
        help="the data's format (default: from the file name)",
    )
    ev.add_argument(
        "--fail-under",
        action="append",
        metavar="[METRIC=]VALUE",
        default=None,
        help="quality gate: exit 3 when a metric's mean is under VALUE (every metric), or "
        "METRIC's mean under VALUE; repeatable",
    )
    ev.add_argument(
        "--fail-on-case-failure",
        action="store_true",
        help="quality gate: exit 3 when any case fails its metric's own threshold",
    )
    ev.add_argument(
        "--allow-unscored",
        action="store_true",
        help="quality gate: let a gated metric that scored no row pass (by default it "
        "fails the gate, with its most common skip reason)",
    )
    ev.add_argument(
        "--max-row-size",
        type=int,
        default=1_000_000,
        metavar="CHARS",
        help="skip (as a bad row) any row with more characters of text (default 1000000)",
    )
    ev.add_argument(
        "--feedback-column",
        default=None,
        metavar="NAME",
        help="a column of human labels (bool, or a number in [0, 1]; negative below 0.5): "
        "print each metric's AUROC against negative labels, its 95%% interval, Cohen's "
        "kappa at the threshold and the number of rows",
    )

    from ragtrace_collector.storage.replay import add_arguments as replay_arguments

    replay = sub.add_parser(
        "replay",
        help="send OTLP/JSON lines (a spill file, a file exporter's output) to a collector",
    )
    replay_arguments(replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv).parse_args(argv)
    if args.command == "serve":
        from ragtrace_collector.service.server import serve_command

        overrides = dict(args.set)
        for flag, key in _ENDPOINT_FLAGS.items():
            value = getattr(args, flag.removeprefix("--").replace("-", "_"))
            if value is not None:
                overrides[key] = value
        return serve_command(args.config, overrides)
    if args.command == "check-config":
        from ragtrace_collector.service.preflight import check_config_command

        return check_config_command(args.config)
    if args.command == "eval":
        from ragtrace_collector.offline.cli import eval_command

        return eval_command(args)
    if args.command == "replay":
        from ragtrace_collector.storage.replay import replay_command

        return replay_command(args)
    raise AssertionError(args.command)  # argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
