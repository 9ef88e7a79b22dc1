"""Replaying the bundled traffic: golden questions, scripted conversations, a steady mix.

These are the functions a demo script calls directly::

    from examples.support_bot import SupportBot, run_golden, run_conversations

    bot = SupportBot()
    healthy = run_golden(bot)                       # canary traffic with ground truth
    broken = run_golden(bot, fault="wrong_index")   # same questions, broken retrieval
    print(healthy.id_recall, broken.id_recall)
    run_conversations(bot, count=3)
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from examples.support_bot.bot import Answer, Conversation, SupportBot
from examples.support_bot.data import (
    GoldenItem,
    ScriptedConversation,
    load_conversations,
    load_golden,
)
from examples.support_bot.retrieval import FaultMode, parse_fault

__all__ = [
    "ConversationRun",
    "GoldenResult",
    "GoldenRun",
    "TrafficStats",
    "id_recall",
    "run_conversations",
    "run_golden",
    "run_traffic",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def id_recall(retrieved_ids: Iterable[str], reference_ids: Iterable[str]) -> float:
    """``|reference ∩ retrieved| / |reference|`` on string ids (the collector's ID recall)."""
    reference = {str(i) for i in reference_ids}
    if not reference:
        raise ValueError("no reference ids to compute recall against")
    return len(reference & {str(i) for i in retrieved_ids}) / len(reference)


@dataclass(frozen=True)
class GoldenResult:
    item: GoldenItem
    answer: Answer

    @property
    def id_recall(self) -> float:
        return id_recall(self.answer.context_ids, self.item.reference_context_ids)


@dataclass
class GoldenRun:
    fault: FaultMode
    results: list[GoldenResult] = field(default_factory=list)

    @property
    def id_recall(self) -> float:
        """Mean ID recall of the final contexts over the run (what the collector should see)."""
        if not self.results:
            return 0.0
        return sum(r.id_recall for r in self.results) / len(self.results)


@dataclass
class ConversationRun:
    conversation: ScriptedConversation
    session_id: str
    answers: list[Answer]


def _take(items: Sequence[_T], count: int | None) -> Iterator[_T]:
    """All items once, or ``count`` of them cycling through the list."""
    if count is None:
        return iter(items)
    if count < 0:
        raise ValueError("count must not be negative")
    if not items:
        return iter(())
    return itertools.islice(itertools.cycle(items), count)


def _bot_for(bot: SupportBot | None, fault: FaultMode | str | None) -> SupportBot:
    if bot is None:
        return SupportBot(fault=fault)
    if fault is not None:
        bot.fault = parse_fault(fault)
    return bot


def run_golden(
    bot: SupportBot | None = None,
    *,
    fault: FaultMode | str | None = None,
    count: int | None = None,
    set_reference: bool = True,
    items: Sequence[GoldenItem] | None = None,
    on_result: Callable[[GoldenResult], None] | None = None,
) -> GoldenRun:
    """Ask the golden questions (all once, or ``count`` cycling).

    With ``set_reference`` (default) each request carries its ground truth through
    ``ragtrace.set_reference``, like canary traffic.  ``fault``, when given, is set on the
    bot and stays set.
    """
    bot = _bot_for(bot, fault)
    golden = list(items) if items is not None else load_golden()
    run = GoldenRun(fault=bot.fault)
    for item in _take(golden, count):
        answer = bot.answer(item.input, reference=item if set_reference else None)
        result = GoldenResult(item=item, answer=answer)
        run.results.append(result)
        if on_result is not None:
            on_result(result)
    return run


def run_conversations(
    bot: SupportBot | None = None,
    *,
    fault: FaultMode | str | None = None,
    count: int | None = None,
    set_expected_outcome: bool = True,
    conversations: Sequence[ScriptedConversation] | None = None,
    session_prefix: str | None = None,
) -> list[ConversationRun]:
    """Play the scripted conversations (all once, or ``count`` cycling), one session each.

    Session ids are ``<conversation id>-<suffix>``, the suffix random unless
    ``session_prefix`` is given (then ``<prefix>-<conversation id>-<n>``).
    """
    bot = _bot_for(bot, fault)
    scripts = list(conversations) if conversations is not None else load_conversations()
    runs: list[ConversationRun] = []
    for n, script in enumerate(_take(scripts, count)):
        if session_prefix is None:
            session_id = f"{script.id}-{uuid.uuid4().hex[:8]}"
        else:
            session_id = f"{session_prefix}-{script.id}-{n}"
        with Conversation(
            bot,
            session_id,
            user_id=script.user_id,
            expected_outcome=script.expected_outcome if set_expected_outcome else None,
        ) as chat:
            for turn in script.turns:
                chat.ask(turn)
        runs.append(
            ConversationRun(conversation=script, session_id=session_id, answers=chat.answers)
        )
    return runs


@dataclass
class TrafficStats:
    requests: int = 0
    canary: int = 0
    conversations: int = 0
    errors: int = 0


def run_traffic(
    bot: SupportBot,
    *,
    rounds: int | None = None,
    duration: float | None = None,
    interval: float = 1.0,
    canary_every: int = 2,
    conversation_every: int = 10,
    fault_after: float | None = None,
    fault_mode: FaultMode | str = FaultMode.WRONG_INDEX,
    stop: threading.Event | None = None,
) -> TrafficStats:
    """A steady mix of traffic until ``rounds``, ``duration`` or ``stop`` ends it.

    Each round asks one golden question; every ``canary_every``-th carries its ground
    truth, the rest rely on the collector's reference store.  Every
    ``conversation_every``-th round also plays one scripted conversation.  With
    ``fault_after`` (seconds), the bot switches to ``fault_mode`` after that long, which
    makes a recall drop appear in the middle of a run.  A failed request is logged and
    counted; the loop goes on.
    """
    if interval < 0:
        raise ValueError("interval must not be negative")
    if canary_every < 1 or conversation_every < 1:
        raise ValueError("canary_every and conversation_every must be at least 1")
    stop = stop or threading.Event()
    golden = load_golden()
    scripts = load_conversations()
    mode = parse_fault(fault_mode)
    stats = TrafficStats()
    started = time.monotonic()
    for n in itertools.count():
        elapsed = time.monotonic() - started
        if (rounds is not None and n >= rounds) or (duration is not None and elapsed >= duration):
            break
        if stop.is_set():
            break
        if fault_after is not None and elapsed >= fault_after and bot.fault is not mode:
            _log.warning("switching retrieval fault on: %s", mode.value)
            bot.fault = mode
        item = golden[n % len(golden)]
        canary = n % canary_every == 0
        try:
            bot.answer(item.input, reference=item if canary else None)
            stats.requests += 1
            stats.canary += int(canary)
            if n % conversation_every == conversation_every - 1:
                run = run_conversations(
                    bot, conversations=[scripts[stats.conversations % len(scripts)]]
                )
                stats.conversations += 1
                stats.requests += len(run[0].answers)
        except Exception:
            stats.errors += 1
            _log.exception("support bot request failed")
        if interval and stop.wait(interval):
            break
    return stats
