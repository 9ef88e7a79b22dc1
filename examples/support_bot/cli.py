"""``python -m examples.support_bot``: ask a question, replay golden traffic or conversations,
play steady traffic, or serve over HTTP.  Spans go wherever ragtrace is configured to send
them (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``RAGTRACE_*`` variables, or ``--endpoint``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import ragtrace
from examples.support_bot.bot import Answer, SupportBot
from examples.support_bot.replay import (
    GoldenResult,
    run_conversations,
    run_golden,
    run_traffic,
)
from examples.support_bot.retrieval import FAULT_ENV, FaultMode, parse_fault

__all__ = ["main"]

_log = logging.getLogger("examples.support_bot")


def _fault_arg(value: str) -> FaultMode:
    try:
        return parse_fault(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_arg(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.support_bot",
        description="The Orla support bot: an offline RAG app instrumented with ragtrace.",
    )
    _common_options(parser, nested=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ask = sub.add_parser("ask", help="answer one question")
    _common_options(ask, nested=True)
    ask.add_argument("question")
    ask.add_argument("--session-id", default=None, help="record as a turn of this session")
    ask.add_argument("--user-id", default=None)

    golden = sub.add_parser("golden", help="ask the golden questions and report ID recall")
    _common_options(golden, nested=True)
    golden.add_argument("--count", type=_count_arg, default=None, help="questions (cycling)")
    golden.add_argument(
        "--no-reference",
        dest="set_reference",
        action="store_false",
        help="do not attach ground truth (ragtrace.set_reference) to the requests",
    )

    conv = sub.add_parser("conversations", help="play the scripted conversations")
    _common_options(conv, nested=True)
    conv.add_argument("--count", type=_count_arg, default=None, help="conversations (cycling)")
    conv.add_argument(
        "--no-outcome",
        dest="set_expected_outcome",
        action="store_false",
        help="do not attach the expected outcome to the sessions",
    )

    traffic = sub.add_parser("traffic", help="play a steady mix of traffic")
    _common_options(traffic, nested=True)
    _traffic_options(traffic)
    traffic.add_argument("--rounds", type=_count_arg, default=None, help="stop after N rounds")
    traffic.add_argument("--duration", type=float, default=None, help="stop after S seconds")

    serve = sub.add_parser("serve", help="serve over HTTP (POST /ask, POST /fault)")
    _common_options(serve, nested=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--traffic",
        action="store_true",
        help="also play steady traffic in the background (options below)",
    )
    _traffic_options(serve)
    return parser


def _common_options(parser: argparse.ArgumentParser, *, nested: bool) -> None:
    """Options accepted before and after the command (``--json golden`` = ``golden --json``)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    parser.add_argument(
        "--fault",
        type=_fault_arg,
        default=default(None),
        help=f"degrade retrieval: {', '.join(m.value for m in FaultMode)} "
        f"(default: ${FAULT_ENV} or none)",
    )
    parser.add_argument(
        "--model", default=default(None), help="litellm model (default: extractive)"
    )
    parser.add_argument(
        "--service-name",
        default=default(None),
        help="service.name of the spans (default: RAGTRACE_SERVICE_NAME / OTEL_SERVICE_NAME, "
        "else support-bot)",
    )
    parser.add_argument(
        "--endpoint", default=default(None), help="OTLP endpoint (default: OTEL_* env)"
    )
    parser.add_argument(
        "--protocol",
        choices=["http/protobuf", "grpc"],
        default=default(None),
        help="OTLP protocol",
    )
    parser.add_argument(
        "--no-tracing", action="store_true", default=default(False), help="do not export spans"
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON lines"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default(False), help="log at INFO"
    )


def _traffic_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    parser.add_argument(
        "--canary-every", type=int, default=2, help="every Nth question carries ground truth"
    )
    parser.add_argument(
        "--conversation-every", type=int, default=10, help="a conversation every N rounds"
    )
    parser.add_argument(
        "--fault-after", type=float, default=None, help="switch the fault on after S seconds"
    )
    parser.add_argument(
        "--fault-mode",
        type=_fault_arg,
        default=FaultMode.WRONG_INDEX,
        help="the fault --fault-after switches on (default: wrong_index)",
    )


def _emit(args: argparse.Namespace, record: dict[str, Any], line: str) -> None:
    print(json.dumps(record, ensure_ascii=False) if args.json else line, flush=True)


def _answer_record(answer: Answer) -> dict[str, Any]:
    return {
        "question": answer.question,
        "answer": answer.text,
        "context_ids": answer.context_ids,
        "fault": answer.fault.value,
        "generator": answer.generator,
    }


def _run(args: argparse.Namespace, bot: SupportBot) -> int:
    if args.command == "ask":
        if args.session_id:
            with ragtrace.session(args.session_id, user_id=args.user_id):
                answer = bot.answer(args.question)
        else:
            answer = bot.answer(args.question)
        _emit(args, _answer_record(answer), f"{answer.text}\n  [{', '.join(answer.context_ids)}]")
        return 0

    if args.command == "golden":

        def show(result: GoldenResult) -> None:
            record = _answer_record(result.answer) | {
                "reference_context_ids": list(result.item.reference_context_ids),
                "id_recall": result.id_recall,
            }
            _emit(args, record, f"{result.id_recall:4.2f}  {result.item.input}")

        golden = run_golden(bot, count=args.count, set_reference=args.set_reference, on_result=show)
        summary: dict[str, Any] = {
            "summary": True,
            "fault": golden.fault.value,
            "questions": len(golden.results),
            "id_recall": round(golden.id_recall, 4),
        }
        _emit(
            args,
            summary,
            f"fault={golden.fault.value} questions={len(golden.results)} "
            f"mean ID recall={golden.id_recall:.3f}",
        )
        return 0

    if args.command == "conversations":
        runs = run_conversations(
            bot, count=args.count, set_expected_outcome=args.set_expected_outcome
        )
        for run in runs:
            for turn, answer in enumerate(run.answers):
                record = _answer_record(answer) | {"session_id": run.session_id, "turn": turn}
                _emit(
                    args, record, f"[{run.session_id} #{turn}] {answer.question}\n  {answer.text}"
                )
        return 0

    if args.command == "traffic":
        stats = run_traffic(
            bot,
            rounds=args.rounds,
            duration=args.duration,
            **_traffic_kwargs(args),
        )
        _emit(
            args,
            vars(stats),
            f"requests={stats.requests} canary={stats.canary} "
            f"conversations={stats.conversations} errors={stats.errors}",
        )
        return 1 if stats.errors else 0

    if args.command == "serve":
        from examples.support_bot.server import SupportBotServer

        server = SupportBotServer(bot, args.host, args.port)
        if args.traffic:
            server.start_traffic(**_traffic_kwargs(args))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        _log.warning("support bot listening on http://%s:%d", args.host, server.port)
        try:
            server.serve_forever()
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            server.shutdown()
        return 0

    raise AssertionError(args.command)


def _traffic_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "interval": args.interval,
        "canary_every": args.canary_every,
        "conversation_every": args.conversation_every,
        "fault_after": args.fault_after,
        "fault_mode": args.fault_mode,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options: dict[str, Any] = {}
    service_name = args.service_name
    if service_name is None and not any(
        os.environ.get(name)
        for name in ("RAGTRACE_SERVICE_NAME", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
    ):
        service_name = "support-bot"
    if service_name:
        options["service_name"] = service_name
    if args.endpoint:
        options["endpoint"] = args.endpoint
    if args.protocol:
        options["protocol"] = args.protocol
    if args.no_tracing:
        options["enabled"] = False
    ragtrace.configure(**options)
    try:
        bot = SupportBot(fault=args.fault, model=args.model)
        return _run(args, bot)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        ragtrace.shutdown()
