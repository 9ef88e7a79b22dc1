"""README.md and docs/ cannot drift from the code: the configuration reference
(docs/configuration.md) is the generator's output, every YAML example is a valid config
(or a valid reference file), the metric reference (docs/metrics.md) names exactly the
registered metrics and the default set, every link resolves, and the README stays a
landing page whose details live in docs/, each listed in the index docs/README.md."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ragtrace_collector.admin.config import AdminConfig
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.configref import DOCUMENT, REGENERATE, extract_block, render_reference
from ragtrace_collector.metrics import METRIC_NAMES, NO_JUDGE_METRICS, OFFLINE_METRICS
from ragtrace_collector.offline.loaders import load_dataset
from ragtrace_collector.stores.reference import ReferenceStore, ReferenceStoreConfig
from tests.docs._readme import (
    CONFIG_DOC,
    DOCS,
    DOCS_INDEX,
    DOCUMENTS,
    METRICS_DOC,
    ROOT,
    Block,
    all_blocks,
    between,
    code_blocks,
    doc_name,
    doc_text,
    find_marked,
    github_anchor,
    outside_code,
    readme_text,
)
from tests.fakes.services import PROMTOOL

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CHECKS = {
    "check: reference-jsonl",
    "check: reference-yaml",
    "check: eval-dataset",
    "check: prometheus-config",
}


def _blocks(lang: str) -> list[Block]:
    """The ``lang`` code blocks of the README and of every document in docs/."""
    return [b for b in all_blocks() if b.lang == lang]


def _config_blocks() -> list[Block]:
    return [b for b in _blocks("yaml") if not b.marker.startswith("check:")]


def test_config_reference_matches_the_generator() -> None:
    assert CONFIG_DOC == ROOT / DOCUMENT
    in_doc = extract_block(doc_text(CONFIG_DOC))
    generated = render_reference()
    assert in_doc == generated, (
        f"{DOCUMENT}'s configuration reference is out of date with the config models; "
        f"regenerate it with: .venv/bin/{REGENERATE}"
    )


def test_the_readme_points_to_the_references_instead_of_holding_them() -> None:
    text = readme_text()
    assert "config-reference:begin" not in text
    assert "](docs/configuration.md)" in text
    assert "](docs/metrics.md)" in text


def test_config_reference_covers_every_top_level_section() -> None:
    from ragtrace_collector.config import CollectorConfig

    block = extract_block(doc_text(CONFIG_DOC))
    headings = re.findall(r"^### `([a-z_]+)`$", block, re.MULTILINE)
    assert headings == list(CollectorConfig.model_fields)


def test_there_are_collector_config_examples() -> None:
    # Guards the next test against passing vacuously (e.g. a changed fence language).
    assert len(_config_blocks()) >= 6


@pytest.mark.parametrize("block", _config_blocks(), ids=lambda b: f"{b.doc}:{b.line}")
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
    marks = [b.marker for b in all_blocks() if b.marker.startswith("check:")]
    assert sorted(marks) == sorted(_CHECKS), (
        "a check: marker without a test, a test without its block, or a marker used twice"
    )


def test_no_marker_names_two_blocks() -> None:
    # Tests find a marked block in whichever document holds it: a name must be unique.
    markers = [b.marker for b in all_blocks() if b.marker]
    assert len(markers) == len(set(markers)), sorted(markers)


@pytest.mark.parametrize(
    ("marker", "suffix"),
    [("check: reference-jsonl", ".jsonl"), ("check: reference-yaml", ".yaml")],
)
def test_reference_file_examples_load(marker: str, suffix: str, tmp_path: Path) -> None:
    block = find_marked(marker)
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
    block = find_marked("check: eval-dataset")
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


def test_prometheus_example_scrapes_the_collectors_admin_port() -> None:
    """The scrape config of docs/rollouts.md: the admin port's default address and its
    /metrics, under the job name of the shipped docker/prometheus/prometheus.yml."""
    config: dict[str, Any] = yaml.safe_load(find_marked("check: prometheus-config").body)
    (job,) = config["scrape_configs"]
    shipped = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    (shipped_job,) = [j for j in shipped["scrape_configs"] if j["job_name"] == job["job_name"]]
    assert job.get("metrics_path", "/metrics") == shipped_job["metrics_path"] == "/metrics"
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets == [AdminConfig().endpoint]


@pytest.mark.services  # promtool
def test_promtool_accepts_the_prometheus_example(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool is required (scripts/setup-services.sh installs it)"
    config = tmp_path / "prometheus.yml"
    config.write_text(find_marked("check: prometheus-config").body, encoding="utf-8")
    result = subprocess.run(
        [PROMTOOL, "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _metric_rows() -> list[list[str]]:
    table = between(doc_text(METRICS_DOC), "metrics")
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


def test_default_metric_set_is_written_out_right() -> None:
    words = {11: "eleven", 12: "twelve", 10: "ten"}
    assert f"runs the {words[len(OFFLINE_METRICS)]} metrics" in " ".join(readme_text().split())
    text = doc_text(METRICS_DOC)
    paragraph = text[text.index("**The default set.**") :].split("\n\n")[0]
    assert f"runs {words[len(OFFLINE_METRICS)]} metrics" in paragraph
    assert re.findall(r"`([a-z_]+)`", paragraph) == list(OFFLINE_METRICS)


def test_metric_doc_has_a_section_for_every_metric() -> None:
    text = doc_text(METRICS_DOC)
    headings = re.findall(r"^### `([a-z_]+)`(?: and `([a-z_]+)`)?$", text, re.MULTILINE)
    named = [n for pair in headings for n in pair if n]
    assert sorted(named) == sorted(METRIC_NAMES)
    for differs in ("Skip versus 0", "Entity normalisation", "verdict-word rule", "Float ids"):
        assert differs in text, differs


def test_python_snippets_compile() -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 3
    for block in blocks:
        compile(block.body, block.where(), "exec")


def _anchors(path: Path) -> set[str]:
    prose = outside_code(doc_text(path))
    anchors = {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.MULTILINE)}
    return anchors | set(re.findall(r'<a id="([^"]+)">', prose))


def test_documents_include_the_new_docs() -> None:
    # Guards the link and example tests against passing vacuously on a narrower set.
    names = {doc_name(p) for p in DOCUMENTS}
    for expected in ("README.md", "docs/README.md", "docs/metrics.md", "docs/operations.md"):
        assert expected in names
    assert len(names) >= 10


@pytest.mark.parametrize("path", DOCUMENTS, ids=doc_name)
def test_internal_links_resolve(path: Path) -> None:
    prose = outside_code(doc_text(path))
    name = path.relative_to(ROOT)
    for target in re.findall(r"\]\(#([^)]+)\)", prose):
        assert target in _anchors(path), f"{name} links to #{target}: no such heading"
    for target, anchor in re.findall(r"\]\((?!https?://|#)([^)#]+)(?:#([^)]*))?\)", prose):
        linked = (path.parent / target).resolve()
        assert linked.exists(), f"{name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{name} links to {target}#{anchor}: no heading"


def test_readme_starts_with_the_two_commands() -> None:
    text = readme_text()
    first_block = code_blocks(text)[0]
    assert first_block.lang == "bash"
    assert "bash scripts/demo.sh" in first_block.body
    assert "bash scripts/test.sh" in first_block.body
    for script in ("demo.sh", "test.sh"):
        assert (ROOT / "scripts" / script).is_file(), script


def test_readme_names_the_fast_subset_with_registered_markers() -> None:
    command = 'bash scripts/test.sh -m "not services and not slow"'
    assert command in readme_text()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for marker in ("services", "slow"):
        assert f'"{marker}: ' in pyproject, f"marker {marker} is not registered"


def _test_sh_bullet() -> str:
    """The README's account of what ``scripts/test.sh`` sets up (its bullet)."""
    text = readme_text()
    start = text.index("- **`scripts/test.sh`**")
    return text[start : text.index("\n- ", start)]


def test_readme_names_every_package_setup_services_installs() -> None:
    script = (ROOT / "scripts" / "setup-services.sh").read_text(encoding="utf-8")
    packages = {p for group in re.findall(r"need\+=\(([^)]*)\)", script) for p in group.split()}
    assert {"redis-server", "prometheus", "chromium"} <= packages  # the parse finds them
    bullet = _test_sh_bullet()
    missing = sorted(p for p in packages if f"`{p}`" not in bullet)
    assert not missing, f"README.md's scripts/test.sh bullet does not name {missing}"
    assert "ensure_phoenix" in script
    assert "Phoenix" in bullet


#: A uv command as if uv were on the PATH; the scripts bootstrap it into .tools/bin/uv.
_BARE_UV = re.compile(r"(?<![\w./$\"-])uv (?:sync|run|pip|venv|lock|add|tool)\b")


@pytest.mark.parametrize("path", DOCUMENTS, ids=doc_name)
def test_no_document_runs_uv_from_the_path(path: Path) -> None:
    found = _BARE_UV.findall(doc_text(path))
    assert not found, f"{doc_name(path)} runs {found}, but uv is only in .tools/bin/"


def test_readme_builds_the_venv_as_the_scripts_do() -> None:
    """The README's command for .venv alone calls the function both scripts call."""
    assert "bash -c 'source scripts/_env.sh && ensure_venv'" in readme_text()
    env = (ROOT / "scripts" / "_env.sh").read_text(encoding="utf-8")
    assert re.search(r"^ensure_venv\(\) \{", env, re.MULTILINE)
    for script in ("test.sh", "demo.sh"):
        assert "ensure_venv" in (ROOT / "scripts" / script).read_text(encoding="utf-8")


def test_readme_is_a_landing_page() -> None:
    # Details belong in docs/; the README keeps the pitch, the two commands, the quick
    # start, the frameworks table and links.
    text = readme_text()
    assert len(text.splitlines()) <= 260, "README.md grew: move the details to docs/"
    assert "](docs/README.md)" in text


def test_docs_index_lists_every_document() -> None:
    index = outside_code(doc_text(DOCS_INDEX))
    linked = set(re.findall(r"\]\(([^)#]+\.md)\)", index))
    documents = {p.name for p in DOCS.glob("*.md")} - {DOCS_INDEX.name}
    assert documents <= linked, f"docs/README.md does not list {sorted(documents - linked)}"
    # One line per document: none listed twice.
    listed = [line for line in index.splitlines() if line.startswith("- [")]
    assert len(listed) == len(documents)
    assert "](../README.md)" in index


def test_readme_links_every_document_it_moved() -> None:
    text = readme_text()
    for doc in (
        "instrumenting.md",
        "already-instrumented.md",
        "viewing-scores.md",
        "alerting.md",
        "ground-truth.md",
        "offline-evaluation.md",
        "scaling-out.md",
        "performance.md",
        "delivery.md",
        "operations.md",
        "comparison.md",
        "development.md",
    ):
        assert f"](docs/{doc})" in text, doc
        assert (DOCS / doc).is_file(), doc


_MODULE_PATH = re.compile(r"\bragtrace_collector(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute reached from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("path", DOCUMENTS, ids=doc_name)
def test_every_module_path_in_the_docs_exists(path: Path) -> None:
    # Prose and examples name modules (ragtrace_collector.offline.pytest_plugin, ...);
    # a package reorganisation must not leave a stale one behind.
    for dotted in sorted(set(_MODULE_PATH.findall(doc_text(path)))):
        assert _resolves(dotted), f"{doc_name(path)} names {dotted}, which does not exist"
