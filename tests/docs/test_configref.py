"""The configuration reference generator on small models built for the purpose, and on
the real config model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from ragtrace_collector.config import CollectorConfig
from ragtrace_collector.configbase import ByteSize, Duration
from ragtrace_collector.configref import (
    BEGIN_MARKER,
    END_MARKER,
    MissingDescriptionError,
    Row,
    extract_block,
    main,
    render_reference,
    replace_block,
    sections,
)


class _Base(BaseModel):
    #: Shared by every kind;
    #: on two comment lines.
    retries: int = Field(3, ge=0)


class _Http(_Base):
    type: Literal["http"]
    #: Where to send.
    url: str
    timeout: Duration = Field(2.5, description="Per call | bounded.")


class _File(_Base):
    type: Literal["file"]
    path: Path = Field(description="Output file.")
    #: Where to send.
    url: str = "file://"


class _Item(BaseModel):
    name: str = Field(min_length=1, description="Item name.")
    size: ByteSize = Field(16 * 1024 * 1024, description="How big.")


class _Section(BaseModel):
    #: A comment that the Field description overrides.
    flag: bool = Field(True, description="The field's own words win.")
    wait: Duration = Field(90.0, description="A duration.")
    items: list[_Item] = Field(default_factory=list, description="Some items.")


class _Root(BaseModel):
    section: _Section = Field(default_factory=_Section, description="A section.")
    outputs: dict[str, Annotated[_Http | _File, Field(discriminator="type")]] = Field(
        default_factory=dict, description="Named outputs."
    )
    optional: _Item | None = Field(None, description="Off unless set.")


class _Undocumented(BaseModel):
    documented: int = Field(1, description="Yes.")
    bare: int = 2
    other: str = "x"


def _rows(model: type[BaseModel]) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for section in sections(model):
        for row in section.rows:
            key = row.path + (f" ({row.tag})" if row.tag else "")
            assert key not in rows, f"duplicate row {key}"
            rows[key] = row
    return rows


def test_paths_walk_nested_models_lists_maps_and_unions() -> None:
    rows = _rows(_Root)
    assert list(rows) == [
        "section",
        "section.flag",
        "section.wait",
        "section.items",
        "section.items[].name",
        "section.items[].size",
        "outputs",
        "outputs.<name>.type",
        "outputs.<name>.retries",
        "outputs.<name>.url (type: http)",
        "outputs.<name>.url (type: file)",
        "outputs.<name>.timeout (type: http)",
        "outputs.<name>.path (type: file)",
        "optional",
        "optional.name",
        "optional.size",
    ]


def test_types_defaults_and_descriptions() -> None:
    rows = _rows(_Root)
    assert rows["section.flag"] == Row(
        "section.flag", "bool", "`true`", "The field's own words win."
    )
    assert rows["section.wait"].type == "duration"
    assert rows["section.wait"].default == "`90s`"
    assert rows["section.items"].type == "list of mapping"
    assert rows["section.items"].default == "`[]`"
    assert rows["section.items[].name"].type == "string (not empty)"
    assert rows["section.items[].name"].default == "required"
    assert rows["section.items[].size"].type == "size"
    assert rows["section.items[].size"].default == "`16MiB`"
    assert rows["outputs"].type == "map: string → mapping"
    assert rows["outputs.<name>.type"].type == "one of `http`, `file`"
    assert rows["outputs.<name>.type"].default == "required"
    # Inherited, identical in both kinds: one untagged row, from the base's comment.
    retries = rows["outputs.<name>.retries"]
    assert retries.description == "Shared by every kind; on two comment lines."
    assert retries.type == "int (≥ 0)"
    assert rows["outputs.<name>.url (type: http)"].default == "required"
    assert rows["outputs.<name>.url (type: file)"].default == "`file://`"
    assert rows["optional"].type == "mapping or null"
    assert rows["optional"].default == "`null`"


def test_duration_and_size_spelling() -> None:
    class _Times(BaseModel):
        a: Duration = Field(0.25, description="a")
        b: Duration = Field(86400.0, description="b")
        c: Duration = Field(30.0, description="c")
        d: Duration | None = Field(None, description="d")
        e: ByteSize = Field(1000, description="e")

    rows = _rows(_Times)
    assert [rows[k].default for k in "abcde"] == ["`250ms`", "`24h`", "`30s`", "`null`", "`1000`"]
    assert rows["d"].type == "duration or null"


def test_markdown_escapes_pipes_and_keeps_tags_in_the_key_column() -> None:
    text = render_reference(_Root)
    assert "Per call \\| bounded." in text
    assert "| `outputs.<name>.timeout` (type: http) | duration |" in text
    assert "### `section`" in text
    assert "### `outputs`" in text


def test_missing_descriptions_are_named() -> None:
    with pytest.raises(MissingDescriptionError) as info:
        sections(_Undocumented)
    assert info.value.fields == ["_Undocumented.bare", "_Undocumented.other"]


def test_the_real_config_is_fully_described() -> None:
    all_sections = sections(CollectorConfig)
    assert [s.name for s in all_sections] == list(CollectorConfig.model_fields)
    for section in all_sections:
        for row in section.rows:
            assert row.description, row.path
    text = render_reference()
    for key in (
        "`exporters.<name>.endpoint` (type: otlp_http)",
        "`metrics.<metric>.threshold`",
        "`alerts.rules[].for`",
        "`alerts.rules[].baseline.window` (kind: trailing)",
        "`sampling.rules[].match.equals`",
    ):
        assert key in text, key


def test_block_replacement_round_trips() -> None:
    doc = f"# Title\n\n{BEGIN_MARKER}\nold\n{END_MARKER}\n\nAfter.\n"
    new = replace_block(doc, "new text\n")
    assert new == f"# Title\n\n{BEGIN_MARKER}\nnew text\n{END_MARKER}\n\nAfter.\n"
    assert extract_block(new) == "new text\n"
    with pytest.raises(ValueError, match="markers"):
        replace_block("no markers here", "x")


def test_main_writes_the_block_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "README.md"
    doc.write_text(f"intro\n{BEGIN_MARKER}\n{END_MARKER}\nend\n", encoding="utf-8")
    assert main(["--write", str(doc)]) == 0
    assert extract_block(doc.read_text(encoding="utf-8")) == render_reference()
    assert "updated" in capsys.readouterr().err
    assert main(["--write", str(doc)]) == 0
    assert "already up to date" in capsys.readouterr().err
    bad = tmp_path / "bad.md"
    bad.write_text("nothing", encoding="utf-8")
    assert main(["--write", str(bad)]) == 1
    assert bad.read_text(encoding="utf-8") == "nothing"


def test_main_prints_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == render_reference()
