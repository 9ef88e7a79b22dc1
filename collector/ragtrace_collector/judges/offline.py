"""The offline judge: deterministic lexical rules, no network, no model.

It answers every judge task of :mod:`ragtrace_collector.judges.base` with:

* a sentence splitter (statements are sentences);
* content words: lower-cased word tokens minus English stopwords, lightly stemmed
  (``capitals`` ~ ``capital``, ``located`` ~ ``locate``);
* coverage: the share of a statement's content words found in a text;
* entities: capitalised phrases (``Taj Mahal``, ``Bank of America``) and numbers, read
  sentence by sentence (a lone capitalised word opening a sentence is not a name unless
  the word itself says so: ``NASA``, ``OpenAI``).

Rules (``COVERAGE`` = 0.5):

* attribution: a reference sentence is attributable (``yes``, citing the node) when
  some node covers at least half of its content words;
* usefulness: a node is useful when it covers at least half of the content words of
  some sentence of the reference;
* relevance: a node's sentence is relevant when it shares a content word with the
  input (``ceil(0.3 * |query words|)`` of them for inputs of more than four), or
  starts with a pronoun right after a relevant sentence (``idk`` when the input has
  no content words at all: no signal);
* faithfulness: a claim is supported (``yes``) when some node covers half its content
  words, contradicted (``no``) when every such node states its numbers differently or
  the closest sentence flips its negation, else ``idk``;
* answer relevance: a statement sharing a content word with the input is relevant;
  a short one sharing none is ``idk``, a longer one ``no``;
* rubric: precision is the average precision of the usefulness verdicts, recall the
  share of attributable reference sentences.

Its scores track lexical overlap, which tracks retrieval quality well enough to see a
degraded retriever, but it is a heuristic: results produced with it are labelled so
(``heuristic=True``, reason prefixed ``[heuristic]``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from ragtrace_collector.judges.base import (
    AnswerRelevanceRequest,
    AnswerRelevanceResponse,
    AttributionRequest,
    AttributionResponse,
    AttributionVerdict,
    ClaimVerdict,
    EntityExtractionRequest,
    EntityExtractionResponse,
    FaithfulnessRequest,
    FaithfulnessResponse,
    JudgeAnswer,
    JudgeCallRecord,
    JudgeError,
    JudgeTask,
    NodeRelevance,
    RelevanceRequest,
    RelevanceResponse,
    RubricRequest,
    RubricResponse,
    StatementVerdict,
    UsefulnessRequest,
    UsefulnessResponse,
    UsefulnessVerdict,
)
from ragtrace_collector.results import Cost

__all__ = ["COVERAGE", "OfflineJudge", "content_words", "extract_entities", "split_sentences"]

R = TypeVar("R", bound=BaseModel)

#: Share of a statement's content words a text must contain to support it.
COVERAGE = 0.5
#: Share of the input's content words a statement must share to be relevant.
QUERY_SHARE = 0.3

_STOPWORD_TEXT = """
    a about above after again against all almost also although am among an and any are
    aren't as at be because been before being below between both but by can cannot
    could did do does doing done down during each either else etc even ever every
    few for from further had has have having he her here hers herself him himself his
    how however i if in into is isn't it its itself just least less let like made
    make many may me might more most much must my myself near neither no nor not now
    of off often on once one only or other others otherwise our ours ourselves out over
    own per perhaps please quite rather really same shall she should since so some
    still such than that the their theirs them themselves then there therefore these
    they this those though through thus to too toward towards under until up upon us
    use used uses using very via was we well were what whatever when whenever where
    whereas whether which while who whoever whom whose why will with within without
    would yes yet you your yours yourself yourselves
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_NEGATIONS = frozenset({"no", "not", "never", "none", "nobody", "nothing", "neither", "nor"})
# Lower-case words that may sit inside a capitalised name: "Bank of America".
_NAME_CONNECTORS = frozenset({"of", "de", "la", "du", "von", "van", "der", "del", "da", "di"})
_ARTICLES = frozenset({"the", "a", "an"})

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_NAME_TOKEN = re.compile(r"[^\W_]+(?:[-'’.&][^\W_]+)*")
_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
_SENTENCE_END = re.compile(
    r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[^\W_a-z])|\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)])\s)"
)


# ------------------------------------------------------------- lexical tools
_ABBREVIATION_TEXT = (
    "dr mr mrs ms mt st prof inc ltd co corp jr sr vs etc e.g i.e no fig approx dept"
)
_ABBREVIATIONS = frozenset(_ABBREVIATION_TEXT.split())
_LAST_WORD = re.compile(r"([^\W_]+(?:\.[^\W_]+)*)\.[\"'”’)\]]*$")


def _is_abbreviation(before: str) -> bool:
    m = _LAST_WORD.search(before)
    if m is None:
        return False
    word = m.group(1)
    # "Dr.", "e.g.", an initial ("J. K. Rowling"), but not "in 1889." or "U.S." at the end
    return word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper())


def split_sentences(text: str) -> list[str]:
    """Sentences (and list items / paragraphs) of ``text``, stripped, non-empty."""
    parts: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        plain_space = m.group(0).strip() == "" and "\n" not in m.group(0)
        if plain_space and _is_abbreviation(text[start : m.start()]):
            continue
        parts.append(text[start : m.start()])
        start = m.end()
    parts.append(text[start:])
    out: list[str] = []
    for part in parts:
        for line in part.split("\n"):
            line = line.strip().lstrip("-*• ").strip()
            if line:
                out.append(line)
    return out


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    if word.isdigit() or len(word) <= 3:
        return word
    if word.endswith("'s") or word.endswith("’s"):
        word = word[:-2]
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        word = word[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def _tokens(text: str) -> list[str]:
    return [m.group(0).lower() for m in _WORD.finditer(text)]


@lru_cache(maxsize=4096)
def content_words(text: str) -> frozenset[str]:
    """Stemmed, lower-cased content words (stopwords and one-letter tokens dropped)."""
    return frozenset(
        _stem(t) for t in _tokens(text) if t not in _STOPWORDS and (len(t) > 1 or t.isdigit())
    )


def _coverage(statement: frozenset[str], text: frozenset[str]) -> float:
    return len(statement & text) / len(statement) if statement else 0.0


def _numbers(text: str) -> frozenset[str]:
    return frozenset(m.group(0).rstrip(".,") for m in _NUMBER.finditer(text))


def _negated(text: str) -> bool:
    return any(t in _NEGATIONS or t.endswith("n't") for t in _tokens(text))


def _reads_as_name(word: str) -> bool:
    """A single capitalised word at the start of a sentence: a name only when the word
    itself says so (``NASA``, ``McDonald``, ``OpenAI``)."""
    return (len(word) > 1 and word.isupper()) or any(c.isupper() for c in word[1:])


def _emit_phrase(phrase: list[str], starts_sentence: bool, found: dict[str, None]) -> None:
    words = list(phrase)
    while words and words[0].lower() in _ARTICLES:
        words.pop(0)
    while words and words[-1].lower() in _NAME_CONNECTORS:
        words.pop()
    if not words:
        return
    if len(words) == 1:
        if words[0].lower() in _STOPWORDS:
            return
        # A sentence's first word is capitalised whatever it is ("Card refunds are ...",
        # "Reset the password ..."): alone, it is not read as a name.  The rule looks at
        # the word only, never at the rest of the text, so the same sentence gives the
        # same entities in every text (the reference and each retrieved chunk alike).
        if starts_sentence and len(phrase) == 1 and not _reads_as_name(words[0]):
            return
    found.setdefault(" ".join(words), None)


def extract_entities(text: str) -> list[str]:
    """Unique capitalised phrases and numbers, in order of first appearance.

    Each sentence is read on its own: the entities of a text are the union of the
    entities of its sentences (:func:`split_sentences`), so a sentence that the
    reference and a retrieved chunk share gives both the same entities.
    """
    found: dict[str, None] = {}
    for sentence in split_sentences(text):
        phrase: list[str] = []
        starts_sentence = False
        last_end = -1
        for index, m in enumerate(_NAME_TOKEN.finditer(sentence)):
            token = m.group(0)
            adjacent = last_end >= 0 and sentence[last_end : m.start()].strip() == ""
            if token[0].isdigit():
                if phrase:
                    _emit_phrase(phrase, starts_sentence, found)
                    phrase = []
                number = _NUMBER.match(token)
                found.setdefault(number.group(0) if number else token, None)
            elif token[0].isupper():
                if phrase and not adjacent:
                    _emit_phrase(phrase, starts_sentence, found)
                    phrase = []
                if not phrase:
                    starts_sentence = index == 0
                phrase.append(token)
            elif phrase and adjacent and token in _NAME_CONNECTORS:
                phrase.append(token)
            elif phrase:
                _emit_phrase(phrase, starts_sentence, found)
                phrase = []
            last_end = m.end()
        if phrase:
            _emit_phrase(phrase, starts_sentence, found)
    return list(found)


# ----------------------------------------------------------------- the judge
class OfflineJudge:
    """Deterministic lexical judge (``model == "offline"``, ``heuristic == True``).

    Each answer costs one call, no tokens and 0 USD.  ``on_call`` receives a
    :class:`JudgeCallRecord` per answer, like the LLM judge's hook.
    """

    def __init__(self, on_call: Callable[[JudgeCallRecord], None] | None = None) -> None:
        self._on_call = on_call

    @property
    def model(self) -> str:
        return "offline"

    @property
    def heuristic(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "OfflineJudge()"

    async def ask(self, task: JudgeTask[R]) -> JudgeAnswer[R]:
        started = time.perf_counter()
        response = self.answer(task)
        problem = task.check(cast(R, response))
        if problem is not None:  # a bug in the rules, never bad luck
            raise JudgeError("invalid_response", f"offline judge: {problem}")
        if self._on_call is not None:
            self._on_call(
                JudgeCallRecord(
                    model=self.model,
                    task=task.task_name,
                    outcome="ok",
                    latency_s=time.perf_counter() - started,
                    cost_usd=0.0,
                )
            )
        return JudgeAnswer(value=cast(R, response), cost=Cost(calls=1, usd=0.0))

    def answer(self, task: JudgeTask[Any]) -> BaseModel:
        """The response model instance for ``task`` (synchronous, pure)."""
        if isinstance(task, AttributionRequest):
            return _attribution(task.reference, task.contexts)
        if isinstance(task, UsefulnessRequest):
            return _usefulness(task.reference, task.contexts)
        if isinstance(task, RelevanceRequest):
            return _relevance(task.input, task.contexts)
        if isinstance(task, EntityExtractionRequest):
            return EntityExtractionResponse(entities=[extract_entities(t) for t in task.texts])
        if isinstance(task, RubricRequest):
            return _rubric(task)
        if isinstance(task, FaithfulnessRequest):
            return _faithfulness(task.output, task.contexts)
        if isinstance(task, AnswerRelevanceRequest):
            return _answer_relevance(task.input, task.output)
        raise JudgeError("config", f"the offline judge cannot answer {type(task).__name__} tasks")


# ------------------------------------------------------------------- rules
def _statements(text: str) -> list[tuple[str, frozenset[str]]]:
    out = []
    for sentence in split_sentences(text):
        words = content_words(sentence)
        if words:
            out.append((sentence, words))
    return out


def _best_node(words: frozenset[str], nodes: list[frozenset[str]]) -> tuple[int, float]:
    best, best_cov = -1, 0.0
    for i, node in enumerate(nodes):
        cov = _coverage(words, node)
        if cov > best_cov:
            best, best_cov = i, cov
    return best, best_cov


def _attribution(reference: str, contexts: Iterable[str]) -> AttributionResponse:
    nodes = [content_words(c) for c in contexts]
    verdicts: list[AttributionVerdict] = []
    for sentence, words in _statements(reference):
        node, cov = _best_node(words, nodes)
        supported = cov >= COVERAGE
        verdicts.append(
            AttributionVerdict(
                statement=sentence,
                verdict="yes" if supported else "no",
                node=node + 1 if supported else None,
            )
        )
    yes = sum(1 for v in verdicts if v.verdict == "yes")
    return AttributionResponse(
        verdicts=verdicts,
        reason=f"{yes} of {len(verdicts)} sentences share at least half their content words "
        "with a retrieved node",
    )


def _usefulness(reference: str, contexts: tuple[str, ...]) -> UsefulnessResponse:
    sentences = [w for _, w in _statements(reference)]
    verdicts = []
    for i, context in enumerate(contexts, start=1):
        node = content_words(context)
        best = max((_coverage(s, node) for s in sentences), default=0.0)
        useful = best >= COVERAGE
        verdicts.append(
            UsefulnessVerdict(
                node=i,
                verdict="yes" if useful else "no",
                reason=f"covers {best:.0%} of the closest reference sentence",
            )
        )
    return UsefulnessResponse(
        verdicts=verdicts, reason="nodes covering half of a reference sentence count as useful"
    )


_PRONOUN_START = frozenset(
    {"it", "its", "this", "these", "they", "their", "he", "she", "his", "her"}
)


def _relevant_verdict(words: frozenset[str], query: frozenset[str]) -> str:
    if not query:
        return "idk"
    need = 1 if len(query) <= 4 else math.ceil(QUERY_SHARE * len(query))
    return "yes" if len(words & query) >= need else "no"


def _relevance(question: str, contexts: tuple[str, ...]) -> RelevanceResponse:
    query = content_words(question)
    nodes = []
    for i, context in enumerate(contexts, start=1):
        statements: list[StatementVerdict] = []
        for sentence, words in _statements(context):
            verdict = _relevant_verdict(words, query)
            first = _tokens(sentence[:24])[:1]
            if verdict == "no" and statements and first and first[0] in _PRONOUN_START:
                # "It was completed in 1889." continues the previous sentence's subject.
                verdict = statements[-1].verdict
            statements.append(StatementVerdict(statement=sentence, verdict=verdict))
        nodes.append(NodeRelevance(node=i, statements=statements))
    return RelevanceResponse(
        nodes=nodes, reason="statements sharing content words with the input count as relevant"
    )


def _rubric(task: RubricRequest) -> RubricResponse:
    if task.kind == "recall":
        reference = task.expected_output or ""
        verdicts = _attribution(reference, task.contexts).verdicts
        if not verdicts:
            raise JudgeError("invalid_response", "offline judge: the reference has no sentences")
        score = sum(1 for v in verdicts if v.verdict == "yes") / len(verdicts)
        return RubricResponse(
            score=score,
            reason=f"{score:.0%} of the expected answer's sentences are covered by the context",
        )
    reference = task.expected_output or task.actual_output or ""
    if not task.contexts:
        return RubricResponse(score=0.0, reason="nothing was retrieved")
    useful = [v.verdict == "yes" for v in _usefulness(reference, task.contexts).verdicts]
    hits, total = 0, 0.0
    for k, u in enumerate(useful, start=1):
        if u:
            hits += 1
            total += hits / k
    score = total / hits if hits else 0.0
    return RubricResponse(
        score=score,
        reason=f"{hits} of {len(useful)} retrieved nodes useful for the answer, "
        f"ranking score {score:.2f}",
    )


def _faithfulness(output: str, contexts: tuple[str, ...]) -> FaithfulnessResponse:
    nodes = [(c, content_words(c), _numbers(c)) for c in contexts]
    claims = []
    for claim, words in _statements(output):
        supporting = [n for n in nodes if _coverage(words, n[1]) >= COVERAGE]
        if not supporting:
            claims.append(ClaimVerdict(claim=claim, verdict="idk"))
            continue
        claim_numbers = _numbers(claim)
        # A number the context states differently, or a flipped negation, contradicts.
        conflict = bool(claim_numbers) and all(
            numbers and not claim_numbers <= numbers for _, _, numbers in supporting
        )
        if not conflict:
            best = max(
                (s for text, _, _ in supporting for s in split_sentences(text)),
                key=lambda s: _coverage(words, content_words(s)),
            )
            conflict = _negated(claim) != _negated(best)
        claims.append(ClaimVerdict(claim=claim, verdict="no" if conflict else "yes"))
    return FaithfulnessResponse(
        claims=claims,
        reason="claims disagreeing with the context on a number or a negation count as "
        "contradicted",
    )


def _answer_relevance(question: str, output: str) -> AnswerRelevanceResponse:
    query = content_words(question)
    statements = []
    for sentence, words in _statements(output):
        if not query:
            verdict = "idk"
        elif words & query:
            verdict = "yes"
        else:
            verdict = "idk" if len(words) <= 3 else "no"
        statements.append(StatementVerdict(statement=sentence, verdict=verdict))
    return AnswerRelevanceResponse(
        statements=statements,
        reason="statements sharing content words with the input count as relevant",
    )
