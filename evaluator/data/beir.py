"""BEIR folders: the corpus as a registry, the queries with the judgements of one split, grades kept.

The layout of BEIR's `GenericDataLoader` (also COLT's ToolLens, ToolRet's and MTEB's retrieval tasks):
- `corpus.jsonl`: one document a line, `_id`, `title` (optional), `text`;
- `queries.jsonl`: one query a line, `_id`, `text` (other fields, e.g. `metadata`, are kept for `subset_field`);
- `qrels/<split>.tsv`: a header line, then `query-id<TAB>corpus-id<TAB>score` per judgement, the score an
  integer grade.
Any of them may be gzipped (`corpus.jsonl.gz`, `queries.jsonl.gz`, `qrels/test.tsv.gz`). Ids are strings
(a JSON integer is read as its digits, as the TSV writes it). A document is embedded as BEIR's own dense
models embed it (`model.corpus_text`). As BEIR's loader does, only the queries the split judges are kept
(the others are counted); a judgement of score > 0 makes a document relevant with that grade, a score of 0 or
less is judged non-relevant and kept out of the gold set. What BEIR's loader would read wrongly or refuse (a
file missing, an id repeated with another text, two scores for one pair, a line that is not three cells, a
malformed line) stops the study with one line naming the file and line and what to do; a line repeated as it is
is read once and counted. Judgements of a query-id no query has, or of a
corpus-id no document has (checked against the registry: `queries.finish`), are counted warnings up to
`model.UNRESOLVED_GOLD_SHARE` of them (public folders have a few: BEIR's NFCorpus and ArguAna), and stop the study
past it (the qrels are another folder's); a missing document stays in the gold set, unreachable, as pytrec_eval
scores it on the folder's qrels.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from evaluator.core.errors import DataError
from evaluator.data.model import (
    NAME_CAP_CHARS,
    UNRESOLVED_GOLD_SHARE,
    Api,
    Warnings,
    corpus_text,
    description_or_none,
)
from evaluator.data.source import get_str, json_type, parse_jsonl, read_text, reading

CORPUS_NAMES = ("corpus.jsonl", "corpus.jsonl.gz")
QUERY_NAMES = ("queries.jsonl", "queries.jsonl.gz")
QRELS_DIR = "qrels"
DEFAULT_SPLIT = "test"  # BEIR's GenericDataLoader.load(split="test")
LAYOUT = "a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv (each may end in .gz)"

Entry = tuple[str, Api]


def is_folder(path: Path) -> bool:
    """A folder with a corpus.jsonl[.gz] or a qrels/ folder is read as BEIR (what it lacks is then an error)."""
    with reading(path):
        return path.is_dir() and (any((path / n).is_file() for n in CORPUS_NAMES) or (path / QRELS_DIR).is_dir())


def _one_of(folder: Path, names: tuple[str, ...]) -> Path:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    raise DataError(f"{folder / names[0]}: missing; {LAYOUT}.")


def corpus_file(folder: Path) -> Path:
    return _one_of(folder, CORPUS_NAMES)


def queries_file(folder: Path) -> Path:
    return _one_of(folder, QUERY_NAMES)


def qrels_file(folder: Path, split: str) -> Path:
    """`qrels/<split>.tsv` (or `.tsv.gz`); a missing one names the splits the folder has."""
    qrels = folder / QRELS_DIR
    for name in (f"{split}.tsv", f"{split}.tsv.gz"):
        if (qrels / name).is_file():
            return qrels / name
    with reading(qrels):
        have = sorted(p.name.removesuffix(".gz").removesuffix(".tsv") for p in qrels.iterdir()
                      if p.name.endswith((".tsv", ".tsv.gz"))) if qrels.is_dir() else []
    hint = f"the folder has the split(s) {', '.join(have)}: pass --split NAME" if have else LAYOUT
    raise DataError(f"{qrels / (split + '.tsv')}: missing; {hint}.")


def is_document(rec: object) -> bool:
    """A corpus record (`_id` and `text`), not a registry record of another format."""
    return isinstance(rec, dict) and "_id" in rec and "text" in rec and "tool_name" not in rec


def is_query(rec: object) -> bool:
    """A BEIR query record (`_id` and `text`), not one of the project's own query files (`query`, `gold`)."""
    return isinstance(rec, dict) and "_id" in rec and "text" in rec and "query" not in rec


def _id(rec: dict, where: str, what: str) -> str:
    value = rec.get("_id")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # as the qrels TSV writes it
    if not isinstance(value, str) or not value.strip():
        shown = json_type(value) if not isinstance(value, str) else "empty"
        raise DataError(f"{where}: '_id' must be the {what}'s id, a non-empty string ({shown} given).")
    if len(value) > NAME_CAP_CHARS:
        raise DataError(f"{where}: '_id' has {len(value):,} characters; ids are at most {NAME_CAP_CHARS}.")
    return value


def documents(records: list[tuple[str, object]], warnings: Warnings) -> list[Entry]:
    """The corpus as APIs: id = `_id`, title as the tool name, text embedded by `corpus_text`. A repeated `_id`
    is an error (BEIR's loader would keep the last silently), unless the line repeats the first (counted once)."""
    out: list[Entry] = []
    seen: dict[str, tuple[str, Api]] = {}
    for where, rec in records:
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a corpus document ({{\"_id\", \"title\", \"text\"}}), got {json_type(rec)}.")
        doc = _id(rec, where, "document")
        if "text" not in rec:
            raise DataError(f"{where}: missing the string field 'text' (the document's text; it may be empty).")
        text = get_str(rec, "text", where) or ""
        title = get_str(rec, "title", where) or ""
        joined = corpus_text(title, text)
        api = Api(title, doc, None, description_or_none(joined), document=joined)
        if (prior := seen.get(doc)) is not None:
            if prior[1] != api:
                raise DataError(f"{where}: document id {doc!r} repeats {prior[0]} with another title or text; give "
                                "every document a unique _id.")
            warnings.add("repeated_document", f"{where} repeats {prior[0]}; read once")
            continue
        seen[doc] = (where, api)
        out.append((where, api))
    return out


@dataclass
class Judged:
    """One query of queries.jsonl that the split judges: its relevant documents with their grades (> 0, in the
    qrels' order) and the qrels line of each."""

    where: str
    qid: str
    text: str
    subset: str
    grades: dict[str, int] = field(default_factory=dict)
    judged_at: dict[str, str] = field(default_factory=dict)


def _field(rec: Mapping, path: str) -> object:
    """`metadata.subset`: the key as written, else each dotted part in turn; None when absent."""
    if path in rec:
        return rec[path]
    value: object = rec
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _subset(rec: dict, where: str, subset_field: str) -> str:
    value = _field(rec, subset_field)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        got = "absent" if value is None else ("empty" if isinstance(value, str) else json_type(value))
        raise DataError(f"{where}: the subset field {subset_field!r} is {got}; every query needs it as a non-empty "
                        "string (--subset-field names it), or drop --subset-field for one subset named after the folder.")
    value = value.strip()
    if not value.isprintable() or any(c in value for c in "/\\"):
        # Subset names become parts of output names (figures, tables): keep them plain.
        raise DataError(f"{where}: subset {value!r} may not contain '/', '\\' or control characters.")
    return value


def read_qrels(path: Path, warnings: Warnings) -> dict[str, dict[str, tuple[int, str]]]:
    """query-id -> corpus-id -> (score, `file:line`), in the file's order. The first line is BEIR's header
    (`query-id corpus-id score`) unless its score is an integer (BEIR's loader would drop that judgement)."""
    text = read_text(path)
    out: dict[str, dict[str, tuple[int, str]]] = {}
    first = True
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not any(c.strip() for c in row):
                continue
            header, first = first, False
            if header and (len(row) < 3 or _grade(row[2].strip()) is None):
                continue  # the header line (query-id, corpus-id, score)
            if len(row) < 3:
                tabs = " Separate the columns with tabs." if len(row) == 1 and " " in row[0].strip() else ""
                raise DataError(f"{where}: expected 3 tab-separated cells (query-id, corpus-id, score), got "
                                f"{len(row)}.{tabs}")
            qid, doc, score = row[0], row[1], row[2].strip()
            grade = _grade(score)
            if grade is None:
                raise DataError(f"{where}: score {score[:40]!r} is not an integer grade (0 = not relevant, 1, 2, ...).")
            if not qid.strip() or not doc.strip():
                raise DataError(f"{where}: an empty {'query-id' if not qid.strip() else 'corpus-id'}.")
            judged = out.setdefault(qid, {})
            if doc in judged:
                prior, prior_where = judged[doc]
                if prior != grade:
                    raise DataError(f"{where}: ({qid!r}, {doc!r}) is judged {grade} here and {prior} at {prior_where}; "
                                    "keep one judgement per pair.")
                warnings.add("repeated_judgement", f"{where} repeats {prior_where}; counted once")
                continue
            judged[doc] = (grade, where)
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: malformed TSV ({e}).") from None
    return out


def _grade(cell: str) -> int | None:
    try:
        return int(cell)
    except ValueError:
        try:
            f = float(cell)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None


def read_queries(where: Path, split: str, subset_field: str, warnings: Warnings) -> tuple[Path, list[Judged]]:
    """(queries file, the queries the split judges, in the file's order): `where` is a BEIR folder or its
    queries file (the qrels are then the folder's beside it). Subset: `subset_field` of each query, else the
    folder's name."""
    folder = where if where.is_dir() else where.parent
    qfile = queries_file(folder) if where.is_dir() else where
    qrels_path = qrels_file(folder, split)
    qrels = read_qrels(qrels_path, warnings)
    records = parse_jsonl(qfile, read_text(qfile))
    seen: dict[str, tuple[str, str, str]] = {}  # query id -> (where, text, subset)
    folder_name = folder.resolve().name or "beir"
    out: list[Judged] = []
    for w, rec in records:
        qid = _id(rec, w, "query")
        text = get_str(rec, "text", w, required=True)
        subset = _subset(rec, w, subset_field) if subset_field else folder_name
        if (prior := seen.get(qid)) is not None:
            if prior[1:] != (text, subset):
                raise DataError(f"{w}: query id {qid!r} repeats {prior[0]} with another text or subset; give every "
                                "query a unique _id.")
            warnings.add("repeated_query", f"{w} repeats {prior[0]}; read once")
            continue
        seen[qid] = (w, text, subset)
        judged = qrels.get(qid)
        if judged is None:
            warnings.add("unjudged_query", f"{w} (_id {qid}): not judged in {qrels_path}; left out, as BEIR's loader does")
            continue
        relevant = {d: (g, at) for d, (g, at) in judged.items() if g > 0}
        if not relevant:
            warnings.add("no_relevant_judgement", f"{w} (_id {qid}): every judgement in {qrels_path} has score <= 0; "
                         "left out (no relevant document to find)")
            continue
        out.append(Judged(w, qid, text, subset, {d: g for d, (g, _) in relevant.items()},
                          {d: at for d, (_, at) in relevant.items()}))
    missing = [(qid, next(iter(judged.values()))[1]) for qid, judged in qrels.items() if qid not in seen]
    if len(missing) > UNRESOLVED_GOLD_SHARE * len(qrels):
        (qid, at) = missing[0]
        raise DataError(f"{at}: {len(missing)} of the {len(qrels)} query-ids {qrels_path.name} judges are not in {qfile}, "
                        f"e.g. {qid!r}; the qrels and the queries must be of one folder: fix the ids.")
    for qid, at in missing:  # a few (BEIR's NFCorpus has some): nothing to ask, counted
        warnings.add("judged_query_missing", f"{at}: query-id {qid!r} is not in {qfile}; its judgements are left out")
    return qfile, out
