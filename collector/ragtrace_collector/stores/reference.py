"""Ground truth for production traffic, looked up by the request's input text.

Production traces seldom carry ground truth, and recall needs it.  A reference file
maps inputs to their expected output, reference contexts and ids, or expected
outcome; the collector looks up every sampled ``@rag`` input in it.

**File.**  JSON lines (``.jsonl``, ``.ndjson``: one object per line, blank lines
skipped) or YAML (``.yaml``, ``.yml``: a list of mappings, or a mapping whose
``references`` key holds that list).  A row has ``input`` (alias ``user_input``, the
Ragas name) and at least one of ``expected_output`` (alias ``reference``),
``reference_contexts`` (list of strings), ``reference_context_ids`` (list of strings
or numbers; compared as strings) and ``expected_outcome``.  Columns that peers'
dataset exports carry and ragtrace does not use (``response``,
``retrieved_contexts``, ``actual_output``, ``retrieval_context``, ``id``,
``metadata``, ...) are ignored; any other key is an error, so that a typo cannot
silently drop ground truth.  Two rows with the same normalised input are an error.
Every error names the file, the line and the field.

**Matching.**  Inputs are normalised: Unicode NFKC, casefold, whitespace runs
collapsed to one space, punctuation and whitespace stripped at both ends.  ``exact``
matches normalised text only.  ``fuzzy`` tries exact first, then the closest input by
a rapidfuzz scorer, accepted when its score / 100 reaches ``fuzzy_ratio``.  Results
(misses too) are cached per input text in an LRU cache of ``cache_size`` entries.

**Reload.**  :meth:`ReferenceStore.start` polls the file every ``reload_interval``
seconds: its mtime and size first, then (when they changed) a SHA-256 of its bytes,
so a touched but unchanged file is not parsed again.  A file that fails to load
keeps the previous version in service, and the error is logged once per broken
version.  :meth:`ReferenceStore.reload` reloads on demand.

**Status.**  The store is the ``reference_store`` component: ``ok`` while the file
loads, ``recoverable_error`` while it is missing, unreadable or broken (the last good
version, or none, stays in service), and ``ok`` again once a poll loads it.  With
``missing_ok`` (as ``serve`` builds it) a file missing at startup is such a status,
not a crash; a file that exists but does not parse is still a configuration error.
The polling loop runs under the service's supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import fuzz, process

from ragtrace_collector.cases import id_text
from ragtrace_collector.component import Component, Status, Supervisor
from ragtrace_collector.units import Duration

__all__ = [
    "ReferenceEntry",
    "ReferenceStore",
    "ReferenceStoreConfig",
    "ReferenceStoreError",
    "normalize_input",
]


def _log() -> Any:
    # Imported where used, so that loading the config stays fast.
    import structlog

    return structlog.get_logger(__name__)


Scorer = Literal["ratio", "token_sort_ratio", "token_set_ratio", "partial_ratio", "WRatio"]

_SCORERS: Final[dict[str, Callable[..., float]]] = {
    "ratio": fuzz.ratio,
    "token_sort_ratio": fuzz.token_sort_ratio,
    "token_set_ratio": fuzz.token_set_ratio,
    "partial_ratio": fuzz.partial_ratio,
    "WRatio": fuzz.WRatio,
}

# canonical field <- accepted names
_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "input": ("input", "user_input"),
    "expected_output": ("expected_output", "reference"),
    "reference_contexts": ("reference_contexts",),
    "reference_context_ids": ("reference_context_ids",),
    "expected_outcome": ("expected_outcome",),
}
_KNOWN: Final = frozenset(name for names in _ALIASES.values() for name in names)
#: Columns of Ragas / DeepEval datasets (and common bookkeeping) that ragtrace ignores.
_IGNORED: Final = frozenset(
    {
        "id",
        "name",
        "metadata",
        "tags",
        "comments",
        "response",
        "retrieved_contexts",
        "multi_responses",
        "rubrics",
        "actual_output",
        "retrieval_context",
        "context",
        "additional_metadata",
        "tools_called",
        "expected_tools",
    }
)
_GROUND_TRUTH: Final = (
    "expected_output",
    "reference_contexts",
    "reference_context_ids",
    "expected_outcome",
)


class ReferenceStoreError(Exception):
    """The reference file cannot be loaded; the message names file, line and field."""


class ReferenceStoreConfig(BaseModel):
    """The ``reference_store:`` section of the collector config."""

    model_config = ConfigDict(extra="forbid")

    path: Path = Field(description="The JSONL or YAML file of references.")
    #: ``auto``: by suffix (.jsonl/.ndjson -> jsonl, .yaml/.yml -> yaml).
    format: Literal["auto", "jsonl", "yaml"] = "auto"
    match: Literal["exact", "fuzzy"] = Field(
        "exact",
        description="`exact`: same input after normalising case, Unicode and whitespace; "
        "`fuzzy`: exact first, else the closest input scoring at least `fuzzy_ratio`.",
    )
    #: Minimum similarity in [0, 1] for a fuzzy match (rapidfuzz score / 100).
    fuzzy_ratio: float = Field(default=0.9, ge=0.0, le=1.0)
    fuzzy_scorer: Scorer = Field(
        "token_sort_ratio", description="The rapidfuzz scorer of fuzzy matching."
    )
    #: Seconds between checks of the file; 0 turns polling off.
    reload_interval: Duration = Field(default=5.0, ge=0.0)
    cache_size: int = Field(
        default=10_000, ge=0, description="Lookups (misses too) cached per input text."
    )


class ReferenceEntry(BaseModel):
    """The ground truth found for one input."""

    model_config = ConfigDict(frozen=True)

    expected_output: str | None = None
    reference_contexts: tuple[str, ...] | None = None
    reference_context_ids: tuple[str, ...] | None = None
    expected_outcome: str | None = None
    #: The row's own input text, as written in the file.
    matched_input: str
    #: 1.0 for an exact match, else the fuzzy score in [0, 1].
    match_score: float
    #: ``file:line`` of the row.
    source: str


# ------------------------------------------------------------- normalisation

_WS = re.compile(r"\s+")


def _is_edge_char(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch).startswith("P")


def normalize_input(text: str) -> str:
    """The text exact matching compares: NFKC, casefold, collapsed whitespace, and
    punctuation and whitespace stripped at both ends (``" What is X?! "`` ->
    ``"what is x"``)."""
    norm = _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    start, end = 0, len(norm)
    while start < end and _is_edge_char(norm[start]):
        start += 1
    while end > start and _is_edge_char(norm[end - 1]):
        end -= 1
    return norm[start:end]


# ------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    input: str
    expected_output: str | None
    reference_contexts: tuple[str, ...] | None
    reference_context_ids: tuple[str, ...] | None
    expected_outcome: str | None


def _fail(path: Path, line: int, field: str | None, message: str) -> ReferenceStoreError:
    where = f"{path}:{line}"
    if field is not None:
        where += f": field {field!r}"
    return ReferenceStoreError(f"reference store {where}: {message}")


def _parse_row(
    path: Path, line: int, raw: object, field_lines: Mapping[str, int] | None = None
) -> _Row:
    def at(key: str) -> int:
        return field_lines.get(key, line) if field_lines else line

    if not isinstance(raw, Mapping):
        raise _fail(path, line, None, f"a row must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if not isinstance(key, str):
            raise _fail(path, line, str(key), "field names must be strings")
        if key not in _KNOWN and key not in _IGNORED:
            raise _fail(
                path,
                at(key),
                key,
                "unknown field (expected input/user_input, expected_output/reference,"
                " reference_contexts, reference_context_ids, expected_outcome)",
            )
    values: dict[str, Any] = {}
    for canonical, names in _ALIASES.items():
        present = [name for name in names if name in raw]
        if len(present) > 1:
            raise _fail(path, at(present[1]), present[1], f"given together with {present[0]!r}")
        if present:
            values[canonical] = (present[0], raw[present[0]])

    if "input" not in values:
        raise _fail(path, line, "input", "missing (also accepted as 'user_input')")
    name, text = values["input"]
    if not isinstance(text, str) or not normalize_input(text):
        raise _fail(path, at(name), name, "must be a non-empty string")

    def string(key: str) -> str | None:
        if key not in values:
            return None
        field, value = values[key]
        if value is None:
            return None
        if not isinstance(value, str):
            raise _fail(path, at(field), field, f"must be a string, got {type(value).__name__}")
        return value

    def strings(key: str, *, allow_numbers: bool) -> tuple[str, ...] | None:
        if key not in values:
            return None
        field, value = values[key]
        if value is None:
            return None
        if not isinstance(value, list):
            raise _fail(path, at(field), field, f"must be a list, got {type(value).__name__}")
        out: list[str] = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append(item)
            elif allow_numbers and isinstance(item, int | float) and not isinstance(item, bool):
                out.append(id_text(item))
            else:
                kind = "a string or a number" if allow_numbers else "a string"
                raise _fail(
                    path, at(field), f"{field}[{i}]", f"must be {kind}, got {type(item).__name__}"
                )
        return tuple(out)

    row = _Row(
        line=line,
        input=text,
        expected_output=string("expected_output"),
        reference_contexts=strings("reference_contexts", allow_numbers=False),
        reference_context_ids=strings("reference_context_ids", allow_numbers=True),
        expected_outcome=string("expected_outcome"),
    )
    if all(getattr(row, key) is None for key in _GROUND_TRUTH):
        raise _fail(
            path,
            line,
            None,
            "no ground truth: give expected_output (or reference), reference_contexts,"
            " reference_context_ids or expected_outcome",
        )
    return row


def _parse_jsonl(path: Path, text: str) -> list[_Row]:
    rows: list[_Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(path, number, None, f"invalid JSON: {exc.msg} (column {exc.colno})")
        rows.append(_parse_row(path, number, raw))
    return rows


def _parse_yaml(path: Path, text: str) -> list[_Row]:
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            raise _fail(path, line, None, f"invalid YAML: {exc.problem or exc}")
        except yaml.YAMLError as exc:
            raise _fail(path, 1, None, f"invalid YAML: {exc}")
        if root is None:
            return []
        items = root
        if isinstance(root, yaml.MappingNode):
            found = [
                v
                for k, v in root.value
                if isinstance(k, yaml.ScalarNode) and k.value == "references"
            ]
            if not found or len(root.value) != 1:
                raise _fail(
                    path,
                    root.start_mark.line + 1,
                    None,
                    "a YAML reference file is a list of rows, or a mapping with one key,"
                    " 'references', holding that list",
                )
            items = found[0]
        if not isinstance(items, yaml.SequenceNode):
            raise _fail(path, items.start_mark.line + 1, None, "expected a list of rows")
        rows: list[_Row] = []
        for node in items.value:
            line = node.start_mark.line + 1
            try:
                raw = loader.construct_document(node)
            except yaml.YAMLError as exc:
                raise _fail(path, line, None, f"invalid YAML value: {exc}")
            field_lines: dict[str, int] = {}
            if isinstance(node, yaml.MappingNode):
                for key_node, _value in node.value:
                    if isinstance(key_node, yaml.ScalarNode):
                        field_lines[key_node.value] = key_node.start_mark.line + 1
            rows.append(_parse_row(path, line, raw, field_lines))
        return rows
    finally:
        loader.dispose()


def _parse(path: Path, data: bytes, fmt: Literal["auto", "jsonl", "yaml"]) -> list[_Row]:
    if fmt == "auto":
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".ndjson"):
            fmt = "jsonl"
        elif suffix in (".yaml", ".yml"):
            fmt = "yaml"
        else:
            raise ReferenceStoreError(
                f"reference store {path}: cannot tell the format from the suffix"
                f" {suffix!r}; use .jsonl, .ndjson, .yaml or .yml, or set 'format'"
            )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _fail(path, line, None, "not valid UTF-8")
    return _parse_jsonl(path, text) if fmt == "jsonl" else _parse_yaml(path, text)


# --------------------------------------------------------------------- index


class _Index:
    """One immutable version of the store, with its own lookup cache."""

    def __init__(self, path: Path, rows: list[_Row], config: ReferenceStoreConfig) -> None:
        self.size = len(rows)
        self._exact: dict[str, ReferenceEntry] = {}
        first_line: dict[str, int] = {}
        for row in rows:
            key = normalize_input(row.input)
            if key in self._exact:
                raise _fail(
                    path,
                    row.line,
                    "input",
                    f"duplicate input (same normalised text as line {first_line[key]})",
                )
            first_line[key] = row.line
            self._exact[key] = ReferenceEntry(
                expected_output=row.expected_output,
                reference_contexts=row.reference_contexts,
                reference_context_ids=row.reference_context_ids,
                expected_outcome=row.expected_outcome,
                matched_input=row.input,
                match_score=1.0,
                source=f"{path}:{row.line}",
            )
        self._keys = list(self._exact)
        self._fuzzy = config.match == "fuzzy"
        self._scorer = _SCORERS[config.fuzzy_scorer]
        self._cutoff = config.fuzzy_ratio * 100.0
        self.lookup: Callable[[str], ReferenceEntry | None] = (
            functools.lru_cache(maxsize=config.cache_size)(self._lookup)
            if config.cache_size
            else self._lookup
        )

    def _lookup(self, text: str) -> ReferenceEntry | None:
        key = normalize_input(text)
        if not key:
            return None
        entry = self._exact.get(key)
        if entry is not None or not self._fuzzy or not self._keys:
            return entry
        best = process.extractOne(
            key, self._keys, scorer=self._scorer, processor=None, score_cutoff=self._cutoff
        )
        if best is None:
            return None
        choice, score, _index = best
        return self._exact[choice].model_copy(update={"match_score": round(score / 100.0, 6)})


# --------------------------------------------------------------------- store


class ReferenceStore(Component):
    """Ground truth by input text, from a file, reloaded when the file changes.

    The constructor loads the file and raises :class:`ReferenceStoreError` when it
    cannot: a broken reference file at startup is a configuration error.  With
    ``missing_ok``, a file that cannot be read (missing) starts the store empty, in
    ``recoverable_error``, and polling loads it once it appears.
    """

    component_name = "reference_store"

    def __init__(
        self,
        config: ReferenceStoreConfig,
        *,
        supervisor: Supervisor | None = None,
        missing_ok: bool = False,
    ) -> None:
        self.config = config
        self._path = config.path
        self._lock = threading.Lock()
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._task: asyncio.Task[None] | None = None
        self._failed_digest: str | None = None
        self._digest: str | None = None
        self.version = 0
        try:
            signature = self._stat()
            data = self._read()
        except ReferenceStoreError as exc:
            if not missing_ok:
                raise
            self._index = _Index(self._path, [], config)
            self._signature = (0, -1)
            self._failed_digest = self._digest_or_none()
            self.report(Status.RECOVERABLE_ERROR, str(exc))
            _log().error(
                "reference_store.missing",
                path=str(self._path),
                error=str(exc),
                detail="serving no ground truth until the file can be read",
            )
            return
        self._index = _Index(self._path, _parse(self._path, data, config.format), config)
        self._digest = hashlib.sha256(data).hexdigest()
        self._signature = signature
        self.version = 1
        self.report(Status.OK)

    # ---------------------------------------------------------------- lookup

    def lookup(self, input_text: str) -> ReferenceEntry | None:
        """The ground truth for ``input_text``, or None."""
        return self._index.lookup(input_text)

    def __len__(self) -> int:
        return self._index.size

    # ---------------------------------------------------------------- reload

    def reload(self) -> bool:
        """Read the file again; True when a new version was loaded.

        False when the content is unchanged.  Raises :class:`ReferenceStoreError`
        when the file cannot be loaded; the store keeps serving the old version.
        """
        with self._lock:
            try:
                changed = self._reload_locked(self._stat())
            except ReferenceStoreError as exc:
                self.report(Status.RECOVERABLE_ERROR, str(exc))
                raise
            self.report_ok()
            return changed

    def _reload_locked(self, signature: tuple[int, int]) -> bool:
        data = self._read()
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            self._signature = signature
            return False
        index = _Index(self._path, _parse(self._path, data, self.config.format), self.config)
        self._index = index
        self._digest = digest
        self._signature = signature
        self._failed_digest = None
        self.version += 1
        return True

    def poll(self) -> bool:
        """One polling step: reload if the file's mtime or size changed.

        Never raises: a broken file is logged (once per broken content) and the
        old version stays in service.
        """
        with self._lock:
            signature: tuple[int, int] | None = None
            try:
                signature = self._stat()
                if signature == self._signature:
                    return False
                changed = self._reload_locked(signature)
            except ReferenceStoreError as exc:
                self.report(Status.RECOVERABLE_ERROR, str(exc))
                digest = self._digest_or_none()
                if digest != self._failed_digest:
                    _log().error(
                        "reference_store.reload_failed",
                        path=str(self._path),
                        error=str(exc),
                        serving_version=self.version,
                        entries=self._index.size,
                    )
                self._failed_digest = digest
                if signature is not None:
                    # The file as it was before the read that failed, never a later
                    # stat: a fix written meanwhile must still look like a change.
                    self._signature = signature
                return False
            self.report_ok()
            if changed:
                _log().info(
                    "reference_store.reloaded",
                    path=str(self._path),
                    version=self.version,
                    entries=self._index.size,
                )
            return changed

    def _digest_or_none(self) -> str:
        try:
            return hashlib.sha256(self._path.read_bytes()).hexdigest()
        except OSError as exc:
            return f"<unreadable: {exc.strerror}>"

    def _stat(self) -> tuple[int, int]:
        try:
            st = os.stat(self._path)
        except OSError as exc:
            raise ReferenceStoreError(f"reference store {self._path}: cannot read: {exc.strerror}")
        return st.st_mtime_ns, st.st_size

    def _read(self) -> bytes:
        try:
            return self._path.read_bytes()
        except OSError as exc:
            raise ReferenceStoreError(f"reference store {self._path}: cannot read: {exc.strerror}")

    # ------------------------------------------------------------ async poll

    def start(self) -> None:
        """Start polling the file in the running event loop (no-op when the
        interval is 0 or polling already runs)."""
        if self.config.reload_interval <= 0 or self._task is not None:
            return
        # poll() reports its own errors; anything else is the supervisor's to log,
        # count and restart.
        self._task = self._supervisor.spawn(self, self._poll_forever, name="reference-store-poll")

    async def _poll_forever(self) -> None:
        interval = self.config.reload_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.poll)
            except Exception:  # poll() reports its own errors; never let the task die
                _log().exception("reference_store.poll_crashed", path=str(self._path))

    async def aclose(self) -> None:
        """Stop polling."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.report(Status.STOPPED)
