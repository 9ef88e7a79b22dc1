"""The bundled corpus, golden file and conversations: shape and consistency."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from examples.support_bot.data import (
    DataError,
    load_conversations,
    load_corpus,
    load_golden,
)

_ID = re.compile(r"^kb-([a-z]+)-(\d{3})$")


def test_corpus_has_about_forty_articles_with_stable_ids() -> None:
    corpus = load_corpus()
    assert 38 <= len(corpus) <= 50
    ids = [a.id for a in corpus]
    assert len(set(ids)) == len(ids)
    for article in corpus:
        match = _ID.match(article.id)
        assert match, article.id
        assert article.category.startswith(match.group(1)), (article.id, article.category)
        assert len(article.text.split()) >= 25, f"{article.id} is too short to be useful"
    assert len({a.category for a in corpus}) >= 8


def test_corpus_carries_named_entities_and_numbers() -> None:
    text = " ".join(a.text for a in load_corpus())
    for entity in ("Orla Hub Pro", "Orla Cam 2", "Tallinn", "Frankfurt", "Rotterdam", "DHL"):
        assert entity in text
    assert "12 February 2025" in text
    assert "4.2.1" in text


def test_golden_file_references_the_exact_article_texts() -> None:
    corpus = {a.id: a.text for a in load_corpus()}
    golden = load_golden()
    assert 20 <= len(golden) <= 30
    assert len({g.input for g in golden}) == len(golden)
    for item in golden:
        assert item.reference_context_ids, item.input
        for doc_id, context in zip(
            item.reference_context_ids, item.reference_contexts, strict=True
        ):
            assert corpus[doc_id] == context, f"{item.input}: {doc_id} text differs"


def test_golden_file_is_plain_jsonl_with_the_reference_store_fields() -> None:
    from examples.support_bot.data import GOLDEN_PATH

    for line in GOLDEN_PATH.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        assert set(record) == {
            "input",
            "expected_output",
            "reference_context_ids",
            "reference_contexts",
        }


def test_conversations_are_scripted_multi_turn_with_outcomes() -> None:
    conversations = load_conversations()
    assert 4 <= len(conversations) <= 6
    assert len({c.id for c in conversations}) == len(conversations)
    for conv in conversations:
        assert 3 <= len(conv.turns) <= 4, conv.id
        assert conv.expected_outcome
        assert len(conv.expected_outcome) > 40
        assert conv.user_id


def test_malformed_files_give_clear_errors(tmp_path: Path) -> None:
    bad_json = tmp_path / "corpus.jsonl"
    bad_json.write_text('{"id": "kb-a-001", "category": "a", "title": "t", "text": "x"}\n{oops\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl:2: invalid JSON"):
        load_corpus(bad_json)

    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": "kb-a-001", "category": "a", "title": "t"}\n')
    with pytest.raises(DataError, match=r"missing\.jsonl:1: field 'text'"):
        load_corpus(missing)

    dup = tmp_path / "dup.jsonl"
    row = '{"id": "kb-a-001", "category": "a", "title": "t", "text": "x"}\n'
    dup.write_text(row + row)
    with pytest.raises(DataError, match="duplicate article id 'kb-a-001'"):
        load_corpus(dup)

    golden = tmp_path / "golden.jsonl"
    golden.write_text(
        json.dumps(
            {
                "input": "q",
                "expected_output": "a",
                "reference_context_ids": ["kb-a-001", "kb-a-002"],
                "reference_contexts": ["only one"],
            }
        )
        + "\n"
    )
    with pytest.raises(DataError, match="differ in length"):
        load_golden(golden)

    convs = tmp_path / "conversations.json"
    convs.write_text('{"id": "not a list"}')
    with pytest.raises(DataError, match="expected a JSON list"):
        load_conversations(convs)
