"""Orla support bot: a small RAG application, instrumented with ragtrace, that runs offline.

* BM25 retrieval (``rank_bm25``) over a bundled knowledge base of support articles,
  a lexical reranker, and an extractive answer generator (or an LLM through litellm
  when ``RAGTRACE_EXAMPLE_MODEL`` is set);
* golden questions with ground truth and scripted multi-turn conversations;
* a fault switch that breaks retrieval on purpose (``wrong_index``, ``drop_top``,
  ``shuffle``) so that a quality drop can be shown.

Run ``python -m examples.support_bot --help``.
"""

from __future__ import annotations

from examples.support_bot.bot import Answer, Conversation, SupportBot, condense_query
from examples.support_bot.data import (
    Article,
    DataError,
    GoldenItem,
    ScriptedConversation,
    load_conversations,
    load_corpus,
    load_golden,
)
from examples.support_bot.replay import (
    ConversationRun,
    GoldenResult,
    GoldenRun,
    TrafficStats,
    id_recall,
    run_conversations,
    run_golden,
    run_traffic,
)
from examples.support_bot.retrieval import FaultMode, Hit, KnowledgeBase, parse_fault

__all__ = [
    "Answer",
    "Article",
    "Conversation",
    "ConversationRun",
    "DataError",
    "FaultMode",
    "GoldenItem",
    "GoldenResult",
    "GoldenRun",
    "Hit",
    "KnowledgeBase",
    "ScriptedConversation",
    "SupportBot",
    "TrafficStats",
    "condense_query",
    "id_recall",
    "load_conversations",
    "load_corpus",
    "load_golden",
    "parse_fault",
    "run_conversations",
    "run_golden",
    "run_traffic",
]
