"""Data stage: the API registry and the benchmark queries, read and validated.

Two registry layouts are read: the project's JSONL (optionally gzipped; one API a line) and the
original ToolBench tree `data/toolenv/tools/<Category>/<tool>.json`. Queries are ToolBench
`test_instruction` files. Problems in the data either stop the run with a message naming the file,
the record and what to do (`DataError`), or are counted as warnings that reach the report; nothing is
dropped silently.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

GOLD_SETS = ("api_list", "relevant")
REGISTRY_CHOICES = ("full", "described")


class DataError(Exception):
    """Bad or missing input data; the message says where and what to do."""


def api_id(tool_name: str, api_name: str) -> str:
    return f"{tool_name}::{api_name}"


@dataclass(frozen=True)
class Api:
    tool_name: str
    api_name: str
    category: str | None
    description: str | None

    @property
    def id(self) -> str:
        return api_id(self.tool_name, self.api_name)

    @property
    def display(self) -> str:
        """How the planner prompt names the API."""
        return f"{self.tool_name}/{self.api_name}"

    @property
    def text(self) -> str:
        """The document text that is embedded (STUDY.md)."""
        return f"{self.tool_name}/{self.api_name}: {self.description or ''}"


@dataclass
class Warnings:
    """Counted data problems; each kind keeps a few examples for the report."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(example)

    def as_dict(self) -> dict:
        return {k: {"count": n, "examples": self.examples.get(k, [])} for k, n in sorted(self.counts.items())}


@dataclass
class Registry:
    apis: list[Api]
    source: str
    choice: str = "full"

    def __post_init__(self) -> None:
        self.ids = [a.id for a in self.apis]
        self.row = {i: n for n, i in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.apis)

    def texts(self) -> list[str]:
        return [a.text for a in self.apis]

    def lookup_display(self) -> dict[str, str]:
        """Map of `tool/api` display names (case-folded) to ids, for resolving planner output."""
        return {a.display.casefold(): a.id for a in self.apis}


@dataclass(frozen=True)
class Query:
    subset: str
    query_id: int
    text: str
    gold: dict[str, tuple[str, ...]]  # gold set name -> API ids


# ---------------------------------------------------------------- registry


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        with _open_text(path) as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno}). "
                        "Each line must be one JSON object; fix or remove that line."
                    ) from None
                if not isinstance(rec, dict):
                    raise DataError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}.")
                yield f"{path}:{n}", rec
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read the registry ({e}).") from None


def _read_json(path: Path, hint: str) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg}); {hint}.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e}).") from None


def _tree_records(root: Path) -> Iterator[tuple[str, dict]]:
    """ToolBench's `tools/<Category>/<tool>.json`: one tool per file with its `api_list`."""
    files = sorted(root.glob("*/*.json"))
    if not files:
        raise DataError(f"{root}: no <Category>/<tool>.json files found in this ToolBench tools tree.")
    for path in files:
        tool = _read_json(path, "fix or remove this tool file")
        if not isinstance(tool, dict):
            raise DataError(f"{path}: expected a JSON object describing one tool.")
        tool_name = tool.get("tool_name") or tool.get("name") or path.stem
        for n, api in enumerate(tool.get("api_list") or []):
            if not isinstance(api, dict):
                raise DataError(f"{path}: api_list[{n}] is not an object.")
            yield f"{path} api_list[{n}]", {
                "tool_name": tool_name,
                "api_name": api.get("name") or api.get("api_name"),
                "category": path.parent.name,
                "api_description": api.get("description") or api.get("api_description"),
            }


def _find_registry(path: Path) -> tuple[str, Path]:
    if path.is_file():
        return "jsonl", path
    candidates = [
        ("jsonl", path / "registry" / "apis.jsonl.gz"),
        ("jsonl", path / "registry" / "apis.jsonl"),
        ("jsonl", path / "apis.jsonl.gz"),
        ("jsonl", path / "apis.jsonl"),
        ("tree", path / "data" / "toolenv" / "tools"),
        ("tree", path / "toolenv" / "tools"),
        ("tree", path / "tools"),
    ]
    for kind, p in candidates:
        if p.exists():
            return kind, p
    if any(path.glob("*/*.json")):
        return "tree", path
    looked = ", ".join(str(p) for _, p in candidates)
    raise DataError(f"No registry found under {path}. Looked for: {looked}.")


def load_registry(path: str | Path, choice: str = "full", warnings: Warnings | None = None) -> Registry:
    """Read a registry file or folder; `described` keeps only APIs that have a description."""
    if choice not in REGISTRY_CHOICES:
        raise DataError(f"Unknown registry choice {choice!r}; use one of {', '.join(REGISTRY_CHOICES)}.")
    warnings = warnings if warnings is not None else Warnings()
    kind, found = _find_registry(Path(path))
    records = _jsonl_records(found) if kind == "jsonl" else _tree_records(found)
    apis: list[Api] = []
    seen: dict[str, tuple[str, Api]] = {}
    for where, rec in records:
        tool, name = rec.get("tool_name"), rec.get("api_name")
        if not isinstance(tool, str) or not isinstance(name, str) or not tool or not name:
            raise DataError(f"{where}: record lacks a string 'tool_name' and 'api_name': {json.dumps(rec)[:200]}")
        desc = rec.get("api_description")
        cat = rec.get("category") or rec.get("category_name")
        api = Api(tool, name, cat if isinstance(cat, str) and cat else None, desc if isinstance(desc, str) and desc.strip() else None)
        if api.id in seen:
            first_where, first = seen[api.id]
            # Keep the first record (or the first described one): a later duplicate never wins silently.
            warnings.add("duplicate_api", f"{where} repeats {api.id!r} from {first_where}")
            if first.description is None and api.description is not None:
                apis[apis.index(first)] = api
                seen[api.id] = (where, api)
            continue
        seen[api.id] = (where, api)
        apis.append(api)
    if not apis:
        raise DataError(f"{found}: the registry holds no API.")
    if choice == "described":
        kept = [a for a in apis if a.description is not None]
        if not kept:
            raise DataError(f"{found}: no API has a description, so the 'described' registry is empty.")
        apis = kept
    return Registry(apis=apis, source=str(found), choice=choice)


# ---------------------------------------------------------------- queries


def find_query_files(path: Path) -> list[Path]:
    for d in (path / "queries", path / "data" / "test_instruction", path / "test_instruction", path):
        files = sorted(d.glob("*.json")) if d.is_dir() else []
        if files:
            return files
    raise DataError(
        f"No query files (*.json in ToolBench test_instruction format) under {path}/queries or "
        f"{path}/data/test_instruction."
    )


def select_subsets(files: Iterable[Path], wanted: list[str] | None) -> list[Path]:
    """`wanted` holds file stems or prefixes such as `G1`; None keeps every file."""
    files = list(files)
    if not wanted:
        return files
    out: list[Path] = []
    for w in wanted:
        match = [f for f in files if f.stem == w] or [f for f in files if f.stem.startswith(w)]
        if not match:
            raise DataError(f"Subset {w!r} matches no query file; available: {', '.join(f.stem for f in files)}.")
        out += [f for f in match if f not in out]
    return out


def _gold_ids(where: str, rec: dict) -> dict[str, tuple[str, ...]]:
    api_list = rec.get("api_list")
    relevant = rec.get("relevant APIs", rec.get("relevant_apis"))
    if not isinstance(api_list, list) or not isinstance(relevant, list):
        raise DataError(f"{where}: needs a list 'api_list' and a list 'relevant APIs'.")
    try:
        al = [api_id(a["tool_name"], a["api_name"]) for a in api_list]
        rel = [api_id(t, a) for t, a in relevant]
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"{where}: 'api_list' entries need tool_name and api_name; 'relevant APIs' entries are "
            "[tool_name, api_name] pairs."
        ) from None
    return {"api_list": tuple(dict.fromkeys(al)), "relevant": tuple(dict.fromkeys(rel))}


def load_queries(
    path: Path, registry: Registry | None = None, warnings: Warnings | None = None, limit: int | None = None
) -> list[Query]:
    warnings = warnings if warnings is not None else Warnings()
    records = _read_json(path, "a query file is one JSON list")
    if not isinstance(records, list):
        raise DataError(f"{path}: expected a JSON list of queries (ToolBench test_instruction format).")
    subset = path.stem
    out: list[Query] = []
    seen_ids: set[int] = set()
    for n, rec in enumerate(records):
        where = f"{path} record {n}"
        if not isinstance(rec, dict) or not isinstance(rec.get("query"), str):
            raise DataError(f"{where}: needs a string 'query'.")
        qid = rec.get("query_id", n)
        if qid in seen_ids:
            warnings.add("duplicate_query_id", f"{where}: query_id {qid} repeats; later one skipped")
            continue
        seen_ids.add(qid)
        gold = _gold_ids(where, rec)
        if not gold["api_list"]:
            warnings.add("empty_gold", f"{where} (query_id {qid}) has an empty api_list; skipped")
            continue
        if registry is not None:
            for g in GOLD_SETS:
                for a in gold[g]:
                    if a not in registry.row:
                        # Kept in the gold set: a retriever that cannot find it should be scored as missing it.
                        warnings.add(f"gold_not_in_registry_{g}", f"{where} (query_id {qid}): {a}")
        out.append(Query(subset=subset, query_id=int(qid), text=rec["query"], gold=gold))
        if limit is not None and len(out) >= limit:
            break
    return out


def resolve_data_dir(cli: str | None, configured: str | None, base: Path) -> Path:
    """`--data`, else `EVALUATOR_DATA`, else the config (relative to the repository root)."""
    tried: list[str] = []
    for label, value in (("--data", cli), ("EVALUATOR_DATA", os.environ.get("EVALUATOR_DATA")), ("config data.dir", configured)):
        if not value:
            continue
        p = Path(value).expanduser()
        candidates = [p] if p.is_absolute() else [Path.cwd() / p, base / p]
        for c in candidates:
            if c.is_dir() or c.is_file():
                return c.resolve()
            tried.append(f"{label}: {c}")
        if label != "config data.dir":
            # An explicit choice that does not exist is an error, not a reason to fall back silently.
            break
    raise DataError(
        "ToolBench data not found. Looked in: " + ("; ".join(tried) or "nothing was set") + ".\n"
        "Point to it with --data DIR or EVALUATOR_DATA=DIR. DIR holds registry/apis.jsonl.gz and "
        "queries/G*_instruction.json (the layout of shared/toolbench), or ToolBench's own archive "
        "(data/toolenv/tools and data/test_instruction) from https://github.com/OpenBMB/ToolBench."
    )
