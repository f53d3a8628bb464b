"""Query files: ToolBench `test_instruction` JSON, your own JSONL / CSV with `query` and `gold`, or a BEIR
folder's queries with the judgements of one split (`data.beir`: graded gold).

Own files: one query a record with `query` (the request), `gold` (API ids `tool::api`, a JSON list or
a `;`-separated cell), and optional `id`, `subset` (default: the file's name) and `relevant` (a
stricter second gold set; default: the same as `gold`). Query ids of any JSON type are normalised:
integral numbers and canonical integer strings become ints (so `"7"` and `7` are the same id), any
other id is a string; within a subset ids are all ints or, if any is not, all strings. A repeated id
within a subset is an error naming both records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from evaluator.core.errors import DataError
from evaluator.data import beir, toolbench
from evaluator.data.model import (
    GOLD_SETS,
    UNRESOLVED_GOLD_SHARE,
    Query,
    Registry,
    Warnings,
    api_id,
    bounded_id,
    loose_id,
    match_subsets,
)
from evaluator.data.source import (
    get_str,
    json_type,
    parse_csv,
    parse_json,
    parse_jsonl,
    read_text,
    reading,
    stem,
)

QUERY_SUFFIXES = (".json", ".jsonl", ".ndjson", ".csv", ".tsv")
QUERY_DIRS = ("queries", "data/test_instruction", "test_instruction")
_INT_RE = re.compile(r"-?(?:0|[1-9][0-9]*)")


@dataclass
class RawQuery:
    where: str
    subset: str
    qid: int | str  # normalised, before the per-subset type rule
    text: str
    gold: dict[str, tuple[str, ...]]
    defaulted: bool  # the id is the record's position: the file gave none
    one_gold: bool = False  # an own file without `relevant`: both gold sets are `gold`
    file: str = ""  # the query file it came from (the unresolved-gold rule is per file)
    grades: dict[str, int] = field(default_factory=dict)  # graded gold (BEIR qrels): every gold id's grade
    # BEIR: the qrels line that judged each gold id. Such gold is the folder's own judgement of its corpus, so an
    # id the registry lacks is an error at that line, not a counted warning.
    judged_at: dict[str, str] = field(default_factory=dict)


def _is_query_name(p: Path) -> bool:
    n = p.name.lower()
    return p.is_file() and any(n.endswith(s) or n.endswith(s + ".gz") for s in QUERY_SUFFIXES)


def find_query_files(path: Path) -> list[Path]:
    """Query files of a data folder: its queries/ (or ToolBench's test_instruction/) folder, else the
    folder's own queries*.jsonl/csv/json and *_instruction.json files."""
    path = Path(path)
    if beir.is_folder(path):
        return [path]  # the folder stands for its queries and the qrels of the split (read_query_file)
    with reading(path):
        for rel in QUERY_DIRS:
            d = path / rel
            files = sorted(p for p in d.iterdir() if _is_query_name(p)) if d.is_dir() else []
            if files:
                return files
        if path.is_dir():
            top = sorted(p for p in path.iterdir() if _is_query_name(p))
            named = [p for p in top if stem(p).lower().startswith("queries") or stem(p).endswith("_instruction")]
            if named:
                return named
    raise DataError(
        f"No query files under {path}: expected a queries/ folder, queries.jsonl or queries.csv "
        f"(query, gold columns), ToolBench's data/test_instruction/*.json, or a BEIR folder (corpus.jsonl, "
        f"queries.jsonl, qrels/<split>.tsv)."
    )


def select_subsets(files: Iterable[Path], wanted: list[str] | None) -> list[Path]:
    """`wanted` holds file stems or prefixes such as `G1`; None keeps every file."""
    files = list(files)
    if not wanted:
        return files
    return match_subsets(files, wanted, lambda w: DataError(
        f"Subset {w!r} matches no query file; available: {', '.join(stem(f) for f in files)}."), name=stem)


def normalise_qid(value: object, where: str) -> int | str | None:
    """An id of any JSON type as int (integral numbers, canonical integer strings) or str; None if absent."""
    if value is None:
        return None
    if isinstance(value, (bool, list, dict)):
        raise DataError(f"{where}: a query id must be a string or a number, not {json_type(value)}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(f"{where}: a query id must be a finite number or a string, not {value}.")
        return int(value) if value.is_integer() else repr(value)
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        return int(s) if _INT_RE.fullmatch(s) else s
    raise DataError(f"{where}: a query id must be a string or a number, not {type(value).__name__}.")


def _gold_list(value: object, where: str, column: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        items = value.split(";")
    elif isinstance(value, list):
        bad = next((v for v in value if not isinstance(v, str)), None)
        if bad is not None:
            raise DataError(f"{where}: '{column}' entries must be API id strings (tool::api), not {json_type(bad)}.")
        items = value
    else:
        raise DataError(
            f"{where}: '{column}' must be a list of API ids or one ';'-separated string, not {json_type(value)}."
        )
    ids = [i.strip() for i in items if i.strip()]
    return tuple(dict.fromkeys(ids))


def _own_record(where: str, rec: dict, position: int, subset: str) -> RawQuery:
    text = get_str(rec, "query", where, required=True)
    if "gold" not in rec:
        raise DataError(f"{where}: missing 'gold' (the expected API ids, tool::api, as a list or ';'-separated).")
    gold = _gold_list(rec["gold"], where, "gold")
    relevant = _gold_list(rec.get("relevant"), where, "relevant")
    one_gold = not relevant  # no stricter set given: both gold sets are `gold`
    raw_id = rec.get("id", rec.get("query_id"))
    qid = normalise_qid(raw_id, where)
    sub = (get_str(rec, "subset", where) or "").strip()
    if sub and (not sub.isprintable() or any(c in sub for c in "/\\")):
        # Subset names become parts of output names (figures, tables): keep them plain.
        raise DataError(f"{where}: subset {sub!r} may not contain '/', '\\' or control characters.")
    return RawQuery(where, sub or subset, position if qid is None else qid, text,
                    {"api_list": gold, "relevant": gold if one_gold else relevant}, qid is None, one_gold)


def _toolbench_record(where: str, rec: object, n: int, subset: str) -> RawQuery:
    if not isinstance(rec, dict) or not isinstance(rec.get("query"), str):
        raise DataError(f"{where}: needs a string 'query' (ToolBench test_instruction format).")
    if not rec["query"].strip():
        raise DataError(f"{where}: 'query' is empty; write the request, or remove the record.")
    qid = normalise_qid(rec.get("query_id"), where)
    return RawQuery(where, subset, n if qid is None else qid, rec["query"], toolbench.gold_ids(where, rec), qid is None)


def read_query_file(path: Path, warnings: Warnings | None = None, split: str = beir.DEFAULT_SPLIT,
                    subset_field: str = "") -> list[RawQuery]:
    """Every record of one query file, validated; raises DataError at the first bad one. A BEIR folder (or its
    queries.jsonl) gives the queries `split` judges; `subset_field` names the query field holding the subset."""
    warnings = warnings if warnings is not None else Warnings()
    path = Path(path)
    raws = _read_query_file(path, warnings, split, subset_field)
    for r in raws:
        r.file = r.file or str(path)
    return raws


def _beir(path: Path, warnings: Warnings, split: str, subset_field: str) -> list[RawQuery]:
    qfile, judged = beir.read_queries(path, split, subset_field, warnings)
    out = []
    for j in judged:
        qid = normalise_qid(j.qid, j.where)
        assert qid is not None  # beir.read_queries refuses an empty id
        ids = tuple(j.grades)
        out.append(RawQuery(j.where, j.subset, qid, j.text, {"api_list": ids, "relevant": ids}, False, True,
                            str(qfile), j.grades, j.judged_at))
    return out


def _read_query_file(path: Path, warnings: Warnings, split: str, subset_field: str) -> list[RawQuery]:
    subset = stem(path)
    if path.is_dir():
        return _beir(path, warnings, split, subset_field)  # only a BEIR folder reaches here (`_expand`)
    with reading(path):
        text = read_text(path)
        name = path.name.lower().removesuffix(".gz")
        if name.endswith((".csv", ".tsv")):
            rows = parse_csv(path, text, ("query", "gold"))
            return [_own_record(w, r, n, subset) for n, (w, r) in enumerate(rows, 1)]
        if name.endswith((".jsonl", ".ndjson")):
            recs = parse_jsonl(path, text)
            if recs and beir.is_query(recs[0][1]):
                return _beir(path, warnings, split, subset_field)  # a BEIR queries.jsonl: its folder's qrels
            if recs and toolbench.is_query_record(recs[0][1]):
                return [_toolbench_record(w, r, n, subset) for n, (w, r) in enumerate(recs)]
            return [_own_record(w, r, n, subset) for n, (w, r) in enumerate(recs, 1)]
        doc = parse_json(path, text, "a JSON list of queries (name the file .jsonl for one query a line)")
        if not isinstance(doc, list):
            raise DataError(
                f"{path}: expected a JSON list of queries (ToolBench test_instruction format, or records with "
                f"query and gold), got {json_type(doc)}."
            )
        if doc and isinstance(doc[0], dict) and not toolbench.is_query_record(doc[0]):
            out = []
            for n, r in enumerate(doc):
                where = f"{path} record {n}"
                if not isinstance(r, dict):
                    raise DataError(f"{where}: expected an object with query and gold, got {json_type(r)}.")
                out.append(_own_record(where, r, n + 1, subset))
            return out
        return [_toolbench_record(f"{path} record {n}", r, n, subset) for n, r in enumerate(doc)]


def _unify_ids(raws: list[RawQuery]) -> None:
    """Within a subset ids are all ints or all strings (outputs sort by them); then no id repeats."""
    by_subset: dict[str, list[RawQuery]] = {}
    for r in raws:
        by_subset.setdefault(r.subset, []).append(r)
    for subset, group in by_subset.items():
        if any(isinstance(r.qid, str) for r in group):
            for r in group:
                r.qid = str(r.qid)
        first: dict[int | str, RawQuery] = {}
        for r in group:
            prior = first.setdefault(r.qid, r)
            if prior is not r:
                how = " (its position: the record has no id)" if r.defaulted else ""
                raise DataError(
                    f"{r.where}: query id {r.qid!r}{how} repeats {prior.where} in subset {subset!r}; "
                    "give every query a unique id."
                )


def _pick_subsets(raws: list[RawQuery], wanted: list[str] | None) -> list[RawQuery]:
    if not wanted:
        return raws
    names = list(dict.fromkeys(r.subset for r in raws))
    keep = set(match_subsets(names, wanted, lambda w: DataError(
        f"Subset {w!r} matches no query subset; available: {', '.join(names)}.")))
    return [r for r in raws if r.subset in keep]


# UNRESOLVED_GOLD_SHARE (data.model): when gold ids match no API of the registry, as read (an id the `described`
# choice left out is a known API), a file where more than this share of its gold ids match none, or any query
# none of whose ids in a gold set matches, stops the study before any paid work. A BEIR folder's judgements are
# held to the share alone (`_judged_in`).
GOLD_ID_FORM = "`tool::api` as the registry names them (tool and API name joined by '::', case and spaces as written)"


def finish(
    raws: list[RawQuery], registry: Registry | None, warnings: Warnings, limit: int | None
) -> list[Query]:
    """Skip empty gold sets (counted), keep the first `limit` per subset, count gold ids the registry lacks and
    stop on gold that matches nothing (UNRESOLVED_GOLD_SHARE)."""
    out: list[Query] = []
    per_subset: dict[str, int] = {}
    per_file: dict[str, list[int]] = {}  # file -> [gold ids checked, matching no API]
    unresolved: dict[str, str] = {}  # file -> a first unresolved id (for the message)
    no_gold: list[str] = []  # the line of each query none of whose ids in a gold set matches
    judged = JudgedTally()  # a BEIR folder's relevant judgements and those naming no document
    for r in raws:
        if limit and per_subset.get(r.subset, 0) >= limit:
            continue
        if not r.gold["api_list"]:
            warnings.add("empty_gold", f"{r.where} (query_id {r.qid}) has an empty gold set; skipped")
            continue
        r.gold = {g: tuple(dict.fromkeys(bounded_id(a) for a in ids)) for g, ids in r.gold.items()}
        if registry is not None and r.judged_at:
            _judged_in(r, registry, warnings, judged)
        elif registry is not None:
            tally = per_file.setdefault(r.file, [0, 0])
            for g in GOLD_SETS:
                if g != GOLD_SETS[0] and r.one_gold:
                    continue  # the same set as the first: its missing ids are counted once
                missing = 0
                for a in r.gold[g]:
                    tally[0] += 1
                    if a in registry.row:
                        continue
                    # Kept in the gold set: a retriever that cannot find it should be scored as missing it.
                    warnings.add(f"gold_not_in_registry_{g}", f"{r.where} (query_id {r.qid}): {a}")
                    if a not in registry.left_out:
                        missing += 1
                        tally[1] += 1
                        unresolved.setdefault(r.file, a)
                if r.gold[g] and missing == len(r.gold[g]) and not no_gold:
                    no_gold.append(_unresolved_line(r.where, f"no gold id of query {r.qid!r} ({g}) matches an "
                                                    "API of the registry", r.gold[g][0], registry))
        per_subset[r.subset] = per_subset.get(r.subset, 0) + 1
        graded = any(g != 1 for g in r.grades.values())
        out.append(Query(subset=r.subset, query_id=r.qid, text=r.text, gold=r.gold,
                         grades=dict(r.grades) if graded else {}))
    for file, (n, bad) in per_file.items():
        if n and bad / n > UNRESOLVED_GOLD_SHARE:
            raise DataError(_unresolved_line(file, f"{bad} of {n} gold ids match no API of the registry",
                                             unresolved[file], registry))
    if no_gold:
        raise DataError(no_gold[0])
    if registry is not None and judged.missing > UNRESOLVED_GOLD_SHARE * judged.n:
        raise DataError(f"{judged.first}: {judged.missing} of {judged.n} relevant judgements name no document of the "
                        f"registry ({registry.source}), e.g. corpus-id {judged.example!r}; the qrels and the corpus "
                        "must be of one folder: pass the BEIR folder itself with --data DIR (or --tools DIR), or fix "
                        "the ids.")
    return out


@dataclass
class JudgedTally:
    """A BEIR folder's relevant judgements checked against the registry, and the first naming no document."""

    n: int = 0
    missing: int = 0
    first: str = ""  # its qrels line
    example: str = ""


def _judged_in(r: RawQuery, registry: Registry, warnings: Warnings, tally: JudgedTally) -> None:
    """A judgement names a document of the folder's own corpus. One the registry lacks stays in the gold set,
    unreachable, as pytrec_eval scores it on the folder's qrels (public folders have a few: BEIR's ArguAna), and is
    counted; past UNRESOLVED_GOLD_SHARE of them the qrels are not this registry's (`finish` stops)."""
    for a in r.gold["api_list"]:
        tally.n += 1
        if a in registry.row:
            continue
        at = r.judged_at.get(a, r.where)
        if a in registry.left_out:
            warnings.add("gold_not_in_registry_api_list", f"{at} (query_id {r.qid}): {a}")
            continue
        tally.missing += 1
        if not tally.first:
            tally.first, tally.example = at, a
        warnings.add("judged_not_in_corpus", f"{at}: corpus-id {a!r} (query {r.qid!r}) is no document of the "
                     "registry; kept in the gold set, unreachable, as pytrec_eval scores it")


def _unresolved_line(where: str, what: str, example: str, registry: Registry | None) -> str:
    hint = suggest_id(example, registry) if registry is not None else None
    shown = f", e.g. {example[:120]!r}" + (f" (the registry has {hint!r})" if hint else "")
    src = f" ({registry.source})" if registry is not None else ""
    return (f"{where}: {what}{src}{shown}; gold ids are written {GOLD_ID_FORM}. Fix the ids, or pass the "
            "registry they name with --tools/--data.")


def suggest_id(aid: str, registry: Registry) -> str | None:
    """The registry id a gold id that matches none most likely means: the same id up to case and spaces, with
    another separator (`tool/api`, `tool.api`, `tool:api`, `tool api`), `_` or `-` for a space, or the API
    name alone when one API has it. None when nothing fits."""
    loose: dict[str, str] = {}
    by_name: dict[str, list[str]] = {}
    for a in registry.apis:
        loose.setdefault(_looser(a.id), a.id)
        by_name.setdefault(_looser(a.api_name), []).append(a.id)
    forms = [aid]
    for sep in ("::", "/", ".", ":", "->", "|", " "):
        head, found, tail = aid.partition(sep)
        if found and head and tail:
            forms.append(api_id(head, tail))
    for f in forms:
        if (hit := loose.get(_looser(f))) is not None:
            return hit
    name = aid.rpartition("::")[2] if "::" in aid else aid
    hits = by_name.get(_looser(name), [])
    return hits[0] if len(hits) == 1 else None


def _looser(aid: str) -> str:
    return loose_id(aid.replace("_", " ").replace("-", " "))


def load_queries(
    path: Path, registry: Registry | None = None, warnings: Warnings | None = None, limit: int | None = None,
    split: str = beir.DEFAULT_SPLIT, subset_field: str = "",
) -> list[Query]:
    """One query file (may be empty), or a BEIR folder's judged queries."""
    warnings = warnings if warnings is not None else Warnings()
    raws = read_query_file(Path(path), warnings, split, subset_field)
    _unify_ids(raws)
    return finish(raws, registry, warnings, limit)


def _expand(p: Path) -> list[Path]:
    """A folder given as a query path stands for its query files (else a data folder's); a BEIR folder for itself."""
    if not p.is_dir() or beir.is_folder(p):
        return [p]
    with reading(p):
        files = sorted(f for f in p.iterdir() if _is_query_name(f))
    return files or find_query_files(p)


def load_query_files(
    paths: Iterable[str | Path], registry: Registry | None = None, warnings: Warnings | None = None,
    limit: int | None = None, subsets: list[str] | None = None, split: str = beir.DEFAULT_SPLIT,
    subset_field: str = "",
) -> list[Query]:
    """Every query of every file (a folder: its query files; a BEIR folder: the queries `split` judges),
    validated together (ids unique per subset); an empty result is an error."""
    warnings = warnings if warnings is not None else Warnings()
    files = [f for p in paths for f in _expand(Path(p))]
    if not files:
        raise DataError("No query file given; pass --queries FILE... or a --data folder with queries.")
    raws = [r for p in files for r in read_query_file(p, warnings, split, subset_field)]
    _unify_ids(raws)
    raws = _pick_subsets(raws, subsets)
    queries = finish(raws, registry, warnings, limit)
    if not queries:
        names = ", ".join(str(p) for p in paths)
        unjudged = warnings.counts["unjudged_query"] + warnings.counts["no_relevant_judgement"]
        why = ("every query has an empty gold set" if raws else
               f"no query has a judgement of score > 0 in the split ({unjudged} left out); check --split" if unjudged
               else "the files hold no query")
        raise DataError(f"No query to run in {names}: {why}; add queries with a non-empty gold set.")
    return queries
