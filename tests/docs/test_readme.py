"""README.md cannot drift from the code: the configuration reference is the generator's
output, every YAML example is a valid config (or a valid reference file), the metric
reference names exactly the registered metrics, and every link resolves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.configref import REGENERATE, extract_block, render_reference
from ragtrace_collector.loaders import load_dataset
from ragtrace_collector.metrics import METRIC_NAMES, NO_JUDGE_METRICS, OFFLINE_METRICS
from ragtrace_collector.reference_store import ReferenceStore, ReferenceStoreConfig
from tests.docs._readme import (
    ROOT,
    Block,
    between,
    code_blocks,
    github_anchor,
    outside_code,
    readme_text,
)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CHECKS = {"check: reference-jsonl", "check: reference-yaml", "check: eval-dataset"}


def _blocks(lang: str) -> list[Block]:
    return [b for b in code_blocks(readme_text()) if b.lang == lang]


def _config_blocks() -> list[Block]:
    return [b for b in _blocks("yaml") if not b.marker.startswith("check:")]


def test_config_reference_matches_the_generator() -> None:
    in_readme = extract_block(readme_text())
    generated = render_reference()
    assert in_readme == generated, (
        "README.md's configuration reference is out of date with the config models; "
        f"regenerate it with: .venv/bin/{REGENERATE}"
    )


def test_config_reference_covers_every_top_level_section() -> None:
    from ragtrace_collector.config import CollectorConfig

    block = extract_block(readme_text())
    headings = re.findall(r"^### `([a-z_]+)`$", block, re.MULTILINE)
    assert headings == list(CollectorConfig.model_fields)


def test_there_are_collector_config_examples() -> None:
    # Guards the next test against passing vacuously (e.g. a changed fence language).
    assert len(_config_blocks()) >= 6


@pytest.mark.parametrize("block", _config_blocks(), ids=lambda b: f"line{b.line}")
def test_every_yaml_example_is_a_valid_collector_config(block: Block) -> None:
    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block.where()}: not a mapping"
    # ${VAR} without a default must be set; give each one a placeholder value.
    env = {name: "placeholder" for name in _ENV_REF.findall(block.body)}
    try:
        parse_config(data, env=env, source=block.where())
    except ConfigError as exc:
        pytest.fail(exc.render())


def test_every_checked_block_has_a_known_check() -> None:
    marks = {b.marker for b in code_blocks(readme_text()) if b.marker.startswith("check:")}
    assert marks == _CHECKS, "a check: marker without a test, or a test without its block"


@pytest.mark.parametrize(
    ("marker", "suffix"),
    [("check: reference-jsonl", ".jsonl"), ("check: reference-yaml", ".yaml")],
)
def test_reference_file_examples_load(marker: str, suffix: str, tmp_path: Path) -> None:
    [block] = [b for b in code_blocks(readme_text()) if b.marker == marker]
    path = tmp_path / f"references{suffix}"
    path.write_text(block.body, encoding="utf-8")
    store = ReferenceStore(ReferenceStoreConfig(path=path, match="fuzzy"))
    rows = (
        [json.loads(line) for line in block.body.splitlines() if line.strip()]
        if suffix == ".jsonl"
        else yaml.safe_load(block.body)["references"]
    )
    assert len(store) == len(rows) >= 2
    for row in rows:
        entry = store.lookup(row["input"])
        assert entry is not None, row["input"]
        for key in ("expected_output", "reference_context_ids", "expected_outcome"):
            if key in row:
                value = getattr(entry, key)
                assert (list(value) if isinstance(value, tuple) else value) == row[key]
    # Fuzzy matching finds a slightly different wording of the first input.
    assert store.lookup(rows[0]["input"].upper() + "  ") is not None


def test_eval_dataset_example_loads_with_deepeval_and_ragas_names(tmp_path: Path) -> None:
    [block] = [b for b in code_blocks(readme_text()) if b.marker == "check: eval-dataset"]
    path = tmp_path / "cases.jsonl"
    path.write_text(block.body, encoding="utf-8")
    result = load_dataset(path)
    assert result.errors == []
    assert result.warnings == []
    cases = result.cases
    assert len(cases) == 2
    assert all(c.input and c.actual_output and c.expected_output for c in cases)
    assert all(c.retrieval_context for c in cases)
    assert cases[1].reference_contexts == ["Our office in Lyon is open Monday to Friday."]


def _metric_rows() -> list[list[str]]:
    table = between(readme_text(), "metrics")
    rows = []
    for line in table.strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("Metric",) or set(cells[0]) <= {"-", " "}:
            continue
        rows.append(cells)
    return rows


def test_metric_reference_names_exactly_the_registered_metrics() -> None:
    names = [re.fullmatch(r"`([a-z_]+)`", row[0]).group(1) for row in _metric_rows()]  # type: ignore[union-attr]
    assert names == list(METRIC_NAMES)


def test_metric_reference_marks_exactly_the_metrics_without_a_judge() -> None:
    no_llm = [row[0].strip("`") for row in _metric_rows() if row[3].startswith("no LLM")]
    assert no_llm == list(NO_JUDGE_METRICS)


def test_default_metric_set_count_is_right() -> None:
    words = {11: "eleven", 12: "twelve", 10: "ten"}
    assert f"runs the {words[len(OFFLINE_METRICS)]} metrics" in readme_text()


def test_python_snippets_compile() -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 3
    for block in blocks:
        compile(block.body, block.where(), "exec")


def test_internal_links_resolve() -> None:
    text = readme_text()
    prose = outside_code(text)
    anchors = {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.MULTILINE)}
    anchors |= set(re.findall(r'<a id="([^"]+)">', prose))
    for target in re.findall(r"\]\(#([^)]+)\)", prose):
        assert target in anchors, f"README link to #{target}: no such heading"
    for target in re.findall(r"\]\((?!https?://|#)([^)#]+)[^)]*\)", prose):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_readme_starts_with_the_two_commands() -> None:
    text = readme_text()
    first_block = code_blocks(text)[0]
    assert first_block.lang == "bash"
    assert "bash scripts/demo.sh" in first_block.body
    assert "bash scripts/test.sh" in first_block.body
    for script in ("demo.sh", "test.sh"):
        assert (ROOT / "scripts" / script).is_file(), script
