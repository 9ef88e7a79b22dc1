"""Ground truth from a file: parsing, matching and reload (ragtrace_collector.stores.reference)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from ragtrace_collector.component import ComponentHost, Status, Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.stores.reference import (
    ReferenceStore,
    ReferenceStoreConfig,
    ReferenceStoreError,
    normalize_input,
)
from tests.fakes.polling import eventually

ROWS: list[dict[str, Any]] = [
    {
        "input": "What is the capital of France?",
        "expected_output": "Paris is the capital of France.",
        "reference_contexts": ["Paris is the capital and largest city of France."],
        "reference_context_ids": ["doc-fr", 7],
    },
    {"user_input": "Who wrote Hamlet", "reference": "William Shakespeare."},
    {
        "input": "How do I reset my password?",
        "expected_outcome": "The user can reset the password.",
        "response": "ignored peer column",
        "retrieved_contexts": ["ignored"],
    },
]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _store(path: Path, **kw: Any) -> ReferenceStore:
    return ReferenceStore(ReferenceStoreConfig(path=path, **kw))


def _bump_mtime(path: Path, seconds: int) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


# ------------------------------------------------------------- normalising


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("  What is   X?! ", "what is x"),
        ("«Hello»,\tWORLD.", "hello», world"),
        ("Straße", "strasse"),
        ("ＡＢＣ", "abc"),  # NFKC folds full-width letters
        ("...", ""),
        ("e.g. 3.5", "e.g. 3.5"),
    ],
)
def test_normalize_input(raw: str, norm: str) -> None:
    assert normalize_input(raw) == norm


# ------------------------------------------------------------------- exact


def test_exact_lookup_on_normalised_text(tmp_path: Path) -> None:
    store = _store(_write_jsonl(tmp_path / "refs.jsonl", ROWS))
    assert len(store) == 3
    entry = store.lookup("  what is the CAPITAL of france ")
    assert entry is not None
    assert entry.expected_output == "Paris is the capital of France."
    assert entry.reference_contexts == ("Paris is the capital and largest city of France.",)
    assert entry.reference_context_ids == ("doc-fr", "7")  # ids compared as strings
    assert entry.expected_outcome is None
    assert entry.matched_input == "What is the capital of France?"
    assert entry.match_score == 1.0
    assert entry.source == f"{tmp_path / 'refs.jsonl'}:1"
    assert store.lookup("What is the capital of Spain?") is None
    assert store.lookup("") is None
    # exact mode never matches a near miss
    assert store.lookup("What is the capitol of France?") is None


def test_ragas_aliases_and_ignored_columns(tmp_path: Path) -> None:
    store = _store(_write_jsonl(tmp_path / "refs.jsonl", ROWS))
    hamlet = store.lookup("who wrote hamlet?")
    assert hamlet is not None
    assert hamlet.expected_output == "William Shakespeare."
    assert hamlet.reference_contexts is None
    assert hamlet.source.endswith(":2")
    password = store.lookup("How do I reset my password")
    assert password is not None
    assert password.expected_outcome == "The user can reset the password."
    assert password.expected_output is None


def test_yaml_file_list_and_references_key(tmp_path: Path) -> None:
    listed = tmp_path / "refs.yaml"
    listed.write_text(
        "# golden set\n"
        "- input: What is the capital of France?\n"
        "  expected_output: Paris.\n"
        "  reference_context_ids: [a, 2]\n"
        "- user_input: Who wrote Hamlet?\n"
        "  reference: Shakespeare.\n",
        encoding="utf-8",
    )
    store = _store(listed)
    entry = store.lookup("who wrote hamlet")
    assert entry is not None
    assert entry.expected_output == "Shakespeare."
    assert entry.source.endswith("refs.yaml:5")
    france = store.lookup("what is the capital of france")
    assert france is not None
    assert france.reference_context_ids == ("a", "2")

    keyed = tmp_path / "refs.yml"
    keyed.write_text(
        "references:\n  - input: hello\n    expected_outcome: greeted\n", encoding="utf-8"
    )
    hello = _store(keyed).lookup("Hello!")
    assert hello is not None
    assert hello.expected_outcome == "greeted"
    assert hello.source.endswith(":2")


def test_empty_file_is_an_empty_store(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("", encoding="utf-8")
    assert len(_store(tmp_path / "a.jsonl")) == 0
    assert _store(tmp_path / "b.yaml", match="fuzzy").lookup("anything") is None


# ------------------------------------------------------------------- fuzzy


def test_fuzzy_lookup_above_ratio(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path, match="fuzzy", fuzzy_ratio=0.9, fuzzy_scorer="ratio")
    exact = store.lookup("what is the capital of france")
    assert exact is not None
    assert exact.match_score == 1.0
    near = store.lookup("What is the capitol of France?")  # one letter off
    assert near is not None
    assert near.matched_input == "What is the capital of France?"
    assert 0.9 <= near.match_score < 1.0
    assert store.lookup("What is the capital of Germany?") is None  # below the ratio
    assert store.lookup("completely different question") is None
    lenient = _store(path, match="fuzzy", fuzzy_ratio=0.7, fuzzy_scorer="ratio")
    germany = lenient.lookup("What is the capital of Germany?")
    assert germany is not None
    assert germany.matched_input.endswith("France?")


def test_fuzzy_token_sort_ignores_word_order(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path, match="fuzzy", fuzzy_ratio=0.95)  # default scorer: token_sort_ratio
    entry = store.lookup("France: what is the capital of")
    assert entry is not None
    assert entry.matched_input.startswith("What is the capital")
    assert (
        _store(path, match="fuzzy", fuzzy_ratio=0.95, fuzzy_scorer="ratio").lookup(
            "France: what is the capital of"
        )
        is None
    )


def test_lookups_are_cached_per_version(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path, match="fuzzy", cache_size=16)
    first = store.lookup("Who wrote Hamlet??")
    assert first is not None
    assert store.lookup("Who wrote Hamlet??") is first  # served from the cache
    _write_jsonl(path, [{"input": "Who wrote Hamlet", "reference": "Shakespeare, c. 1600."}])
    assert store.reload()
    second = store.lookup("Who wrote Hamlet??")
    assert second is not None
    assert second.expected_output == "Shakespeare, c. 1600."


# ------------------------------------------------------------------- errors


def _error(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReferenceStoreError) as info:
        _store(path)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize(
    ("lines", "where", "field", "what"),
    [
        (['{"input": "a", "expected_output": "b"}', "{not json"], ":2", None, "invalid JSON"),
        (['{"expected_output": "b"}'], ":1", "'input'", "missing"),
        (['{"input": "", "expected_output": "b"}'], ":1", "'input'", "non-empty"),
        (['{"input": 3, "expected_output": "b"}'], ":1", "'input'", "non-empty string"),
        (['{"input": "a"}'], ":1", None, "no ground truth"),
        (['{"input": "a", "expected_ouput": "b"}'], ":1", "'expected_ouput'", "unknown field"),
        (['{"input": "a", "expected_output": ["b"]}'], ":1", "'expected_output'", "string"),
        (['{"input": "a", "reference_contexts": "b"}'], ":1", "'reference_contexts'", "a list"),
        (
            ['{"input": "a", "reference_contexts": ["x", 1]}'],
            ":1",
            "'reference_contexts[1]'",
            "a string",
        ),
        (
            ['{"input": "a", "reference_context_ids": [1, null]}'],
            ":1",
            "'reference_context_ids[1]'",
            "a string or a number",
        ),
        (
            ['{"input": "a", "user_input": "a", "reference": "b"}'],
            ":1",
            "'user_input'",
            "together with 'input'",
        ),
        (['["input", "a"]'], ":1", None, "must be a mapping"),
        (
            ['{"input": "Q?", "reference": "b"}', "", '{"input": "q", "reference": "c"}'],
            ":3",
            "'input'",
            "duplicate input (same normalised text as line 1)",
        ),
    ],
)
def test_bad_jsonl_rows_name_file_line_and_field(
    tmp_path: Path, lines: list[str], where: str, field: str | None, what: str
) -> None:
    message = _error(tmp_path, "refs.jsonl", "\n".join(lines) + "\n")
    assert f"refs.jsonl{where}" in message
    if field is not None:
        assert f"field {field}" in message
    assert what in message


def test_bad_yaml_rows_name_file_line_and_field(tmp_path: Path) -> None:
    message = _error(
        tmp_path,
        "refs.yaml",
        "- input: ok\n  reference: fine\n- input: second\n  reference_contexts: 5\n",
    )
    assert "refs.yaml:4: field 'reference_contexts'" in message
    message = _error(tmp_path, "refs.yaml", "- input: a\n  expected_output: b\n- [1, 2\n")
    assert "refs.yaml:" in message
    assert "invalid YAML" in message
    message = _error(tmp_path, "refs.yaml", "input: a\nexpected_output: b\n")
    assert "refs.yaml:1" in message
    assert "'references'" in message
    message = _error(tmp_path, "refs.yaml", "- input: a\n  typo: b\n")
    assert "refs.yaml:2: field 'typo'" in message


def test_unknown_suffix_and_missing_file(tmp_path: Path) -> None:
    message = _error(tmp_path, "refs.csv", "input,expected_output\n")
    assert "format" in message
    with pytest.raises(ReferenceStoreError, match="cannot read"):
        _store(tmp_path / "absent.jsonl")
    forced = tmp_path / "refs.txt"
    forced.write_text('{"input": "a", "reference": "b"}\n', encoding="utf-8")
    assert _store(forced, format="jsonl").lookup("A") is not None


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "refs.jsonl"
    path.write_bytes(b'{"input": "a", "reference": "b"}\n{"input": "\xff"}\n')
    with pytest.raises(ReferenceStoreError, match=r"refs\.jsonl:2: not valid UTF-8"):
        _store(path)


def test_config_validation() -> None:
    with pytest.raises(ValidationError):
        ReferenceStoreConfig.model_validate({"path": "x.jsonl", "match": "regex"})
    with pytest.raises(ValidationError):
        ReferenceStoreConfig.model_validate({"path": "x.jsonl", "fuzzy_ratio": 90})
    with pytest.raises(ValidationError):
        ReferenceStoreConfig.model_validate({"path": "x.jsonl", "reload": 1})
    config = ReferenceStoreConfig.model_validate({"path": "x.jsonl"})
    assert (config.match, config.fuzzy_ratio, config.reload_interval) == ("exact", 0.9, 5.0)


# ------------------------------------------------------------------- reload


def test_sync_reload_picks_up_changes(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path)
    assert not store.reload()  # unchanged content
    assert store.version == 1
    _write_jsonl(path, [*ROWS, {"input": "new question", "reference": "new answer"}])
    assert store.reload()
    assert store.version == 2
    new = store.lookup("New question")
    assert new is not None
    assert new.expected_output == "new answer"
    assert len(store) == 4


def test_broken_reload_keeps_old_store(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path)
    path.write_text('{"input": "a", "reference": "b"}\n{"input": \n', encoding="utf-8")
    with pytest.raises(ReferenceStoreError, match=r"refs\.jsonl:2"):
        store.reload()
    assert store.version == 1
    assert len(store) == 3
    assert store.lookup("who wrote hamlet") is not None
    path.unlink()
    with pytest.raises(ReferenceStoreError, match="cannot read"):
        store.reload()
    assert store.lookup("who wrote hamlet") is not None


def test_poll_checks_stat_then_hash_and_logs_a_broken_file_once(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path)
    assert not store.poll()  # nothing changed
    _bump_mtime(path, 5)
    assert not store.poll()  # touched, same bytes: not parsed again
    assert store.version == 1

    with capture_logs() as logs:
        path.write_text("{broken\n", encoding="utf-8")
        _bump_mtime(path, 10)
        assert not store.poll()
        _bump_mtime(path, 15)
        assert not store.poll()  # same broken content: not logged again
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["event"] == "reference_store.reload_failed"
    assert "refs.jsonl:1" in errors[0]["error"]
    assert errors[0]["serving_version"] == 1
    assert store.lookup("who wrote hamlet") is not None

    with capture_logs() as logs:
        _write_jsonl(path, ROWS[:1])
        _bump_mtime(path, 20)
        assert store.poll()
    assert [e["event"] for e in logs] == ["reference_store.reloaded"]
    assert len(store) == 1
    assert store.lookup("who wrote hamlet") is None


def _failed(logs: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "reference_store.reload_failed" for e in logs)


async def test_background_poll_reloads_and_survives_a_broken_file(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path, reload_interval=0.05)
    store.start()
    store.start()  # idempotent
    try:
        with capture_logs() as logs:
            path.write_text("- not json\n", encoding="utf-8")
            _bump_mtime(path, 3)
            await eventually(
                lambda: any(e["event"] == "reference_store.reload_failed" for e in logs)
            )
        assert store.version == 1
        assert store.lookup("who wrote hamlet") is not None

        _write_jsonl(path, [{"input": "fresh", "expected_outcome": "done"}])
        _bump_mtime(path, 6)
        await eventually(lambda: store.lookup("Fresh") is not None)
        assert store.version == 2
        assert store.lookup("who wrote hamlet") is None
    finally:
        await store.aclose()
    # stopped: changes are no longer picked up
    _write_jsonl(path, ROWS)
    _bump_mtime(path, 9)
    await asyncio.sleep(0.2)
    assert store.version == 2


async def test_zero_interval_does_not_poll(tmp_path: Path) -> None:
    store = _store(_write_jsonl(tmp_path / "refs.jsonl", ROWS), reload_interval=0)
    store.start()
    await store.aclose()
    assert store.version == 1


def test_integral_float_ids_are_their_integer(tmp_path: Path) -> None:
    # 3.0 (a number column read as floats) is the document 3, as in the loaders.
    path = _write_jsonl(
        tmp_path / "refs.jsonl", [{"input": "q", "reference_context_ids": [3.0, 4.5, "5", 6]}]
    )
    entry = _store(path).lookup("q")
    assert entry is not None
    assert entry.reference_context_ids == ("3", "4.5", "5", "6")


def _status_of(store: ReferenceStore) -> Status:
    return store.status  # read afresh each time (no narrowing across awaits)


async def test_a_missing_file_is_a_status_and_loads_when_it_appears(tmp_path: Path) -> None:
    telemetry = Telemetry()
    host = ComponentHost(telemetry)
    path = tmp_path / "later" / "refs.jsonl"
    store = ReferenceStore(
        ReferenceStoreConfig(path=path, reload_interval=0.05),
        supervisor=Supervisor(host),
        missing_ok=True,
    )
    host.register(store)
    assert _status_of(store) is Status.RECOVERABLE_ERROR
    assert "cannot read" in (store.last_error or "")
    assert store.lookup("who wrote hamlet") is None
    assert len(store) == 0
    store.start()
    try:
        # A broken file is still an error status, with the old (empty) index served.
        path.parent.mkdir()
        path.write_text("- not json\n", encoding="utf-8")
        await eventually(lambda: "refs.jsonl:1" in (store.last_error or ""))
        assert _status_of(store) is Status.RECOVERABLE_ERROR
        _write_jsonl(path, ROWS)
        _bump_mtime(path, 3)
        await eventually(lambda: _status_of(store) is Status.OK)
        assert store.lookup("who wrote hamlet") is not None
        gauge = telemetry.registry.get_sample_value(
            "ragtrace_component_status", {"component": "reference_store", "status": "ok"}
        )
        assert gauge == 1
        # Deleted again: a status, the loaded version keeps serving.
        path.unlink()
        await eventually(lambda: _status_of(store) is Status.RECOVERABLE_ERROR)
        assert store.lookup("who wrote hamlet") is not None
    finally:
        await store.aclose()
    assert _status_of(store) is Status.STOPPED


def test_a_fix_written_while_a_broken_file_is_read_is_still_picked_up(tmp_path: Path) -> None:
    """The poll reads the broken content, the fixed file lands before the poll records
    what it saw: the next poll must still see a change (it used to stat again after
    the failure and take the fixed file's signature for the broken one's)."""
    path = _write_jsonl(tmp_path / "refs.jsonl", ROWS)
    store = _store(path, reload_interval=0)
    assert store.version == 1
    path.write_text("- not json\n", encoding="utf-8")
    _bump_mtime(path, 3)
    read = store._read

    def read_then_fixed() -> bytes:
        data = read()
        _write_jsonl(path, ROWS[:1])  # the operator's fix, written during the poll
        _bump_mtime(path, 6)
        return data

    store._read = read_then_fixed  # type: ignore[method-assign]
    with capture_logs():
        assert store.poll() is False  # the broken content: refused, old version serves
    store._read = read  # type: ignore[method-assign]
    assert store.poll() is True  # the fix is seen
    assert store.version == 2
    assert len(store) == 1
