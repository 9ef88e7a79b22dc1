"""Tokenising, stemming and sentence splitting shared by retrieval, reranking and generation.

Deliberately small and deterministic: lower-case word tokens (decimal numbers such as
``2.4`` and ``192.168.68.1`` stay whole), a short stop-word list and a crude suffix
stripper, so that "recordings", "recorded" and "record" meet in one term.
"""

from __future__ import annotations

import re

__all__ = ["sentences", "stem", "terms"]

_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")

_STOPWORDS = frozenset(
    {
        "a",
        "about",
        "above",
        "after",
        "again",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "else",
        "few",
        "for",
        "from",
        "further",
        "get",
        "got",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "know",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "need",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "out",
        "over",
        "own",
        "please",
        "s",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "t",
        "tell",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "want",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
    }
)


def stem(word: str) -> str:
    """Strip common English suffixes (not a real stemmer; consistent is what matters)."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            # "setting" -> "sett" -> "set", "stopped" -> "stopp" -> "stop"
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Content terms of ``text``, stemmed, in order (duplicates kept)."""
    return [stem(tok) for tok in _TOKEN.findall(text.lower()) if tok not in _STOPWORDS]


def sentences(text: str) -> list[str]:
    """Split prose into sentences (a full stop inside ``4.99`` or a domain does not split)."""
    return [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]
